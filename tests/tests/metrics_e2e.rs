//! The agent's /metrics during real traffic: the per-policy counters grow by
//! (at least) what the pod sent, and the EIP's NAT use is visible.

use std::time::Duration;

use egress_tests::{
    cluster::{traffic_report, wait_until, Cluster},
    topology::SERVER_IP,
    traffic_bin,
};

/// Value of the sample `name{labels...}` (labels in any order, never
/// empty here), 0 if absent.
fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    egress_tests::metric_sample(text, name, labels).unwrap_or(0.0)
}

/// The value of the unlabelled sample `name`, or NaN.
fn plain(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN)
}

#[test]
#[ignore = "needs root: namespaces, BPF, etcd"]
fn per_policy_counters_grow_by_the_bytes_sent() -> anyhow::Result<()> {
    let cluster = Cluster::start_default()?;
    cluster.apply_example_policy()?;
    let policy = [
        ("policy", "EgressPolicy/default/web"),
        ("direction", "egress"),
    ];
    let traffic = traffic_bin()?;
    let t = traffic.to_string_lossy().into_owned();
    let mut sink = cluster
        .topo
        .server
        .spawn_ready(&[&t, "udp-sink", "0.0.0.0:6000"])?;
    // A policy is in the maps before its EIP and gateway are: until then it
    // fails closed (drops `no_gateway`). Short bursts until one is counted
    // by the policy with no such drop.
    let no_gateway = [("reason", "no_gateway")];
    wait_until(
        "w1 forwards the policy's traffic",
        Duration::from_secs(30),
        || {
            let m0 = cluster.agent_http(0, "/metrics")?;
            traffic_report(
                &cluster.topo.nodes[0].pods[0].ns,
                &["udp-source", &format!("{SERVER_IP}:6000"), "10"],
                0.05,
            )?;
            let m1 = cluster.agent_http(0, "/metrics")?;
            Ok(sample(&m1, "egress_drops_total", &no_gateway)
                == sample(&m0, "egress_drops_total", &no_gateway)
                && sample(&m1, "egress_policy_packets_total", &policy)
                    > sample(&m0, "egress_policy_packets_total", &policy))
        },
    )?;
    let before = cluster.agent_http(0, "/metrics")?;
    let bytes0 = sample(&before, "egress_policy_bytes_total", &policy);
    let packets0 = sample(&before, "egress_policy_packets_total", &policy);

    let sent = traffic_report(
        &cluster.topo.nodes[0].pods[0].ns,
        &["udp-source", &format!("{SERVER_IP}:6000"), "2"],
        0.5,
    )?;
    let sent = sent["sent"].as_u64().unwrap();
    assert!(sent > 50, "the source sent too little to measure: {sent}");

    // The counters are read until they cover what was sent (a datagram can
    // still be in flight when the source exits), not once.
    let mut after = String::new();
    let mut bytes = 0.0;
    let mut packets = 0.0;
    let counted = wait_until(
        "the counters cover the datagrams sent",
        Duration::from_secs(5),
        || {
            after = cluster.agent_http(0, "/metrics")?;
            bytes = sample(&after, "egress_policy_bytes_total", &policy) - bytes0;
            packets = sample(&after, "egress_policy_packets_total", &policy) - packets0;
            Ok(packets >= sent as f64)
        },
    );
    // Each datagram is 64 bytes of payload + 8 UDP + 20 IPv4 at least.
    assert!(
        counted.is_ok(),
        "{packets} packets counted for {sent} sent:\n{after}"
    );
    assert!(
        bytes >= (sent * 92) as f64,
        "{bytes} bytes counted for {sent} datagrams:\n{after}"
    );
    assert!(
        after.contains("egress_nat_entries{eip=\"10.10.0.200\"}"),
        "no NAT use for the EIP:\n{after}"
    );
    // The table's fill: the default capacity, the entries the flow made.
    assert_eq!(
        plain(&after, "egress_nat_table_capacity"),
        262_144.0,
        "{after}"
    );
    let entries = plain(&after, "egress_nat_table_entries");
    assert!(entries >= 1.0, "{after}");
    let fill = plain(&after, "egress_nat_table_fill_ratio");
    assert!((fill - entries / 262_144.0).abs() < 1e-9, "{after}");
    sink.signal_term();
    Ok(())
}
