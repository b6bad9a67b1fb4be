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
use super::gateway_grants::{GrantInput, UnitUse};
use super::plan::{EipMove, FailoverReason, Plan};
use super::ports::Claim;
use super::spread::{previous_spread, spread_units, Spread, SpreadInput};
use super::unit::{asks_reconfirmation, Allocation, Unit, Units};

/// Where each unit is: its node and the epoch it holds it at.
type Places = BTreeMap<Unit, (String, u64)>;

/// What one gateway's pass reads.
pub struct GatewayPass<'a> {
    pub view: &'a ClusterView,
    pub gateway: &'a EgressGateway,
    pub v4: &'a IpPool,
    pub v6: &'a IpPool,
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

    /// Plans the gateway's status and its policies' placement; `pols` in
    /// order of precedence. Returns what its port-block step reads.
    pub fn run(&self, pols: &[&PolicyView<'_>], plan: &mut Plan) -> GrantInput {
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
        self.write_gateway_status(&nodes, &units, &placement, plan);
        self.write_policy_statuses(&units, &placement, plan);
        self.grant_input(&units, &placement.placed)
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

    /// What the port-block step reads: each unit's addresses (a node
    /// address's once placed) and the policies using it, with their claims.
    fn grant_input(&self, units: &Units<'_, '_>, placed: &Places) -> GrantInput {
        let mut out = GrantInput {
            gateway: self.name(),
            ..Default::default()
        };
        for (u, ps) in units {
            let addresses: Vec<String> = if u.node_ip_of.is_some() {
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
            out.addresses.extend(addresses.iter().cloned());
            let policies: Vec<_> = ps
                .iter()
                .map(|p| {
                    let claim: Claim = (
                        policy_name(&p.policy_ref()).into(),
                        p.fields.max_ports_per_node,
                    );
                    ((p.kind, p.key.clone()), claim)
                })
                .collect();
            for (key, _) in &policies {
                out.units_of
                    .entry(key.clone())
                    .or_default()
                    .push(out.units.len());
            }
            out.units.push(UnitUse {
                addresses,
                policies,
            });
        }
        out
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
            .gateways_mut()
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
                let st = plan
                    .policies_mut()
                    .get_mut(&(p.kind, p.key.clone()))
                    .unwrap();
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
        let st = plan
            .policies_mut()
            .get_mut(&(p.kind, p.key.clone()))
            .unwrap();
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
