//! A node's desired dataplane as a pure function of the datastore view.
//!
//! [`desired`] says what the BPF maps of one node should hold, in plain
//! `std::net` types; the datapath side maps it onto its own map types and
//! writes only the difference. Nothing here touches the kernel.
//!
//! Semantics:
//! - A policy is active when the controller gave it an EIP and a gateway
//!   node (`status.eip`, `status.node`). One that is not yet, but selects
//!   pods here, is listed in [`NodeDesired::pending`]: it fails closed, its
//!   pods' traffic to its destinations is dropped rather than sent with
//!   their own address (see `pending`).
//! - For each local pod, policies apply in order of precedence (lower
//!   `priority`, then the older object). A destination prefix already taken
//!   by a policy with precedence is not given to a later one; a broader
//!   prefix of a later policy still covers what is left (the LPM lookup
//!   picks the longer prefix, which belongs to the winner).
//! - Cluster CIDRs (pod CIDRs and addresses of every node, configured
//!   service and extra CIDRs) and each policy's `excludedSubnet` map to
//!   [`RuleAction::Skip`]: that traffic is never sent to a gateway.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

use crate::api::TunnelPhase;
use crate::datastore::{Kind, ObjectKey};
use crate::validate::parse_cidr;
use crate::view::{ClusterView, PolicyIndex};

mod pending;
pub use pending::{PendingPolicy, PendingReason};

/// What the agent knows that the datastore does not.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AgentConfig {
    /// This node's name.
    pub node: String,
    /// Service CIDRs (not visible from node records).
    pub service_cidrs: Vec<IpNet>,
    /// Anything else that must never go through a gateway.
    pub extra_cidrs: Vec<IpNet>,
    /// Pod CIDRs to add to those the node records carry.
    pub pod_cidrs: Vec<IpNet>,
}

/// Cluster CIDRs, by where they came from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterCidrs {
    pub pods: BTreeSet<IpNet>,
    pub services: BTreeSet<IpNet>,
    pub nodes: BTreeSet<IpNet>,
    pub extra: BTreeSet<IpNet>,
}

impl ClusterCidrs {
    pub fn all(&self) -> BTreeSet<IpNet> {
        self.pods
            .iter()
            .chain(&self.services)
            .chain(&self.nodes)
            .chain(&self.extra)
            .copied()
            .collect()
    }
}

/// Where one policy's traffic goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyTarget {
    pub kind: Kind,
    pub key: ObjectKey,
    pub eip_v4: Option<Ipv4Addr>,
    pub eip_v6: Option<Ipv6Addr>,
    /// The gateway node carrying the policy.
    pub gateway_node: String,
    /// That node's underlay tunnel endpoint (IPv4 preferred).
    pub tunnel_endpoint: Option<IpAddr>,
    /// The gateway node is this node: skip the tunnel.
    pub local: bool,
    pub use_node_ip: bool,
    /// Epoch of the EIP's current assignment.
    pub epoch: u64,
    /// Precedence rank among all policies (0 wins).
    pub rank: i32,
    /// Its `excludedSubnet`: never sent to a gateway.
    pub excluded: Vec<IpNet>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum RuleAction {
    /// Send through the policy with this id.
    Egress(u32),
    /// Leave untouched.
    Skip,
}

/// One policy-match entry: traffic from `src` to `dst`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct MatchRule {
    pub src: IpAddr,
    pub dst: IpNet,
    pub action: RuleAction,
}

/// An inclusive port range of a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PortRange {
    pub block: u16,
    pub first: u16,
    pub last: u16,
}

/// An EIP this node must announce (it is its current gateway node).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnedEip {
    pub gateway: String,
    pub epoch: u64,
}

/// Everything one node's maps should hold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeDesired {
    pub node: String,
    /// Policy id -> target (egress target map).
    pub policies: BTreeMap<u32, PolicyTarget>,
    /// Policy match entries for local pods, sorted.
    pub rules: Vec<MatchRule>,
    /// Policies not assigned yet that select local pods (they fail closed).
    pub pending: Vec<PendingPolicy>,
    pub cluster_cidrs: ClusterCidrs,
    /// This node's port blocks, per EIP (worker side).
    pub port_blocks: BTreeMap<IpAddr, Vec<PortRange>>,
    /// (EIP, block index) -> worker tunnel endpoint, for every EIP of every
    /// gateway this node is eligible for (held ahead of a takeover).
    pub reply_steering: BTreeMap<(IpAddr, u16), IpAddr>,
    /// EIPs this node announces (ARP/NDP or BGP), with their epoch.
    pub owned_eips: BTreeMap<IpAddr, OwnedEip>,
    /// This node is picked by some gateway's node selector.
    pub gateway_eligible: bool,
    /// Ports per block the controller grants with (0: no grant seen yet).
    /// A gateway node that holds no block itself still steers by it.
    pub port_block_size: u16,
}

/// A stable id for a policy: FNV-1a of its kind and key, never 0; on a
/// collision the later key (in sorted order) takes the next free value.
pub fn policy_ids<'a>(
    keys: impl IntoIterator<Item = (Kind, &'a ObjectKey)>,
) -> BTreeMap<(Kind, ObjectKey), u32> {
    let mut sorted: Vec<(Kind, ObjectKey)> =
        keys.into_iter().map(|(k, o)| (k, o.clone())).collect();
    sorted.sort();
    let mut used = BTreeSet::new();
    let mut out = BTreeMap::new();
    for (k, o) in sorted {
        let mut h: u32 = 0x811c9dc5;
        for b in format!("{}/{}/{}", k.name(), o.namespace, o.name).bytes() {
            h ^= b as u32;
            h = h.wrapping_mul(0x01000193);
        }
        let mut id = h.max(1);
        while !used.insert(id) {
            id = id.wrapping_add(1).max(1);
        }
        out.insert((k, o), id);
    }
    out
}

fn host(ip: IpAddr) -> IpNet {
    IpNet::from(ip)
}

fn covered(taken: &[IpNet], n: &IpNet) -> bool {
    taken.iter().any(|t| t.contains(n))
}

fn tunnel_endpoint(view: &ClusterView, node: &str) -> Option<IpAddr> {
    let t = view.tunnel(node)?.status.as_ref()?;
    t.tunnel
        .ipv4
        .parse()
        .ok()
        .or_else(|| t.tunnel.ipv6.parse().ok())
}

/// Whether `node` is a candidate of some gateway the controller has given a
/// status: such a node heartbeats (`NodeDesired::gateway_eligible`, read
/// without computing the rest).
pub fn gateway_eligible(view: &ClusterView, node: &str) -> bool {
    view.node(node).is_some_and(|n| {
        view.gateways
            .iter()
            .any(|g| g.status.is_some() && g.spec.node_selector.selector.matches(&n.labels))
    })
}

/// The desired dataplane of `cfg.node`.
pub fn desired(view: &ClusterView, cfg: &AgentConfig) -> NodeDesired {
    Prepared::new(view).node(cfg)
}

/// What every node's desired state shares, computed once per view (useful
/// when one process computes many nodes, as the benchmark does).
pub struct Prepared<'a> {
    view: &'a ClusterView,
    views: Vec<crate::view::PolicyView<'a>>,
    index: PolicyIndex,
    /// Policy index (into `views`) -> id, for active policies.
    active: BTreeMap<usize, u32>,
    /// Every view's id and precedence rank, by index.
    ids: Vec<u32>,
    ranks: Vec<i32>,
    targets: BTreeMap<u32, PolicyTarget>,
    cluster_cidrs: ClusterCidrs,
    gateways: Vec<GatewayParts>,
}

/// One gateway's status and the port blocks of its addresses, parsed once
/// per view.
struct GatewayParts {
    eligible: BTreeSet<String>,
    /// node -> EIP -> its blocks.
    blocks: BTreeMap<String, BTreeMap<IpAddr, Vec<PortRange>>>,
    steering: BTreeMap<(IpAddr, u16), IpAddr>,
    /// node -> EIPs it owns.
    owned: BTreeMap<String, BTreeMap<IpAddr, OwnedEip>>,
}

/// The block size of the grants in the view: any tunnel's (the controller
/// grants every block with one size), else any gateway's status.
fn grant_block_size(view: &ClusterView) -> u16 {
    let tunnels = view.tunnels.iter().filter_map(|t| t.status.as_ref());
    let gateways = view.gateways.iter().filter_map(|g| g.status.as_ref());
    tunnels
        .map(|s| s.port_block_size)
        .chain(gateways.map(|s| s.port_block_size))
        .find(|s| *s != 0)
        .unwrap_or(0)
}

fn gateway_parts(view: &ClusterView) -> Vec<GatewayParts> {
    let mut out = Vec::new();
    for g in &view.gateways {
        let Some(st) = &g.status else { continue };
        let gw_name = g.metadata.name.clone().unwrap_or_default();
        let mut parts = GatewayParts {
            eligible: view
                .nodes
                .iter()
                .filter(|n| g.spec.node_selector.selector.matches(&n.labels))
                .map(|n| n.name.clone())
                .collect(),
            blocks: BTreeMap::new(),
            steering: BTreeMap::new(),
            owned: BTreeMap::new(),
        };
        // The grants of this gateway's addresses, from every worker's
        // EgressTunnel (where the controller records them).
        for t in &view.tunnels {
            let (Some(node), Some(ts)) = (t.metadata.name.as_deref(), t.status.as_ref()) else {
                continue;
            };
            let size = ts.port_block_size.max(1) as u32;
            let endpoint = tunnel_endpoint(view, node);
            for b in ts.port_blocks.iter().filter(|b| b.gateway == gw_name) {
                let Ok(eip) = b.eip.parse::<IpAddr>() else {
                    continue;
                };
                if let Some(ep) = endpoint {
                    for &i in &b.blocks {
                        parts.steering.insert((eip, i), ep);
                    }
                }
                // The node chooses new flows' ports only in blocks that
                // are not draining; replies to every held block are
                // steered to it. None active and none refused: nothing to
                // choose from, and nothing to refuse either.
                let active: Vec<u16> = b
                    .blocks
                    .iter()
                    .copied()
                    .filter(|i| !b.draining.contains(i))
                    .collect();
                if active.is_empty() && !b.exhausted {
                    continue;
                }
                let ranges = parts
                    .blocks
                    .entry(node.to_string())
                    .or_default()
                    .entry(eip)
                    .or_default();
                ranges.extend(active.into_iter().map(|i| {
                    let first = (i as u32 * size).min(65535) as u16;
                    PortRange {
                        block: i,
                        first,
                        last: (first as u32 + size - 1).min(65535) as u16,
                    }
                }));
                ranges.sort();
            }
        }
        for n in &st.node_list {
            for e in &n.eips {
                // A useNodeIP unit has no addresses of its own: it is the
                // node's, as the controller grants its blocks.
                let addrs: Vec<IpAddr> = if e.ipv4.is_empty() && e.ipv6.is_empty() {
                    [false, true]
                        .into_iter()
                        .filter_map(|v6| view.node_ip(&n.name, v6))
                        .collect()
                } else {
                    [&e.ipv4, &e.ipv6]
                        .into_iter()
                        .filter_map(|a| a.parse().ok())
                        .collect()
                };
                for ip in addrs {
                    parts.owned.entry(n.name.clone()).or_default().insert(
                        ip,
                        OwnedEip {
                            gateway: gw_name.clone(),
                            epoch: e.epoch,
                        },
                    );
                }
            }
        }
        out.push(parts);
    }
    out
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
            Some((n, tunnel_endpoint(view, n)?))
        })
        .collect();
    let epochs = assignment_epochs(view);
    let mut active: BTreeMap<usize, u32> = BTreeMap::new();
    let mut targets = BTreeMap::new();
    for (vi, p) in views.iter().enumerate() {
        let Some(st) = p.status else { continue };
        if st.node.is_empty() || (st.eip.ipv4.is_empty() && st.eip.ipv6.is_empty()) {
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
                gateway_node: st.node.clone(),
                tunnel_endpoint: endpoints.get(st.node.as_str()).copied(),
                local: false,
                use_node_ip: p.fields.egress_ip.use_node_ip,
                epoch: epochs
                    .get(&(gw, st.node.as_str(), v4, v6))
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
        let views = view.policy_views();
        let ids = policy_ids(views.iter().map(|p| (p.kind, &p.key)));
        let ranks = pending::precedence_ranks(&views);
        let (active, targets) = active_targets(view, &views, &ids, &ranks);
        let index = PolicyIndex::new(&views);
        let ids = views
            .iter()
            .map(|p| ids[&(p.kind, p.key.clone())])
            .collect();
        Self {
            view,
            views,
            index,
            active,
            ids,
            ranks,
            targets,
            cluster_cidrs: known_cluster_cidrs(view),
            gateways: gateway_parts(view),
        }
    }

    /// The desired dataplane of `cfg.node`.
    pub fn node(&self, cfg: &AgentConfig) -> NodeDesired {
        let me = cfg.node.as_str();
        let mut out = NodeDesired {
            node: me.into(),
            policies: self.targets.clone(),
            cluster_cidrs: self.cluster_cidrs.clone(),
            port_block_size: grant_block_size(self.view),
            ..Default::default()
        };
        for t in out.policies.values_mut() {
            t.local = t.gateway_node == me;
        }
        let cc = &mut out.cluster_cidrs;
        cc.pods.extend(cfg.pod_cidrs.iter().copied());
        cc.services.extend(cfg.service_cidrs.iter().copied());
        cc.extra.extend(cfg.extra_cidrs.iter().copied());
        out.rules = self.local_rules(me, &out.policies);
        let policies = pending::Policies {
            view: self.view,
            views: &self.views,
            index: &self.index,
            active: &self.active,
            ids: &self.ids,
            ranks: &self.ranks,
        };
        out.pending = pending::pending_on(&policies, me);
        self.add_gateway_parts(me, &mut out);
        out
    }

    /// Match rules for the pods on node `me`, per source address in order
    /// of precedence: a destination a policy took is not another's.
    fn local_rules(&self, me: &str, policies: &BTreeMap<u32, PolicyTarget>) -> Vec<MatchRule> {
        let view = self.view;
        let mut rules = BTreeSet::new();
        for pod in view.pods.iter().filter(|p| p.node == me) {
            let nsl = view.namespace_labels(&pod.namespace);
            for src in pod.ips.iter().filter_map(|s| s.parse::<IpAddr>().ok()) {
                let mut taken: Vec<IpNet> = Vec::new();
                for vi in self.index.selecting(&self.views, pod, &nsl) {
                    let Some(id) = self.active.get(&vi) else {
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
                    let mine = policy_rules(&self.views[vi], *id, src, &taken);
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
        for g in &self.gateways {
            out.gateway_eligible |= g.eligible.contains(me);
            if let Some(b) = g.blocks.get(me) {
                for (eip, ranges) in b {
                    out.port_blocks
                        .entry(*eip)
                        .or_default()
                        .extend(ranges.iter().copied());
                }
            }
            if g.eligible.contains(me) {
                if out.reply_steering.is_empty() {
                    // One gateway (the usual case): a copy, not 10,000 inserts.
                    out.reply_steering = g.steering.clone();
                } else {
                    out.reply_steering
                        .extend(g.steering.iter().map(|(k, v)| (*k, *v)));
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

#[cfg(test)]
mod tests;
