//! A datastore restart costs no process and loses no change (etcd,
//! controller, agents in namespaces). etcd is killed and, 7 s later,
//! started again on the same data: every client's connection and watches
//! break, and meanwhile every request is refused; one agent starts again
//! during the outage. The controller and every agent must
//! keep running (the controller used to exit when its list after a broken
//! watch failed), each agent lists again, and changes made after the
//! restart reach the maps and the statuses.

use std::time::Duration;

use anyhow::{Context, Result};
use egress_tests::{
    cluster::{examples_dir, wait_until, Cluster, ClusterSpec},
    egress_bin,
};
use serde_json::Value;

#[test]
#[ignore = "needs root: namespaces, BPF, etcd"]
fn a_datastore_restart_costs_no_process_and_loses_no_change() -> Result<()> {
    restart_costs_nothing(ClusterSpec::default())
}

/// The same with the Kubernetes API server down for 7 s: connections
/// refused, and its watch history gone when it is back (resuming watches
/// get 410 Gone and list again).
#[test]
#[ignore = "needs root: namespaces, BPF"]
fn an_api_server_restart_costs_no_process_and_loses_no_change() -> Result<()> {
    restart_costs_nothing(ClusterSpec {
        kubernetes: true,
        ..ClusterSpec::default()
    })
}

fn restart_costs_nothing(spec: ClusterSpec) -> Result<()> {
    let egress = egress_bin()?;
    let mut cluster = Cluster::start(&egress, spec)?;
    cluster.apply_example_policy()?;
    wait_until("the policy is placed", Duration::from_secs(30), || {
        placed(&cluster, "web")
    })?;
    let agents = cluster.topo.nodes.len();
    let before = cluster.agent_lists()?;

    // Down for longer than a client's connect timeout (5 s): requests fail
    // rather than wait for the restart. Meanwhile w2's agent starts again:
    // it cannot register until etcd is back, and must wait for it rather
    // than exit.
    cluster.stop_datastore();
    cluster.restart_agent_unready(1)?;
    std::thread::sleep(Duration::from_secs(7));
    cluster.start_datastore_again()?;
    cluster.agents[1]
        .as_mut()
        .context("w2's agent")?
        .wait_for_line("ready node=", Duration::from_secs(30))
        .context("w2's agent, started while the datastore was down, registers once it is back")?;

    // A pod added after the restart reaches w1's maps (its agent's watch
    // broke with the connection: it listed again and watches anew).
    cluster.add_pod("late", "app=web", "w1", "10.244.1.200")?;
    wait_until(
        "w1 translates the pod added after the restart",
        Duration::from_secs(30),
        || {
            Ok(cluster
                .policy_sources(0)?
                .contains(&"10.244.1.200/32".to_string()))
        },
    )?;
    // A policy created after the restart is placed: the controller leads
    // and reconciles again.
    let other = std::fs::read_to_string(examples_dir().join("policy.yaml"))?
        .replace("name: web", "name: other")
        .replace("app: web", "app: other");
    let file = std::env::temp_dir().join(egress_tests::unique_name("other-policy.yaml"));
    std::fs::write(&file, other)?;
    let applied = cluster.apply(&file);
    let _ = std::fs::remove_file(&file);
    applied?;
    wait_until("the new policy is placed", Duration::from_secs(30), || {
        placed(&cluster, "other")
    })?;

    for (i, c) in cluster.controllers.iter_mut().enumerate() {
        let c = c.as_mut().context("controller running")?;
        assert_eq!(c.exited(), None, "controller {i} exited");
    }
    for (i, a) in cluster.agents.iter_mut().enumerate() {
        let a = a.as_mut().context("agent running")?;
        assert_eq!(a.exited(), None, "agent {i} exited");
    }
    let after = cluster.agent_lists()?;
    assert!(
        (0..agents)
            .filter(|&i| i != 1)
            .all(|i| after[i] > before[i]),
        "every agent lists again after its watches broke: {before:?} -> {after:?}"
    );
    Ok(())
}

/// Whether policy `name` (namespace default) has its EIP in its status.
fn placed(cluster: &Cluster, name: &str) -> Result<bool> {
    let out = cluster.egress(&["get", "egp", name, "-n", "default", "-o", "json"])?;
    let v: Value = serde_json::from_str(&out).context("egress get egp -o json")?;
    Ok(v["status"]["eip"]["ipv4"]
        .as_str()
        .is_some_and(|a| !a.is_empty()))
}
