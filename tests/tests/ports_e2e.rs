//! Port blocks on a real cluster (agents, controller, etcd): a worker
//! capped at one block of 64 ports (`--max-ports-per-node 64`) opens
//! connections from its pod to one server port until none is free; the
//! ones past that are refused at once (ICMP administratively prohibited:
//! EHOSTUNREACH, not a SYN timeout), counted as `ports_exhausted`, and the
//! controller's metrics show the grant and the use for that EIP and node.

use std::time::Duration;

use anyhow::Result;
use egress_tests::{
    cluster::{traffic_report, wait_until, Cluster, ClusterSpec},
    egress_bin,
    topology::SERVER_IP,
    traffic_bin,
};

fn metric(text: &str, name: &str, has: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(name) && l.contains(has))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

#[test]
#[ignore = "needs root: namespaces, BPF, etcd"]
fn a_worker_out_of_ports_is_refused_at_once_and_the_grant_is_reported() -> Result<()> {
    let egress = egress_bin()?;
    let spec = ClusterSpec {
        controller_args: vec!["--max-ports-per-node".into(), "64".into()],
        ..Default::default()
    };
    let cluster = Cluster::start(&egress, spec)?;
    cluster.apply_example_policy()?;
    let traffic = traffic_bin()?.to_string_lossy().into_owned();
    let mut sink = cluster
        .topo
        .server
        .spawn(&[&traffic, "tcp-sink", "0.0.0.0:7100"])?;
    sink.wait_for_line("ready", Duration::from_secs(10))?;
    let pod = &cluster.topo.nodes[0].pods[0].ns;
    // The grant reaches the worker: a first connection gets through.
    wait_until(
        "the worker holds its block",
        Duration::from_secs(60),
        || {
            Ok(
                traffic_report(pod, &["tcp-open", &format!("{SERVER_IP}:7100"), "1"], 0.1)
                    .is_ok_and(|r| r["opened"] == 1),
            )
        },
    )?;
    let r = traffic_report(pod, &["tcp-open", &format!("{SERVER_IP}:7100"), "120"], 0.5)?;
    println!("tcp-open report: {r}");
    let opened = r["opened"].as_u64().unwrap_or(0);
    let refused = r["refused"].as_u64().unwrap_or(0);
    assert!((32..=64).contains(&opened), "one block of 64 ports: {r}");
    assert_eq!(opened + refused, 120, "{r}");
    assert!(
        r["errors"]["HostUnreachable"].as_u64() == Some(refused),
        "refused by ICMP, not timed out: {r}"
    );
    assert!(
        r["slowest_refusal_ms"].as_f64().unwrap_or(1e9) < 1000.0,
        "refusals are immediate: {r}"
    );
    let m = cluster.agent_http(0, "/metrics")?;
    let exhausted = metric(&m, "egress_drops_total{", "reason=\"ports_exhausted\"").unwrap_or(0.0);
    assert!(
        exhausted >= refused as f64,
        "counted: {exhausted} for {refused}"
    );
    // The controller shows the grant (one block) and, once the agent has
    // reported, the ports in use on that node for that EIP.
    wait_until("the use is reported", Duration::from_secs(30), || {
        let c = cluster.controller_http(0, "/metrics")?;
        Ok(metric(&c, "egress_ports_in_use{", "node=\"w1\"").is_some_and(|v| v >= 32.0))
    })?;
    let c = cluster.controller_http(0, "/metrics")?;
    assert_eq!(
        metric(&c, "egress_ports_granted{", "node=\"w1\""),
        Some(64.0),
        "{c}"
    );
    assert_eq!(
        metric(&c, "egress_port_blocks_granted{", "node=\"w1\""),
        Some(1.0)
    );
    sink.signal_term();
    Ok(())
}
