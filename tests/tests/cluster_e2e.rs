//! The control plane end to end on the real kernel: a real etcd, the
//! controller, one agent per node, `egress apply` of the example gateway and
//! policy. A selected pod leaves with the EIP; a pod outside the policy
//! leaves with its own address; deleting the policy sends the selected pod
//! the normal way again; relabelling the other pod makes it follow.

use std::time::Duration;

use egress_tests::{
    cluster::{pod_source_seen, wait_until, Cluster, ClusterSpec},
    egress_bin,
    topology::eip,
};

#[test]
#[ignore = "needs root: namespaces, BPF, etcd"]
fn selected_pod_leaves_with_the_eip_and_follows_policy_changes() -> anyhow::Result<()> {
    let cluster = Cluster::start_default()?;

    let eip = eip(0).to_string();
    // The EIP is announced by exactly one gateway, and the worker has the policy.
    cluster.examples_up()?;

    // p11 (app=web) leaves with the EIP; p12 (app=other) with its own address.
    assert_eq!(
        pod_source_seen(&cluster, 0, 0)?,
        eip,
        "the selected pod must leave with the EIP"
    );
    let p12 = cluster.topo.nodes[0].pods[1].ip.to_string();
    assert_eq!(
        pod_source_seen(&cluster, 0, 1)?,
        p12,
        "a pod outside the policy keeps its address"
    );

    // Relabel p12 to app=web: it follows.
    cluster.egress(&[
        "pod", "add", "p12", "-n", "default", "-l", "app=web", "--node", "w1", "--ip", &p12,
    ])?;
    cluster.wait_pod_source(0, 1, &eip, "p12 leaves with the EIP")?;

    // Delete the policy: p11 leaves the normal way again.
    cluster.egress(&["delete", "EgressPolicy", "web", "-n", "default"])?;
    let p11 = cluster.topo.nodes[0].pods[0].ip.to_string();
    cluster.wait_pod_source(0, 0, &p11, "p11 leaves with its own address")?;
    Ok(())
}

/// A node that is worker and gateway at once: the only gateway candidate
/// is the worker itself, so the EIP lands on it and its selected pod's
/// traffic is translated and forwarded there without the tunnel; the
/// other pod keeps its own address.
#[test]
#[ignore = "needs root: namespaces, BPF, etcd"]
fn a_worker_that_is_its_own_gateway_translates_without_the_tunnel() -> anyhow::Result<()> {
    let egress = egress_bin()?;
    let spec = ClusterSpec {
        workers: 1,
        gateways: 0,
        workers_are_gateways: true,
        ..ClusterSpec::default()
    };
    let cluster = Cluster::start(&egress, spec)?;
    cluster.apply_examples()?;
    let eip = eip(0).to_string();
    wait_until("w1 announces the EIP", Duration::from_secs(30), || {
        Ok(cluster.announcers(&eip) == [0])
    })?;
    wait_until("w1 applies the policy", Duration::from_secs(30), || {
        Ok(cluster.agent_state(0)?["policies"].as_u64() == Some(1))
    })?;
    cluster.wait_pod_source(0, 0, &eip, "p11 leaves with the EIP")?;
    // The policy's target on w1 says "local gateway": no tunnel.
    let snap = egress_user::datapath::stats::datapath_snapshot(cluster.pin_dir(0))?;
    let flags = snap["policy_targets"][0]["flags"].as_u64().unwrap_or(0) as u32;
    assert_ne!(
        flags & egress_common::policy::TARGET_LOCAL_GATEWAY,
        0,
        "target {}",
        snap["policy_targets"]
    );
    let p12 = cluster.topo.nodes[0].pods[1].ip.to_string();
    assert_eq!(
        pod_source_seen(&cluster, 0, 1)?,
        p12,
        "not selected: its own address"
    );
    Ok(())
}
