//! One gateway's share of a reconcile pass, in its phases: its nodes and
//! the Ready ones, a unit per policy, a node per unit (with the epochs
//! that fence the old holder), the port blocks of each address, and the
//! statuses to write. Pure, like the pass it belongs to.

use std::collections::{BTreeMap, BTreeSet};

use crate::api::{
    EgressGateway, EgressGatewayStatus, EipStatus, GatewayMode, GatewayNodeStatus, IpUsage,
    NodeRecord, PolicyEip, TunnelPhase,
};
use crate::datastore::{Event, Kind, ObjectKey};
use crate::validate::IpPool;
use crate::view::{ClusterView, PolicyView};

use super::conditions::{cond, policy_name, refuse};
use super::config::{whole_blocks, ControllerConfig};
use super::dirty::Dirty;
use super::plan::{EipMove, FailoverReason, Plan};
use super::ports::{grant_address, Claim, GrantMemo, Holders};
use super::spread::{previous_spread, spread_units, Spread, SpreadInput};
use super::unit::{asks_reconfirmation, Allocation, Unit, Units};
use super::workers::{Workers, WorkersOf};

/// Where each unit is: its node and the epoch it holds it at.
type Places = BTreeMap<Unit, (String, u64)>;

/// address -> worker -> the policies using it there, with their caps.
type Demand<'a> = BTreeMap<String, BTreeMap<&'a str, Vec<Claim>>>;

/// A policy and its workers.
type PolicyWorkers<'u, 'a> = (&'u PolicyView<'u>, &'a Workers);

/// What a gateway's units want of its addresses.
#[derive(Default)]
struct Wanted<'u, 'a> {
    /// Each unit's addresses, and its policies that have workers.
    units: Vec<(Vec<String>, Vec<PolicyWorkers<'u, 'a>>)>,
    /// The addresses that are a gateway node's own (useNodeIP).
    node_ips: BTreeSet<String>,
    /// Every address some unit uses.
    addresses: BTreeSet<String>,
    /// The addresses of units with a policy whose workers changed.
    changed: BTreeSet<String>,
}

/// What one gateway's pass reads.
pub struct GatewayPass<'a> {
    pub view: &'a ClusterView,
    pub cfg: &'a ControllerConfig,
    pub gateway: &'a EgressGateway,
    pub v4: &'a IpPool,
    pub v6: &'a IpPool,
    pub workers_of: &'a WorkersOf,
    /// What changed since the last pass, when only pods, grants and
    /// reports did: the port blocks of the other addresses are kept.
    pub since: Option<&'a Dirty>,
}

/// The gateway's nodes (those its selector matches) and the Ready ones.
struct GatewayNodes<'a> {
    all: Vec<&'a NodeRecord>,
    ready: BTreeSet<&'a str>,
}

/// The placement as it grows: units placed, units per Ready node, and the
/// gateway's epoch (one more for every unit placed anew or reconfirmed).
struct Placement<'a> {
    placed: Places,
    /// ActiveActive units, on every Ready node.
    spread: Spread,
    load: BTreeMap<&'a str, usize>,
    epoch: u64,
}

impl<'a> GatewayPass<'a> {
    fn name(&self) -> String {
        self.gateway.metadata.name.clone().unwrap_or_default()
    }

    /// A Normal Event on the gateway.
    fn event(&self, reason: &str, message: String) -> Event {
        Event::normal(
            Kind::EgressGateway,
            ObjectKey::cluster(self.name()),
            reason,
            message,
        )
    }

    /// Plans the gateway's status, its policies' placement and the port
    /// blocks of its addresses; `pols` in order of precedence. `memo` holds
    /// the last pass's grants of addresses whose inputs are unchanged.
    pub fn run(&self, pols: &[&PolicyView<'_>], memo: &mut GrantMemo, plan: &mut Plan) {
        let prev = self.gateway.status.clone().unwrap_or_default();
        let nodes = self.nodes();
        let before = previous_places(&prev);
        let units = self.allocate(pols, plan);
        let mut placement = Placement {
            placed: Places::new(),
            spread: Spread::new(),
            load: nodes.ready.iter().map(|n| (*n, 0)).collect(),
            epoch: prev.epoch,
        };
        if self.active_active() {
            let selected = nodes.all.iter().map(|n| n.name.as_str()).collect();
            let name = self.name();
            let input = SpreadInput {
                gateway: &name,
                view: self.view,
                ready: &nodes.ready,
                selected: &selected,
            };
            let before = previous_spread(&prev);
            placement.spread = spread_units(&input, &units, &before, &mut placement.epoch, plan);
        }
        self.keep_in_place(&units, &before, &mut placement, plan);
        self.place_the_rest(&units, &before, &nodes, &mut placement, plan);
        self.tell_released(&units, &before, plan);
        self.grant_ports(&units, &placement.placed, memo, plan);
        self.write_gateway_status(&nodes, &units, &placement, plan);
        self.write_policy_statuses(&units, &placement, plan);
    }

    fn active_active(&self) -> bool {
        self.gateway.spec.mode == GatewayMode::ActiveActive
    }

    /// `u` is on every Ready node (ActiveActive), not on one.
    fn spreads(&self, u: &Unit) -> bool {
        self.active_active() && u.node_ip_of.is_none()
    }

    fn nodes(&self) -> GatewayNodes<'a> {
        let sel = &self.gateway.spec.node_selector.selector;
        let all: Vec<&NodeRecord> = self
            .view
            .nodes
            .iter()
            .filter(|n| sel.matches(&n.labels))
            .collect();
        let ready = all
            .iter()
            .filter(|n| self.view.phase(&n.name) == TunnelPhase::Ready)
            .map(|n| n.name.as_str())
            .collect();
        GatewayNodes { all, ready }
    }

    /// A unit per policy, in order of precedence; a policy without one
    /// gets a condition saying why.
    fn allocate<'p, 'v>(&self, pols: &[&'p PolicyView<'v>], plan: &mut Plan) -> Units<'p, 'v> {
        let mut alloc = Allocation::new(self.v4, self.v6);
        for &p in pols {
            let unit = alloc.choose(p, &self.gateway.spec);
            if unit.is_empty() {
                let c = cond(
                    "Allocated",
                    false,
                    "NoPool",
                    "the gateway has no pool for this policy",
                );
                refuse(plan, p, c);
                continue;
            }
            // An address may belong to one pair only: the policy that
            // comes first in precedence keeps the pairing.
            if let Some((addr, other)) = alloc.clash(&unit) {
                let c = cond(
                    "Allocated",
                    false,
                    "EipConflict",
                    format!(
                        "spec.egressIP: {addr} is already paired as {} by policy {}, which takes precedence",
                        other.label(),
                        alloc.holder(&other)
                    ),
                );
                refuse(plan, p, c);
                continue;
            }
            alloc.take(unit, p);
        }
        alloc.units
    }

    /// A unit stays on its node while that node is Ready; a node that
    /// fenced itself holding it and asks for a newer epoch (see
    /// EgressTunnelStatus) gets one, on the same node.
    fn keep_in_place(
        &self,
        units: &Units<'_, '_>,
        before: &Places,
        at: &mut Placement<'_>,
        plan: &mut Plan,
    ) {
        for u in units.keys().filter(|u| !self.spreads(u)) {
            let Some((node, ep)) = before.get(u) else {
                continue;
            };
            let Some(load) = at.load.get_mut(node.as_str()) else {
                continue;
            };
            *load += 1;
            let ep = if asks_reconfirmation(self.view, node, u, *ep) {
                at.epoch += 1;
                plan.events.push(self.event(
                    "EipReconfirmed",
                    format!(
                        "{} reconfirmed on node {node}, which had fenced itself at epoch {ep}: epoch {}",
                        u.label(),
                        at.epoch
                    ),
                ));
                at.epoch
            } else {
                *ep
            };
            at.placed.insert(u.clone(), (node.clone(), ep));
        }
    }

    /// Every unit not kept goes to the Ready node with the fewest units,
    /// at a new epoch; with no Ready node it waits, and says so.
    fn place_the_rest(
        &self,
        units: &Units<'_, '_>,
        before: &Places,
        nodes: &GatewayNodes<'_>,
        at: &mut Placement<'_>,
        plan: &mut Plan,
    ) {
        for (u, ps) in units {
            if at.placed.contains_key(u) || at.spread.contains_key(u) {
                continue;
            }
            let target = at
                .load
                .iter()
                .min_by_key(|(n, c)| (**c, **n))
                .map(|(n, _)| n.to_string());
            let from = before.get(u).map(|(n, _)| n.as_str());
            match target {
                Some(node) => self.place(u, from, node, nodes, at, plan),
                None => self.no_ready_node(u, ps, from.is_some(), plan),
            }
        }
    }

    /// `u` goes to `node` (from `from`, if it was placed before).
    fn place(
        &self,
        u: &Unit,
        from: Option<&str>,
        node: String,
        nodes: &GatewayNodes<'_>,
        at: &mut Placement<'_>,
        plan: &mut Plan,
    ) {
        at.epoch += 1;
        let epoch = at.epoch;
        *at.load.get_mut(node.as_str()).unwrap() += 1;
        let (reason, msg) = match from {
            Some(f) => (
                "EipMoved",
                format!(
                    "{} moved from node {f} ({}) to node {node}, epoch {epoch}",
                    u.label(),
                    self.view.phase(f).as_str()
                ),
            ),
            None => (
                "EipAssigned",
                format!("{} assigned to node {node}, epoch {epoch}", u.label()),
            ),
        };
        if let Some(f) = from {
            plan.moves.push(EipMove {
                gateway: self.name(),
                what: u.label(),
                from: f.to_string(),
                to: node.clone(),
                reason: FailoverReason::of(
                    self.view.phase(f),
                    nodes.all.iter().any(|n| n.name == f),
                ),
            });
        }
        plan.events.push(self.event(reason, msg));
        at.placed.insert(u.clone(), (node, epoch));
    }

    /// `u` has no Ready node to go to: a warning when it leaves a node, or
    /// when its policies were not told before.
    fn no_ready_node(&self, u: &Unit, ps: &[&PolicyView<'_>], moving: bool, plan: &mut Plan) {
        let warned_before = ps.iter().any(|p| {
            p.status.is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.reason == "NoReadyGatewayNode")
            })
        });
        if moving || !warned_before {
            plan.events.push(Event::warning(
                Kind::EgressGateway,
                ObjectKey::cluster(self.name()),
                "NoReadyGatewayNode",
                format!("{} has no Ready gateway node to go to", u.label()),
            ));
        }
    }

    /// Units placed before that no policy uses any more.
    fn tell_released(&self, units: &Units<'_, '_>, before: &Places, plan: &mut Plan) {
        for (u, (node, _)) in before {
            if !units.contains_key(u) {
                plan.events.push(self.event(
                    "EipReleased",
                    format!("{} released from node {node}: no policy uses it", u.label()),
                ));
            }
        }
    }

    /// Port blocks per (address, worker), by use (see `grants`): an EIP's
    /// from the first port on, a node address's only from the reserved
    /// range. When only pods, grants and reports changed since the last
    /// pass, an address none of those changes reach keeps its last outcome.
    fn grant_ports(
        &self,
        units: &Units<'_, '_>,
        placed: &Places,
        memo: &mut GrantMemo,
        plan: &mut Plan,
    ) {
        let cfg = self.cfg;
        let eip_blocks = whole_blocks(cfg.first_port, u16::MAX, cfg.port_block_size);
        let node_ip_blocks = whole_blocks(
            cfg.node_ip_ports.0,
            cfg.node_ip_ports.1,
            cfg.port_block_size,
        );
        let wanted = self.uses(units, placed);
        let name = self.name();
        // The addresses whose inputs may have changed since the last pass
        // (all of them: `None`), and any it did not look at.
        let dirty: Option<BTreeSet<&str>> = self.since.map(|s| {
            let changed = wanted.changed.iter().map(String::as_str);
            let unseen = wanted
                .addresses
                .iter()
                .map(String::as_str)
                .filter(|a| !memo.looked_at(&name, a));
            changed.chain(s.addresses_of(&name)).chain(unseen).collect()
        });
        let demand = Self::demand(&wanted, dirty.as_ref());
        let holders = Holders::new(self.view, &name, dirty.as_ref());
        // Addresses some worker still holds (draining) though no policy
        // uses them any more: they stay until released.
        let mut addrs = wanted.addresses.clone();
        addrs.extend(holders.addresses().map(str::to_string));
        if let Some(d) = &dirty {
            let kept = memo.last_addresses(&name).filter(|a| !d.contains(a));
            addrs.extend(kept.map(str::to_string));
        }
        let none = BTreeMap::new();
        for addr in &addrs {
            if dirty.as_ref().is_some_and(|d| !d.contains(addr.as_str())) {
                memo.carry(&name, addr)
                    .expect("an address not reached was looked at by the last pass")
                    .add_to(cfg, plan);
                continue;
            }
            let range = if wanted.node_ips.contains(addr) {
                node_ip_blocks.clone()
            } else {
                eip_blocks.clone()
            };
            let d = demand.get(addr).unwrap_or(&none);
            grant_address(&holders, cfg, &name, addr, range, d, memo, plan);
        }
    }

    /// The addresses in use, each unit's with the workers of its policies,
    /// and which addresses have policies whose workers changed.
    fn uses<'u>(&self, units: &'u Units<'_, '_>, placed: &Places) -> Wanted<'u, 'a> {
        let mut out = Wanted::default();
        for (u, ps) in units {
            let addrs: Vec<String> = if u.node_ip_of.is_some() {
                let Some((node, _)) = placed.get(u) else {
                    continue;
                };
                let ips: Vec<String> = [false, true]
                    .into_iter()
                    .filter_map(|v6| self.view.node_ip(node, v6))
                    .map(|a| a.to_string())
                    .collect();
                out.node_ips.extend(ips.iter().cloned());
                ips
            } else {
                u.addresses().cloned().collect()
            };
            out.addresses.extend(addrs.iter().cloned());
            let mut workers = Vec::new();
            for p in ps {
                let Some(w) = self.workers_of.get(&(p.kind, p.key.clone())) else {
                    continue;
                };
                if w.changed {
                    out.changed.extend(addrs.iter().cloned());
                }
                if !w.nodes.is_empty() {
                    workers.push((*p, w));
                }
            }
            out.units.push((addrs, workers));
        }
        out
    }

    /// Who wants ports of which address (of those in `only`, if given).
    fn demand(wanted: &Wanted<'_, 'a>, only: Option<&BTreeSet<&str>>) -> Demand<'a> {
        let mut demand = Demand::new();
        for (addrs, workers) in &wanted.units {
            let mut addrs = addrs
                .iter()
                .filter(|a| only.is_none_or(|o| o.contains(a.as_str())))
                .peekable();
            if addrs.peek().is_none() {
                continue;
            }
            let addrs: Vec<&String> = addrs.collect();
            for (p, w) in workers {
                let claim: Claim = (
                    policy_name(&p.policy_ref()).into(),
                    p.fields.max_ports_per_node,
                );
                for a in &addrs {
                    let at = demand.entry((*a).clone()).or_default();
                    for n in &w.nodes {
                        at.entry(n.as_str()).or_default().push(claim.clone());
                    }
                }
            }
        }
        demand
    }

    /// The gateway's epoch, its nodes with their units, and its pools' use.
    fn write_gateway_status(
        &self,
        nodes: &GatewayNodes<'_>,
        units: &Units<'_, '_>,
        at: &Placement<'_>,
        plan: &mut Plan,
    ) {
        let status: &mut EgressGatewayStatus = plan
            .gateways
            .get_mut(&self.name())
            .expect("every gateway has a status");
        status.epoch = at.epoch;
        status.node_list = nodes
            .all
            .iter()
            .map(|n| GatewayNodeStatus {
                name: n.name.clone(),
                status: self.view.phase(&n.name).as_str().into(),
                eips: at
                    .placed
                    .iter()
                    .filter(|(_, (node, _))| *node == n.name)
                    .map(|(u, (_, ep))| (u, *ep))
                    .chain(
                        at.spread
                            .iter()
                            .filter(|(_, (on, _))| on.contains(&n.name))
                            .map(|(u, (_, ep))| (u, *ep)),
                    )
                    .map(|(u, epoch)| EipStatus {
                        ipv4: u.v4.clone(),
                        ipv6: u.v6.clone(),
                        policies: units[u].iter().map(|p| p.policy_ref()).collect(),
                        epoch,
                    })
                    .collect(),
            })
            .collect();
        let used = |v6: bool| {
            let family = |u: &Unit| if v6 { &u.v6 } else { &u.v4 }.clone();
            units
                .keys()
                .map(family)
                .filter(|a| !a.is_empty())
                .collect::<BTreeSet<String>>()
                .len() as u64
        };
        status.ip_usage = IpUsage {
            ipv4_total: self.v4.len(),
            ipv4_free: self.v4.len().saturating_sub(used(false)),
            ipv6_total: self.v6.len(),
            ipv6_free: self.v6.len().saturating_sub(used(true)),
        };
    }

    /// Each placed policy's node and addresses, and whether it is Ready.
    fn write_policy_statuses(&self, units: &Units<'_, '_>, at: &Placement<'_>, plan: &mut Plan) {
        let name = self.name();
        for (u, ps) in units {
            if let Some((nodes, _)) = at.spread.get(u) {
                write_spread_status(u, nodes, ps, plan);
                continue;
            }
            let node = at.placed.get(u).map(|(n, _)| n.clone()).unwrap_or_default();
            let eip = if u.node_ip_of.is_some() {
                let ip = |v6| {
                    self.view
                        .node_ip(&node, v6)
                        .map(|a| a.to_string())
                        .unwrap_or_default()
                };
                PolicyEip {
                    ipv4: ip(false),
                    ipv6: ip(true),
                }
            } else {
                PolicyEip {
                    ipv4: u.v4.clone(),
                    ipv6: u.v6.clone(),
                }
            };
            let ready = if node.is_empty() {
                cond(
                    "Ready",
                    false,
                    "NoReadyGatewayNode",
                    format!("gateway {name} has no Ready node"),
                )
            } else {
                cond("Ready", true, "Assigned", format!("on node {node}"))
            };
            for p in ps {
                let st = plan.policies.get_mut(&(p.kind, p.key.clone())).unwrap();
                st.node = node.clone();
                st.eip = eip.clone();
                st.conditions.push(ready.clone());
            }
        }
    }
}

/// The status of the policies of a unit on every node in `nodes`.
fn write_spread_status(
    u: &Unit,
    nodes: &BTreeSet<String>,
    ps: &[&PolicyView<'_>],
    plan: &mut Plan,
) {
    let list: Vec<String> = nodes.iter().cloned().collect();
    let ready = cond(
        "Ready",
        true,
        "Assigned",
        format!("on nodes {} (active-active)", list.join(", ")),
    );
    for p in ps {
        let st = plan.policies.get_mut(&(p.kind, p.key.clone())).unwrap();
        st.nodes = list.clone();
        st.eip = PolicyEip {
            ipv4: u.v4.clone(),
            ipv6: u.v6.clone(),
        };
        st.conditions.push(ready.clone());
    }
}

/// Where each unit was last time, from the gateway's status.
fn previous_places(prev: &EgressGatewayStatus) -> Places {
    let mut out = Places::new();
    for n in &prev.node_list {
        for e in &n.eips {
            let node_ip_of = if e.ipv4.is_empty() && e.ipv6.is_empty() {
                e.policies.first().cloned()
            } else {
                None
            };
            let u = Unit {
                v4: e.ipv4.clone(),
                v6: e.ipv6.clone(),
                node_ip_of,
            };
            out.insert(u, (n.name.clone(), e.epoch));
        }
    }
    out
}
