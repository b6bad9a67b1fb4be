//! `gateway-under-load`: nothing fails, the EIP's owner is only made busy,
//! and no failover may happen. Two loads in turn, each for `LOAD`:
//!
//! - `cpu`: one busy loop per CPU in the owner's namespace (on this
//!   machine the namespaces share the CPUs, so the owner's agent, which
//!   answers the probes, competes with them);
//! - `traffic`: iperf3 from the selected pod to the server through the
//!   EIP, four TCP streams as fast as they go, so the probes share the
//!   gateway's links and softirq time with a saturating flow.
//!
//! A false failover is a tunnel leaving `Ready` while its node is healthy
//! (the controller declared it down); the EIP must also stay with its
//! owner. Both are counted per load, from the load's start to one probe
//! detection bound after its end.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde_json::json;

use super::{
    ms, say,
    stage::{stage, Stage},
    tracker::{check_one_announcer_at_end, stop_and_check_traffic},
    Bins, Options, Outcome,
};
use crate::{topology::SERVER_IP, Proc};

/// How long each load runs.
const LOAD: Duration = Duration::from_secs(10);
const IPERF_PORT: u16 = 5299;

/// What one load did to the cluster.
struct LoadResult {
    false_failovers: usize,
    eip_moved: bool,
}

pub(super) fn gateway_under_load(bins: &Bins, opts: &Options) -> Result<Outcome> {
    let (mut st, mut out) = stage(bins, opts, 1, "gateway-under-load")?;
    std::thread::sleep(opts.settle);
    let grace = opts.probe_bound();
    let cpu = under(
        &st,
        &mut out,
        "cpu",
        grace,
        || cpu_hogs(&st),
        |procs| {
            drop(procs);
            Ok(json!(null))
        },
    )?;
    let traffic = under(&st, &mut out, "traffic", grace, || iperf(&st), iperf_result)?;
    let total = cpu.false_failovers + traffic.false_failovers;
    out.extra
        .insert("false_failovers_under_load".into(), json!(total));
    out.extra.insert(
        "eip_moved_under_load".into(),
        json!(cpu.eip_moved || traffic.eip_moved),
    );
    out.check(total == 0, format!("{total} false failovers under load"));
    stop_and_check_traffic(&mut out, &mut st, grace)?;
    check_one_announcer_at_end(&mut out, &st.tracker);
    st.finish(out)
}

/// Runs one load (`start` returns what to stop at the end) and counts what
/// it caused.
fn under(
    st: &Stage,
    out: &mut Outcome,
    label: &str,
    grace: Duration,
    start: impl FnOnce() -> Result<Vec<Proc>>,
    finish: impl FnOnce(Vec<Proc>) -> Result<serde_json::Value>,
) -> Result<LoadResult> {
    let owner = st.owner;
    let t0 = Instant::now();
    let cpu0 = cpu_times();
    let load = start().with_context(|| format!("starting the {label} load"))?;
    say(&format!("load {label}: started ({} processes)", load.len()));
    // The load's duration: a measurement window, not a wait for an event.
    std::thread::sleep(LOAD);
    let busy = busy_share(cpu0, cpu_times());
    let figure = finish(load).with_context(|| format!("ending the {label} load"))?;
    let ended = Instant::now();
    say(&format!(
        "load {label}: ended; CPUs busy {:.0} %, {figure}",
        busy.unwrap_or(f64::NAN) * 100.0
    ));
    // A load that did not load would count no false failover and prove
    // nothing.
    out.check(
        busy.is_some_and(|b| b > 0.5),
        format!("the {label} load left the CPUs mostly idle ({busy:?})"),
    );
    out.extra
        .insert(format!("load_{label}_cpu_busy"), json!(busy));
    out.extra.insert(format!("load_{label}_figure"), figure);
    // Consequences may follow the load by up to one detection time.
    std::thread::sleep(grace);
    let to = Instant::now();
    let downs = st.ds.left_ready_between(t0, to);
    for (at, node, phase) in &downs {
        say(&format!(
            "load {label}: {node}'s tunnel went {phase} at +{} ms",
            ms(*at - t0)
        ));
    }
    let other = st.tracker.first_other(owner, t0).filter(|(at, _)| *at < to);
    let silent = st.tracker.first_silent(owner, t0).filter(|at| *at < to);
    let eip_moved = other.is_some() || silent.is_some();
    out.extra
        .insert(format!("false_failovers_{label}"), json!(downs.len()));
    out.extra
        .insert(format!("load_{label}_ms"), json!(ms(ended - t0)));
    out.check(
        !eip_moved,
        format!("the EIP left its owner under the {label} load (another announcer {other:?}, owner silent {silent:?})"),
    );
    Ok(LoadResult {
        false_failovers: downs.len(),
        eip_moved,
    })
}

/// One busy loop per CPU, in the owner's namespace.
fn cpu_hogs(st: &Stage) -> Result<Vec<Proc>> {
    let ns = &st.cluster.topo.nodes[st.owner].ns;
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
    (0..cpus)
        .map(|_| ns.spawn(&["sh", "-c", "while :; do :; done"]))
        .collect()
}

/// (busy, total) jiffies of all CPUs, from /proc/stat.
fn cpu_times() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next()?.strip_prefix("cpu ")?;
    let v: Vec<u64> = line
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3)? + v.get(4)?;
    Some((total - idle, total))
}

/// The share of CPU time spent busy between two readings.
fn busy_share(a: Option<(u64, u64)>, b: Option<(u64, u64)>) -> Option<f64> {
    let ((b0, t0), (b1, t1)) = (a?, b?);
    (t1 > t0).then(|| (b1 - b0) as f64 / (t1 - t0) as f64)
}

/// The client's throughput, from its summary line (`[SUM] ... Gbits/sec
/// ... sender`), as `{"iperf3_gbps": x}`.
fn iperf_result(mut procs: Vec<Proc>) -> Result<serde_json::Value> {
    let line = procs[0].wait_for_line("[SUM]", Duration::from_secs(15))?;
    let words: Vec<&str> = line.split_whitespace().collect();
    let gbps = words.windows(2).find_map(|w| {
        let v: f64 = w[0].parse().ok()?;
        match w[1] {
            "Gbits/sec" => Some(v),
            "Mbits/sec" => Some(v / 1000.0),
            _ => None,
        }
    });
    let gbps = gbps.with_context(|| format!("no rate in iperf3's summary: {line}"))?;
    Ok(json!({ "iperf3_gbps": gbps }))
}

/// An iperf3 server on the external server and four saturating TCP
/// streams to it from the selected pod, through the EIP, for `LOAD`
/// (no interval reports: the first `[SUM]` line is the summary).
fn iperf(st: &Stage) -> Result<Vec<Proc>> {
    let port = IPERF_PORT.to_string();
    // Its own line once it listens (a "ready" printed before the exec
    // raced the client's connect).
    let mut server =
        st.cluster
            .topo
            .server
            .spawn(&["iperf3", "-s", "-1", "-p", &port, "--forceflush"])?;
    server.wait_for_line("Server listening", Duration::from_secs(10))?;
    let secs = LOAD.as_secs().to_string();
    let client = st.cluster.topo.nodes[0].pods[0].ns.spawn(&[
        "iperf3",
        "-c",
        &SERVER_IP.to_string(),
        "-p",
        &port,
        "-P",
        "4",
        "-t",
        &secs,
        "-i",
        "0",
    ])?;
    Ok(vec![client, server])
}
