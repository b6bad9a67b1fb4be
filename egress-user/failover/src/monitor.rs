//! The controller's heartbeat monitor: from the heartbeats it has seen (on
//! its own clock) and the probes' verdict, decide every EgressTunnel's
//! phase. This is the one phase model: the controller's loop runs it
//! (`egress_control::controller::tick_cached_report`), and the tests of the
//! partition and of the probe path run it through that loop.
//!
//! Pure: the caller passes what it read and the time. It writes the
//! [`PhaseChange`]s and their events; the controller's reconcile then moves
//! the EIPs of every gateway node that is not `Ready`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::phase::TunnelPhase;
use crate::probe::{DownReason, SessionEvent};

/// What the controller knows of one EgressTunnel at a check, besides the
/// heartbeats and the probes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TunnelFacts<'a> {
    pub node: &'a str,
    /// The phase stored in its EgressTunnel now.
    pub phase: TunnelPhase,
    /// False when the node's Node says it is not Ready (true without one).
    pub node_ready: bool,
    /// Its agent wrote a tunnel address (IPv4 or IPv6).
    pub registered: bool,
    /// Some EgressGateway selects the node: only such nodes heartbeat.
    pub eligible: bool,
}

/// Normal or Warning, as Kubernetes events have it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventType {
    Normal,
    Warning,
}

/// A phase the controller must write, with the event it records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PhaseChange {
    pub node: String,
    pub from: TunnelPhase,
    pub to: TunnelPhase,
    /// The writer's renew time of the last heartbeat seen, if any.
    pub last_heartbeat: Option<String>,
}

impl PhaseChange {
    /// The event's reason: the new phase's name.
    pub fn reason(&self) -> &'static str {
        self.to.as_str()
    }

    /// Normal for `Ready`, Warning for every other phase.
    pub fn event_type(&self) -> EventType {
        if self.to == TunnelPhase::Ready {
            EventType::Normal
        } else {
            EventType::Warning
        }
    }

    pub fn message(&self) -> String {
        format!("EgressTunnel {} status changes to {}", self.node, self.to)
    }
}

/// A heartbeat counter value and when the monitor first saw it.
#[derive(Clone, Debug)]
struct Seen {
    counter: u64,
    at: Instant,
    renew_time: String,
}

/// Remembers when each node's heartbeat counter last changed, and which
/// nodes' datapath probes are down.
#[derive(Clone, Debug)]
pub struct HeartbeatMonitor {
    started: Instant,
    seen: BTreeMap<String, Seen>,
    /// Nodes whose datapath probe failed: their EIPs move like after a
    /// heartbeat timeout, even while their heartbeats still arrive.
    probe_down: BTreeSet<String>,
}

impl HeartbeatMonitor {
    /// `now` starts every node's grace period: a new leader gives each node
    /// a full timeout before it declares it dead.
    pub fn new(now: Instant) -> Self {
        Self {
            started: now,
            seen: BTreeMap::new(),
            probe_down: BTreeSet::new(),
        }
    }

    /// The nodes whose datapath probe is down now (replaces the last set).
    pub fn set_probe_down(&mut self, nodes: BTreeSet<String>) {
        self.probe_down = nodes;
    }

    /// Records the counter read for `node` at `now`; true when it changed.
    /// The instant a new value is first seen is the heartbeat's time, so
    /// the writer's clock (`renew_time`, kept for people) never matters. A
    /// recreated heartbeat restarts its counter: that is a change too.
    pub fn observe(&mut self, node: &str, counter: u64, renew_time: &str, now: Instant) -> bool {
        if self.seen.get(node).is_some_and(|s| s.counter == counter) {
            return false;
        }
        let seen = Seen {
            counter,
            at: now,
            renew_time: renew_time.to_string(),
        };
        self.seen.insert(node.to_string(), seen);
        true
    }

    /// When the node's heartbeat last changed (the grace start if never).
    pub fn last_seen(&self, node: &str) -> Instant {
        self.seen.get(node).map_or(self.started, |s| s.at)
    }

    /// The phase of one tunnel now. Rules, in order:
    /// 1. its Node is not Ready -> NodeNotReady;
    /// 2. no tunnel address yet -> Pending;
    /// 3. not gateway-eligible (sends no heartbeat) -> Ready;
    /// 4. no new heartbeat for longer than `timeout` -> HeartbeatTimeout;
    /// 5. its datapath probe is down -> Failed;
    /// 6. a heartbeat seen by this monitor, or Ready already -> Ready (so a
    ///    node in HeartbeatTimeout or Failed recovers with a fresh heartbeat
    ///    and a probe not down; its EIPs do not move back);
    /// 7. otherwise -> Init (waiting for its first heartbeat).
    pub fn phase(&self, t: &TunnelFacts<'_>, now: Instant, timeout: Duration) -> TunnelPhase {
        if !t.node_ready {
            TunnelPhase::NodeNotReady
        } else if !t.registered {
            TunnelPhase::Pending
        } else if !t.eligible {
            TunnelPhase::Ready
        } else if now.saturating_duration_since(self.last_seen(t.node)) > timeout {
            TunnelPhase::HeartbeatTimeout
        } else if self.probe_down.contains(t.node) {
            TunnelPhase::Failed
        } else if self.seen.contains_key(t.node) || t.phase == TunnelPhase::Ready {
            TunnelPhase::Ready
        } else {
            TunnelPhase::Init
        }
    }

    /// The phase changes of every tunnel (only those whose phase differs).
    pub fn changes<'a>(
        &self,
        tunnels: impl IntoIterator<Item = TunnelFacts<'a>>,
        now: Instant,
        timeout: Duration,
    ) -> Vec<PhaseChange> {
        tunnels
            .into_iter()
            .filter_map(|t| {
                let to = self.phase(&t, now, timeout);
                (to != t.phase).then(|| PhaseChange {
                    node: t.node.to_string(),
                    from: t.phase,
                    to,
                    last_heartbeat: self.seen.get(t.node).map(|s| s.renew_time.clone()),
                })
            })
            .collect()
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

#[cfg(test)]
mod tests;
