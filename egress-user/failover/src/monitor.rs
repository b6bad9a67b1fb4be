//! The controller's heartbeat monitor: from what it has observed (heartbeats
//! on its own clock, probe results), decide each gateway-eligible node's
//! EgressTunnel phase, the events to record, and whose EIPs must move.
//!
//! Pure. The controller calls [`HeartbeatTracker::observe`] for every
//! heartbeat it reads and [`evaluate`] every `tunnelMonitorPeriod`, then
//! writes the phase changes, records the events and moves the EIPs of the
//! nodes in [`MonitorDecision::evict`] (each move with a new epoch).

use std::collections::BTreeMap;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::phase::TunnelPhase;
use crate::probe::{DownReason, SessionEvent};
use crate::timers::FailoverTimers;

/// Times heartbeat renewals on the monitor's clock. The datastore gives a
/// counter that grows on every renewal; the instant at which the monitor
/// first sees a new value is the heartbeat time, so the writer's clock (and
/// its skew) never matters.
#[derive(Clone, Debug, Default)]
pub struct HeartbeatTracker {
    seen: BTreeMap<String, (u64, Instant)>,
}

impl HeartbeatTracker {
    pub fn new() -> Self {
        Self::default()
    }

    /// Records the counter read for `node` at `now`; true when it changed
    /// (the first observation counts as a change: a new leader gives every
    /// node a full timeout before judging it).
    pub fn observe(&mut self, node: &str, counter: u64, now: Instant) -> bool {
        match self.seen.get_mut(node) {
            Some((c, _)) if *c == counter => false,
            Some(entry) => {
                *entry = (counter, now);
                true
            }
            None => {
                self.seen.insert(node.to_string(), (counter, now));
                true
            }
        }
    }

    pub fn last_heartbeat(&self, node: &str) -> Option<Instant> {
        self.seen.get(node).map(|(_, at)| *at)
    }

    /// Forgets nodes that are no longer gateway-eligible.
    pub fn retain(&mut self, mut keep: impl FnMut(&str) -> bool) {
        self.seen.retain(|node, _| keep(node));
    }
}

/// What the probes say about a node's datapath.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ProbeHealth {
    /// Not probed, or no session has come up yet.
    #[default]
    Unknown,
    Up,
    /// A session that was Up failed (detection timeout, or the node said it
    /// lost us).
    Down,
    /// The node ended its session on purpose (agent restart, shutdown): not a
    /// failure; the heartbeat still decides.
    AdminDown,
}

impl ProbeHealth {
    /// The health after a session event of the prober that probes the node.
    pub fn after(event: SessionEvent) -> Self {
        match event {
            SessionEvent::SessionUp => Self::Up,
            SessionEvent::SessionDown {
                reason: DownReason::DetectTimeExpired | DownReason::NeighborSignaledDown,
            } => Self::Down,
            SessionEvent::SessionDown {
                reason: DownReason::NeighborAdminDown | DownReason::AdminDown,
            } => Self::AdminDown,
        }
    }

    /// Combines the views of several probers (the controller and the other
    /// gateway candidates): Down only when more of them see it Down than Up,
    /// so one prober with a broken path cannot evict a healthy node.
    pub fn combine(views: impl IntoIterator<Item = ProbeHealth>) -> Self {
        let (mut up, mut down, mut admin) = (0usize, 0usize, 0usize);
        for v in views {
            match v {
                Self::Up => up += 1,
                Self::Down => down += 1,
                Self::AdminDown => admin += 1,
                Self::Unknown => {}
            }
        }
        if down > up {
            Self::Down
        } else if up > 0 {
            Self::Up
        } else if admin > 0 {
            Self::AdminDown
        } else {
            Self::Unknown
        }
    }
}

/// What the controller knows about one gateway-eligible node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeObservation {
    pub node: String,
    /// The phase stored in its EgressTunnel now.
    pub phase: TunnelPhase,
    /// From [`HeartbeatTracker::last_heartbeat`]; None if none seen since
    /// this controller started monitoring.
    pub last_heartbeat: Option<Instant>,
    pub probe: ProbeHealth,
    /// EIPs assigned to the node now.
    pub eip_count: usize,
}

/// Normal or Warning, as Kubernetes events have it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventType {
    Normal,
    Warning,
}

/// An event to record on the node's EgressTunnel.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TunnelEvent {
    pub node: String,
    pub event_type: EventType,
    /// Stable machine-readable cause, for alerts.
    pub reason: String,
    pub message: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PhaseChange {
    pub node: String,
    pub from: TunnelPhase,
    pub to: TunnelPhase,
}

/// The outcome of one check.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MonitorDecision {
    /// The phase of every observed node after this check.
    pub phases: BTreeMap<String, TunnelPhase>,
    /// Phase writes to make (only nodes whose phase changes).
    pub changes: Vec<PhaseChange>,
    pub events: Vec<TunnelEvent>,
    /// Nodes that are dead and still own EIPs: move all of them. Repeated on
    /// every check until the moves are done, so a failed write is retried.
    pub evict: Vec<String>,
}

impl MonitorDecision {
    /// The Ready node with the fewest EIPs (ties: the smaller name), the
    /// target of a move. `eip_count` gives the current count of a node.
    pub fn least_loaded_ready(&self, eip_count: impl Fn(&str) -> usize) -> Option<&str> {
        self.phases
            .iter()
            .filter(|(_, p)| **p == TunnelPhase::Ready)
            .map(|(n, _)| n.as_str())
            .min_by_key(|n| (eip_count(n), *n))
    }
}

/// One heartbeat check. `monitor_started` stands in for the last heartbeat of
/// nodes not seen yet, so a fresh controller gives them a full timeout.
///
/// Rules, in order, for each node:
/// 1. no heartbeat for longer than `eipEvictionTimeout` -> HeartbeatTimeout;
/// 2. probes say the datapath is Down -> Failed (the datastore is healthy,
///    the datapath is not);
/// 3. a node in HeartbeatTimeout or Failed with a fresh heartbeat and no
///    failed probe -> Ready (recovery; its EIPs do not move back);
/// 4. otherwise the phase stays (Pending/Init/NodeNotReady belong to tunnel
///    registration and node readiness, not to the monitor).
pub fn evaluate(
    now: Instant,
    monitor_started: Instant,
    timers: &FailoverTimers,
    nodes: &[NodeObservation],
) -> MonitorDecision {
    let mut decision = MonitorDecision::default();
    for obs in nodes {
        let last = obs.last_heartbeat.unwrap_or(monitor_started);
        let silent = now.saturating_duration_since(last);
        let to = if silent > timers.eip_eviction_timeout {
            TunnelPhase::HeartbeatTimeout
        } else if obs.probe == ProbeHealth::Down {
            TunnelPhase::Failed
        } else if is_dead(obs.phase) && obs.last_heartbeat.is_some() {
            TunnelPhase::Ready
        } else {
            obs.phase
        };
        if to != obs.phase {
            decision.changes.push(PhaseChange {
                node: obs.node.clone(),
                from: obs.phase,
                to,
            });
            if let Some(event) = event_for(&obs.node, obs.phase, to) {
                decision.events.push(event);
            }
        }
        if is_dead(to) && obs.eip_count > 0 {
            decision.evict.push(obs.node.clone());
        }
        decision.phases.insert(obs.node.clone(), to);
    }
    decision
}

/// Phases whose EIPs must move away.
fn is_dead(phase: TunnelPhase) -> bool {
    matches!(phase, TunnelPhase::Failed | TunnelPhase::HeartbeatTimeout)
}

fn event_for(node: &str, from: TunnelPhase, to: TunnelPhase) -> Option<TunnelEvent> {
    let (event_type, reason) = match to {
        TunnelPhase::HeartbeatTimeout => (EventType::Warning, "HeartbeatTimeout"),
        TunnelPhase::Failed => (EventType::Warning, "ProbeFailed"),
        TunnelPhase::Ready if is_dead(from) => (EventType::Normal, "TunnelRecovered"),
        _ => return None,
    };
    Some(TunnelEvent {
        node: node.to_string(),
        event_type,
        reason: reason.to_string(),
        message: format!("EgressTunnel {node} status changes to {to}"),
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use TunnelPhase::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    /// Default timers: 5 s / 5 s / 15 s.
    fn timers() -> FailoverTimers {
        FailoverTimers::default()
    }

    struct Case {
        name: &'static str,
        phase: TunnelPhase,
        /// Milliseconds since the last heartbeat; None: never seen.
        silent_ms: Option<u64>,
        probe: ProbeHealth,
        eips: usize,
        want: TunnelPhase,
        want_reason: Option<&'static str>,
        want_evict: bool,
    }

    #[test]
    fn phase_table() {
        let cases = [
            Case {
                name: "fresh heartbeat stays Ready",
                phase: Ready,
                silent_ms: Some(1_000),
                probe: ProbeHealth::Up,
                eips: 2,
                want: Ready,
                want_reason: None,
                want_evict: false,
            },
            Case {
                name: "exactly the timeout is not yet a timeout",
                phase: Ready,
                silent_ms: Some(15_000),
                probe: ProbeHealth::Unknown,
                eips: 2,
                want: Ready,
                want_reason: None,
                want_evict: false,
            },
            Case {
                name: "past the timeout",
                phase: Ready,
                silent_ms: Some(15_001),
                probe: ProbeHealth::Up,
                eips: 2,
                want: HeartbeatTimeout,
                want_reason: Some("HeartbeatTimeout"),
                want_evict: true,
            },
            Case {
                name: "timeout without EIPs: nothing to move",
                phase: Ready,
                silent_ms: Some(20_000),
                probe: ProbeHealth::Unknown,
                eips: 0,
                want: HeartbeatTimeout,
                want_reason: Some("HeartbeatTimeout"),
                want_evict: false,
            },
            Case {
                name: "still timed out: no new event, evict again",
                phase: HeartbeatTimeout,
                silent_ms: Some(30_000),
                probe: ProbeHealth::Down,
                eips: 1,
                want: HeartbeatTimeout,
                want_reason: None,
                want_evict: true,
            },
            Case {
                name: "probe down with healthy datastore",
                phase: Ready,
                silent_ms: Some(1_000),
                probe: ProbeHealth::Down,
                eips: 1,
                want: Failed,
                want_reason: Some("ProbeFailed"),
                want_evict: true,
            },
            Case {
                name: "probe admin down is not a failure",
                phase: Ready,
                silent_ms: Some(1_000),
                probe: ProbeHealth::AdminDown,
                eips: 1,
                want: Ready,
                want_reason: None,
                want_evict: false,
            },
            Case {
                name: "heartbeat back: recovered, nothing to move",
                phase: HeartbeatTimeout,
                silent_ms: Some(100),
                probe: ProbeHealth::Unknown,
                eips: 0,
                want: Ready,
                want_reason: Some("TunnelRecovered"),
                want_evict: false,
            },
            Case {
                name: "probe back up: recovered",
                phase: Failed,
                silent_ms: Some(100),
                probe: ProbeHealth::Up,
                eips: 0,
                want: Ready,
                want_reason: Some("TunnelRecovered"),
                want_evict: false,
            },
            Case {
                name: "heartbeat back but probe still down",
                phase: HeartbeatTimeout,
                silent_ms: Some(100),
                probe: ProbeHealth::Down,
                eips: 0,
                want: Failed,
                want_reason: Some("ProbeFailed"),
                want_evict: false,
            },
            Case {
                name: "pending node is left to registration",
                phase: Pending,
                silent_ms: Some(100),
                probe: ProbeHealth::Unknown,
                eips: 0,
                want: Pending,
                want_reason: None,
                want_evict: false,
            },
            Case {
                name: "never seen, within grace",
                phase: Ready,
                silent_ms: None,
                probe: ProbeHealth::Unknown,
                eips: 1,
                want: Ready,
                want_reason: None,
                want_evict: false,
            },
            Case {
                name: "dead node is not recovered by the grace period",
                phase: HeartbeatTimeout,
                silent_ms: None,
                probe: ProbeHealth::Unknown,
                eips: 1,
                want: HeartbeatTimeout,
                want_reason: None,
                want_evict: true,
            },
        ];
        let started = Instant::now();
        let now = started + ms(60_000);
        for c in cases {
            let obs = NodeObservation {
                node: "gw1".into(),
                phase: c.phase,
                last_heartbeat: c.silent_ms.map(|s| now - ms(s)),
                probe: c.probe,
                eip_count: c.eips,
            };
            // "never seen" cases: the controller started 10 s ago.
            let monitor_started = if c.silent_ms.is_none() {
                now - ms(10_000)
            } else {
                started
            };
            let d = evaluate(now, monitor_started, &timers(), &[obs]);
            assert_eq!(d.phases["gw1"], c.want, "{}", c.name);
            assert_eq!(
                d.changes.len(),
                usize::from(c.want != c.phase),
                "{}",
                c.name
            );
            assert_eq!(
                d.events.first().map(|e| e.reason.as_str()),
                c.want_reason,
                "{}",
                c.name
            );
            assert_eq!(d.evict == ["gw1"], c.want_evict, "{}", c.name);
        }
    }

    #[test]
    fn event_texts() {
        let now = Instant::now() + ms(100_000);
        let node = |name: &str, phase, silent| NodeObservation {
            node: name.into(),
            phase,
            last_heartbeat: Some(now - ms(silent)),
            probe: ProbeHealth::Unknown,
            eip_count: 1,
        };
        let d = evaluate(
            now,
            now,
            &timers(),
            &[
                node("node-a", Ready, 16_000),
                node("node-b", HeartbeatTimeout, 10),
            ],
        );
        assert_eq!(
            d.events,
            vec![
                TunnelEvent {
                    node: "node-a".into(),
                    event_type: EventType::Warning,
                    reason: "HeartbeatTimeout".into(),
                    message: "EgressTunnel node-a status changes to HeartbeatTimeout".into(),
                },
                TunnelEvent {
                    node: "node-b".into(),
                    event_type: EventType::Normal,
                    reason: "TunnelRecovered".into(),
                    message: "EgressTunnel node-b status changes to Ready".into(),
                },
            ]
        );
        assert_eq!(d.evict, vec!["node-a".to_string()]);
    }

    #[test]
    fn sub_second_timers() {
        let t = FailoverTimers::new(ms(100), ms(100), ms(300)).unwrap();
        let now = Instant::now() + ms(10_000);
        let obs = |silent| NodeObservation {
            node: "gw".into(),
            phase: Ready,
            last_heartbeat: Some(now - ms(silent)),
            probe: ProbeHealth::Up,
            eip_count: 1,
        };
        assert_eq!(evaluate(now, now, &t, &[obs(300)]).phases["gw"], Ready);
        assert_eq!(
            evaluate(now, now, &t, &[obs(301)]).phases["gw"],
            HeartbeatTimeout
        );
    }

    #[test]
    fn tracker_times_counter_changes_on_its_own_clock() {
        let t0 = Instant::now();
        let mut tr = HeartbeatTracker::new();
        assert!(tr.observe("a", 7, t0));
        assert!(!tr.observe("a", 7, t0 + ms(5_000)));
        assert_eq!(tr.last_heartbeat("a"), Some(t0));
        assert!(tr.observe("a", 8, t0 + ms(6_000)));
        assert_eq!(tr.last_heartbeat("a"), Some(t0 + ms(6_000)));
        // A recreated lease restarts its counter: still a renewal.
        assert!(tr.observe("a", 1, t0 + ms(7_000)));
        tr.retain(|n| n != "a");
        assert_eq!(tr.last_heartbeat("a"), None);
    }

    #[test]
    fn probe_health_from_events_and_majority() {
        let down = |reason| ProbeHealth::after(SessionEvent::SessionDown { reason });
        assert_eq!(ProbeHealth::after(SessionEvent::SessionUp), ProbeHealth::Up);
        assert_eq!(down(DownReason::DetectTimeExpired), ProbeHealth::Down);
        assert_eq!(down(DownReason::NeighborSignaledDown), ProbeHealth::Down);
        assert_eq!(down(DownReason::NeighborAdminDown), ProbeHealth::AdminDown);
        assert_eq!(down(DownReason::AdminDown), ProbeHealth::AdminDown);
        use ProbeHealth::*;
        let cases: &[(&[ProbeHealth], ProbeHealth)] = &[
            (&[], Unknown),
            (&[Down], Down),
            (&[Down, Up], Up),
            (&[Down, Down, Up], Down),
            (&[Down, Unknown, Unknown], Down),
            (&[AdminDown, Unknown], AdminDown),
            (&[AdminDown, Up], Up),
        ];
        for (views, want) in cases {
            assert_eq!(
                ProbeHealth::combine(views.iter().copied()),
                *want,
                "{views:?}"
            );
        }
    }

    #[test]
    fn move_target_is_least_loaded_ready_node() {
        let mut d = MonitorDecision::default();
        for (n, p) in [
            ("a", Ready),
            ("b", Ready),
            ("c", HeartbeatTimeout),
            ("d", Ready),
        ] {
            d.phases.insert(n.into(), p);
        }
        let counts = |n: &str| match n {
            "a" => 3,
            "b" => 1,
            "c" => 0,
            _ => 1,
        };
        assert_eq!(d.least_loaded_ready(counts), Some("b"));
        d.phases.insert("b".into(), Failed);
        assert_eq!(d.least_loaded_ready(counts), Some("d"));
        d.phases.clear();
        assert_eq!(d.least_loaded_ready(counts), None);
    }
}
