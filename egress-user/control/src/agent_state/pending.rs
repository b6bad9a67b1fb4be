//! Policies that select pods on a node but that the controller has not
//! given an EIP and a gateway node yet. They are not left out of the node's
//! maps: they fail closed (the datapath drops what they match, counted as
//! `no_gateway`) until they are assigned, so a selected pod never leaves
//! with its own address.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;

use crate::datastore::{Kind, ObjectKey};
use crate::validate::parse_cidr;
use crate::view::{ClusterView, PolicyIndex, PolicyView};

/// One such policy, with what it matches on this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PendingPolicy {
    pub id: u32,
    pub kind: Kind,
    pub key: ObjectKey,
    /// Precedence rank among all policies (0 wins).
    pub rank: i32,
    /// The local pods' addresses it selects, of the families it will get
    /// an EIP of.
    pub sources: Vec<IpAddr>,
    /// Its `destSubnet` as written (both families).
    pub destinations: Vec<IpNet>,
    pub excluded: Vec<IpNet>,
    pub reason: PendingReason,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PendingReason {
    NoEip,
    NoGatewayNode,
}

impl PendingReason {
    pub fn describe(self) -> &'static str {
        match self {
            Self::NoEip => "no EIP assigned yet",
            Self::NoGatewayNode => "no gateway node assigned yet",
        }
    }
}

/// The policy views' parts the computation reads, by view index.
pub(super) struct Policies<'v, 'a> {
    pub view: &'a ClusterView,
    /// View index -> its view.
    pub at: &'v dyn Fn(usize) -> &'v PolicyView<'a>,
    pub index: &'v PolicyIndex,
    /// View index -> id, of the assigned policies.
    pub active: &'v BTreeMap<usize, u32>,
    pub ids: &'v [u32],
    pub ranks: &'v [i32],
}

/// The pending policies that select a pod on `node`, in view order.
pub(super) fn pending_on(p: &Policies<'_, '_>, node: &str) -> Vec<PendingPolicy> {
    let mut sources: BTreeMap<usize, BTreeSet<IpAddr>> = BTreeMap::new();
    for pod in p.view.pods_on(node) {
        let nsl = p.view.namespace_labels(&pod.namespace);
        for vi in p
            .index
            .selecting_by(pod, |vi| (p.at)(vi).selects(pod, &nsl))
        {
            if p.active.contains_key(&vi) {
                continue;
            }
            let (v4, v6) = expected_families(p.view, (p.at)(vi));
            let ips = pod.ips.iter().filter_map(|s| s.parse::<IpAddr>().ok());
            let wanted = ips.filter(|ip| if ip.is_ipv4() { v4 } else { v6 });
            sources.entry(vi).or_default().extend(wanted);
        }
    }
    sources
        .into_iter()
        .filter(|(_, s)| !s.is_empty())
        .map(|(vi, s)| pending_policy(p, vi, s))
        .collect()
}

fn pending_policy(p: &Policies<'_, '_>, vi: usize, sources: BTreeSet<IpAddr>) -> PendingPolicy {
    let v = (p.at)(vi);
    let has_eip = v
        .status
        .is_some_and(|st| !st.eip.ipv4.is_empty() || !st.eip.ipv6.is_empty());
    PendingPolicy {
        id: p.ids[vi],
        kind: v.kind,
        key: v.key.clone(),
        rank: p.ranks[vi],
        sources: sources.into_iter().collect(),
        destinations: cidrs(v.fields.dest_subnet),
        excluded: cidrs(v.fields.excluded_subnet),
        reason: if has_eip {
            PendingReason::NoGatewayNode
        } else {
            PendingReason::NoEip
        },
    }
}

/// The CIDRs of a list that parse (validation reports the others).
pub(super) fn cidrs(list: &[String]) -> Vec<IpNet> {
    list.iter().filter_map(|c| parse_cidr(c).ok()).collect()
}

/// The address families a policy will get an EIP of: those asked for
/// explicitly and those its gateway has a pool of. A policy whose gateway
/// does not exist (or has no pool, or uses the node's address) is expected
/// to cover both.
fn expected_families(view: &ClusterView, p: &PolicyView<'_>) -> (bool, bool) {
    let e = p.fields.egress_ip;
    let (mut v4, mut v6) = (!e.ipv4.is_empty(), !e.ipv6.is_empty());
    if let Some(g) = view.gateway_for(p.fields.gateway) {
        if !e.use_node_ip {
            v4 |= !g.spec.ippools.ipv4.is_empty();
            v6 |= !g.spec.ippools.ipv6.is_empty();
        }
    }
    if !v4 && !v6 {
        (true, true)
    } else {
        (v4, v6)
    }
}

/// Each view's precedence rank (0 wins): lower `spec.priority`, then older.
pub(super) fn precedence_ranks(views: &[PolicyView<'_>]) -> Vec<i32> {
    let mut order: Vec<usize> = (0..views.len()).collect();
    order.sort_by(|&a, &b| views[a].precedence().cmp(&views[b].precedence()));
    let mut ranks = vec![0; views.len()];
    for (rank, vi) in order.into_iter().enumerate() {
        ranks[vi] = rank as i32;
    }
    ranks
}
