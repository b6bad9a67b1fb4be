//! The shared stage: cluster, policy, traffic (the announcement tracking
//! is in `tracker`, the datastore's view in `ds_watch`).

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde_json::{json, Value};

use super::{ds_watch::DsWatch, ms, say, tracker::Tracker, Bins, Options, Outcome};
use crate::{
    cluster::{Cluster, ClusterSpec},
    topology::{eip, SERVER_IP},
    Proc,
};

const WORKERS: usize = 2;
const GATEWAYS: usize = 3;
const UDP_PORT: u16 = 6000;
const TCP_PORT: u16 = 6001;
pub(super) const UDP2_PORT: u16 = 6002;

pub(super) struct Stage {
    pub(super) cluster: Cluster,
    pub(super) eip: String,
    pub(super) owner: usize,
    pub(super) traffic: Traffic,
    pub(super) tracker: Tracker,
    pub(super) ds: DsWatch,
}

/// The stage of a run of `scenario`, and the run's outcome to fill in.
pub(super) fn stage(
    bins: &Bins,
    opts: &Options,
    controllers: usize,
    scenario: &str,
) -> Result<(Stage, Outcome)> {
    // Other fields (added by other scenarios' work) keep their defaults.
    #[allow(clippy::needless_update)]
    let spec = ClusterSpec {
        workers: WORKERS,
        gateways: GATEWAYS,
        pods_per_worker: 1,
        controllers,
        timers: opts.timers.clone(),
        kubernetes: opts.kubernetes,
        ipv6_underlay: opts.ipv6_underlay,
        ..ClusterSpec::default()
    };
    let cluster = Cluster::start(&bins.egress, spec)?;
    if opts.ipv6_underlay {
        cluster.ensure_ipv6_only()?;
        say("underlay: IPv6 only (no node has an IPv4 address)");
    }
    if opts.timers.probe.is_some() && !cluster.agents_probe() {
        say(
            "note: `egress agent` has no probe flags yet (prober not wired): the heartbeat decides",
        );
    }
    let eip = eip(0).to_string();
    let owner = cluster.examples_up()?;
    say(&format!(
        "cluster up: EIP {eip} announced by {}",
        cluster.topo.nodes[owner].name
    ));
    if let Some(rto) = opts.tcp_rto_max_ms {
        for ns in [&cluster.topo.server, &cluster.topo.nodes[0].pods[0].ns] {
            ns.sysctl(&[&format!("net.ipv4.tcp_rto_max_ms={rto}")])
                .context("net.ipv4.tcp_rto_max_ms (kernel 6.15 or newer)")?;
        }
    }
    let traffic = Traffic::start(&cluster, bins, opts)?;
    let tracker = Tracker::start(&cluster, &eip)?;
    let ds = DsWatch::start(&cluster)?;
    let stage = Stage {
        cluster,
        eip,
        owner,
        traffic,
        tracker,
        ds,
    };
    Ok((stage, Outcome::named(scenario)))
}

impl Stage {
    /// `node` announces the EIP `after` the fault (`what` names it): the
    /// detection time, recorded and said.
    pub(super) fn note_new_owner(
        &self,
        out: &mut Outcome,
        node: usize,
        after: Duration,
        what: &str,
    ) {
        out.detection_ms = Some(ms(after));
        say(&format!(
            "{} announces the EIP {} ms after {what}",
            self.cluster.topo.nodes[node].name,
            ms(after)
        ));
    }

    /// The EIP's owner when the stage was set: its index and its name.
    pub(super) fn owner_and_name(&self) -> (usize, String) {
        (self.owner, self.cluster.topo.nodes[self.owner].name.clone())
    }

    /// Stops the watchers and settles the verdict (ok when nothing failed);
    /// the cluster is torn down as the stage drops.
    pub(super) fn finish(self, mut out: Outcome) -> Result<Outcome> {
        self.ds.finish();
        self.tracker.finish();
        out.ok = out.failures.is_empty();
        Ok(out)
    }
}

/// The pod's streams and the server's sinks.
pub(super) struct Traffic {
    udp: Option<(Proc, Proc)>,
    tcp: Option<(Proc, Proc)>,
    started: Instant,
    tcp_interval_ms: u64,
    udp_interval_ms: u64,
}

#[derive(Debug, Default)]
pub(super) struct UdpReport {
    /// The largest gap between arrivals, or the silence at the end of the
    /// run (datagrams sent after the last one received) if that is longer.
    pub(super) gap_ms: Option<f64>,
    pub(super) lost: u64,
    pub(super) sent: u64,
    pub(super) last_seq: u64,
    pub(super) sources: Vec<String>,
}

#[derive(Debug, Default)]
pub(super) struct TcpReport {
    pub(super) gap_ms: Option<f64>,
    pub(super) survived: bool,
    pub(super) detail: Value,
}

pub(super) fn report_of(mut p: Proc) -> Result<Value> {
    p.signal_term();
    let line = p.wait_for_line("\"role\"", Duration::from_secs(40))?;
    Ok(serde_json::from_str(&line)?)
}

/// Starts a UDP sink on the server and a numbered stream from p11 to it.
pub(super) fn start_udp(
    cluster: &Cluster,
    bins: &Bins,
    port: u16,
    interval_ms: u64,
) -> Result<(Proc, Proc)> {
    start_stream(cluster, bins, "udp", port, interval_ms)
}

/// Starts the traffic tool's `{proto}-sink` on the server's `port` and its
/// `{proto}-source` from p11 to it, one message every `interval_ms`.
fn start_stream(
    cluster: &Cluster,
    bins: &Bins,
    proto: &str,
    port: u16,
    interval_ms: u64,
) -> Result<(Proc, Proc)> {
    let tb = bins.traffic.to_string_lossy().into_owned();
    let sink = cluster.topo.server.spawn_ready(&[
        &tb,
        &format!("{proto}-sink"),
        &format!("0.0.0.0:{port}"),
    ])?;
    let src = cluster.topo.nodes[0].pods[0].ns.spawn_ready(&[
        &tb,
        &format!("{proto}-source"),
        &format!("{SERVER_IP}:{port}"),
        &interval_ms.to_string(),
    ])?;
    Ok((sink, src))
}

/// Stops a UDP pair: the source first, then (after the last datagrams) the sink.
pub(super) fn stop_udp(pair: (Proc, Proc), interval_ms: u64) -> Result<UdpReport> {
    let (sink, src) = pair;
    let src = report_of(src)?;
    std::thread::sleep(Duration::from_millis(100));
    let udp = report_of(sink)?;
    let sent = src["sent"].as_u64().unwrap_or(0);
    let last = udp["last_seq"].as_u64().unwrap_or(0);
    let tail_ms = (sent.saturating_sub(last + 1) * interval_ms) as f64;
    Ok(UdpReport {
        gap_ms: udp["max_gap_ms"].as_f64().map(|g| g.max(tail_ms)),
        lost: udp["lost"].as_u64().unwrap_or(0),
        sent: src["sent"].as_u64().unwrap_or(0),
        last_seq: udp["last_seq"].as_u64().unwrap_or(0),
        sources: udp["sources"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default(),
    })
}

impl Traffic {
    fn start(cluster: &Cluster, bins: &Bins, opts: &Options) -> Result<Self> {
        let tcp = start_stream(cluster, bins, "tcp", TCP_PORT, opts.tcp_interval_ms)?;
        let udp = start_udp(cluster, bins, UDP_PORT, opts.udp_interval_ms)?;
        say("traffic started: UDP stream and one TCP connection from p11 to the server");
        Ok(Self {
            udp: Some(udp),
            tcp: Some(tcp),
            started: Instant::now(),
            tcp_interval_ms: opts.tcp_interval_ms,
            udp_interval_ms: opts.udp_interval_ms,
        })
    }

    pub(super) fn stop_udp(&mut self) -> Result<UdpReport> {
        stop_udp(
            self.udp.take().context("UDP already stopped")?,
            self.udp_interval_ms,
        )
    }

    pub(super) fn stop_tcp(&mut self) -> Result<TcpReport> {
        let (sink, src) = self.tcp.take().context("TCP already stopped")?;
        let ran_ms = self.started.elapsed().as_secs_f64() * 1000.0;
        let src = report_of(src)?;
        let tcp = report_of(sink)?;
        let conn = &tcp["connections"][0];
        let echoed = src["echoed"].as_u64().unwrap_or(0);
        // The source catches up after a stall (it does not sleep while
        // behind), so a connection that works at the end has echoed about
        // once per interval over the whole run.
        let behind_ms = ran_ms - (echoed * self.tcp_interval_ms) as f64;
        // A stopped source still waits for its pending echo (up to its 30 s
        // read timeout), so `survived` means the connection was never reset
        // and came back, possibly after the stop: after a long outage the
        // sender's retransmission backoff can take longer than the run.
        // (The sink sees the close of the stopped source: `closed` says nothing.)
        let survived =
            src["survived"] == true && tcp["connections"].as_array().map(Vec::len) == Some(1);
        Ok(TcpReport {
            gap_ms: conn["max_gap_ms"].as_f64(),
            survived,
            detail: json!({"source": src, "sink": tcp, "behind_ms": behind_ms.round(),
                "caught_up_by_the_end": behind_ms < 1500.0}),
        })
    }
}
