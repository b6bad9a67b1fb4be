//! The agent and the controller from the chart's image, each run as the
//! chart renders its container: the same command and args, env, added and
//! dropped capabilities, user, read-only root filesystem, host mounts and
//! host network (`egress_tests::chart_pods` says what stands in for
//! Kubernetes). They run on the Kubernetes datastore against the in-memory
//! API server with the chart's RBAC: the chart's `--datastore=kubernetes`
//! args stay as rendered, only the service account token becomes a
//! kubeconfig.
//!
//! `RuntimeDefault` seccomp is containerd's rule for bpf() (allowed with
//! `CAP_BPF`) unless a test says otherwise; the last test runs the agent
//! under containers-common's (CRI-O's), which allows bpf() only with
//! `CAP_SYS_ADMIN`.
//!
//! `cargo xtask test` builds the image (`cargo xtask image --binary
//! target/debug/egress`) before these run.

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use egress_tests::{
    chart_pods::{image_exists, ChartPods, RuntimeDefault, Seccomp},
    cluster::{pod_source_seen, wait_until, Cluster, ClusterSpec, Launcher, UPSTREAM_IP},
    egress_bin,
    topology::eip,
    Netns,
};

/// The chart with the harness's short failover timers (so a failover takes
/// seconds), the underlay interface of the test nodes, and BGP off, so
/// that EIPs are announced by ARP/NDP (the way without BGP; the last test
/// turns BGP on).
fn chart() -> Result<ChartPods> {
    chart_with(&[])
}

fn chart_with(more: &[&str]) -> Result<ChartPods> {
    let mut sets: Vec<String> = [
        "feature.tunnelUpdatePeriod=500ms",
        "feature.tunnelMonitorPeriod=250ms",
        "feature.eipEvictionTimeout=3s",
        "controller.leaderElection.leaseDuration=3s",
        "controller.replicas=1",
        "agent.uplink=eth0",
        "bgp.enabled=false",
    ]
    .map(String::from)
    .to_vec();
    sets.extend(more.iter().map(|s| s.to_string()));
    let chart = ChartPods::render(&sets)?;
    ensure!(
        image_exists(&chart.image),
        "podman has no image {}: run `cargo xtask image` (or `cargo xtask image --binary target/debug/egress`)",
        chart.image
    );
    Ok(chart)
}

/// Capability numbers (linux/capability.h) of the names the chart uses.
fn cap_bit(name: &str) -> u32 {
    match name.trim_start_matches("CAP_") {
        "NET_BIND_SERVICE" => 10,
        "NET_ADMIN" => 12,
        "NET_RAW" => 13,
        "SYS_ADMIN" => 21,
        "PERFMON" => 38,
        "BPF" => 39,
        other => panic!("no bit known for capability {other}"),
    }
}

/// (uid, effective capabilities) of the `egress` process in `ns`.
fn egress_process_in(ns: &Netns) -> Result<(u32, u64)> {
    let pids = egress_tests::run(&["ip", "netns", "pids", ns.name()])?;
    for pid in pids.split_whitespace() {
        let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
            continue;
        };
        if !status.lines().any(|l| l == "Name:\tegress") {
            continue;
        }
        let field = |key: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .map(|v| v.trim().to_owned())
                .with_context(|| format!("{key} of pid {pid}"))
        };
        let uid: u32 = field("Uid:")?
            .split_whitespace()
            .next()
            .context("uid")?
            .parse()?;
        let caps = u64::from_str_radix(&field("CapEff:")?, 16)?;
        return Ok((uid, caps));
    }
    anyhow::bail!("no egress process in {}", ns.name())
}

#[test]
#[ignore = "needs root: namespaces, BPF, podman"]
fn the_charts_containers_carry_a_policy_and_fail_over() -> Result<()> {
    let chart = chart()?;
    // What the chart asks for, and so what the containers below run under.
    let agent = &chart.agent;
    assert!(agent.host_network && !agent.privileged && agent.read_only_root);
    assert_eq!(agent.caps_drop, ["ALL"]);
    assert_eq!(agent.run_as_user, Some(0));
    assert_eq!(agent.seccomp, Seccomp::RuntimeDefault);
    let controller = &chart.controller;
    assert!(!controller.host_network && controller.read_only_root);
    assert!(controller.caps_add.is_empty() && controller.no_new_privileges);
    assert_eq!(controller.run_as_user, Some(65532));
    let agent_caps: u64 = agent.caps_add.iter().map(|c| 1u64 << cap_bit(c)).sum();

    let spec = ClusterSpec {
        kubernetes: true,
        launcher: Launcher::Chart(Box::new(chart.clone())),
        ..ClusterSpec::default()
    };
    let mut cluster = Cluster::start(&egress_bin()?, spec)?;

    // Each agent runs as root with exactly the chart's capabilities; the
    // controller as 65532 with none.
    for node in &cluster.topo.nodes {
        let (uid, caps) = egress_process_in(&node.ns)?;
        assert_eq!(
            (uid, caps),
            (0, agent_caps),
            "agent of {}: uid and CapEff",
            node.name
        );
    }
    assert_eq!(egress_process_in(&cluster.topo.fabric)?, (65532, 0));

    // p11 (app=web) leaves with the EIP; p12 (app=other) with its own address.
    let (eip, owner) = cluster.examples_up_and_checked()?;

    // The owner's agent container is removed (as a node's agent crashing):
    // the controller moves the EIP to the other gateway, whose agent
    // announces it with a gratuitous ARP from its raw socket, and p11
    // leaves with it there.
    cluster.kill_owner_and_wait_failover(owner, &eip, "another gateway announces the EIP")?;
    let refused = cluster.api_server().refused_requests();
    assert!(
        refused.is_empty(),
        "refused by the chart's RBAC: {refused:#?}"
    );
    Ok(())
}

/// A one-worker, one-gateway cluster of the chart's containers whose
/// gateway's agent is stopped, so a test can start its own variants there.
fn cluster_with_a_free_gateway(chart: &ChartPods) -> Result<(Cluster, usize)> {
    let spec = ClusterSpec {
        workers: 1,
        gateways: 1,
        pods_per_worker: 1,
        kubernetes: true,
        launcher: Launcher::Chart(Box::new(chart.clone())),
        ..ClusterSpec::default()
    };
    let mut cluster = Cluster::start(&egress_bin()?, spec)?;
    let gateway = 1;
    cluster.kill_agent(gateway);
    Ok((cluster, gateway))
}

/// The agent checks its capabilities before it touches the kernel: started
/// with the chart's set minus any one capability, it exits naming the one
/// it lacks; with the chart's whole set it comes up. So a chart that grants
/// less than the agent needs fails here.
#[test]
#[ignore = "needs root: namespaces, BPF, podman"]
fn the_agent_names_each_capability_of_the_chart_it_lacks() -> Result<()> {
    let chart = chart()?;
    let (cluster, gateway) = cluster_with_a_free_gateway(&chart)?;
    ensure!(!chart.agent.caps_add.is_empty(), "the chart grants nothing");
    for cap in &chart.agent.caps_add {
        let mut fewer = chart.agent.clone();
        fewer.caps_add.retain(|c| c != cap);
        let mut agent = cluster.spawn_agent_container(gateway, &fewer)?;
        let line = agent
            .wait_for_line("lacks", Duration::from_secs(30))
            .with_context(|| format!("the agent without {cap} did not say what it lacks"))?;
        assert!(
            line.contains(&format!("CAP_{cap}")),
            "without {cap}: {line}"
        );
        let others: Vec<String> = chart
            .agent
            .caps_add
            .iter()
            .filter(|c| *c != cap)
            .map(|c| format!("CAP_{c}"))
            .collect();
        for other in &others {
            assert!(!line.contains(other.as_str()), "without {cap}: {line}");
        }
    }
    // The chart's whole set: the same node's agent comes up.
    let mut agent = cluster.spawn_agent_container(gateway, &chart.agent)?;
    agent.wait_for_line("ready node=", Duration::from_secs(30))?;
    Ok(())
}

/// Under a runtime whose default seccomp profile lets bpf() through only
/// with `CAP_SYS_ADMIN` (containers-common's: CRI-O, podman), the chart's
/// default set (PERFMON, no SYS_ADMIN) cannot work: the agent exits saying
/// so and naming the chart value that fixes it; with that value set
/// (SYS_ADMIN instead of PERFMON) the agent comes up under the same profile.
#[test]
#[ignore = "needs root: namespaces, BPF, podman"]
fn the_agent_names_the_value_for_a_runtime_that_gates_bpf_on_sys_admin() -> Result<()> {
    let chart = chart()?;
    let (cluster, gateway) = cluster_with_a_free_gateway(&chart)?;

    let mut default_set = chart.agent.clone();
    default_set.runtime_default = RuntimeDefault::SysAdminGatesBpf;
    assert!(!default_set.caps_add.iter().any(|c| c == "SYS_ADMIN"));
    let mut agent = cluster.spawn_agent_container(gateway, &default_set)?;
    let line = agent
        .wait_for_line("bpf() is refused", Duration::from_secs(30))
        .context("the agent did not say that bpf() is refused")?;
    assert!(line.contains("agent.sysAdminForBpf=true"), "{line}");
    drop(agent);

    let mut with_sys_admin = chart_with(&["agent.sysAdminForBpf=true"])?.agent;
    assert!(with_sys_admin.caps_add.iter().any(|c| c == "SYS_ADMIN"));
    assert!(!with_sys_admin.caps_add.iter().any(|c| c == "PERFMON"));
    with_sys_admin.runtime_default = RuntimeDefault::SysAdminGatesBpf;
    let mut agent = cluster.spawn_agent_container(gateway, &with_sys_admin)?;
    agent.wait_for_line("ready node=", Duration::from_secs(30))?;
    Ok(())
}

/// The chart's default, BGP: the reflector runs in the controller's
/// container (non-root, binding port 179 by its pod's sysctl), every agent
/// container is its client through the reflectors' Service name (answered
/// by the stand-in for the cluster DNS), and an FRR upstream router, the
/// chart's `bgp.upstreamPeers`, learns every pod CIDR and the EIP from the
/// owner's agent; when that agent's container goes, the EIP's route moves
/// to the other gateway and the pod leaves with the EIP again.
#[test]
#[ignore = "needs root: namespaces, BPF, podman, FRR"]
fn the_charts_reflector_serves_the_agent_containers_and_the_upstream() -> Result<()> {
    let chart = chart_with(&[
        "bgp.enabled=true",
        &format!("bgp.upstreamPeers[0].address={UPSTREAM_IP}"),
        "bgp.upstreamPeers[0].asn=64512",
    ])?;
    assert!(
        !chart.controller.sysctls.is_empty(),
        "no sysctl for port 179"
    );
    let spec = ClusterSpec {
        kubernetes: true,
        bgp: true,
        upstream_frr: true,
        reflector_in_controller: true,
        launcher: Launcher::Chart(Box::new(chart)),
        ..ClusterSpec::default()
    };
    let mut cluster = Cluster::start(&egress_bin()?, spec)?;
    cluster.apply_examples()?;
    let eip_prefix = format!("{}/32", eip(0));
    let owner = cluster.example_eip_owner()?;
    let routes_reach = |cluster: &Cluster, owner: usize| -> Result<bool> {
        let frr = &cluster.upstream.as_ref().context("no upstream")?.frr;
        let routes = frr.ipv4_routes()?;
        let nodes = &cluster.topo.nodes;
        Ok(nodes
            .iter()
            .all(|n| routes.get(&n.pod_cidr()) == Some(&n.ip.to_string()))
            && routes.get(&eip_prefix) == Some(&nodes[owner].ip.to_string()))
    };
    wait_until(
        "FRR has every pod CIDR and the EIP from its owner",
        Duration::from_secs(60),
        || routes_reach(&cluster, owner),
    )
    .with_context(|| {
        let frr = cluster.upstream.as_ref().map(|u| u.frr.ipv4_routes());
        let status = cluster.controller_http(0, "/bgp/status");
        format!("FRR: {frr:?}; the reflector: {status:?}")
    })?;
    let status: serde_json::Value =
        serde_json::from_str(&cluster.controller_http(0, "/bgp/status")?)?;
    let established = |p: &serde_json::Value| p["state"] == "Established";
    let peers = status["peers"].as_array().context("no peers")?;
    let clients = peers
        .iter()
        .filter(|p| p["client"] == true && established(p))
        .count();
    assert_eq!(clients, cluster.topo.nodes.len(), "{status}");
    assert!(
        peers.iter().any(|p| p["client"] == false && established(p)),
        "the upstream is not established: {status}"
    );
    assert_eq!(pod_source_seen(&cluster, 0, 0)?, eip(0).to_string());

    cluster.kill_agent(owner);
    let address = eip(0).to_string();
    wait_until(
        "another gateway announces the EIP",
        Duration::from_secs(30),
        || Ok(matches!(cluster.announcers(&address).as_slice(), [n] if *n != owner)),
    )?;
    let other = cluster.announcers(&address)[0];
    let other_ip = cluster.topo.nodes[other].ip.to_string();
    wait_until(
        "FRR's EIP route follows the new owner",
        Duration::from_secs(30),
        || {
            let frr = &cluster.upstream.as_ref().context("no upstream")?.frr;
            Ok(frr.ipv4_routes()?.get(&eip_prefix) == Some(&other_ip))
        },
    )?;
    cluster.wait_pod_source(0, 0, &eip(0).to_string(), "p11 leaves with the EIP again")?;
    Ok(())
}
