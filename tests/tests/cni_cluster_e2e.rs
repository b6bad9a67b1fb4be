//! The agent on pods wired by the CNI reference plugins (`bridge`, `ptp`):
//! a real etcd, the controller and one agent per node, the example policy.
//! The agent finds the plugins' veths by itself (also those that appear
//! after it started), and a pod removed and created again in place, on a
//! new veth and bridge port with the same address, is served again.

use std::time::Duration;

use egress_tests::{
    cluster::{pod_source_seen, wait_until, Cluster, ClusterSpec},
    cni::Wiring,
    egress_bin,
    topology::eip,
};

fn pods_on_plugin_wiring_leave_with_the_eip(wiring: Wiring) -> anyhow::Result<()> {
    let egress = egress_bin()?;
    let spec = ClusterSpec {
        workers: 1,
        gateways: 1,
        pods_per_worker: 1,
        wiring,
        ..ClusterSpec::default()
    };
    let mut cluster = Cluster::start(&egress, spec)?;
    cluster.apply_examples()?;
    wait_until("w1 applies the policy", Duration::from_secs(30), || {
        Ok(cluster.agent_state(0)?["policies"].as_u64() == Some(1))
    })?;
    let eip = eip(0).to_string();
    assert_eq!(
        pod_source_seen(&cluster, 0, 0)?,
        eip,
        "p11 (wired before the agent started)"
    );

    // A pod the plugin wires while the agent runs.
    let late = cluster.topo.add_pod_wired(0, "p12", wiring)?;
    let ips = format!("{},{}", late.ip, late.ip6);
    cluster.add_pod("p12", "app=web", "w1", &ips)?;
    cluster.wait_pod_source(0, 1, &eip, "p12 leaves with the EIP")?;

    // p11 removed (CNI DEL) and created again with its address on a new veth.
    let old_veth = cluster.topo.nodes[0].pods[0].host_veth.clone();
    let new_veth = cluster.topo.recreate_pod(0, 0)?.host_veth.clone();
    assert_ne!(old_veth, new_veth, "the plugin made a new veth");
    cluster.wait_pod_source(0, 0, &eip, "the re-created p11 leaves with the EIP")?;
    Ok(())
}

#[test]
#[ignore = "needs root: namespaces, BPF, etcd, the CNI plugins"]
fn bridge_pods_leave_with_the_eip_also_when_wired_later_or_recreated() -> anyhow::Result<()> {
    pods_on_plugin_wiring_leave_with_the_eip(Wiring::Bridge)
}

#[test]
#[ignore = "needs root: namespaces, BPF, etcd, the CNI plugins"]
fn ptp_pods_leave_with_the_eip_also_when_wired_later_or_recreated() -> anyhow::Result<()> {
    pods_on_plugin_wiring_leave_with_the_eip(Wiring::Ptp)
}
