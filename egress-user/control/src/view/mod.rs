//! The cluster as the controller and the agents see it: plain decoded
//! data ([`ClusterView`]) and the policy index over it. Built from the
//! datastore by [`load_view`] / [`load_kinds`], or kept current from
//! watches by the controller's `ViewCache`, both through [`put`].

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use ipnet::IpNet;

use crate::api::*;
use crate::datastore::{Kind, ObjectKey};
use crate::validate::{parse_cidr, PolicyFields};

mod load;
mod pods;
mod put;

pub use load::{load_kinds, load_view};
pub(crate) use put::{meta_is, put, Put};

/// Everything the controller and the agents look at, decoded.
#[derive(Clone, Debug, Default)]
pub struct ClusterView {
    pub gateways: Vec<EgressGateway>,
    pub policies: Vec<EgressPolicy>,
    pub cluster_policies: Vec<EgressClusterPolicy>,
    pub tunnels: Vec<EgressTunnel>,
    pub nodes: Vec<NodeRecord>,
    /// Changed through [`put`] and the view cache (which keep
    /// `pod_index` with it); read directly or by [`ClusterView::pods_on`].
    pub pods: Vec<PodRecord>,
    pub(crate) pod_index: pods::PodIndex,
    pub namespaces: Vec<NamespaceRecord>,
    /// When each kind last changed (see [`Generations`]).
    pub generations: Generations,
}

/// Marks of when each kind of a view last changed, so work derived from
/// the kinds other than pods can be kept while only pods change. Each mark
/// is a fresh value of one process-wide counter, so no two views (a view
/// and the one a new list built) share one. 0 means never marked: a view
/// built by hand, which no cache may trust.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Generations {
    pub gateways: u64,
    pub policies: u64,
    pub tunnels: u64,
    /// The tunnels' port-block grants: moved alone when nothing else of a
    /// tunnel changed, so what derives from tunnels but not from their
    /// grants can be kept (see [`Generations::touch_grants`]).
    pub grants: u64,
    pub nodes: u64,
    pub namespaces: u64,
}

static NEXT_GENERATION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl Generations {
    /// Marks `kind` as changed (pods are not tracked). A tunnel's change
    /// may be one of its grants too.
    pub fn touch(&mut self, kind: Kind) {
        let g = next_generation();
        match kind {
            Kind::EgressGateway => self.gateways = g,
            Kind::EgressPolicy | Kind::EgressClusterPolicy => self.policies = g,
            Kind::EgressTunnel => {
                self.tunnels = g;
                self.grants = g;
            }
            Kind::Node => self.nodes = g,
            Kind::Namespace => self.namespaces = g,
            Kind::Pod => {}
        }
    }

    /// Marks the tunnels' grants alone as changed: a tunnel whose other
    /// fields are as they were.
    pub fn touch_grants(&mut self) {
        self.grants = next_generation();
    }

    /// Marks every kind (a fresh list).
    pub fn touch_all(&mut self) {
        for k in Kind::ALL {
            self.touch(k);
        }
    }

    /// The kinds whose marks differ between `self` and `other`.
    pub fn differing(&self, other: &Generations) -> Vec<&'static str> {
        [
            ("gateways", self.gateways, other.gateways),
            ("policies", self.policies, other.policies),
            ("tunnels", self.tunnels, other.tunnels),
            ("grants", self.grants, other.grants),
            ("nodes", self.nodes, other.nodes),
            ("namespaces", self.namespaces, other.namespaces),
        ]
        .into_iter()
        .filter(|(_, a, b)| a != b)
        .map(|(k, _, _)| k)
        .collect()
    }

    /// Every kind has a mark.
    pub fn known(&self) -> bool {
        [
            self.gateways,
            self.policies,
            self.tunnels,
            self.grants,
            self.nodes,
            self.namespaces,
        ]
        .iter()
        .all(|g| *g != 0)
    }

    /// Equal but perhaps for the grants' mark.
    pub fn same_but_grants(&self, other: &Generations) -> bool {
        Self {
            grants: other.grants,
            ..*self
        } == *other
    }
}

fn next_generation() -> u64 {
    NEXT_GENERATION.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Which gateways count for [`ClusterView::is_gateway_candidate`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gateways {
    /// Every gateway: the controller monitors a candidate's heartbeat as
    /// soon as a selector picks it.
    All,
    /// Only those the controller has given a status: an agent heartbeats,
    /// and holds reply steering, for those.
    WithStatus,
}

/// One policy of either kind, in the shape the reconcilers use.
#[derive(Clone, Debug)]
pub struct PolicyView<'a> {
    pub kind: Kind,
    pub key: ObjectKey,
    pub fields: PolicyFields<'a>,
    pub priority: i64,
    /// Creation time in nanoseconds (objects without one count as newest).
    pub created: i128,
    pub status: Option<&'a EgressPolicyStatus>,
}

impl PolicyView<'_> {
    pub fn policy_ref(&self) -> PolicyRef {
        PolicyRef {
            name: self.key.name.clone(),
            namespace: self.key.namespace.clone(),
        }
    }

    /// Order of precedence: lower priority first, then older, then by name.
    pub fn precedence(&self) -> (i64, i128, Kind, &ObjectKey) {
        (self.priority, self.created, self.kind, &self.key)
    }

    /// True when the policy applies to `pod` (labels, subnet, namespace).
    pub fn selects(&self, pod: &PodRecord, ns_labels: &BTreeMap<String, String>) -> bool {
        if self.kind == Kind::EgressPolicy && pod.namespace != self.key.namespace {
            return false;
        }
        if let Some(nsel) = self.fields.namespace_selector {
            if !nsel.matches(ns_labels) {
                return false;
            }
        }
        if let Some(sel) = self.fields.pod_selector {
            return sel.matches(&pod.labels);
        }
        if !self.fields.pod_subnet.is_empty() {
            let nets: Vec<IpNet> = self
                .fields
                .pod_subnet
                .iter()
                .filter_map(|s| parse_cidr(s).ok())
                .collect();
            return pod
                .ips
                .iter()
                .filter_map(|s| s.parse::<IpAddr>().ok())
                .any(|ip| nets.iter().any(|n| n.contains(&ip)));
        }
        false
    }
}

fn created(meta: &kube::core::ObjectMeta) -> i128 {
    meta.creation_timestamp
        .as_ref()
        .map(|t| t.0.as_nanosecond())
        .unwrap_or(i128::MAX)
}

impl ClusterView {
    /// The pods on `node`, in view order.
    pub fn pods_on<'a>(&'a self, node: &str) -> impl Iterator<Item = &'a PodRecord> + 'a {
        pods::on_node(&self.pods, &self.pod_index, node)
    }

    /// The pod `namespace`/`name`.
    pub fn pod(&self, namespace: &str, name: &str) -> Option<&PodRecord> {
        pods::find(&self.pods, &self.pod_index, namespace, name)
    }

    /// The pods with their index, to change them.
    pub(crate) fn pods_mut(&mut self) -> pods::Pods<'_> {
        pods::Pods {
            list: &mut self.pods,
            index: &mut self.pod_index,
        }
    }

    /// Both policy kinds in one list, in order of precedence.
    pub fn policy_views(&self) -> Vec<PolicyView<'_>> {
        let mut v = self.policy_views_as_stored();
        v.sort_by(|a, b| a.precedence().cmp(&b.precedence()));
        v
    }

    /// Both policy kinds in one list, namespaced ones first, each in the
    /// order the view holds them.
    pub fn policy_views_as_stored(&self) -> Vec<PolicyView<'_>> {
        let n = self.policies.len() + self.cluster_policies.len();
        (0..n)
            .filter_map(|i| self.policy_view_as_stored(i))
            .collect()
    }

    /// The `i`th of [`ClusterView::policy_views_as_stored`], alone (a
    /// node's state reads a few of thousands).
    pub fn policy_view_as_stored(&self, i: usize) -> Option<PolicyView<'_>> {
        if let Some(p) = self.policies.get(i) {
            return Some(PolicyView {
                kind: Kind::EgressPolicy,
                key: ObjectKey::namespaced(
                    p.metadata.namespace.clone().unwrap_or_default(),
                    p.metadata.name.clone().unwrap_or_default(),
                ),
                fields: (&p.spec).into(),
                priority: p.spec.priority.unwrap_or(DEFAULT_PRIORITY),
                created: created(&p.metadata),
                status: p.status.as_ref(),
            });
        }
        let p = self.cluster_policies.get(i - self.policies.len())?;
        Some(PolicyView {
            kind: Kind::EgressClusterPolicy,
            key: ObjectKey::cluster(p.metadata.name.clone().unwrap_or_default()),
            fields: (&p.spec).into(),
            priority: p.spec.priority.unwrap_or(DEFAULT_PRIORITY),
            created: created(&p.metadata),
            status: p.status.as_ref(),
        })
    }

    pub fn namespace_labels(&self, ns: &str) -> BTreeMap<String, String> {
        NamespaceRecord::effective_labels(ns, self.namespaces.iter().find(|n| n.name == ns))
    }

    pub fn tunnel(&self, node: &str) -> Option<&EgressTunnel> {
        self.tunnels
            .iter()
            .find(|t| t.metadata.name.as_deref() == Some(node))
    }

    pub fn node(&self, name: &str) -> Option<&NodeRecord> {
        self.nodes.iter().find(|n| n.name == name)
    }

    /// Phase of a node's tunnel; a node without tunnel is Pending, a node
    /// that is not Ready is NodeNotReady.
    pub fn phase(&self, node: &str) -> TunnelPhase {
        if self.node(node).is_some_and(|n| !n.ready) {
            return TunnelPhase::NodeNotReady;
        }
        self.tunnel(node)
            .and_then(|t| t.status.as_ref())
            .map(|s| s.phase)
            .unwrap_or(TunnelPhase::Pending)
    }

    /// A node's underlay address of the given family: the tunnel's, else the
    /// first node address.
    pub fn node_ip(&self, node: &str, v6: bool) -> Option<IpAddr> {
        let from_tunnel = self
            .tunnel(node)
            .and_then(|t| t.status.as_ref())
            .and_then(|s| {
                let t = if v6 { &s.tunnel.ipv6 } else { &s.tunnel.ipv4 };
                t.parse::<IpAddr>().ok()
            });
        from_tunnel.or_else(|| {
            self.node(node)?
                .addresses
                .iter()
                .filter_map(|a| a.parse::<IpAddr>().ok())
                .find(|a| a.is_ipv6() == v6)
        })
    }

    /// Whether some gateway's node selector picks `node`, among `which`
    /// gateways: the one rule for who is a gateway candidate.
    pub fn is_gateway_candidate(&self, node: &NodeRecord, which: Gateways) -> bool {
        self.gateways.iter().any(|g| {
            (which == Gateways::All || g.status.is_some())
                && g.spec.node_selector.selector.matches(&node.labels)
        })
    }

    /// The names of the nodes [`Self::is_gateway_candidate`] picks.
    pub fn gateway_candidates(&self, which: Gateways) -> std::collections::BTreeSet<String> {
        self.nodes
            .iter()
            .filter(|n| self.is_gateway_candidate(n, which))
            .map(|n| n.name.clone())
            .collect()
    }

    /// The gateway a policy uses: the named one, or the oldest cluster default.
    pub fn gateway_for(&self, name: &str) -> Option<&EgressGateway> {
        if !name.is_empty() {
            return self
                .gateways
                .iter()
                .find(|g| g.metadata.name.as_deref() == Some(name));
        }
        self.gateways
            .iter()
            .filter(|g| g.spec.cluster_default)
            .min_by_key(|g| (created(&g.metadata), g.metadata.name.clone()))
    }
}

pub(crate) fn gateway_created(g: &EgressGateway) -> i128 {
    created(&g.metadata)
}

/// Finds the policies that select a pod without testing every policy:
/// policies with `matchLabels` are indexed by their first label.
#[derive(Debug)]
pub struct PolicyIndex {
    /// label key -> label value -> policies whose selector asks for it
    /// (looked up by `&str`: no allocation per pod).
    by_label: HashMap<String, HashMap<String, Vec<usize>>>,
    rest: Vec<usize>,
}

impl PolicyIndex {
    /// `views` in order of precedence (as [`ClusterView::policy_views`] gives them).
    pub fn new(views: &[PolicyView<'_>]) -> Self {
        let mut by_label: HashMap<String, HashMap<String, Vec<usize>>> = HashMap::new();
        let mut rest = Vec::new();
        for (i, p) in views.iter().enumerate() {
            match p
                .fields
                .pod_selector
                .and_then(|s| s.match_labels.iter().next())
            {
                Some((k, v)) => by_label
                    .entry(k.clone())
                    .or_default()
                    .entry(v.clone())
                    .or_default()
                    .push(i),
                None => rest.push(i),
            }
        }
        Self { by_label, rest }
    }

    /// Indices (into `views`, ascending = precedence order) of the policies
    /// that select `pod`.
    pub fn selecting(
        &self,
        views: &[PolicyView<'_>],
        pod: &PodRecord,
        ns_labels: &BTreeMap<String, String>,
    ) -> Vec<usize> {
        self.selecting_by(pod, |i| views[i].selects(pod, ns_labels))
    }

    /// [`PolicyIndex::selecting`] where `selects(i)` says whether the
    /// policy at index `i` selects the pod (asked only of the candidates).
    pub fn selecting_by(&self, pod: &PodRecord, selects: impl Fn(usize) -> bool) -> Vec<usize> {
        let mut out: Vec<usize> = self.rest.clone();
        for (k, v) in &pod.labels {
            if let Some(l) = self.by_label.get(k).and_then(|vs| vs.get(v)) {
                out.extend(l);
            }
        }
        out.sort_unstable();
        out.dedup();
        out.retain(|&i| selects(i));
        out
    }
}
