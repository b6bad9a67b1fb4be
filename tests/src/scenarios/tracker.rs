//! Announcement tracking (which node announces the EIP, and when) and the
//! checks the scenarios share on events, tunnels and traffic.

use std::{
    net::{Shutdown, TcpStream},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use anyhow::Result;
use serde_json::{json, Value};

use super::{
    ms, say,
    stage::{Stage, TcpReport, UdpReport},
    Outcome,
};
use crate::cluster::{wait_until, Cluster, AGENT_ADMIN};

/// A node's agent state as the tracker saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(super) struct Seen {
    pub(super) reachable: bool,
    pub(super) announced: bool,
    pub(super) fenced: bool,
}

/// Polls every agent's `/state` every 20 ms (one thread per node, inside its
/// namespace) and keeps, per node, the changes with their instants.
pub(super) struct Tracker {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
    pub(super) tracks: Tracks,
}

/// Per node, the state changes with their instants.
pub(super) type Tracks = Arc<Mutex<Vec<Vec<(Instant, Seen)>>>>;

fn query_state() -> Option<Value> {
    let mut s =
        TcpStream::connect_timeout(&AGENT_ADMIN.parse().ok()?, Duration::from_millis(200)).ok()?;
    use std::io::{Read, Write};
    s.set_read_timeout(Some(Duration::from_millis(500))).ok()?;
    s.write_all(b"GET /state HTTP/1.1\r\nconnection: close\r\n\r\n")
        .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let _ = s.shutdown(Shutdown::Both);
    let body = out.split_once("\r\n\r\n")?.1;
    serde_json::from_str(body).ok()
}

impl Tracker {
    pub(super) fn start(cluster: &Cluster, eip: &str) -> Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let n = cluster.topo.nodes.len();
        let tracks = Arc::new(Mutex::new(vec![Vec::new(); n]));
        let mut threads = Vec::new();
        for (i, node) in cluster.topo.nodes.iter().enumerate() {
            let file = std::fs::File::open(node.ns.path())?;
            let (stop, tracks, eip) = (stop.clone(), tracks.clone(), eip.to_owned());
            threads.push(std::thread::spawn(move || {
                use std::os::fd::AsRawFd;
                // SAFETY: a valid namespace fd; affects only this thread.
                if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                    return;
                }
                let mut last: Option<Seen> = None;
                while !stop.load(Ordering::Relaxed) {
                    let seen = match query_state() {
                        Some(v) => Seen {
                            reachable: true,
                            announced: v["announced"]
                                .as_array()
                                .is_some_and(|a| a.iter().any(|e| e == eip.as_str())),
                            fenced: v["fenced"] == true,
                        },
                        None => Seen::default(),
                    };
                    if last != Some(seen) {
                        tracks.lock().unwrap()[i].push((Instant::now(), seen));
                        last = Some(seen);
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            }));
        }
        let t = Self {
            stop,
            threads,
            tracks,
        };
        // Every thread has taken its first sample.
        wait_until("the tracker samples", Duration::from_secs(5), || {
            Ok(t.tracks.lock().unwrap().iter().all(|v| !v.is_empty()))
        })?;
        Ok(t)
    }

    pub(super) fn now(&self, node: usize) -> Seen {
        self.tracks.lock().unwrap()[node]
            .last()
            .map(|s| s.1)
            .unwrap_or_default()
    }

    pub(super) fn announcers_now(&self) -> Vec<usize> {
        let t = self.tracks.lock().unwrap();
        (0..t.len())
            .filter(|&i| t[i].last().is_some_and(|s| s.1.announced))
            .collect()
    }

    /// First instant at or after `from` when a node other than `old` announced.
    pub(super) fn first_other(&self, old: usize, from: Instant) -> Option<(Instant, usize)> {
        let t = self.tracks.lock().unwrap();
        t.iter()
            .enumerate()
            .filter(|(i, _)| *i != old)
            .filter_map(|(i, tr)| {
                let mut cur = tr.iter().rev().find(|s| s.0 <= from).map(|s| s.1);
                if cur.is_some_and(|s| s.announced) {
                    return Some((from, i));
                }
                for s in tr.iter().filter(|s| s.0 > from) {
                    cur = Some(s.1);
                    if s.1.announced {
                        return Some((s.0, i));
                    }
                }
                None
            })
            .min_by_key(|x| x.0)
    }

    /// First instant at or after `from` when `node` was not announcing.
    pub(super) fn first_silent(&self, node: usize, from: Instant) -> Option<Instant> {
        let t = self.tracks.lock().unwrap();
        let tr = &t[node];
        if tr
            .iter()
            .rev()
            .find(|s| s.0 <= from)
            .is_some_and(|s| !s.1.announced)
        {
            return Some(from);
        }
        tr.iter()
            .find(|s| s.0 > from && !s.1.announced)
            .map(|s| s.0)
    }

    /// Did `node` announce at any instant in [from, to)?
    pub(super) fn announced_between(&self, node: usize, from: Instant, to: Instant) -> bool {
        let t = self.tracks.lock().unwrap();
        let tr = &t[node];
        tr.iter()
            .rev()
            .find(|s| s.0 <= from)
            .is_some_and(|s| s.1.announced)
            || tr.iter().any(|s| s.0 > from && s.0 < to && s.1.announced)
    }

    /// How long (ms) two or more nodes announced at once within [from, to).
    pub(super) fn dual_ms(&self, from: Instant, to: Instant) -> u64 {
        let t = self.tracks.lock().unwrap();
        let mut cuts: Vec<Instant> = t.iter().flatten().map(|s| s.0).collect();
        cuts.push(from);
        cuts.push(to);
        cuts.retain(|c| *c >= from && *c <= to);
        cuts.sort();
        cuts.dedup();
        let mut total = Duration::ZERO;
        for w in cuts.windows(2) {
            let n = t
                .iter()
                .filter(|tr| {
                    tr.iter()
                        .rev()
                        .find(|s| s.0 <= w[0])
                        .is_some_and(|s| s.1.announced)
                })
                .count();
            if n >= 2 {
                total += w[1] - w[0];
            }
        }
        ms(total)
    }

    pub(super) fn finish(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Tracker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Waits for another node than `old` to announce; returns when and who.
pub(super) fn wait_new_owner(
    tracker: &Tracker,
    old: usize,
    since: Instant,
    timeout: Duration,
) -> Option<(Instant, usize)> {
    let deadline = since + timeout;
    loop {
        if let Some(x) = tracker.first_other(old, since) {
            return Some(x);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
/// Waits (3 s at most) for an event whose message is "EgressTunnel NODE
/// status changes to PHASE" (issue 5: every phase change is recorded).
pub(super) fn check_event(out: &mut Outcome, cluster: &Cluster, node: &str, phase: &str) {
    let msg = format!("EgressTunnel {node} status changes to {phase}");
    // With datapath probes a dead gateway is first marked Failed (the probe
    // sees it before the heartbeat times out); either event records the loss.
    let probe_msg = format!("EgressTunnel {node} status changes to Failed");
    let accept_probe = phase == "HeartbeatTimeout";
    let found = wait_until(&msg, Duration::from_secs(3), || {
        let evs: Value = serde_json::from_str(&cluster.egress(&["get", "events", "-o", "json"])?)?;
        Ok(evs.as_array().is_some_and(|a| {
            a.iter().any(|e| {
                e["message"] == msg.as_str() || (accept_probe && e["message"] == probe_msg.as_str())
            })
        }))
    });
    out.check(found.is_ok(), format!("no event \"{msg}\" recorded"));
}

pub(super) fn tunnel_phase(cluster: &Cluster, node: &str) -> Option<String> {
    let out = cluster.egress(&["get", "egt", node, "-o", "json"]).ok()?;
    let v: Value = serde_json::from_str(&out).ok()?;
    v["status"]["phase"].as_str().map(str::to_owned)
}

/// Records `node`'s tunnel phase in `out` as `key`; the run fails with
/// `why` when it is HeartbeatTimeout.
pub(super) fn check_not_heartbeat_timeout(
    cluster: &Cluster,
    out: &mut Outcome,
    node: &str,
    key: &str,
    why: String,
) {
    let phase = tunnel_phase(cluster, node);
    out.extra.insert(key.into(), json!(phase));
    out.check(phase.as_deref() != Some("HeartbeatTimeout"), why);
}

/// Records how long two nodes announced the EIP at once, from `t0` to now:
/// in all, and after the eviction timeout (when it must not happen).
pub(super) fn record_dual_announce(
    out: &mut Outcome,
    tracker: &Tracker,
    t0: Instant,
    eviction: Duration,
) {
    let now = Instant::now();
    out.dual_announce_total_ms = tracker.dual_ms(t0, now);
    out.dual_announce_ms = tracker.dual_ms(t0 + eviction, now);
}

/// Checks that no two nodes announced the EIP at once after the eviction
/// timeout (as [`record_dual_announce`] measured).
pub(super) fn check_no_dual_announce_after_eviction(out: &mut Outcome) {
    out.check(
        out.dual_announce_ms == 0,
        format!(
            "two nodes announced the EIP for {} ms after the eviction timeout",
            out.dual_announce_ms
        ),
    );
}

/// Checks that exactly one node announces the EIP when the run ends.
pub(super) fn check_one_announcer_at_end(out: &mut Outcome, tracker: &Tracker) {
    let end = tracker.announcers_now();
    out.check(
        end.len() == 1,
        format!("{} nodes announce the EIP at the end", end.len()),
    );
}

/// Stops the run's UDP and TCP streams and checks both ([`check_udp`],
/// [`check_tcp`]).
pub(super) fn stop_and_check_traffic(
    out: &mut Outcome,
    st: &mut Stage,
    gap_bound: Duration,
) -> Result<()> {
    let udp = st.traffic.stop_udp()?;
    check_udp(out, &udp, &st.eip, gap_bound);
    let tcp = st.traffic.stop_tcp()?;
    check_tcp(out, &tcp);
    Ok(())
}

/// Checks on the UDP stream of a run whose EIP moved once.
pub(super) fn check_udp(out: &mut Outcome, r: &UdpReport, eip: &str, gap_bound: Duration) {
    out.gap_ms = r.gap_ms;
    out.extra.insert("udp_lost".into(), json!(r.lost));
    out.extra.insert("udp_sent".into(), json!(r.sent));
    out.extra.insert("udp_sources".into(), json!(r.sources));
    say(&format!(
        "UDP: largest gap {:.0} ms, lost {} of {}, sources {:?}",
        r.gap_ms.unwrap_or(-1.0),
        r.lost,
        r.sent,
        r.sources,
    ));
    out.check(
        r.sources == [eip.to_owned()],
        format!(
            "the server saw UDP from {:?}, expected only the EIP {eip}",
            r.sources
        ),
    );
    out.check(
        r.sent > 0 && r.last_seq + 100 >= r.sent,
        format!(
            "UDP did not resume: last datagram received {} of {} sent",
            r.last_seq, r.sent
        ),
    );
    out.check(
        r.gap_ms.is_some_and(|g| g <= ms(gap_bound) as f64),
        format!(
            "UDP gap {:?} ms over the bound {} ms",
            r.gap_ms.map(|g| g.round()),
            ms(gap_bound)
        ),
    );
}

pub(super) fn check_tcp(out: &mut Outcome, r: &TcpReport) {
    out.tcp_gap_ms = r.gap_ms;
    out.tcp_survived = r.survived;
    out.extra.insert("tcp".into(), r.detail.clone());
    say(&format!(
        "TCP: largest gap {:.0} ms, survived {}",
        r.gap_ms.unwrap_or(-1.0),
        r.survived
    ));
    out.check(r.survived, "the TCP connection did not survive");
}
