//! Heartbeat monitoring, pure: the caller passes the heartbeats it read and
//! the time on its own clock; the monitor says which tunnels change phase.
//!
//! A heartbeat counts when its counter changes, timed by the monitor's
//! clock, so the clocks of agents never matter.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tokio::time::Instant;

use crate::api::TunnelPhase;
use crate::datastore::Heartbeat;

use super::ClusterView;

/// A phase change the controller must write, with its event message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TunnelChange {
    pub node: String,
    pub from: TunnelPhase,
    pub to: TunnelPhase,
    /// The writer's renew time of the last heartbeat seen, if any.
    pub last_heartbeat: Option<String>,
}

impl TunnelChange {
    pub fn message(&self) -> String {
        format!(
            "EgressTunnel {} status changes to {}",
            self.node,
            self.to.as_str()
        )
    }
}

/// Remembers when each node's heartbeat counter last changed.
#[derive(Clone, Debug)]
pub struct HeartbeatMonitor {
    started: Instant,
    seen: BTreeMap<String, (u64, Instant, String)>,
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

    pub fn observe(&mut self, heartbeats: &[Heartbeat], now: Instant) {
        for hb in heartbeats {
            match self.seen.get_mut(&hb.node) {
                Some(s) if s.0 == hb.counter => {}
                Some(s) => *s = (hb.counter, now, hb.renew_time.clone()),
                None => {
                    self.seen
                        .insert(hb.node.clone(), (hb.counter, now, hb.renew_time.clone()));
                }
            }
        }
    }

    /// When the node's heartbeat last changed (or the grace start).
    pub fn last_seen(&self, node: &str) -> Instant {
        self.seen.get(node).map(|s| s.1).unwrap_or(self.started)
    }

    /// Phase changes for every tunnel. `eligible` are the gateway-eligible
    /// nodes (only they heartbeat); other nodes are Ready once their tunnel
    /// is registered.
    pub fn changes(
        &self,
        view: &ClusterView,
        eligible: &BTreeSet<String>,
        now: Instant,
        timeout: Duration,
    ) -> Vec<TunnelChange> {
        let mut out = Vec::new();
        for t in &view.tunnels {
            let node = t.metadata.name.clone().unwrap_or_default();
            let st = t.status.clone().unwrap_or_default();
            let registered = !st.tunnel.ipv4.is_empty() || !st.tunnel.ipv6.is_empty();
            let seen = self.seen.get(&node);
            let to = if view.node(&node).is_some_and(|n| !n.ready) {
                TunnelPhase::NodeNotReady
            } else if !registered {
                TunnelPhase::Pending
            } else if !eligible.contains(&node) {
                TunnelPhase::Ready
            } else if now.duration_since(self.last_seen(&node)) > timeout {
                TunnelPhase::HeartbeatTimeout
            } else if self.probe_down.contains(&node) {
                TunnelPhase::Failed
            } else if seen.is_some() || st.phase == TunnelPhase::Ready {
                TunnelPhase::Ready
            } else {
                TunnelPhase::Init
            };
            if to != st.phase {
                out.push(TunnelChange {
                    node,
                    from: st.phase,
                    to,
                    last_heartbeat: seen.map(|s| s.2.clone()),
                });
            }
        }
        out
    }
}
