//! What an operator reads on a healthy cluster is true: workers (which
//! never heartbeat) do not call themselves fenced, `egress get egt` shows
//! each gateway's last heartbeat as it is renewed, and `egress get egw`
//! shows both families; `egress inspect` names the policies.

use std::time::Duration;

use egress_tests::{
    cluster::{wait_until, Cluster, ClusterSpec},
    egress_bin,
};

/// The HEARTBEAT cell of node `name`'s row in `egress get egt`.
fn heartbeat_cell(table: &str, name: &str) -> Option<String> {
    let head: Vec<&str> = table.lines().next()?.split_whitespace().collect();
    let col = head.iter().position(|h| *h == "HEARTBEAT")?;
    table
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|cells| cells.first() == Some(&name))
        .and_then(|cells| cells.get(col).map(|c| (*c).to_owned()))
}

#[test]
#[ignore = "needs root: namespaces, BPF, etcd"]
fn a_healthy_cluster_reads_healthy() -> anyhow::Result<()> {
    let egress = egress_bin()?;
    let cluster = Cluster::start(&egress, ClusterSpec::default())?;
    cluster.apply_examples()?;
    cluster.example_eip_owner()?;

    // w1 is a worker, g1 a gateway candidate; neither is fenced.
    for (i, role) in [(0, "worker"), (2, "gateway")] {
        wait_until("the agent reconciled", Duration::from_secs(30), || {
            Ok(cluster.agent_state(i)?["reconciles"].as_u64() > Some(0))
        })?;
        let state = cluster.agent_state(i)?;
        assert_eq!(
            state["fenced"], false,
            "{role} reports itself fenced: {state}"
        );
        let metrics = cluster.agent_http(i, "/metrics")?;
        assert!(
            metrics.lines().any(|l| l == "egress_fenced 0"),
            "{role}: egress_fenced is not 0:\n{metrics}"
        );
    }

    // The gateway's heartbeat cell moves with its renewals; the worker has none.
    let first = heartbeat_cell(&cluster.egress(&["get", "egt"])?, "g1");
    assert!(
        first.as_deref().is_some_and(|c| c.contains('T')),
        "{first:?}"
    );
    wait_until("g1's heartbeat is renewed", Duration::from_secs(20), || {
        Ok(heartbeat_cell(&cluster.egress(&["get", "egt"])?, "g1") != first)
    })?;
    let table = cluster.egress(&["get", "egt"])?;
    assert_eq!(
        heartbeat_cell(&table, "w1").as_deref(),
        Some("-"),
        "{table}"
    );

    // `egress inspect` on w1 names the policy its maps hold by id.
    let inspect = cluster.topo.nodes[0].ns.exec(&[
        egress.to_str().unwrap(),
        "inspect",
        "--pin-dir",
        cluster.pin_dir(0).to_str().unwrap(),
    ])?;
    assert!(inspect.contains("EgressPolicy/default/web"), "{inspect}");
    // ... and shows its destination table.
    assert!(inspect.contains("POLICY DESTINATIONS"), "{inspect}");
    assert!(inspect.contains("198.51.100.0/24"), "{inspect}");

    let egw = cluster.egress(&["get", "egw"])?;
    for col in ["DEFAULTV4", "V4FREE", "DEFAULTV6", "V6FREE", "V6TOTAL"] {
        assert!(
            egw.lines().next().unwrap_or_default().contains(col),
            "{col}:\n{egw}"
        );
    }
    Ok(())
}
