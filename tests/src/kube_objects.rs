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

/// The `default` namespace and one Ready Node per topology node: its
/// addresses as InternalIPs (both, or the IPv6 one on an IPv6 underlay),
/// both pod CIDRs, and the gateway label
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
        let cidrs = [n.pod_cidr(), n.pod_cidr6()];
        // The addresses the node has: on an IPv6 underlay, no IPv4 one.
        let ips = match topo.ipv6_underlay {
            true => vec![n.ip6.to_string()],
            false => vec![n.ip.to_string(), n.ip6.to_string()],
        };
        create_node(api, &n.name, labels, &cidrs, &ips)?;
    }
    Ok(())
}

/// A Ready Node with one InternalIP and no agent behind it.
pub fn put_node(api: &FakeApiServer, name: &str, ip: &str) -> Result<()> {
    let labels = json!({"kubernetes.io/hostname": name});
    create_node(api, name, labels, &[], &[ip.to_string()])
}

/// A Ready Node as the kubelet registers it: `ips` as InternalIPs, then its
/// hostname; `pod_cidrs` in `podCIDRs` (the first also in `podCIDR`).
fn create_node(
    api: &FakeApiServer,
    name: &str,
    labels: Value,
    pod_cidrs: &[String],
    ips: &[String],
) -> Result<()> {
    let mut addresses: Vec<Value> = ips
        .iter()
        .map(|ip| json!({"type": "InternalIP", "address": ip}))
        .collect();
    addresses.push(json!({"type": "Hostname", "address": name}));
    let mut spec = json!({"podCIDRs": pod_cidrs});
    if let Some(first) = pod_cidrs.first() {
        spec["podCIDR"] = json!(first);
    }
    let node = json!({
        "metadata": {"name": name, "labels": labels},
        "spec": spec,
        "status": {
            "addresses": addresses,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
        },
    });
    api.change(|s| s.create(&core("nodes"), "", node))
        .map(|_| ())
        .map_err(|e| anyhow!("node {name}: {}", e.message))
}

/// `kubectl delete node NAME`.
pub fn delete_node(api: &FakeApiServer, name: &str) -> Result<()> {
    api.change(|s| s.delete(&core("nodes"), "", name, None))
        .map(|_| ())
        .map_err(|e| anyhow!("node {name}: {}", e.message))
}

/// The nodes whose heartbeat Lease exists (holder of each `egress.dev/heartbeat=true` Lease).
pub fn heartbeat_nodes(api: &FakeApiServer) -> Result<Vec<String>> {
    let sel = crate::kube_api::store::Selector::parse(Some("egress.dev/heartbeat=true"), None)
        .map_err(|e| anyhow!("{}", e.message))?;
    let leases = Resource::new("coordination.k8s.io/v1", "leases");
    let (items, _) = api
        .read(|s| s.list(&leases, "", &sel))
        .map_err(|e| anyhow!("{}", e.message))?;
    Ok(items
        .iter()
        .filter_map(|l| {
            l.pointer("/spec/holderIdentity")?
                .as_str()
                .map(str::to_string)
        })
        .collect())
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
