//! The objects Kubernetes itself keeps (Nodes, Pods, Namespaces), written
//! into the in-memory API server as the kubelet and the scheduler would
//! have them, for clusters on the Kubernetes datastore.

use anyhow::{anyhow, Result};
use serde_json::{json, Map, Value};

use crate::{
    kube_api::{store::Resource, FakeApiServer},
    topology::Topology,
};

fn core(plural: &str) -> Resource {
    Resource::new("v1", plural)
}

/// The `default` namespace and one Ready Node per topology node: both
/// addresses as InternalIPs, both pod CIDRs, and the gateway label
/// (`egress-gateway=true`) where `is_gateway` says so.
pub fn add_nodes(
    api: &FakeApiServer,
    topo: &Topology,
    is_gateway: impl Fn(&str) -> bool,
) -> Result<()> {
    let ns = json!({"metadata": {"name": "default",
                    "labels": {"kubernetes.io/metadata.name": "default"}}});
    api.change(|s| s.create(&core("namespaces"), "", ns))
        .map_err(|e| anyhow!("namespace default: {}", e.message))?;
    for n in &topo.nodes {
        let mut labels = json!({"kubernetes.io/hostname": n.name, "kubernetes.io/os": "linux"});
        if is_gateway(&n.name) {
            labels["egress-gateway"] = json!("true");
        }
        let node = json!({
            "metadata": {"name": n.name, "labels": labels},
            "spec": {"podCIDR": n.pod_cidr(), "podCIDRs": [n.pod_cidr(), n.pod_cidr6()]},
            "status": {
                "addresses": [
                    {"type": "InternalIP", "address": n.ip.to_string()},
                    {"type": "InternalIP", "address": n.ip6.to_string()},
                    {"type": "Hostname", "address": n.name},
                ],
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
            },
        });
        api.change(|s| s.create(&core("nodes"), "", node))
            .map_err(|e| anyhow!("node {}: {}", n.name, e.message))?;
    }
    Ok(())
}

/// Creates pod `name` (namespace default) on `node`, or replaces it:
/// `labels` as `k=v,...`, `ips` comma-separated, the first one `podIP`.
pub fn put_pod(
    api: &FakeApiServer,
    name: &str,
    labels: &str,
    node: &str,
    ips: &str,
) -> Result<String> {
    let labels: Map<String, Value> = labels
        .split(',')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (k.to_string(), json!(v))
        })
        .collect();
    let ips: Vec<&str> = ips.split(',').filter(|i| !i.is_empty()).collect();
    let mut pod = json!({
        "metadata": {"name": name, "namespace": "default", "labels": labels},
        "spec": {"nodeName": node, "containers": [{"name": "app", "image": "app"}]},
        "status": {"phase": "Running", "podIP": ips.first(),
                   "podIPs": ips.iter().map(|ip| json!({"ip": ip})).collect::<Vec<_>>()},
    });
    let pods = core("pods");
    api.change(|s| match s.get(&pods, "default", name) {
        Ok(old) => {
            pod["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"].clone();
            // A replace keeps the stored status (a subresource): the
            // kubelet's part is written after it.
            let status = pod["status"].take();
            s.replace(&pods, "default", name, pod)?;
            s.merge(&pods, "default", name, &json!({"status": status}))
        }
        Err(_) => s.create(&pods, "default", pod),
    })
    .map(|_| format!("pod/{name} written"))
    .map_err(|e| anyhow!("pod {name}: {}", e.message))
}
