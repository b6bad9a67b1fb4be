//! What every node's desired state shares, computed once per view, and the
//! cache that keeps it while only pods change: an agent then recomputes
//! its own pods' rules and nothing that grows with the cluster.

use std::cell::OnceCell;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;

use super::gateways::{gateway_parts, grant_block_size, node_blocks, GatewayParts};
use super::{
    covered, endpoint_of, host, pending, policy_ids, AgentConfig, ClusterCidrs, MatchRule,
    NodeDesired, PolicyTarget, RuleAction,
};
use crate::api::TunnelPhase;
use crate::datastore::{Kind, ObjectKey};
use crate::validate::parse_cidr;
use crate::view::{ClusterView, Generations, PolicyIndex, PolicyView};

/// What [`Prepared`] derives from every kind but pods and the tunnels'
/// grants. It owns its data, so it can outlive the view it came from (see
/// [`PreparedCache`]).
struct Parts {
    /// Precedence order: position -> index into the view's
    /// `policy_views_as_stored`.
    order: Vec<usize>,
    index: PolicyIndex,
    /// Policy position (in `order`) -> id, for active policies.
    active: BTreeMap<usize, u32>,
    /// Every position's id and precedence rank.
    ids: Vec<u32>,
    ranks: Vec<i32>,
    targets: BTreeMap<u32, PolicyTarget>,
    cluster_cidrs: ClusterCidrs,
}

/// What [`Prepared`] derives from the gateways, nodes and tunnels with
/// their grants: rebuilt alone when only grants changed (a grant anywhere
/// in the cluster changes every gateway candidate's reply steering, and
/// the rest of the parts grows with the number of policies).
struct GrantParts {
    gateways: Vec<GatewayParts>,
    /// See [`NodeDesired::port_block_size`].
    block_size: u16,
}

impl GrantParts {
    fn new(view: &ClusterView) -> Self {
        Self {
            gateways: gateway_parts(view),
            block_size: grant_block_size(view),
        }
    }
}

/// The view, its policies in order of precedence, and the [`Parts`]
/// (useful when one process computes many nodes, as the benchmark does).
pub struct Prepared<'a> {
    view: &'a ClusterView,
    /// Position (in `parts.order`) -> its policy's view, made when first
    /// read: a node reads the few its pods select, and making all of them
    /// on every pass was half of an agent's CPU per change at 5,000
    /// policies.
    views: Vec<OnceCell<PolicyView<'a>>>,
    parts: Arc<Parts>,
    grants: Arc<GrantParts>,
}

/// Keeps the [`Parts`] of the last view for as long as no kind but pods
/// and grants changed, and its [`GrantParts`] while no grant changed
/// either (by the view's [`Generations`]).
#[derive(Default)]
pub struct PreparedCache {
    marks: Generations,
    parts: Option<(Arc<Parts>, Arc<GrantParts>)>,
    reused: u64,
    /// Rebuilds after the first, by the kind whose mark moved (several
    /// kinds count once each): what keeps the parts from serving.
    /// `grants` alone counts the rebuilds of the grant parts only.
    rebuilt_by: BTreeMap<&'static str, u64>,
}

impl PreparedCache {
    /// The prepared view, from the kept parts when they still hold.
    pub fn prepare<'a>(&mut self, view: &'a ClusterView) -> Prepared<'a> {
        let marks = view.generations;
        let kept = self
            .parts
            .as_mut()
            .filter(|_| marks.known() && marks.same_but_grants(&self.marks));
        if let Some((parts, grants)) = kept {
            if marks.grants != self.marks.grants {
                *grants = Arc::new(GrantParts::new(view));
                *self.rebuilt_by.entry("grants").or_default() += 1;
                self.marks = marks;
            }
            let views = unmade(parts.order.len());
            self.reused += 1;
            return Prepared {
                view,
                views,
                parts: parts.clone(),
                grants: grants.clone(),
            };
        }
        if self.parts.is_some() {
            // Another kind moved too (or the parts would have served).
            for kind in marks
                .differing(&self.marks)
                .into_iter()
                .filter(|k| *k != "grants")
            {
                *self.rebuilt_by.entry(kind).or_default() += 1;
            }
        }
        let p = Prepared::new(view);
        self.marks = marks;
        self.parts = Some((p.parts.clone(), p.grants.clone()));
        p
    }

    /// How many times the kept parts served.
    pub fn reused(&self) -> u64 {
        self.reused
    }

    /// How many rebuilds each kind's change caused (see `rebuilt_by`).
    pub fn rebuilt_by(&self) -> &BTreeMap<&'static str, u64> {
        &self.rebuilt_by
    }
}

fn unmade<T>(n: usize) -> Vec<OnceCell<T>> {
    let mut v = Vec::with_capacity(n);
    v.resize_with(n, OnceCell::new);
    v
}

/// `views` rearranged so that position `i` holds `views[order[i]]`.
fn in_order<'a>(views: Vec<PolicyView<'a>>, order: &[usize]) -> Vec<PolicyView<'a>> {
    let mut slots: Vec<Option<PolicyView<'a>>> = views.into_iter().map(Some).collect();
    order
        .iter()
        .filter_map(|&i| slots.get_mut(i)?.take())
        .collect()
}

/// Cluster CIDRs the datastore knows: the nodes' pod CIDRs and addresses,
/// and every tunnel address.
fn known_cluster_cidrs(view: &ClusterView) -> ClusterCidrs {
    let mut cc = ClusterCidrs::default();
    for n in &view.nodes {
        cc.pods
            .extend(n.pod_cidrs.iter().filter_map(|c| parse_cidr(c).ok()));
        cc.nodes.extend(
            n.addresses
                .iter()
                .filter_map(|a| a.parse::<IpAddr>().ok())
                .map(host),
        );
    }
    for t in &view.tunnels {
        if let Some(s) = &t.status {
            for a in [
                &s.tunnel.ipv4,
                &s.tunnel.ipv6,
                &s.tunnel.parent.ipv4,
                &s.tunnel.parent.ipv6,
            ] {
                if let Ok(ip) = a.parse::<IpAddr>() {
                    cc.nodes.insert(host(ip));
                }
            }
        }
    }
    cc
}

/// (gateway, node, ipv4, ipv6) -> epoch of that assignment.
type Epochs<'a> = BTreeMap<(&'a str, &'a str, &'a str, &'a str), u64>;

/// The epoch of every assignment in the gateways' statuses.
fn assignment_epochs(view: &ClusterView) -> Epochs<'_> {
    let mut epochs = Epochs::new();
    for g in &view.gateways {
        let (Some(name), Some(st)) = (g.metadata.name.as_deref(), g.status.as_ref()) else {
            continue;
        };
        for n in &st.node_list {
            for e in &n.eips {
                epochs.insert(
                    (name, n.name.as_str(), e.ipv4.as_str(), e.ipv6.as_str()),
                    e.epoch,
                );
            }
        }
    }
    epochs
}

/// The active policies (index into `views` -> id) and their targets.
fn active_targets(
    view: &ClusterView,
    views: &[crate::view::PolicyView<'_>],
    ids: &BTreeMap<(Kind, ObjectKey), u32>,
    ranks: &[i32],
) -> (BTreeMap<usize, u32>, BTreeMap<u32, PolicyTarget>) {
    // Each node's tunnel endpoint, looked up once (not per policy).
    let endpoints: BTreeMap<&str, IpAddr> = view
        .tunnels
        .iter()
        .filter_map(|t| {
            let n = t.metadata.name.as_deref()?;
            Some((n, endpoint_of(t.status.as_ref()?)?))
        })
        .collect();
    let epochs = assignment_epochs(view);
    let mut active: BTreeMap<usize, u32> = BTreeMap::new();
    let mut targets = BTreeMap::new();
    for (vi, p) in views.iter().enumerate() {
        let Some(st) = p.status else { continue };
        let node = st.nodes.first().unwrap_or(&st.node);
        if node.is_empty() || (st.eip.ipv4.is_empty() && st.eip.ipv6.is_empty()) {
            continue;
        }
        // The target stays even while its gateway node is not Ready: until
        // the controller moves the EIP, the selected pods' traffic goes to
        // the old gateway (and is lost if it is dead) instead of leaving
        // with their own address (fail closed).
        let id = ids[&(p.kind, p.key.clone())];
        let gw = view
            .gateway_for(p.fields.gateway)
            .and_then(|g| g.metadata.name.as_deref())
            .unwrap_or_default();
        let (v4, v6) = if p.fields.egress_ip.use_node_ip {
            ("", "")
        } else {
            (st.eip.ipv4.as_str(), st.eip.ipv6.as_str())
        };
        targets.insert(
            id,
            PolicyTarget {
                kind: p.kind,
                key: p.key.clone(),
                eip_v4: st.eip.ipv4.parse().ok(),
                eip_v6: st.eip.ipv6.parse().ok(),
                gateway_node: node.clone(),
                tunnel_endpoint: endpoints.get(node.as_str()).copied(),
                spread: st
                    .nodes
                    .iter()
                    .map(|n| (n.clone(), endpoints.get(n.as_str()).copied()))
                    .collect(),
                local: false,
                use_node_ip: p.fields.egress_ip.use_node_ip,
                epoch: epochs
                    .get(&(gw, node.as_str(), v4, v6))
                    .copied()
                    .unwrap_or(0),
                rank: ranks[vi],
                excluded: pending::cidrs(p.fields.excluded_subnet),
            },
        );
        active.insert(vi, id);
    }
    (active, targets)
}

impl<'a> Prepared<'a> {
    pub fn new(view: &'a ClusterView) -> Self {
        let stored = view.policy_views_as_stored();
        let mut order: Vec<usize> = (0..stored.len()).collect();
        order.sort_by(|&a, &b| stored[a].precedence().cmp(&stored[b].precedence()));
        let views = in_order(stored, &order);
        let ids = policy_ids(views.iter().map(|p| (p.kind, &p.key)));
        let ranks = pending::precedence_ranks(&views);
        let (active, targets) = active_targets(view, &views, &ids, &ranks);
        let index = PolicyIndex::new(&views);
        let ids = views
            .iter()
            .map(|p| ids[&(p.kind, p.key.clone())])
            .collect();
        let parts = Parts {
            order,
            index,
            active,
            ids,
            ranks,
            targets,
            cluster_cidrs: known_cluster_cidrs(view),
        };
        Self {
            view,
            views: views.into_iter().map(OnceCell::from).collect(),
            parts: Arc::new(parts),
            grants: Arc::new(GrantParts::new(view)),
        }
    }

    /// The view of the policy at position `pos` of the precedence order.
    fn view_at(&self, pos: usize) -> &PolicyView<'a> {
        self.views[pos].get_or_init(|| {
            self.view
                .policy_view_as_stored(self.parts.order[pos])
                .expect("the order covers the view's policies")
        })
    }

    /// The desired dataplane of `cfg.node`.
    pub fn node(&self, cfg: &AgentConfig) -> NodeDesired {
        let me = cfg.node.as_str();
        let parts = &*self.parts;
        let mut out = NodeDesired {
            node: me.into(),
            cluster_cidrs: parts.cluster_cidrs.clone(),
            port_block_size: self.grants.block_size,
            ..Default::default()
        };
        let cc = &mut out.cluster_cidrs;
        cc.pods.extend(cfg.pod_cidrs.iter().copied());
        cc.services.extend(cfg.service_cidrs.iter().copied());
        cc.extra.extend(cfg.extra_cidrs.iter().copied());
        out.rules = self.local_rules(me);
        out.policies = self.targets_of(&out.rules, me);
        let policies = pending::Policies {
            view: self.view,
            at: &|pos| self.view_at(pos),
            index: &parts.index,
            active: &parts.active,
            ids: &parts.ids,
            ranks: &parts.ranks,
        };
        out.pending = pending::pending_on(&policies, me);
        self.add_gateway_parts(me, &mut out);
        out
    }

    /// The targets of the policies `rules` send through, as node `me` sees
    /// them (only those: a node's maps hold no other policy).
    fn targets_of(&self, rules: &[MatchRule], me: &str) -> BTreeMap<u32, PolicyTarget> {
        let ids = rules.iter().filter_map(|r| match r.action {
            RuleAction::Egress(id) => Some(id),
            RuleAction::Skip => None,
        });
        let mut out = BTreeMap::new();
        for id in ids {
            out.entry(id).or_insert_with(|| {
                let mut t = self.parts.targets[&id].clone();
                t.local = t.gateway_node == me || t.spread.iter().any(|(n, _)| n == me);
                t
            });
        }
        out
    }

    /// Match rules for the pods on node `me`, per source address in order
    /// of precedence: a destination a policy took is not another's.
    fn local_rules(&self, me: &str) -> Vec<MatchRule> {
        let view = self.view;
        let (index, active, policies) =
            (&self.parts.index, &self.parts.active, &self.parts.targets);
        let mut rules = BTreeSet::new();
        for pod in view.pods_on(me) {
            let nsl = view.namespace_labels(&pod.namespace);
            for src in pod.ips.iter().filter_map(|s| s.parse::<IpAddr>().ok()) {
                let mut taken: Vec<IpNet> = Vec::new();
                for vi in index.selecting_by(pod, |vi| self.view_at(vi).selects(pod, &nsl)) {
                    let Some(id) = active.get(&vi) else {
                        continue;
                    };
                    let t = &policies[id];
                    let has_eip = match src {
                        IpAddr::V4(_) => t.eip_v4.is_some(),
                        IpAddr::V6(_) => t.eip_v6.is_some(),
                    };
                    if !has_eip {
                        continue;
                    }
                    let mine = policy_rules(self.view_at(vi), *id, src, &taken);
                    for (dst, action) in mine {
                        taken.push(dst);
                        rules.insert(MatchRule { src, dst, action });
                    }
                }
            }
        }
        rules.into_iter().collect()
    }

    /// Port blocks, reply steering and owned EIPs of node `me`.
    fn add_gateway_parts(&self, me: &str, out: &mut NodeDesired) {
        for g in &self.grants.gateways {
            out.gateway_eligible |= g.eligible.contains(me);
            for (eip, ranges) in node_blocks(self.view, &g.name, me) {
                out.port_blocks.entry(eip).or_default().extend(ranges);
            }
            if g.eligible.contains(me) {
                let steering = g.steering(self.view);
                if out.reply_steering.is_empty() {
                    // One gateway (the usual case): shared, not copied.
                    out.reply_steering = steering.clone();
                } else {
                    Arc::make_mut(&mut out.reply_steering)
                        .extend(steering.iter().map(|(k, v)| (*k, *v)));
                }
            }
            if self.view.phase(me) == TunnelPhase::Ready {
                if let Some(owned) = g.owned.get(me) {
                    out.owned_eips
                        .extend(owned.iter().map(|(k, v)| (*k, v.clone())));
                }
            }
        }
        for v in out.port_blocks.values_mut() {
            v.sort();
        }
    }
}

/// What policy `p` (id `id`) adds for source `src` where the prefixes
/// `taken` belong to policies with precedence: its excluded subnets
/// (skipped), then its destinations (or everything of the family).
fn policy_rules(
    p: &crate::view::PolicyView<'_>,
    id: u32,
    src: IpAddr,
    taken: &[IpNet],
) -> Vec<(IpNet, RuleAction)> {
    let fam = |n: &IpNet| n.addr().is_ipv6() == src.is_ipv6();
    let mut mine: Vec<(IpNet, RuleAction)> = Vec::new();
    for ex in p
        .fields
        .excluded_subnet
        .iter()
        .filter_map(|c| parse_cidr(c).ok())
        .filter(fam)
    {
        if !covered(taken, &ex) {
            mine.push((ex, RuleAction::Skip));
        }
    }
    let dsts: Vec<IpNet> = if p.fields.dest_subnet.is_empty() {
        vec![if src.is_ipv6() {
            "::/0".parse().unwrap()
        } else {
            "0.0.0.0/0".parse().unwrap()
        }]
    } else {
        p.fields
            .dest_subnet
            .iter()
            .filter_map(|c| parse_cidr(c).ok())
            .filter(fam)
            .collect()
    };
    for d in dsts {
        if !covered(taken, &d) {
            mine.push((d, RuleAction::Egress(id)));
        }
    }
    mine
}
