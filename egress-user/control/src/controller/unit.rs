//! The unit of assignment (an EIP pair, or the node address of one
//! useNodeIP policy) and how a gateway's policies come to their units:
//! the explicit address, the one held before, the gateway's default or,
//! with the `rr` allocator, the least shared index of the pools.

use std::collections::BTreeMap;
use std::net::IpAddr;

use crate::api::{AllocatorPolicy, EgressGatewaySpec, PolicyRef};
use crate::validate::IpPool;
use crate::view::{ClusterView, PolicyView};

use super::conditions::policy_name;

/// The unit of assignment: an IPv4/IPv6 pair, or the node address of one
/// useNodeIP policy.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Unit {
    pub v4: String,
    pub v6: String,
    pub node_ip_of: Option<PolicyRef>,
}

impl Unit {
    /// What the events call it ("EIP 10.0.0.1").
    pub fn label(&self) -> String {
        match (&self.node_ip_of, self.v4.is_empty(), self.v6.is_empty()) {
            (Some(p), _, _) => format!("node IP of policy {}", policy_name(p)),
            (None, false, false) => format!("EIP {}/{}", self.v4, self.v6),
            (None, false, true) => format!("EIP {}", self.v4),
            _ => format!("EIP {}", self.v6),
        }
    }

    /// No address at all: the gateway has no pool for the policy.
    pub fn is_empty(&self) -> bool {
        self.node_ip_of.is_none() && self.v4.is_empty() && self.v6.is_empty()
    }

    /// Its EIPs (none for a node-IP unit).
    pub fn addresses(&self) -> impl Iterator<Item = &String> {
        [&self.v4, &self.v6].into_iter().filter(|a| !a.is_empty())
    }
}

/// Whether `node`'s agent asks to have `u` reconfirmed at `epoch`: one of
/// its addresses is in the node's `awaitingReconfirmation` at that epoch.
/// A request for an older epoch is already answered.
pub fn asks_reconfirmation(view: &ClusterView, node: &str, u: &Unit, epoch: u64) -> bool {
    let Some(asked) = view
        .tunnel(node)
        .and_then(|t| t.status.as_ref())
        .map(|s| &s.awaiting_reconfirmation)
    else {
        return false;
    };
    let ours = [&u.v4, &u.v6]
        .into_iter()
        .filter_map(|a| a.parse::<IpAddr>().ok())
        .collect::<Vec<_>>();
    asked
        .iter()
        .any(|r| r.epoch == epoch && r.eip.parse::<IpAddr>().is_ok_and(|ip| ours.contains(&ip)))
}

/// The policies of each unit, in order of precedence.
pub type Units<'p, 'v> = BTreeMap<Unit, Vec<&'p PolicyView<'v>>>;

/// A gateway's units as its policies take them, in order of precedence.
pub struct Allocation<'p, 'v> {
    pub units: Units<'p, 'v>,
    /// The unit each address is paired in: an address belongs to one only.
    addr_unit: BTreeMap<String, Unit>,
    /// How each index of the gateway's IPv4 and IPv6 pools is used so far:
    /// the `rr` choice scans them for every policy it places, so a scan
    /// must not parse or format an address (5,000 policies over a pool of
    /// 1,024 took seconds of a cold start that way).
    v4: PoolUse,
    v6: PoolUse,
}

/// One pool and, per index (the first [`RR_SCAN`]), how many policies use
/// the address (one or more: it is paired in a unit).
struct PoolUse {
    pool: IpPool,
    users: Vec<usize>,
}

/// How many indexes of a pool the `rr` choice looks at.
const RR_SCAN: u64 = 1 << 16;

impl PoolUse {
    fn new(pool: &IpPool) -> Self {
        let n = pool.len().min(RR_SCAN) as usize;
        Self {
            pool: pool.clone(),
            users: vec![0; n],
        }
    }

    fn users(&self, i: usize) -> usize {
        self.users.get(i).copied().unwrap_or(0)
    }

    /// Counts one more policy on `addr`, when it is one of the indexes
    /// scanned (an empty `addr`, a family the unit lacks, is none).
    fn take(&mut self, addr: &str) {
        let Some(i) = index_in(&self.pool, addr).and_then(|i| usize::try_from(i).ok()) else {
            return;
        };
        if let Some(n) = self.users.get_mut(i) {
            *n += 1;
        }
    }
}

impl<'p, 'v> Allocation<'p, 'v> {
    /// An empty allocation over a gateway's pools.
    pub fn new(v4: &IpPool, v6: &IpPool) -> Self {
        Self {
            units: Units::new(),
            addr_unit: BTreeMap::new(),
            v4: PoolUse::new(v4),
            v6: PoolUse::new(v6),
        }
    }

    /// The unit `p` asks for, given the units taken before it; empty when
    /// the gateway has no pool for it.
    pub fn choose(&self, p: &PolicyView<'_>, spec: &EgressGatewaySpec) -> Unit {
        let (v4, v6) = (&self.v4.pool, &self.v6.pool);
        let ei = p.fields.egress_ip;
        if ei.use_node_ip {
            return Unit {
                node_ip_of: Some(p.policy_ref()),
                ..Default::default()
            };
        }
        let prev_eip = p.status.map(|s| s.eip.clone()).unwrap_or_default();
        let policy = ei.allocator_policy;
        let mut i4 = pick(
            v4,
            &ei.ipv4,
            &spec.ippools.ipv4_default_eip,
            &prev_eip.ipv4,
            policy,
        );
        let mut i6 = pick(
            v6,
            &ei.ipv6,
            &spec.ippools.ipv6_default_eip,
            &prev_eip.ipv6,
            policy,
        );
        let open4 = i4.is_none() && !v4.is_empty();
        let open6 = i6.is_none() && !v6.is_empty();
        if policy == AllocatorPolicy::Rr && (open4 || open6) {
            let i = self.least_shared(open4, open6);
            if open4 {
                i4 = Some(i.min(v4.len() as u128 - 1));
            }
            if open6 {
                i6 = Some(i.min(v6.len() as u128 - 1));
            }
        }
        let at = |pool: &IpPool, i: Option<u128>| {
            i.and_then(|i| pool.nth(i))
                .map(|a| a.to_string())
                .unwrap_or_default()
        };
        Unit {
            v4: at(v4, i4),
            v6: at(v6, i6),
            node_ip_of: None,
        }
    }

    /// The `rr` choice, joint for both families: the first index free in
    /// both pools; all taken, the least shared. `open4`/`open6`: the family
    /// is still to be chosen.
    fn least_shared(&self, open4: bool, open6: bool) -> u128 {
        let n = self.v4.users.len().max(self.v6.users.len());
        let mut best: Option<(usize, usize)> = None;
        for i in 0..n {
            let u4 = if open4 { self.v4.users(i) } else { 0 };
            let u6 = if open6 { self.v6.users(i) } else { 0 };
            let taken = self.v4.users(i) > 0 || self.v6.users(i) > 0;
            let score = u4 + u6 + usize::from(taken);
            if best.is_none_or(|(s, _)| score < s) {
                best = Some((score, i));
            }
            if score == 0 {
                break;
            }
        }
        best.map(|b| b.1 as u128).unwrap_or(0)
    }

    /// An address of `unit` already paired otherwise: the address and the
    /// unit that holds it.
    pub fn clash(&self, unit: &Unit) -> Option<(String, Unit)> {
        unit.addresses().find_map(|a| {
            self.addr_unit
                .get(a)
                .filter(|u| *u != unit)
                .map(|u| (a.clone(), u.clone()))
        })
    }

    /// The first policy (in precedence) of `unit`, as the messages name it.
    pub fn holder(&self, unit: &Unit) -> String {
        self.units
            .get(unit)
            .and_then(|v| v.first())
            .map(|p| policy_name(&p.policy_ref()))
            .unwrap_or_default()
    }

    /// `p` takes `unit`.
    pub fn take(&mut self, unit: Unit, p: &'p PolicyView<'v>) {
        self.v4.take(&unit.v4);
        self.v6.take(&unit.v6);
        for a in unit.addresses() {
            self.addr_unit.insert(a.clone(), unit.clone());
        }
        self.units.entry(unit).or_default().push(p);
    }
}

/// The index in `pool` of the address `s`.
fn index_in(pool: &IpPool, s: &str) -> Option<u128> {
    s.parse::<IpAddr>().ok().and_then(|ip| pool.index_of(ip))
}

/// A family's index before the `rr` choice: the explicit address, else the
/// one held before, else the default allocator's pick (the gateway's
/// default, or the first). `None`: no pool, or left to `rr`.
fn pick(
    pool: &IpPool,
    explicit: &str,
    default: &str,
    prev: &str,
    policy: AllocatorPolicy,
) -> Option<u128> {
    if pool.is_empty() {
        return None;
    }
    if !explicit.is_empty() {
        return index_in(pool, explicit);
    }
    if let Some(i) = index_in(pool, prev) {
        return Some(i);
    }
    match policy {
        AllocatorPolicy::Default => Some(index_in(pool, default).unwrap_or(0)),
        AllocatorPolicy::Rr => None,
    }
}
