//! `cargo xtask bench bgp`, the cluster shape: one reflector and N clients
//! (the harness's own light speakers, [`egress_tests::bgp_fleet`], all in
//! one namespace and one thread), each announcing one pod CIDR /24 and,
//! for a tenth of them, three EIP /32s, as a cluster's agents do. Measured
//! per reflector and size:
//! - converge: from the clients' start (the reflector already listening)
//!   until every client holds every other client's routes; the reflector's
//!   peak RSS and CPU seconds (from its start) at that point;
//! - churn: a tenth of the clients flap at once (Cease, reconnect, announce
//!   again with a new MED); until every client holds every route at its
//!   new MED again.
//!
//! And for ours alone, restart: with graceful restart on both sides the
//! reflector is killed (SIGKILL) and started again (restarting): the time
//! until every client has End-of-RIB from it, and the routes any client
//! lost meanwhile (withdrawn, or stale and not sent again), which must be 0.
//!
//! Every reflector is configured with one neighbour per client, as an
//! operator generating its configuration from the node list would (Calico
//! does so for BIRD); no dynamic neighbours, so all four do the same work.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use egress_tests::bgp_fleet::{cluster_clients, Event, Fleet, FleetConfig};
use egress_tests::{Netns, Proc};
use serde_json::{json, Map, Value};

use crate::bgp_seat::{cpu_seconds, peak_rss_mb, start_reflector, Dir, Reflector, Seat, ASN};

const REFLECTOR_IP: &str = "10.99.0.1";
/// The link between the two namespaces; the clients (10.99.1.0 and up)
/// and the reflector's own address are routed over it, so each side holds
/// one neighbour entry (the kernel's ARP table holds 1,024 entries for all
/// namespaces together, and 1,000 clients on the reflector's link made it
/// drop entries and stall sessions).
const RR_LINK: &str = "10.98.255.1";
const CL_LINK: &str = "10.98.255.2";
/// EIP /32s announced by every tenth client.
const EIPS: usize = 3;
/// The graceful restart time the restart scenario offers both ways.
const RESTART_TIME: u16 = 120;

pub struct ClusterArgs {
    pub sizes: Vec<usize>,
    /// Per phase (converge, churn, restart): past it, the figure is null.
    pub timeout: Duration,
    pub reflectors: Vec<Reflector>,
}

/// What one reflector did at one size; None: did not finish in time.
#[derive(Default)]
struct Figures {
    converge_s: Option<f64>,
    mb: Option<f64>,
    cpu_s: Option<f64>,
    churn_s: Option<f64>,
}

/// Two namespaces joined by a veth: the reflector's and the clients'.
struct Net {
    rr: Netns,
    clients: Netns,
}

fn net() -> Result<Net> {
    let rr = Netns::new("bcrr")?;
    let clients = Netns::new("bccl")?;
    egress_tests::bgp_fleet::routed_link(&rr, &clients, REFLECTOR_IP, (RR_LINK, CL_LINK))?;
    Ok(Net { rr, clients })
}

fn seat(n: usize, graceful_restart: Option<(u16, bool)>) -> Seat {
    Seat {
        me: REFLECTOR_IP.into(),
        neighbors: cluster_clients(n, EIPS)
            .iter()
            .map(|c| (c.addr.to_string(), true))
            .collect(),
        graceful_restart,
        routed: Some(("10.99.0.0/16".into(), CL_LINK.into())),
    }
}

/// Waits until something listens on port 179 in `ns` (a daemon that
/// prints nothing when ready).
fn wait_listening(ns: &Netns, timeout: Duration) -> Result<()> {
    let until = Instant::now() + timeout;
    loop {
        let out = ns.exec(&["ss", "-Hltn", "sport", "=", ":179"])?;
        if !out.trim().is_empty() {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < until, "the reflector never listened");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn start(kind: Reflector, net: &Net, dir: &Dir, seat: &Seat, speaker: &Path) -> Result<Proc> {
    let p = start_reflector(kind, &net.rr, dir, seat, speaker)?;
    wait_listening(&net.rr, Duration::from_secs(120))?;
    Ok(p)
}

fn fleet(net: &Net, n: usize, restart_time: Option<u16>) -> Result<Fleet> {
    let reflector: SocketAddr = format!("{REFLECTOR_IP}:179").parse()?;
    Fleet::start(
        &net.clients,
        "lo",
        FleetConfig {
            asn: ASN,
            reflector,
            restart_time,
            clients: cluster_clients(n, EIPS),
        },
    )
}

fn latest(t0: Instant, at: &[Instant]) -> f64 {
    at.iter()
        .map(|a| a.saturating_duration_since(t0).as_secs_f64())
        .fold(0.0, f64::max)
}

/// Waits for epoch `epoch` everywhere; None (and why, on stderr) past the
/// timeout.
fn converged(what: &str, fleet: &Fleet, epoch: u32, t0: Instant, timeout: Duration) -> Option<f64> {
    let mut downs = 0usize;
    let mut last_down = String::new();
    let r = fleet.wait_consistent(epoch, timeout, |e| {
        if let Event::Down { client, why } = e {
            downs += 1;
            last_down = format!("client {client}: {why}");
        }
    });
    match r {
        Ok(at) => Some(latest(t0, &at)),
        Err(missing) => {
            eprintln!(
                "  {what}: {} of {} clients not consistent after {timeout:?} \
                 ({downs} sessions lost, last {last_down:?})",
                missing.len(),
                fleet.len()
            );
            None
        }
    }
}

fn measure(kind: Reflector, n: usize, timeout: Duration, speaker: &Path) -> Result<Figures> {
    let net = net()?;
    let dir = Dir::new()?;
    let rr = start(kind, &net, &dir, &seat(n, None), speaker)?;
    let t0 = Instant::now();
    let fleet = fleet(&net, n, None)?;
    let mut f = Figures {
        converge_s: converged("converge", &fleet, 0, t0, timeout),
        ..Figures::default()
    };
    f.mb = Some(peak_rss_mb(rr.pid()));
    f.cpu_s = Some(cpu_seconds(rr.pid()));
    if f.converge_s.is_none() {
        f.cpu_s = None;
        return Ok(f);
    }
    let flapping: Vec<usize> = (0..n).step_by(10).collect();
    let t1 = Instant::now();
    let epoch = fleet.flap(&flapping);
    f.churn_s = converged("churn", &fleet, epoch, t1, timeout);
    f.mb = Some(peak_rss_mb(rr.pid()));
    drop(fleet);
    drop(rr);
    Ok(f)
}

/// The restart of our reflector at `n` clients.
struct Restart {
    /// From SIGKILL until the last client had End-of-RIB from the new one.
    eor_s: Option<f64>,
    /// Routes removed at clients meanwhile (withdrawn, or stale at EoR).
    lost: usize,
}

fn measure_restart(n: usize, timeout: Duration, speaker: &Path) -> Result<Restart> {
    let net = net()?;
    let dir = Dir::new()?;
    let ours = Reflector::Ours;
    let mut rr = start(
        ours,
        &net,
        &dir,
        &seat(n, Some((RESTART_TIME, false))),
        speaker,
    )?;
    let fleet = fleet(&net, n, Some(RESTART_TIME))?;
    let t0 = Instant::now();
    converged("restart: converge", &fleet, 0, t0, timeout)
        .context("the clients never converged before the restart")?;
    let removed_before = fleet.removed();
    let killed = Instant::now();
    rr.kill();
    let _rr = start(
        ours,
        &net,
        &dir,
        &seat(n, Some((RESTART_TIME, true))),
        speaker,
    )?;
    let until = killed + timeout;
    let mut eor: Vec<Option<Instant>> = vec![None; n];
    let mut lost = 0;
    while eor.iter().any(Option::is_none) {
        match fleet.next_event(until) {
            None => break,
            Some(Event::EndOfRib {
                client,
                at,
                stale_left,
            }) if at > killed => {
                eor[client].get_or_insert(at);
                lost += stale_left;
            }
            Some(_) => {}
        }
    }
    lost += fleet.removed() - removed_before;
    let missing = eor.iter().filter(|e| e.is_none()).count();
    if missing > 0 {
        eprintln!("  restart: {missing} of {n} clients without End-of-RIB after {timeout:?}");
    }
    let at: Vec<Instant> = eor.iter().flatten().copied().collect();
    Ok(Restart {
        eor_s: (missing == 0).then(|| latest(killed, &at)),
        lost,
    })
}

fn round3(v: Option<f64>) -> Value {
    v.map_or(Value::Null, |s| json!((s * 1000.0).round() / 1000.0))
}

fn round1(v: Option<f64>) -> Value {
    v.map_or(Value::Null, |s| json!((s * 10.0).round() / 10.0))
}

/// Runs every size for every reflector and adds the figures to `out`:
/// `cluster_<n>_<name>_{s,mb,cpu_s}`, `cluster_<n>_churn_<name>_s` and
/// `cluster_<n>_restart_{eor_s,routes_lost}` per size, and the largest
/// size's again without the `<n>_`, with `cluster_clients`.
pub fn run(args: &ClusterArgs, speaker: &Path, out: &mut Map<String, Value>) -> Result<()> {
    let Some(&largest) = args.sizes.iter().max() else {
        return Ok(());
    };
    out.insert("cluster_clients".into(), json!(largest));
    out.insert("cluster_sizes".into(), json!(args.sizes));
    for &n in &args.sizes {
        let put = |out: &mut Map<String, Value>, key: &str, v: Value| {
            out.insert(format!("cluster_{n}_{key}"), v.clone());
            if n == largest {
                out.insert(format!("cluster_{key}"), v);
            }
        };
        for &kind in &args.reflectors {
            let name = kind.key();
            eprintln!("cluster, {n} clients, {name} as reflector");
            let f = measure(kind, n, args.timeout, speaker)
                .with_context(|| format!("{name} as reflector of {n} clients"))?;
            eprintln!(
                "{name:>6}: {n} clients converged in {:?} s, {:?} MB, {:?} CPU s; churn {:?} s",
                f.converge_s, f.mb, f.cpu_s, f.churn_s
            );
            put(out, &format!("{name}_s"), round3(f.converge_s));
            put(out, &format!("{name}_mb"), round1(f.mb));
            put(out, &format!("{name}_cpu_s"), round1(f.cpu_s));
            put(out, &format!("churn_{name}_s"), round3(f.churn_s));
        }
        if args.reflectors.contains(&Reflector::Ours) {
            eprintln!("cluster, {n} clients, restart of ours");
            let r = measure_restart(n, args.timeout, speaker)?;
            eprintln!(
                "  ours restarted: End-of-RIB at every client after {:?} s, {} routes lost",
                r.eor_s, r.lost
            );
            put(out, "restart_eor_s", round3(r.eor_s));
            put(out, "restart_routes_lost", json!(r.lost));
        }
    }
    Ok(())
}
