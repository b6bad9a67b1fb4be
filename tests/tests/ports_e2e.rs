//! Port blocks on a real cluster (agents, controller, etcd): a worker
//! capped at one block of 64 ports (`--max-ports-per-node 64`) opens
//! connections from its pod to one server port until none is free; the
//! ones past that are refused at once (ICMP administratively prohibited:
//! EHOSTUNREACH, not a SYN timeout), counted as `ports_exhausted`, and the
//! controller's metrics show the grant and the use for that EIP and node.

use std::time::Duration;

use anyhow::Result;
use egress_tests::{
    cluster::{examples_dir, traffic_report, wait_until, Cluster, ClusterSpec},
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
    let mut sink = open_past_one_block(&cluster)?;
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

/// The example policy with `spec.maxPortsPerNode: 64`, in a folder removed
/// when dropped.
struct QuotaPolicy(std::path::PathBuf);

impl QuotaPolicy {
    fn write() -> Result<Self> {
        let dir = std::env::temp_dir().join(format!("egress-quota-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let example = std::fs::read_to_string(examples_dir().join("policy.yaml"))?;
        let with_quota = example.replace(
            "  egressGatewayName: default\n",
            "  egressGatewayName: default\n  maxPortsPerNode: 64\n",
        );
        anyhow::ensure!(with_quota != example, "the example policy changed shape");
        std::fs::write(dir.join("policy.yaml"), with_quota)?;
        Ok(Self(dir))
    }
}

impl Drop for QuotaPolicy {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A policy's own cap (`spec.maxPortsPerNode`, one block here; the node's
/// limit stays the default) holds its worker to one block however much it
/// uses: connections past it are refused at once, counted, and the
/// controller says which policy's quota was reached.
#[test]
#[ignore = "needs root: namespaces, BPF, etcd"]
fn a_policy_quota_refuses_at_once_and_names_the_policy() -> Result<()> {
    let cluster = Cluster::start_default()?;
    let policy = QuotaPolicy::write()?;
    cluster.apply_policy(&policy.0.join("policy.yaml"))?;
    let mut sink = open_past_one_block(&cluster)?;
    // Its use asks for more blocks than the quota allows: reported, with
    // the policy, and the grant stays one block.
    wait_until("the quota is reported", Duration::from_secs(30), || {
        let c = cluster.controller_http(0, "/metrics")?;
        Ok(metric(&c, "egress_port_quota_reached{", "policy=\"default/web\"") == Some(1.0))
    })?;
    let c = cluster.controller_http(0, "/metrics")?;
    let quota = metric(&c, "egress_port_quota_reached{", "policy=\"default/web\"");
    assert!(
        c.lines()
            .any(|l| l.starts_with("egress_port_quota_reached{") && l.contains("node=\"w1\"")),
        "the node is named: {c}"
    );
    assert_eq!(quota, Some(1.0));
    assert_eq!(
        metric(&c, "egress_port_blocks_granted{", "node=\"w1\""),
        Some(1.0),
        "{c}"
    );
    assert_eq!(
        metric(&c, "egress_port_blocks_exhausted{", "node=\"w1\""),
        Some(0.0),
        "the EIP has free blocks: the quota, not the pool, refuses: {c}"
    );
    sink.signal_term();
    Ok(())
}

/// w1's pod opens 120 connections to the server while its worker may hold
/// one block of 64 ports: between 32 and 64 open (the program's random port
/// probes miss as the block fills), the rest are refused at once (ICMP
/// administratively prohibited: EHOSTUNREACH, not a SYN timeout) and
/// counted as `ports_exhausted`. Returns the server's sink.
fn open_past_one_block(cluster: &Cluster) -> Result<egress_tests::Proc> {
    let traffic = traffic_bin()?.to_string_lossy().into_owned();
    let sink = cluster
        .topo
        .server
        .spawn_ready(&[&traffic, "tcp-sink", "0.0.0.0:7100"])?;
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
    Ok(sink)
}

/// One pod holds 30,000 concurrent TCP connections through one EIP to one
/// server address and port, all of which exchange data; its worker's grant
/// grows from one block by its reported use. Four client processes in the
/// pod and three SO_REUSEPORT echo servers (a process may hold at most
/// 20,000 open files here).
#[test]
#[ignore = "needs root: namespaces, BPF, etcd"]
fn one_pod_holds_thirty_thousand_connections_to_one_server_port() -> Result<()> {
    const CLIENTS: usize = 4;
    const PER_CLIENT: usize = 7_500;
    let cluster = Cluster::start_default()?;
    cluster.apply_example_policy()?;
    let traffic = traffic_bin()?.to_string_lossy().into_owned();
    let target = format!("{SERVER_IP}:7200");
    let mut servers = Vec::new();
    for _ in 0..3 {
        let mut s = cluster
            .topo
            .server
            .spawn(&[&traffic, "tcp-echo", "0.0.0.0:7200"])?;
        s.wait_for_line("ready", Duration::from_secs(10))?;
        servers.push(s);
    }
    let pod = &cluster.topo.nodes[0].pods[0].ns;
    // 30,000 source ports to one server port: more than Linux's default range.
    pod.exec(&["sysctl", "-w", "net.ipv4.ip_local_port_range=1024 65000"])?;
    wait_until(
        "the worker holds its first block",
        Duration::from_secs(60),
        || Ok(traffic_report(pod, &["tcp-open", &target, "1"], 0.1).is_ok_and(|r| r["opened"] == 1)),
    )?;
    let started = std::time::Instant::now();
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        let mut c = pod.spawn(&[
            &traffic,
            "tcp-open",
            &target,
            &PER_CLIENT.to_string(),
            "240",
        ])?;
        c.wait_for_line("ready", Duration::from_secs(10))?;
        clients.push(c);
    }
    for c in clients.iter_mut() {
        c.wait_for_line("opened", Duration::from_secs(300))?;
    }
    let open_s = started.elapsed().as_secs_f64();
    let (mut opened, mut echoed, mut retries) = (0, 0, 0);
    for mut c in clients {
        c.signal_term();
        let r: serde_json::Value =
            serde_json::from_str(&c.wait_for_line("\"role\"", Duration::from_secs(120))?)?;
        opened += r["opened"].as_u64().unwrap_or(0);
        echoed += r["echoed_again"].as_u64().unwrap_or(0);
        retries += r["retries"].as_u64().unwrap_or(0);
    }
    let c = cluster.controller_http(0, "/metrics")?;
    let granted = metric(&c, "egress_ports_granted{", "node=\"w1\"").unwrap_or(0.0);
    println!(
        "{{\"connections\": {opened}, \"echoed_again\": {echoed}, \"retries\": {retries}, \
         \"open_s\": {open_s:.1}, \"ports_granted_w1\": {granted}}}"
    );
    let total = (CLIENTS * PER_CLIENT) as u64;
    assert_eq!(opened, total, "every connection opened");
    assert_eq!(
        echoed, total,
        "every connection exchanged data at the end too"
    );
    for mut s in servers {
        s.signal_term();
    }
    Ok(())
}

/// A block whose worker no longer has a selected pod drains, and goes back
/// to the pool once its agent has seen it free of NAT entries for the
/// quarantine (2 s here, `--port-release-quarantine`): the real agent reads
/// the real NAT tables and reports, the controller takes the block back.
#[test]
#[ignore = "needs root: namespaces, BPF, etcd"]
fn a_block_no_pod_needs_drains_and_returns_after_the_quarantine() -> Result<()> {
    let egress = egress_bin()?;
    let spec = ClusterSpec {
        agent_args: vec!["--port-release-quarantine".into(), "2s".into()],
        ..Default::default()
    };
    let cluster = Cluster::start(&egress, spec)?;
    cluster.apply_example_policy()?;
    let g1 = cluster
        .topo
        .nodes
        .iter()
        .find(|n| n.name == "g1")
        .expect("a node g1");
    let ip = g1.pod_cidr().replace(".0/24", ".50");
    cluster.add_pod("drainer", "app=web", "g1", &ip)?;
    let blocks = |what: &str| -> Result<Option<f64>> {
        let c = cluster.controller_http(0, "/metrics")?;
        Ok(metric(
            &c,
            &format!("egress_port_blocks_{what}{{"),
            "node=\"g1\"",
        ))
    };
    wait_until("g1 is granted a block", Duration::from_secs(30), || {
        Ok(blocks("granted")? == Some(1.0))
    })?;
    cluster.egress(&["delete", "pod", "drainer", "-n", "default"])?;
    let deleted = std::time::Instant::now();
    // Draining first: still g1's, so replies to its flows would still
    // reach it; then released and gone from its grant.
    let mut saw_draining = false;
    wait_until("g1's block goes back", Duration::from_secs(30), || {
        saw_draining |= blocks("draining")? == Some(1.0);
        Ok(blocks("granted")?.unwrap_or(0.0) == 0.0)
    })?;
    assert!(saw_draining, "the block went back without draining first");
    assert!(
        deleted.elapsed() >= Duration::from_secs(2),
        "released within the 2 s quarantine: {:?}",
        deleted.elapsed()
    );
    // The other workers keep theirs.
    let c = cluster.controller_http(0, "/metrics")?;
    assert_eq!(
        metric(&c, "egress_port_blocks_granted{", "node=\"w1\""),
        Some(1.0),
        "{c}"
    );
    Ok(())
}
