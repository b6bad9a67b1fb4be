//! The control plane end to end on the real kernel: a real etcd, the
//! controller, one agent per node, `egress apply` of the example gateway and
//! policy. A selected pod leaves with the EIP; a pod outside the policy
//! leaves with its own address; deleting the policy sends the selected pod
//! the normal way again; relabelling the other pod makes it follow.

use std::time::Duration;

use egress_tests::{
    cluster::{examples_dir, wait_until, Cluster, ClusterSpec},
    egress_bin,
    topology::{eip, SERVER_IP},
    traffic_bin, Proc,
};

/// Which source addresses the server saw for one short TCP connection from `pod`.
fn source_seen(cluster: &Cluster, worker: usize, pod: usize) -> anyhow::Result<String> {
    let traffic = traffic_bin()?;
    let traffic = traffic.to_string_lossy().into_owned();
    let mut sink: Proc = cluster
        .topo
        .server
        .spawn(&[&traffic, "tcp-sink", "0.0.0.0:5000"])?;
    sink.wait_for_line("ready", Duration::from_secs(10))?;
    let pod_ns = &cluster.topo.nodes[worker].pods[pod].ns;
    let src = egress_tests::cluster::traffic_report(
        pod_ns,
        &["tcp-source", &format!("{SERVER_IP}:5000"), "5"],
        0.3,
    )?;
    anyhow::ensure!(
        src["survived"] == true && src["echoed"].as_u64() > Some(0),
        "no echo: {src}"
    );
    sink.signal_term();
    let report: serde_json::Value =
        serde_json::from_str(&sink.wait_for_line("\"role\"", Duration::from_secs(10))?)?;
    Ok(report["connections"][0]["peer"]
        .as_str()
        .unwrap_or("")
        .to_owned())
}

#[test]
#[ignore = "needs root: namespaces, BPF, etcd"]
fn selected_pod_leaves_with_the_eip_and_follows_policy_changes() -> anyhow::Result<()> {
    let egress = egress_bin()?;
    let cluster = Cluster::start(&egress, ClusterSpec::default())?;
    let ex = examples_dir();
    cluster.apply(&ex.join("gateway.yaml"))?;
    cluster.apply(&ex.join("policy.yaml"))?;

    let eip = eip(0).to_string();
    // The EIP is announced by exactly one gateway, and the worker has the policy.
    wait_until(
        "a gateway announces the EIP",
        Duration::from_secs(30),
        || Ok(cluster.announcers(&eip).len() == 1),
    )?;
    let owner = cluster.announcers(&eip)[0];
    assert!(
        cluster.topo.nodes[owner].name.starts_with('g'),
        "a worker announces the EIP"
    );
    wait_until("w1 applies the policy", Duration::from_secs(30), || {
        Ok(cluster.agent_state(0)?["policies"].as_u64() == Some(1))
    })?;

    // p11 (app=web) leaves with the EIP; p12 (app=other) with its own address.
    assert_eq!(
        source_seen(&cluster, 0, 0)?,
        eip,
        "the selected pod must leave with the EIP"
    );
    let p12 = cluster.topo.nodes[0].pods[1].ip.to_string();
    assert_eq!(
        source_seen(&cluster, 0, 1)?,
        p12,
        "a pod outside the policy keeps its address"
    );

    // Relabel p12 to app=web: it follows.
    cluster.egress(&[
        "pod", "add", "p12", "-n", "default", "-l", "app=web", "--node", "w1", "--ip", &p12,
    ])?;
    wait_until("p12 leaves with the EIP", Duration::from_secs(30), || {
        Ok(source_seen(&cluster, 0, 1)? == eip)
    })?;

    // Delete the policy: p11 leaves the normal way again.
    cluster.egress(&["delete", "EgressPolicy", "web", "-n", "default"])?;
    let p11 = cluster.topo.nodes[0].pods[0].ip.to_string();
    wait_until(
        "p11 leaves with its own address",
        Duration::from_secs(30),
        || Ok(source_seen(&cluster, 0, 0)? == p11),
    )?;
    Ok(())
}
