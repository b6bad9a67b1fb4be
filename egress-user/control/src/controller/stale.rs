//! EgressTunnels of removed nodes. A node that leaves the cluster (scaled
//! down, replaced) leaves its EgressTunnel behind; the controller deletes
//! it once the node has been gone for a grace period. Not at once: a node
//! and its tunnel reach the view in either order (each kind is listed and
//! watched on its own), so a new node's tunnel may briefly have no node.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::view::ClusterView;

/// When each tunnel's node was first seen missing.
#[derive(Clone, Debug, Default)]
pub struct StaleTunnels {
    absent_since: BTreeMap<String, Instant>,
}

impl StaleTunnels {
    /// The tunnels (name, revision) whose node has been missing from the
    /// view for `grace` at `now`; forgets tunnels whose node came back.
    /// A view with no node at all deletes nothing: that is a datastore
    /// that lost its nodes (or a view that lacks them), not a cluster
    /// whose every node left.
    pub fn due(&mut self, view: &ClusterView, now: Instant, grace: Duration) -> Vec<(String, u64)> {
        if view.nodes.is_empty() {
            self.absent_since.clear();
            return Vec::new();
        }
        let nodes: std::collections::BTreeSet<&str> =
            view.nodes.iter().map(|n| n.name.as_str()).collect();
        let mut due = Vec::new();
        let mut missing = BTreeMap::new();
        for t in &view.tunnels {
            let Some(name) = t.metadata.name.as_deref() else {
                continue;
            };
            if nodes.contains(name) {
                continue;
            }
            let since = self.absent_since.get(name).copied().unwrap_or(now);
            missing.insert(name.to_string(), since);
            if now.duration_since(since) >= grace {
                let revision =
                    crate::datastore::parse_revision(t.metadata.resource_version.as_deref());
                due.push((name.to_string(), revision));
            }
        }
        self.absent_since = missing;
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{EgressTunnel, NodeRecord};
    use serde_json::json;

    fn view(nodes: &[&str], tunnels: &[&str]) -> ClusterView {
        ClusterView {
            nodes: nodes
                .iter()
                .map(|n| NodeRecord {
                    name: n.to_string(),
                    ..Default::default()
                })
                .collect(),
            tunnels: tunnels
                .iter()
                .map(|t| {
                    serde_json::from_value::<EgressTunnel>(json!({
                        "apiVersion": crate::api::API_VERSION, "kind": "EgressTunnel",
                        "metadata": {"name": t, "resourceVersion": "7"}, "spec": {}}))
                    .unwrap()
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn a_tunnel_goes_once_its_node_has_been_gone_for_the_grace_period() {
        let grace = Duration::from_secs(60);
        let t0 = Instant::now();
        let mut stale = StaleTunnels::default();
        let both = view(&["w1", "w2"], &["w1", "w2"]);
        assert!(stale.due(&both, t0, grace).is_empty());
        // w2's node is gone: not at once, after the grace period.
        let gone = view(&["w1"], &["w1", "w2"]);
        assert!(stale.due(&gone, t0, grace).is_empty());
        assert!(stale.due(&gone, t0 + grace / 2, grace).is_empty());
        assert_eq!(stale.due(&gone, t0 + grace, grace), [("w2".to_string(), 7)]);
        // A node that comes back in time keeps its tunnel, and its clock
        // starts again if it goes once more.
        let mut stale = StaleTunnels::default();
        assert!(stale.due(&gone, t0, grace).is_empty());
        assert!(stale.due(&both, t0 + grace / 2, grace).is_empty());
        assert!(stale.due(&gone, t0 + grace, grace).is_empty());
        assert_eq!(stale.due(&gone, t0 + 2 * grace, grace).len(), 1);
        // No node at all: nothing goes, however long.
        let mut stale = StaleTunnels::default();
        let none = view(&[], &["w1", "w2"]);
        assert!(stale.due(&none, t0, grace).is_empty());
        assert!(stale.due(&none, t0 + 10 * grace, grace).is_empty());
    }
}
