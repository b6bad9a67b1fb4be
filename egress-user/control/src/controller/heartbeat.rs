//! The controller's side of the heartbeat monitor: what it read (the
//! heartbeats, the cluster view) as the monitor's inputs. The rules are
//! `egress_failover::monitor`'s, the one phase model.

use std::collections::BTreeSet;
use std::time::Duration;

use egress_failover::monitor::{HeartbeatMonitor, PhaseChange, TunnelFacts};
use tokio::time::Instant;

use crate::datastore::Heartbeat;

use crate::view::ClusterView;

/// Notes every heartbeat read at `now` (the controller's clock).
pub fn observe(monitor: &mut HeartbeatMonitor, heartbeats: &[Heartbeat], now: Instant) {
    for hb in heartbeats {
        monitor.observe(&hb.node, hb.counter, &hb.renew_time, now.into_std());
    }
}

/// When the node's heartbeat last changed (the monitor's start if never).
pub fn last_seen(monitor: &HeartbeatMonitor, node: &str) -> Instant {
    Instant::from_std(monitor.last_seen(node))
}

/// What the monitor needs of every tunnel in `view`. `eligible` are the
/// gateway-eligible nodes (only they heartbeat).
fn tunnel_facts<'a>(
    view: &'a ClusterView,
    eligible: &'a BTreeSet<String>,
) -> impl Iterator<Item = TunnelFacts<'a>> {
    view.tunnels.iter().map(move |t| {
        let node = t.metadata.name.as_deref().unwrap_or_default();
        let st = t.status.as_ref();
        TunnelFacts {
            node,
            phase: st.map(|s| s.phase).unwrap_or_default(),
            node_ready: view.node(node).is_none_or(|n| n.ready),
            registered: st.is_some_and(|s| !s.tunnel.ipv4.is_empty() || !s.tunnel.ipv6.is_empty()),
            eligible: eligible.contains(node),
        }
    })
}

/// The phase changes of every tunnel in `view` at `now`.
pub fn changes(
    monitor: &HeartbeatMonitor,
    view: &ClusterView,
    eligible: &BTreeSet<String>,
    now: Instant,
    timeout: Duration,
) -> Vec<PhaseChange> {
    monitor.changes(tunnel_facts(view, eligible), now.into_std(), timeout)
}
