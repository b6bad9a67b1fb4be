//! `cargo xtask demo`: the project's main job, shown step by step.
//!
//! A local cluster in network namespaces with the project's own defaults: a
//! real etcd, the controller, the route reflector with an FRR upstream
//! router peering with it, two workers with pods, two gateway nodes and an
//! external server. It applies the example EgressGateway and EgressPolicy
//! (docs/examples), shows that the server sees the EIP, kills the active
//! gateway, and shows the traffic gap and that the TCP connection survived.
//! Everything it made is removed at the end, also on failure or Ctrl-C.

use std::{
    path::Path,
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use clap::Args;
use egress_tests::{
    cluster::{examples_dir, wait_until, Cluster, ClusterSpec, Timers},
    topology::{eip, SERVER_IP},
    Proc,
};

use crate::{build_ebpf, shell::step};

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Leave the cluster up and print how to look at it.
    #[arg(long)]
    pub keep: bool,
    /// Skip setup and builds; use the binaries already in target/<profile>.
    #[arg(long)]
    pub no_build: bool,
    /// Use target/debug binaries (what `cargo xtask test` builds) instead of release.
    #[arg(long)]
    pub debug: bool,
    /// Short mode for CI: sub-second failover timers instead of the defaults (5s/5s/15s).
    #[arg(long)]
    pub fast: bool,
    /// Stop the cluster a `--keep` run left up: its processes, namespaces,
    /// pin and temporary folders, nothing else.
    #[arg(long, conflicts_with_all = ["keep", "no_build", "fast"])]
    pub stop: bool,
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

fn check_interrupt() -> Result<()> {
    if INTERRUPTED.load(Ordering::SeqCst) {
        bail!("interrupted; cleaning up");
    }
    Ok(())
}

/// What the demo showed; its last line is this as JSON.
#[derive(Default, Debug)]
struct Summary {
    eip: String,
    eip_seen_by_server: bool,
    owner_before: String,
    owner_after: String,
    owner_after_ip: String,
    upstream_next_hop_before: String,
    upstream_next_hop_after: String,
    detection_ms: f64,
    udp_gap_ms: f64,
    udp_lost: u64,
    tcp_survived: bool,
    tcp_gap_ms: f64,
    leftover: Vec<String>,
}

pub fn run(root: &Path, args: DemoArgs) -> Result<()> {
    // Ctrl-C only sets a flag: the steps stop at the next check and every
    // namespace and process is removed by its destructor on the way out.
    // SAFETY: the handler only stores to an atomic.
    unsafe { libc::signal(libc::SIGINT, on_sigint as *const () as libc::sighandler_t) };
    if args.stop {
        return crate::demo_stop::stop(root);
    }
    if args.keep && crate::demo_stop::state_file(root).exists() {
        bail!("a kept demo is still up: stop it first with `cargo xtask demo --stop`");
    }
    let profile = if args.debug { "debug" } else { "release" };
    if !args.no_build {
        crate::setup::run(root)?;
        build_ebpf::build(root, true)?;
        step("build egress and the traffic tool");
        crate::shell::build_binaries(root, !args.debug)?;
    }
    let bin_dir = root.join("target").join(profile);
    let egress = bin_dir.join("egress");
    let traffic = bin_dir.join("egress-traffic");
    for b in [&egress, &traffic] {
        if !b.exists() {
            bail!(
                "{} is missing: run `cargo xtask demo` without --no-build",
                b.display()
            );
        }
    }
    // The harness finds the traffic tool through this variable.
    std::env::set_var("EGRESS_TRAFFIC_BIN", &traffic);
    // Each process logs to its own file, so the terminal shows the steps.
    let logs = root
        .join("target/demo")
        .join(format!("logs-{}", std::process::id()));
    std::fs::create_dir_all(&logs)?;
    std::env::set_var(egress_tests::LOG_DIR_VAR, &logs);
    println!(
        "logs of every agent, controller and the reflector: {}/<role>-<node>.log",
        logs.display()
    );

    let started = Instant::now();
    let mut summary = Summary::default();
    let prefix = format!("eg{}x", std::process::id());
    let result = run_cluster(root, &egress, &traffic, &args, &mut summary);
    if args.keep && result.is_ok() {
        print_kept_summary(&summary, started.elapsed());
        return Ok(());
    }
    // Everything is dropped by now: check that nothing is left behind.
    summary.leftover = leftovers(&prefix);
    print_summary(&summary, started.elapsed());
    if result.is_err() {
        print_log_tails(&logs);
    }
    result?;
    let ok = summary.eip_seen_by_server
        && summary.tcp_survived
        && summary.owner_after != summary.owner_before
        && summary.upstream_next_hop_after == summary.owner_after_ip
        && !summary.owner_after.is_empty()
        && summary.leftover.is_empty();
    if !ok {
        bail!("the demo's expectations failed (see the summary)");
    }
    Ok(())
}

fn run_cluster(
    root: &Path,
    egress: &Path,
    traffic: &Path,
    args: &DemoArgs,
    s: &mut Summary,
) -> Result<()> {
    let timers = if args.fast {
        Timers {
            update: "200ms".into(),
            monitor: "200ms".into(),
            eviction: "1s".into(),
            ..Timers::default()
        }
    } else {
        Timers::default()
    };
    step(&format!(
        "start the cluster: etcd, controller, reflector + FRR upstream, w1 w2 (pods), g1 g2 (gateways), server; timers {}/{}/{}",
        timers.update, timers.monitor, timers.eviction
    ));
    let spec = ClusterSpec {
        bgp: true,
        upstream_frr: true,
        timers,
        ..ClusterSpec::default()
    };
    let mut cluster = Cluster::start(egress, spec)?;
    check_interrupt()?;

    step("apply docs/examples/gateway.yaml and docs/examples/policy.yaml");
    let ex = examples_dir();
    print!("{}", cluster.apply(&ex.join("gateway.yaml"))?);
    print!("{}", cluster.apply(&ex.join("policy.yaml"))?);
    s.eip = eip(0).to_string();
    wait_until(
        "a gateway announces the EIP",
        Duration::from_secs(60),
        || Ok(cluster.announcers(&s.eip).len() == 1),
    )?;
    let owner = cluster.announcers(&s.eip)[0];
    s.owner_before = cluster.topo.nodes[owner].name.clone();
    println!("EIP {} is owned by {}", s.eip, s.owner_before);
    anyhow::ensure!(cluster.upstream.is_some(), "no upstream router");
    let eip_prefix = format!("{}/32", s.eip);
    wait_until("FRR learns the EIP", Duration::from_secs(30), || {
        Ok(upstream_routes(&cluster)?.contains_key(&eip_prefix))
    })?;
    s.upstream_next_hop_before = upstream_routes(&cluster)?
        .get(&eip_prefix)
        .cloned()
        .unwrap_or_default();
    println!(
        "FRR (upstream) routes {} via {}",
        eip_prefix, s.upstream_next_hop_before
    );
    // The traffic starts once the policy is in force on w1: a connection
    // opened before that leaves with the pod's own address, and is reset
    // when the policy takes it over.
    wait_until("p11 leaves with the EIP", Duration::from_secs(30), || {
        tcp_peer_is(&cluster, &s.eip)
    })?;
    check_interrupt()?;

    step("pod p11 (app=web) streams UDP and holds a TCP connection to the external server");
    let t = traffic.to_string_lossy().into_owned();
    let udp_sink = cluster
        .topo
        .server
        .spawn_ready(&[&t, "udp-sink", "0.0.0.0:6000"])?;
    let tcp_sink = cluster
        .topo
        .server
        .spawn_ready(&[&t, "tcp-sink", "0.0.0.0:5000"])?;
    let pod = &cluster.topo.nodes[0].pods[0].ns;
    let mut udp_source = pod.spawn(&[&t, "udp-source", &format!("{SERVER_IP}:6000"), "10"])?;
    udp_source.wait_for_line("ready", Duration::from_secs(10))?;
    let mut tcp_source = pod.spawn(&[&t, "tcp-source", &format!("{SERVER_IP}:5000"), "20"])?;
    tcp_source.wait_for_line("ready", Duration::from_secs(10))?;
    std::thread::sleep(Duration::from_secs(2));
    check_interrupt()?;

    if args.keep {
        s.eip_seen_by_server = tcp_peer_is(&cluster, &s.eip)?;
        let prefix = format!("eg{}x", std::process::id());
        crate::demo_stop::record(
            root,
            &crate::demo_stop::Kept {
                pid: std::process::id(),
                namespaces: leftovers(&prefix)
                    .iter()
                    .filter_map(|p| p.strip_prefix("/run/netns/").map(str::to_owned))
                    .collect(),
            },
        )?;
        print_keep(&cluster, egress);
        // Leave every namespace and process running.
        std::mem::forget(udp_sink);
        std::mem::forget(tcp_sink);
        std::mem::forget(udp_source);
        std::mem::forget(tcp_source);
        std::mem::forget(cluster);
        return Ok(());
    }

    step(&format!(
        "kill the active gateway {}: its agent dies and its link is cut",
        s.owner_before
    ));
    let fault = Instant::now();
    cluster.kill_agent(owner);
    cluster.topo.cut_node(owner)?;
    wait_until(
        "another gateway announces the EIP",
        Duration::from_secs(90),
        || Ok(cluster.announcers(&s.eip).iter().any(|&i| i != owner)),
    )?;
    s.detection_ms = fault.elapsed().as_secs_f64() * 1000.0;
    let new_owner = *cluster
        .announcers(&s.eip)
        .iter()
        .find(|&&i| i != owner)
        .unwrap();
    s.owner_after = cluster.topo.nodes[new_owner].name.clone();
    println!(
        "{} took the EIP over after {:.0} ms",
        s.owner_after, s.detection_ms
    );
    let new_ip = cluster.topo.nodes[new_owner].ip.to_string();
    s.owner_after_ip = new_ip.clone();
    let _ = wait_until("FRR follows the move", Duration::from_secs(30), || {
        Ok(upstream_routes(&cluster)?.get(&eip_prefix) == Some(&new_ip))
    });
    s.upstream_next_hop_after = upstream_routes(&cluster)?
        .get(&eip_prefix)
        .cloned()
        .unwrap_or_default();
    println!(
        "FRR (upstream) now routes {} via {}",
        eip_prefix, s.upstream_next_hop_after
    );
    // Let traffic run on the new gateway for a while.
    std::thread::sleep(Duration::from_secs(3));
    check_interrupt()?;

    step("stop the traffic and read what the server saw");
    let tcp = report(tcp_source)?;
    let udp = report(udp_source)?;
    let udp_seen = report(udp_sink)?;
    let tcp_seen = report(tcp_sink)?;
    s.eip_seen_by_server = udp_seen["sources"]
        .as_array()
        .is_some_and(|a| a.iter().any(|x| x == s.eip.as_str()))
        && tcp_seen["connections"][0]["peer"] == s.eip.as_str();
    s.udp_gap_ms = udp_seen["max_gap_ms"].as_f64().unwrap_or(f64::NAN);
    s.udp_lost = udp_seen["lost"].as_u64().unwrap_or(0);
    s.tcp_survived =
        tcp["survived"] == true && tcp_seen["connections"].as_array().map(|c| c.len()) == Some(1);
    s.tcp_gap_ms = tcp_seen["connections"][0]["max_gap_ms"]
        .as_f64()
        .unwrap_or(f64::NAN);
    println!("udp source: {udp}");
    println!("udp sink:   {udp_seen}");
    println!("tcp source: {tcp}");
    println!("tcp sink:   {tcp_seen}");
    drop(cluster);
    Ok(())
}

/// The last lines of every process's log, for a failed run (CI shows
/// nothing else of them).
fn print_log_tails(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let text = std::fs::read_to_string(e.path()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        println!("\n--- last lines of {}", e.path().display());
        for l in &lines[lines.len().saturating_sub(20)..] {
            println!("{l}");
        }
    }
}

fn upstream_routes(cluster: &Cluster) -> Result<std::collections::BTreeMap<String, String>> {
    cluster
        .upstream
        .as_ref()
        .context("no upstream router")?
        .frr
        .ipv4_routes()
}

fn report(mut p: Proc) -> Result<serde_json::Value> {
    p.signal_term();
    let line = p.wait_for_line("\"role\"", Duration::from_secs(40))?;
    Ok(serde_json::from_str(&line)?)
}

/// Namespaces and pin folders of this process still present.
fn leftovers(prefix: &str) -> Vec<String> {
    let mut left = Vec::new();
    for dir in ["/run/netns", "/sys/fs/bpf"] {
        if let Ok(entries) = std::fs::read_dir(dir) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.starts_with(prefix) {
                    left.push(format!("{dir}/{name}"));
                }
            }
        }
    }
    left
}

/// Whether a short TCP connection from p11 reaches the server as `eip`.
fn tcp_peer_is(cluster: &Cluster, eip: &str) -> Result<bool> {
    let pod = &cluster.topo.nodes[0].pods[0].ns;
    Ok(egress_tests::cluster::tcp_peer_seen(cluster, pod, 5001)?.0 == eip)
}

/// Commands to look at the kept cluster, each one runnable as printed from
/// the host's shell: `nsenter --net` enters a namespace and keeps the
/// host's /sys/fs/bpf (`ip netns exec` remounts /sys and hides the pins).
fn print_keep(cluster: &Cluster, egress: &Path) {
    let e = egress.display();
    let enter = |ns: &egress_tests::Netns| format!("nsenter --net={}", ns.path().display());
    let w1 = &cluster.topo.nodes[0].ns;
    let fab = &cluster.topo.fabric;
    println!("\n--keep: the cluster stays up. Look at it with:");
    // In w1's namespace so that inspect finds the agent's /state (names).
    println!(
        "  {} {e} inspect --pin-dir {}   # w1's maps",
        enter(w1),
        cluster.pin_dir(0).display()
    );
    println!(
        "  {} curl -s http://127.0.0.1:9465/state   # w1's agent",
        enter(w1)
    );
    println!(
        "  {} {e} bgp status --admin-addr 127.0.0.1:9464   # the reflector",
        enter(fab)
    );
    println!(
        "  {} {e} get EgressGateway --etcd-endpoints {}",
        enter(fab),
        cluster.etcd().endpoint()
    );
    if let Some(u) = &cluster.upstream {
        println!(
            "  {}   # FRR upstream",
            u.frr.vtysh_command_line("show bgp ipv4 unicast")
        );
    }
    println!("Stop it (its processes, namespaces, pin and temp folders only) with:");
    println!("  cargo xtask demo --stop");
}

/// `--keep` skips the failover: say what was done, and only that.
fn print_kept_summary(s: &Summary, elapsed: Duration) {
    println!("\n==> summary (--keep: the failover was not run)");
    for (k, v) in [
        ("EIP", s.eip.clone()),
        ("owned by", s.owner_before.clone()),
        (
            "upstream (FRR) next hop",
            s.upstream_next_hop_before.clone(),
        ),
        ("server saw the EIP as source", yes(s.eip_seen_by_server)),
        ("elapsed", format!("{:.1} s", elapsed.as_secs_f64())),
    ] {
        println!("{k:<42} {v}");
    }
}

fn print_summary(s: &Summary, elapsed: Duration) {
    println!("\n==> summary");
    let rows: Vec<(&str, String)> = vec![
        ("EIP", s.eip.clone()),
        ("server saw the EIP as source", yes(s.eip_seen_by_server)),
        (
            "gateway before -> after",
            format!("{} -> {}", s.owner_before, s.owner_after),
        ),
        (
            "upstream (FRR) next hop before -> after",
            format!(
                "{} -> {}",
                s.upstream_next_hop_before, s.upstream_next_hop_after
            ),
        ),
        (
            "failover detected after",
            format!("{:.0} ms", s.detection_ms),
        ),
        (
            "largest UDP gap at the server",
            format!("{:.0} ms ({} datagrams lost)", s.udp_gap_ms, s.udp_lost),
        ),
        ("TCP connection survived", yes(s.tcp_survived)),
        (
            "largest TCP gap at the server",
            format!("{:.0} ms", s.tcp_gap_ms),
        ),
        (
            "cleanup left nothing behind",
            if s.leftover.is_empty() {
                "yes".into()
            } else {
                format!("NO: {:?}", s.leftover)
            },
        ),
        ("elapsed", format!("{:.1} s", elapsed.as_secs_f64())),
    ];
    for (k, v) in &rows {
        println!("{k:<42} {v}");
    }
    println!(
        "{}",
        serde_json::json!({
            "demo": "gateway-failover", "eip": s.eip, "eip_seen": s.eip_seen_by_server,
            "owner_before": s.owner_before, "owner_after": s.owner_after,
            "detection_ms": s.detection_ms, "udp_gap_ms": s.udp_gap_ms, "udp_lost": s.udp_lost,
            "tcp_survived": s.tcp_survived, "tcp_gap_ms": s.tcp_gap_ms, "clean": s.leftover.is_empty(),
        })
    );
}

fn yes(b: bool) -> String {
    if b { "yes" } else { "NO" }.into()
}
