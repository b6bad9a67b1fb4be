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

use crate::datastore::{Kind, ObjectKey};
use crate::view::ClusterView;

mod gateways;
mod pending;
mod prepared;
pub use pending::{PendingPolicy, PendingReason};
pub use prepared::{Prepared, PreparedCache};

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
    /// ActiveActive: every gateway node carrying the policy (sorted, the
    /// first is `gateway_node`) with its tunnel endpoint; workers spread
    /// flows over them. Empty in ActiveStandby.
    pub spread: Vec<(String, Option<IpAddr>)>,
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
    /// Held by several nodes at once (ActiveActive): announced by BGP
    /// only, never answered for by ARP/NDP.
    pub shared: bool,
}

/// (EIP, block index) -> the tunnel endpoint of the worker holding it.
pub type Steering = BTreeMap<(IpAddr, u16), IpAddr>;

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
    /// gateway this node is eligible for (held ahead of a takeover). Shared
    /// with the prepared view when one gateway picks the node (tens of
    /// thousands of entries at 1,000 nodes, the same for every candidate).
    pub reply_steering: std::sync::Arc<Steering>,
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

/// The tunnel endpoint a tunnel's status publishes.
fn endpoint_of(t: &crate::api::EgressTunnelStatus) -> Option<IpAddr> {
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
    view.node(node)
        .is_some_and(|n| view.is_gateway_candidate(n, crate::view::Gateways::WithStatus))
}

/// The desired dataplane of `cfg.node`.
pub fn desired(view: &ClusterView, cfg: &AgentConfig) -> NodeDesired {
    Prepared::new(view).node(cfg)
}

#[cfg(test)]
mod tests;
