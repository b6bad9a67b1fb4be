//! The worker nodes of each policy's pods (for port-block demand), kept
//! from pass to pass: when only pods changed, only the nodes whose pods
//! changed are looked at again. Selecting over every pod of a large
//! cluster was a fifth of a pass at 50,000 pods.
//!
//! Grants are recorded in the worker's EgressTunnel: a node whose agent
//! has not registered it (no agent, no datapath) gets none.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::datastore::{Kind, ObjectKey};
use crate::view::{ClusterView, PolicyIndex, PolicyView};

/// The worker nodes of each policy that has or had some.
pub type WorkersOf = BTreeMap<(Kind, ObjectKey), BTreeSet<String>>;

/// The workers of every policy, and per node the policies with a pod there.
#[derive(Debug, Default)]
pub struct WorkersMemo {
    built: bool,
    of: WorkersOf,
    /// node -> indices (into the policies of the pass) of the policies
    /// selecting some pod on it.
    by_node: HashMap<String, BTreeSet<usize>>,
    /// The policies whose workers the last update changed.
    changed: BTreeSet<(Kind, ObjectKey)>,
    /// Over the same policies while the memo is kept.
    index: Option<PolicyIndex>,
}

impl WorkersMemo {
    /// The workers of `policies` in `view`. With `pod_nodes` (only the pods
    /// of those nodes changed since the last call, on the same policies),
    /// only those nodes are looked at again; without it, every pod.
    pub fn update(
        &mut self,
        view: &ClusterView,
        policies: &[PolicyView<'_>],
        pod_nodes: Option<&BTreeSet<String>>,
    ) {
        match pod_nodes.filter(|_| self.built) {
            Some(nodes) => self.update_nodes(view, policies, nodes),
            None => self.rebuild(view, policies),
        }
    }

    /// The workers of every policy, as the last update left them.
    pub fn of(&self) -> &WorkersOf {
        &self.of
    }

    /// The policies whose workers changed in the last update.
    pub fn changed(&self) -> &BTreeSet<(Kind, ObjectKey)> {
        &self.changed
    }

    /// Whether a pass built it (so a pass may update it by nodes).
    pub fn is_built(&self) -> bool {
        self.built
    }

    fn rebuild(&mut self, view: &ClusterView, policies: &[PolicyView<'_>]) {
        *self = Self {
            built: true,
            ..Self::default()
        };
        self.scan(view, policies, |_| true);
    }

    fn update_nodes(
        &mut self,
        view: &ClusterView,
        policies: &[PolicyView<'_>],
        nodes: &BTreeSet<String>,
    ) {
        self.changed.clear();
        if nodes.is_empty() {
            return;
        }
        for n in nodes {
            for i in self.by_node.remove(n).unwrap_or_default() {
                let key = (policies[i].kind, policies[i].key.clone());
                if let Some(w) = self.of.get_mut(&key) {
                    w.remove(n);
                    self.changed.insert(key);
                }
            }
        }
        self.scan(view, policies, |n| nodes.contains(n));
    }

    /// Adds the workers of the pods on the registered nodes `on` picks.
    fn scan(&mut self, view: &ClusterView, policies: &[PolicyView<'_>], on: impl Fn(&str) -> bool) {
        let registered = registered_nodes(view);
        let index = self
            .index
            .take()
            .unwrap_or_else(|| PolicyIndex::new(policies));
        let mut ns_labels: BTreeMap<&str, BTreeMap<String, String>> = BTreeMap::new();
        for pod in &view.pods {
            let node = pod.node.as_str();
            if node.is_empty() || pod.ips.is_empty() || !on(node) || !registered.contains(node) {
                continue;
            }
            let nsl = ns_labels
                .entry(pod.namespace.as_str())
                .or_insert_with(|| view.namespace_labels(&pod.namespace));
            let selecting = index.selecting(policies, pod, nsl);
            if selecting.is_empty() {
                continue;
            }
            if !self.by_node.contains_key(node) {
                self.by_node.insert(node.to_string(), BTreeSet::new());
            }
            let on_node = self.by_node.get_mut(node).expect("inserted above");
            for i in selecting {
                if !on_node.insert(i) {
                    continue;
                }
                let key = (policies[i].kind, policies[i].key.clone());
                self.of
                    .entry(key.clone())
                    .or_default()
                    .insert(node.to_string());
                self.changed.insert(key);
            }
        }
        self.index = Some(index);
    }
}

/// Nodes whose agent registered its tunnel (an address in its status).
fn registered_nodes(view: &ClusterView) -> BTreeSet<&str> {
    view.tunnels
        .iter()
        .filter(|t| {
            t.status
                .as_ref()
                .is_some_and(|s| !s.tunnel.ipv4.is_empty() || !s.tunnel.ipv6.is_empty())
        })
        .filter_map(|t| t.metadata.name.as_deref())
        .collect()
}
