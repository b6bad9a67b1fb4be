//! Fills the datastore: one gateway, the nodes (the first ones gateway
//! candidates) with their EgressTunnels as agents and a controller would
//! have left them, the policies (one `app` label each, ten namespaces) and
//! the pods spread over the workers.

use egress_control::api::{NodeRecord, PodRecord, API_VERSION};
use egress_control::datastore::typed::{node_object, pod_object};
use egress_control::datastore::{Datastore, Kind, ObjectKey, StatusPatch};
use futures::StreamExt;
use serde_json::json;

use super::{node_name, pod_cidr, pod_ip, Size};

/// How many writes are in flight at once.
const IN_FLIGHT: usize = 64;

pub async fn seed(ds: &dyn Datastore, size: Size) {
    ds.create(
        Kind::EgressGateway,
        json!({"apiVersion": API_VERSION, "kind": "EgressGateway", "metadata": {"name": "egw"},
               "spec": {"ippools": {"ipv4": ["10.100.0.0/22"]},
                        "nodeSelector": {"selector": {"matchLabels": {"egress": "true"}}}}}),
    )
    .await
    .unwrap();
    futures::stream::iter(0..size.nodes)
        .for_each_concurrent(IN_FLIGHT, |i| seed_node(ds, size, i))
        .await;
    futures::stream::iter(0..size.policies)
        .for_each_concurrent(IN_FLIGHT, |j| async move {
            ds.create(Kind::EgressPolicy, policy(j)).await.unwrap();
        })
        .await;
    futures::stream::iter(0..size.pods)
        .for_each_concurrent(IN_FLIGHT, |k| async move {
            ds.create(Kind::Pod, pod_object(&seeded_pod(size, k)))
                .await
                .unwrap();
        })
        .await;
}

/// Policy `j`: pods labelled `app=app{j}` in namespace `ns{j % 10}`.
fn policy(j: usize) -> serde_json::Value {
    json!({"apiVersion": API_VERSION, "kind": "EgressPolicy",
           "metadata": {"name": format!("p{j:04}"), "namespace": format!("ns{}", j % 10)},
           "spec": {"egressGatewayName": "egw", "egressIP": {"allocatorPolicy": "rr"},
                    "appliedTo": {"podSelector": {"matchLabels": {"app": format!("app{j}")}}},
                    "destSubnet": ["0.0.0.0/0"]}})
}

/// Seeded pod `k`, of policy `k % policies`, the `m`-th pod of its node.
pub fn seeded_pod(size: Size, k: usize) -> PodRecord {
    let j = k % size.policies;
    let node = size.pod_node(k);
    PodRecord {
        name: format!("pod{k:05}"),
        namespace: format!("ns{}", j % 10),
        labels: [("app".to_string(), format!("app{j}"))].into(),
        node: node_name(node),
        ips: vec![pod_ip(node, k / size.workers() + 2)],
    }
}

async fn seed_node(ds: &dyn Datastore, size: Size, i: usize) {
    let gw = i < size.gateway_nodes;
    let n = NodeRecord {
        name: node_name(i),
        labels: [("egress".to_string(), gw.to_string())].into(),
        addresses: vec![format!("172.20.{}.{}", i / 200, i % 200 + 1)],
        pod_cidrs: vec![pod_cidr(i)],
        ready: true,
    };
    ds.create(Kind::Node, node_object(&n)).await.unwrap();
    ds.create(
        Kind::EgressTunnel,
        json!({"apiVersion": API_VERSION, "kind": "EgressTunnel", "metadata": {"name": n.name}, "spec": {}}),
    )
    .await
    .unwrap();
    let key = ObjectKey::cluster(&n.name);
    let write = |manager: &str, field: &str, status: serde_json::Value| StatusPatch {
        manager: manager.into(),
        owned: vec![field.into()],
        status,
    };
    let tunnel = json!({"tunnel": {"ipv4": n.addresses[0], "mac": "02:00:00:00:00:01"}});
    ds.write_status(
        Kind::EgressTunnel,
        &key,
        &write("egress-agent", "tunnel", tunnel),
    )
    .await
    .unwrap();
    // The phase as a previous controller left it (agents never write it).
    let phase = json!({"phase": "Ready"});
    ds.write_status(
        Kind::EgressTunnel,
        &key,
        &write("egress-controller", "phase", phase),
    )
    .await
    .unwrap();
}

/// The key of seeded pod `k`.
pub fn pod_key(size: Size, k: usize) -> ObjectKey {
    let j = k % size.policies;
    ObjectKey::namespaced(format!("ns{}", j % 10), format!("pod{k:05}"))
}

/// Moves seeded pod `k` (its object `v`) to another policy of its
/// namespace (`j + 10` keeps `j % 10`): what the relabels write.
pub fn relabel(size: Size, k: usize, v: &mut serde_json::Value) {
    let j = k % size.policies;
    v["metadata"]["labels"]["app"] = json!(format!("app{}", (j + 10) % size.policies));
}
