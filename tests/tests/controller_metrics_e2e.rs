//! The controller's /metrics through a real failover (issue 7): a cluster
//! with the reflector inside the controller, datapath probes and short
//! timers. The owner of the EIP dies (agent SIGKILL, link cut, as in the
//! gateway-kill scenario); the failover counter grows by exactly one, the
//! dead node's probe goes down and its heartbeat age passes the eviction
//! timeout, and the BGP gauges follow the real sessions.

use std::time::Duration;

use egress_tests::{
    cluster::{wait_until, Cluster, ClusterSpec, Timers},
    egress_bin, metric_sample as sample,
    topology::eip,
};

/// Sum of every `egress_failovers_total` sample, and the reasons with a count.
fn failovers(text: &str) -> (f64, Vec<String>) {
    let mut sum = 0.0;
    let mut reasons = Vec::new();
    for l in text
        .lines()
        .filter(|l| l.starts_with("egress_failovers_total{"))
    {
        let v: f64 = l
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        sum += v;
        if v > 0.0 {
            reasons.push(l.to_owned());
        }
    }
    (sum, reasons)
}

#[test]
#[ignore = "needs root: namespaces, BPF, etcd"]
fn failover_shows_in_the_controllers_metrics() -> anyhow::Result<()> {
    let egress = egress_bin()?;
    let eviction = Duration::from_millis(1500);
    let timers = Timers {
        update: "250ms".into(),
        monitor: "250ms".into(),
        eviction: "1.5s".into(),
        lease: "2s".into(),
        probe: Some((100, 3)),
    };
    let mut cluster = Cluster::start(
        &egress,
        ClusterSpec {
            workers: 1,
            gateways: 2,
            pods_per_worker: 1,
            timers,
            bgp: true,
            reflector_in_controller: true,
            ..ClusterSpec::default()
        },
    )?;
    let nodes = cluster.topo.nodes.len();
    cluster.apply_examples()?;
    let eip = eip(0).to_string();
    let old = cluster.example_eip_owner()?;
    let old_name = cluster.topo.nodes[old].name.clone();
    let old_ip = cluster.topo.nodes[old].ip.to_string();
    let other = (0..nodes)
        .find(|&i| i != old && cluster.topo.nodes[i].name.starts_with('g'))
        .unwrap();
    let other_name = cluster.topo.nodes[other].name.clone();

    // Before the fault: this replica leads, both gateways' probes are up,
    // every node has an Established session with the embedded reflector
    // and announced its pod CIDRs to it.
    let mut text = String::new();
    let healthy = wait_until(
        "leader, probes up, every BGP session established",
        Duration::from_secs(30),
        || {
            text = cluster.controller_http(0, "/metrics")?;
            let up = |n: &str| sample(&text, "egress_probe_up", &[("node", n)]) == Some(1.0);
            Ok(sample(&text, "egress_controller_leader", &[]) == Some(1.0)
                && up(&old_name)
                && up(&other_name)
                && sample(&text, "egress_bgp_sessions", &[("state", "Established")])
                    == Some(nodes as f64)
                && cluster.topo.nodes.iter().all(|n| {
                    let peer = n.ip.to_string();
                    sample(&text, "egress_bgp_peer_up", &[("peer", &peer)]) == Some(1.0)
                        && sample(&text, "egress_bgp_prefixes_received", &[("peer", &peer)])
                            .is_some_and(|v| v >= 1.0)
                }))
        },
    );
    assert!(healthy.is_ok(), "{healthy:?}:\n{text}");
    // The gauge agrees with what `egress bgp status` reads from the same process.
    let status: serde_json::Value =
        serde_json::from_str(&cluster.controller_http(0, "/bgp/status")?)?;
    let established = status["peers"]
        .as_array()
        .map(|p| p.iter().filter(|p| p["state"] == "Established").count())
        .unwrap_or(0);
    assert_eq!(established, nodes, "{status}");
    let (before, _) = failovers(&text);
    assert!(
        text.contains("egress_failovers_total{reason=\"heartbeat_timeout\"}"),
        "{text}"
    );
    assert_eq!(cluster.controller_http(0, "/readyz")?, "ok\n");
    assert_eq!(cluster.controller_http(0, "/healthz")?, "ok\n");
    // An agent's own view: its heartbeat renewals and its session.
    let mut agent = String::new();
    let agent_ok = wait_until(
        "the owner's agent shows a fresh renewal and its session",
        Duration::from_secs(10),
        || {
            agent = cluster.agent_http(old, "/metrics")?;
            Ok(sample(&agent, "egress_heartbeat_renewal_age_seconds", &[])
                .is_some_and(|a| a < eviction.as_secs_f64())
                && sample(&agent, "egress_bgp_sessions", &[("state", "Established")]) == Some(1.0)
                && sample(&agent, "egress_bgp_peer_up", &[("peer", "10.10.0.254")]) == Some(1.0))
        },
    );
    assert!(agent_ok.is_ok(), "{agent_ok:?}:\n{agent}");

    // The fault.
    cluster.kill_agent(old);
    cluster.topo.cut_node(old)?;
    wait_until(
        "another gateway announces the EIP",
        Duration::from_secs(15),
        || Ok(cluster.announcers(&eip) == vec![other]),
    )?;
    let counted = wait_until(
        "the failover counter grows by one",
        Duration::from_secs(5),
        || {
            text = cluster.controller_http(0, "/metrics")?;
            Ok(failovers(&text).0 >= before + 1.0)
        },
    );
    assert!(counted.is_ok(), "{counted:?}:\n{text}");

    // The dead node: probe down, heartbeat older than the eviction timeout;
    // the live one: probe up, heartbeat fresh.
    let dead_seen = wait_until(
        "the dead node's probe is down and its heartbeat old",
        Duration::from_secs(10),
        || {
            text = cluster.controller_http(0, "/metrics")?;
            let age = |n: &str| sample(&text, "egress_heartbeat_age_seconds", &[("node", n)]);
            Ok(
                sample(&text, "egress_probe_up", &[("node", &old_name)]) == Some(0.0)
                    && sample(
                        &text,
                        "egress_probe_state",
                        &[("node", &old_name), ("state", "down")],
                    ) == Some(1.0)
                    && age(&old_name).is_some_and(|a| a > eviction.as_secs_f64())
                    && age(&other_name).is_some_and(|a| a < eviction.as_secs_f64())
                    && sample(&text, "egress_probe_up", &[("node", &other_name)]) == Some(1.0),
            )
        },
    );
    assert!(dead_seen.is_ok(), "{dead_seen:?}:\n{text}");
    // The dead node's tunnel also times out (a second phase change,
    // HeartbeatTimeout after the probe's Failed): still exactly one failover.
    wait_until(
        "the dead node's tunnel reaches HeartbeatTimeout",
        Duration::from_secs(10),
        || {
            let out = cluster.egress(&["get", "egt", &old_name, "-o", "json"])?;
            let v: serde_json::Value = serde_json::from_str(&out)?;
            Ok(v["status"]["phase"] == "HeartbeatTimeout")
        },
    )?;
    text = cluster.controller_http(0, "/metrics")?;
    let (after, reasons) = failovers(&text);
    assert_eq!(after, before + 1.0, "{reasons:?}\n{text}");
    assert!(
        reasons
            .iter()
            .any(|r| r.contains("reason=\"probe_failed\"")
                || r.contains("reason=\"heartbeat_timeout\"")),
        "{reasons:?}"
    );

    // The reflector's session with the dead node ends within its hold time
    // (9 s): the gauges follow.
    let dropped = wait_until(
        "the dead node's BGP session ends",
        Duration::from_secs(20),
        || {
            text = cluster.controller_http(0, "/metrics")?;
            Ok(
                sample(&text, "egress_bgp_peer_up", &[("peer", &old_ip)]) == Some(0.0)
                    && sample(&text, "egress_bgp_sessions", &[("state", "Established")])
                        == Some((nodes - 1) as f64),
            )
        },
    );
    assert!(dropped.is_ok(), "{dropped:?}:\n{text}");
    println!("controller /metrics after the failover:\n{text}");
    Ok(())
}
