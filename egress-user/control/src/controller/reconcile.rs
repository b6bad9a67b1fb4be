//! The controller's decisions as one pure function: from a [`ClusterView`]
//! (with the statuses written last time) to the statuses to write and the
//! events to record. No I/O, no clock: the async loop feeds it and writes
//! what it returns.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use crate::api::*;
use crate::datastore::{Event, Kind, ObjectKey};
use crate::validate::{self, IpPool};

use super::capacity::fold_into;
use super::config::{whole_blocks, ControllerConfig};
use super::plan::{EipMove, FailoverReason, Plan, TunnelGrants};
use super::ports::{grant_address, Claim};
use crate::view::{gateway_created, ClusterView, PolicyIndex, PolicyView};

/// The unit of assignment: an IPv4/IPv6 pair, or the node address of one
/// useNodeIP policy.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
struct Unit {
    v4: String,
    v6: String,
    node_ip_of: Option<PolicyRef>,
}

impl Unit {
    fn label(&self) -> String {
        match (&self.node_ip_of, self.v4.is_empty(), self.v6.is_empty()) {
            (Some(p), _, _) => format!("node IP of policy {}", policy_name(p)),
            (None, false, false) => format!("EIP {}/{}", self.v4, self.v6),
            (None, false, true) => format!("EIP {}", self.v4),
            _ => format!("EIP {}", self.v6),
        }
    }
}

/// Whether `node`'s agent asks to have `u` reconfirmed at `epoch`: one of
/// its addresses is in the node's `awaitingReconfirmation` at that epoch.
/// A request for an older epoch is already answered.
fn asks_reconfirmation(view: &ClusterView, node: &str, u: &Unit, epoch: u64) -> bool {
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

fn policy_name(p: &PolicyRef) -> String {
    if p.namespace.is_empty() {
        p.name.clone()
    } else {
        format!("{}/{}", p.namespace, p.name)
    }
}

fn cond(type_: &str, ok: bool, reason: &str, message: impl Into<String>) -> Condition {
    Condition {
        type_: type_.into(),
        status: if ok { "True" } else { "False" }.into(),
        reason: reason.into(),
        message: message.into(),
    }
}

fn had_condition(status: Option<&EgressPolicyStatus>, c: &Condition) -> bool {
    status.is_some_and(|s| s.conditions.iter().any(|o| o == c))
}

/// Runs every decision of the controller once.
pub fn reconcile(view: &ClusterView, cfg: &ControllerConfig) -> Plan {
    let mut plan = Plan::default();
    let policies = view.policy_views();
    for t in &view.tunnels {
        if let Some(n) = &t.metadata.name {
            plan.tunnels.insert(n.clone(), TunnelGrants::default());
        }
    }
    plan.new_tunnels = view
        .nodes
        .iter()
        .filter(|n| !plan.tunnels.contains_key(&n.name))
        .map(|n| n.name.clone())
        .collect();
    // Nodes whose agent registered its tunnel (an address in its status):
    // only they hold port blocks (no agent, no datapath, no use for them).
    let registered: BTreeSet<&str> = view
        .tunnels
        .iter()
        .filter(|t| {
            t.status
                .as_ref()
                .is_some_and(|s| !s.tunnel.ipv4.is_empty() || !s.tunnel.ipv6.is_empty())
        })
        .filter_map(|t| t.metadata.name.as_deref())
        .collect();

    // Gateways in order of age: on overlapping pools the older one keeps them.
    let mut gateways: Vec<&EgressGateway> = view.gateways.iter().collect();
    gateways.sort_by_key(|g| (gateway_created(g), g.metadata.name.clone()));
    let mut accepted_pools: Vec<(String, IpPool, IpPool)> = Vec::new();
    let mut pools_by_gw: BTreeMap<String, (IpPool, IpPool)> = BTreeMap::new();
    for g in &gateways {
        let name = g.metadata.name.clone().unwrap_or_default();
        let mut problems: Vec<String> = validate::gateway(&g.spec)
            .iter()
            .map(|e| e.to_string())
            .collect();
        if problems.is_empty() {
            let (p4, p6) = validate::gateway_pools(&g.spec).expect("validated");
            for (other, o4, o6) in &accepted_pools {
                if let Some(ip) = p4.overlap(o4).or_else(|| p6.overlap(o6)) {
                    problems.push(format!(
                        "spec.ippools: {ip} is also in the pool of gateway {other}, which is older and keeps it"
                    ));
                }
            }
            if problems.is_empty() {
                accepted_pools.push((name.clone(), p4.clone(), p6.clone()));
                pools_by_gw.insert(name.clone(), (p4, p6));
            }
        }
        let prev = g.status.clone().unwrap_or_default();
        let mut status = EgressGatewayStatus {
            epoch: prev.epoch,
            port_block_size: cfg.port_block_size,
            ..Default::default()
        };
        if !problems.is_empty() {
            let c = cond("Valid", false, "InvalidSpec", problems.join("; "));
            if !prev.conditions.contains(&c) {
                plan.events.push(Event::warning(
                    Kind::EgressGateway,
                    ObjectKey::cluster(&name),
                    "InvalidSpec",
                    c.message.clone(),
                ));
            }
            status.conditions.push(c);
        }
        plan.gateways.insert(name, status);
    }

    // Policies: validate and group by gateway.
    let mut by_gw: BTreeMap<String, Vec<&PolicyView<'_>>> = BTreeMap::new();
    for p in &policies {
        let kind_key = (p.kind, p.key.clone());
        let gw = view.gateway_for(p.fields.gateway);
        let problems = validate::policy(&p.fields, gw);
        let mut status = EgressPolicyStatus::default();
        if !problems.is_empty() {
            let msg = problems
                .iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("; ");
            let c = cond("Valid", false, "InvalidSpec", msg);
            if !had_condition(p.status, &c) {
                plan.events.push(Event::warning(
                    p.kind,
                    p.key.clone(),
                    "InvalidSpec",
                    c.message.clone(),
                ));
            }
            status.conditions.push(c);
            plan.policies.insert(kind_key, status);
            continue;
        }
        let Some(gw) = gw else {
            let msg = if p.fields.gateway.is_empty() {
                "spec.egressGatewayName: empty and no gateway has clusterDefault: true".to_string()
            } else {
                format!(
                    "spec.egressGatewayName: gateway {} does not exist",
                    p.fields.gateway
                )
            };
            let c = cond("GatewayFound", false, "GatewayNotFound", msg);
            if !had_condition(p.status, &c) {
                plan.events.push(Event::warning(
                    p.kind,
                    p.key.clone(),
                    "GatewayNotFound",
                    c.message.clone(),
                ));
            }
            status.conditions.push(c);
            plan.policies.insert(kind_key, status);
            continue;
        };
        let gw_name = gw.metadata.name.clone().unwrap_or_default();
        if !pools_by_gw.contains_key(&gw_name) {
            let c = cond(
                "GatewayFound",
                false,
                "GatewayInvalid",
                format!("spec.egressGatewayName: gateway {gw_name} is invalid (see its status)"),
            );
            status.conditions.push(c);
            plan.policies.insert(kind_key, status);
            continue;
        }
        plan.policies.insert(kind_key, status);
        by_gw.entry(gw_name).or_default().push(p);
    }

    // The worker nodes of each policy's pods (for port-block demand), once.
    // Grants are recorded in the worker's EgressTunnel: a node whose agent
    // has not registered it (no agent, no datapath) gets none.
    let index = PolicyIndex::new(&policies);
    let mut by_index: Vec<BTreeSet<&str>> = vec![BTreeSet::new(); policies.len()];
    let mut ns_labels: BTreeMap<&str, BTreeMap<String, String>> = BTreeMap::new();
    for pod in &view.pods {
        if pod.node.is_empty() || pod.ips.is_empty() || !registered.contains(pod.node.as_str()) {
            continue;
        }
        let nsl = ns_labels
            .entry(pod.namespace.as_str())
            .or_insert_with(|| view.namespace_labels(&pod.namespace));
        for i in index.selecting(&policies, pod, nsl) {
            by_index[i].insert(pod.node.as_str());
        }
    }
    let workers_of: BTreeMap<(Kind, ObjectKey), BTreeSet<&str>> = by_index
        .into_iter()
        .enumerate()
        .filter(|(_, w)| !w.is_empty())
        .map(|(i, w)| ((policies[i].kind, policies[i].key.clone()), w))
        .collect();
    for g in &gateways {
        let name = g.metadata.name.clone().unwrap_or_default();
        let Some((p4, p6)) = pools_by_gw.get(&name) else {
            continue;
        };
        let empty = Vec::new();
        let pols = by_gw.get(&name).unwrap_or(&empty);
        reconcile_gateway(view, cfg, g, p4, p6, pols, &workers_of, &mut plan);
    }
    for t in plan.tunnels.values_mut() {
        t.port_blocks.sort();
    }
    fold_into(view, &mut plan);
    plan
}

#[allow(clippy::too_many_arguments)]
fn reconcile_gateway(
    view: &ClusterView,
    cfg: &ControllerConfig,
    g: &EgressGateway,
    p4: &IpPool,
    p6: &IpPool,
    pols: &[&PolicyView<'_>],
    workers_of: &BTreeMap<(Kind, ObjectKey), BTreeSet<&str>>,
    plan: &mut Plan,
) {
    let gw_name = g.metadata.name.clone().unwrap_or_default();
    let gw_key = ObjectKey::cluster(&gw_name);
    let prev = g.status.clone().unwrap_or_default();
    let mut epoch = prev.epoch;

    // Gateway nodes and the Ready ones.
    let sel = &g.spec.node_selector.selector;
    let gw_nodes: Vec<&NodeRecord> = view
        .nodes
        .iter()
        .filter(|n| sel.matches(&n.labels))
        .collect();
    let ready: BTreeSet<&str> = gw_nodes
        .iter()
        .filter(|n| view.phase(&n.name) == TunnelPhase::Ready)
        .map(|n| n.name.as_str())
        .collect();

    // Where each unit was last time.
    let mut prev_place: BTreeMap<Unit, (String, u64)> = BTreeMap::new();
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
            prev_place.insert(u, (n.name.clone(), e.epoch));
        }
    }

    // 1. An EIP per policy, in order of precedence.
    let mut units: BTreeMap<Unit, Vec<&PolicyView<'_>>> = BTreeMap::new();
    let mut addr_unit: BTreeMap<String, Unit> = BTreeMap::new();
    // How many policies use each address so far.
    let mut addr_users: BTreeMap<String, usize> = BTreeMap::new();
    let idx = |pool: &IpPool, s: &str| s.parse::<IpAddr>().ok().and_then(|ip| pool.index_of(ip));
    for p in pols {
        let kk = (p.kind, p.key.clone());
        let ei = p.fields.egress_ip;
        let unit = if ei.use_node_ip {
            Unit {
                node_ip_of: Some(p.policy_ref()),
                ..Default::default()
            }
        } else {
            let pick = |pool: &IpPool, explicit: &str, default: &str, prev: &str| -> Option<u128> {
                if pool.is_empty() {
                    return None;
                }
                if !explicit.is_empty() {
                    return idx(pool, explicit);
                }
                if let Some(i) = idx(pool, prev) {
                    return Some(i);
                }
                match ei.allocator_policy {
                    AllocatorPolicy::Default => Some(idx(pool, default).unwrap_or(0)),
                    AllocatorPolicy::Rr => None, // chosen below, jointly for both families
                }
            };
            let prev_eip = p.status.map(|s| s.eip.clone()).unwrap_or_default();
            let mut i4 = pick(
                p4,
                &ei.ipv4,
                &g.spec.ippools.ipv4_default_eip,
                &prev_eip.ipv4,
            );
            let mut i6 = pick(
                p6,
                &ei.ipv6,
                &g.spec.ippools.ipv6_default_eip,
                &prev_eip.ipv6,
            );
            if ei.allocator_policy == AllocatorPolicy::Rr
                && ((i4.is_none() && !p4.is_empty()) || (i6.is_none() && !p6.is_empty()))
            {
                // The first index free in both pools; all taken: the least shared.
                let used = |pool: &IpPool, i: u128| {
                    pool.nth(i)
                        .map(|ip| addr_users.get(&ip.to_string()).copied().unwrap_or(0))
                        .unwrap_or(0)
                };
                let n = (p4.len().max(p6.len()) as u128).min(1 << 16);
                let mut best: Option<(usize, u128)> = None;
                for i in 0..n {
                    let u4 = if i4.is_none() && !p4.is_empty() {
                        used(p4, i)
                    } else {
                        0
                    };
                    let u6 = if i6.is_none() && !p6.is_empty() {
                        used(p6, i)
                    } else {
                        0
                    };
                    let taken = addr_unit
                        .contains_key(&p4.nth(i).map(|a| a.to_string()).unwrap_or_default())
                        || addr_unit
                            .contains_key(&p6.nth(i).map(|a| a.to_string()).unwrap_or_default());
                    let score = u4 + u6 + usize::from(taken);
                    if best.is_none_or(|(s, _)| score < s) {
                        best = Some((score, i));
                    }
                    if score == 0 {
                        break;
                    }
                }
                let i = best.map(|b| b.1).unwrap_or(0);
                if i4.is_none() && !p4.is_empty() {
                    i4 = Some(i.min(p4.len() as u128 - 1));
                }
                if i6.is_none() && !p6.is_empty() {
                    i6 = Some(i.min(p6.len() as u128 - 1));
                }
            }
            Unit {
                v4: i4
                    .and_then(|i| p4.nth(i))
                    .map(|a| a.to_string())
                    .unwrap_or_default(),
                v6: i6
                    .and_then(|i| p6.nth(i))
                    .map(|a| a.to_string())
                    .unwrap_or_default(),
                node_ip_of: None,
            }
        };
        if unit.node_ip_of.is_none() && unit.v4.is_empty() && unit.v6.is_empty() {
            let c = cond(
                "Allocated",
                false,
                "NoPool",
                "the gateway has no pool for this policy",
            );
            if !had_condition(p.status, &c) {
                plan.events.push(Event::warning(
                    p.kind,
                    p.key.clone(),
                    "NoPool",
                    c.message.clone(),
                ));
            }
            plan.policies.get_mut(&kk).unwrap().conditions.push(c);
            continue;
        }
        // An address may belong to one pair only: the policy that comes
        // first in precedence keeps the pairing.
        let clash = [&unit.v4, &unit.v6]
            .into_iter()
            .filter(|a| !a.is_empty())
            .find_map(|a| {
                addr_unit
                    .get(a)
                    .filter(|u| **u != unit)
                    .map(|u| (a.clone(), u.clone()))
            });
        if let Some((addr, other)) = clash {
            let holder = units
                .get(&other)
                .and_then(|v| v.first())
                .map(|p| policy_name(&p.policy_ref()))
                .unwrap_or_default();
            let c = cond(
                "Allocated",
                false,
                "EipConflict",
                format!(
                    "spec.egressIP: {addr} is already paired as {} by policy {holder}, which takes precedence",
                    other.label()
                ),
            );
            if !had_condition(p.status, &c) {
                plan.events.push(Event::warning(
                    p.kind,
                    p.key.clone(),
                    "EipConflict",
                    c.message.clone(),
                ));
            }
            plan.policies.get_mut(&kk).unwrap().conditions.push(c);
            continue;
        }
        for a in [&unit.v4, &unit.v6] {
            if !a.is_empty() {
                addr_unit.insert(a.clone(), unit.clone());
                *addr_users.entry(a.clone()).or_default() += 1;
            }
        }
        units.entry(unit).or_default().push(p);
    }

    // 2. A node per unit: stay where it is while that node is Ready; else
    // the Ready node with the fewest units, with a new epoch.
    let mut load: BTreeMap<&str, usize> = ready.iter().map(|n| (*n, 0)).collect();
    let mut placed: BTreeMap<Unit, (String, u64)> = BTreeMap::new();
    for u in units.keys() {
        if let Some((node, ep)) = prev_place.get(u) {
            if ready.contains(node.as_str()) {
                *load.get_mut(node.as_str()).unwrap() += 1;
                // The node fenced itself holding it at this epoch and asks
                // for a newer one (see EgressTunnelStatus): same node.
                let ep = if asks_reconfirmation(view, node, u, *ep) {
                    epoch += 1;
                    plan.events.push(Event::normal(
                        Kind::EgressGateway,
                        gw_key.clone(),
                        "EipReconfirmed",
                        format!(
                            "{} reconfirmed on node {node}, which had fenced itself at epoch {ep}: epoch {epoch}",
                            u.label()
                        ),
                    ));
                    epoch
                } else {
                    *ep
                };
                placed.insert(u.clone(), (node.clone(), ep));
            }
        }
    }
    for u in units.keys() {
        if placed.contains_key(u) {
            continue;
        }
        let target = load
            .iter()
            .min_by_key(|(n, c)| (**c, **n))
            .map(|(n, _)| n.to_string());
        let from = prev_place.get(u).map(|(n, _)| n.clone());
        match target {
            Some(node) => {
                epoch += 1;
                *load.get_mut(node.as_str()).unwrap() += 1;
                let msg = match &from {
                    Some(f) => format!(
                        "{} moved from node {f} ({}) to node {node}, epoch {epoch}",
                        u.label(),
                        view.phase(f).as_str()
                    ),
                    None => format!("{} assigned to node {node}, epoch {epoch}", u.label()),
                };
                if let Some(f) = &from {
                    plan.moves.push(EipMove {
                        gateway: gw_name.clone(),
                        what: u.label(),
                        from: f.clone(),
                        to: node.clone(),
                        reason: FailoverReason::of(
                            view.phase(f),
                            gw_nodes.iter().any(|n| n.name == *f),
                        ),
                    });
                }
                let reason = if from.is_some() {
                    "EipMoved"
                } else {
                    "EipAssigned"
                };
                plan.events.push(Event::normal(
                    Kind::EgressGateway,
                    gw_key.clone(),
                    reason,
                    msg,
                ));
                placed.insert(u.clone(), (node, epoch));
            }
            None => {
                let warned_before = units[u].iter().any(|p| {
                    p.status.is_some_and(|s| {
                        s.conditions
                            .iter()
                            .any(|c| c.reason == "NoReadyGatewayNode")
                    })
                });
                if from.is_some() || !warned_before {
                    plan.events.push(Event::warning(
                        Kind::EgressGateway,
                        gw_key.clone(),
                        "NoReadyGatewayNode",
                        format!("{} has no Ready gateway node to go to", u.label()),
                    ));
                }
            }
        }
    }
    for (u, (node, _)) in &prev_place {
        if !units.contains_key(u) {
            plan.events.push(Event::normal(
                Kind::EgressGateway,
                gw_key.clone(),
                "EipReleased",
                format!("{} released from node {node}: no policy uses it", u.label()),
            ));
        }
    }

    // 3. Port blocks per (address, worker), by use (see `grants`).
    let eip_blocks = whole_blocks(cfg.first_port, u16::MAX, cfg.port_block_size);
    let node_ip_blocks = whole_blocks(
        cfg.node_ip_ports.0,
        cfg.node_ip_ports.1,
        cfg.port_block_size,
    );
    // address -> worker -> the policies using it there, with their caps.
    let mut demand: BTreeMap<String, BTreeMap<&str, Vec<Claim>>> = BTreeMap::new();
    // Addresses that are a gateway node's own (useNodeIP).
    let mut node_ips: BTreeSet<String> = BTreeSet::new();
    let mut addrs_of: BTreeSet<String> = BTreeSet::new();
    for (u, ps) in &units {
        let addrs: Vec<String> = if u.node_ip_of.is_some() {
            let Some((node, _)) = placed.get(u) else {
                continue;
            };
            let ips: Vec<String> = [false, true]
                .into_iter()
                .filter_map(|v6| view.node_ip(node, v6))
                .map(|a| a.to_string())
                .collect();
            node_ips.extend(ips.iter().cloned());
            ips
        } else {
            [&u.v4, &u.v6]
                .into_iter()
                .filter(|a| !a.is_empty())
                .cloned()
                .collect()
        };
        addrs_of.extend(addrs.iter().cloned());
        for p in ps {
            if let Some(workers) = workers_of.get(&(p.kind, p.key.clone())) {
                for a in &addrs {
                    let at = demand.entry(a.clone()).or_default();
                    for w in workers {
                        at.entry(*w)
                            .or_default()
                            .push((policy_name(&p.policy_ref()), p.fields.max_ports_per_node));
                    }
                }
            }
        }
    }
    // Addresses some worker still holds (draining) though no policy uses
    // them any more: they stay until released.
    for t in &view.tunnels {
        for b in t.status.iter().flat_map(|s| &s.port_blocks) {
            if b.gateway == gw_name && !b.blocks.is_empty() {
                addrs_of.insert(b.eip.clone());
            }
        }
    }
    let none = BTreeMap::new();
    for addr in &addrs_of {
        let range = if node_ips.contains(addr) {
            node_ip_blocks.clone()
        } else {
            eip_blocks.clone()
        };
        let d = demand.get(addr).unwrap_or(&none);
        grant_address(view, cfg, &gw_name, addr, range, d, plan);
    }

    // 4. Statuses.
    let status = plan
        .gateways
        .get_mut(&gw_name)
        .expect("every gateway has a status");
    status.epoch = epoch;
    status.node_list = gw_nodes
        .iter()
        .map(|n| GatewayNodeStatus {
            name: n.name.clone(),
            status: view.phase(&n.name).as_str().into(),
            eips: placed
                .iter()
                .filter(|(_, (node, _))| *node == n.name)
                .map(|(u, (_, ep))| EipStatus {
                    ipv4: u.v4.clone(),
                    ipv6: u.v6.clone(),
                    policies: units[u].iter().map(|p| p.policy_ref()).collect(),
                    epoch: *ep,
                })
                .collect(),
        })
        .collect();
    let used4: BTreeSet<&str> = units
        .keys()
        .filter(|u| !u.v4.is_empty())
        .map(|u| u.v4.as_str())
        .collect();
    let used6: BTreeSet<&str> = units
        .keys()
        .filter(|u| !u.v6.is_empty())
        .map(|u| u.v6.as_str())
        .collect();
    status.ip_usage = IpUsage {
        ipv4_total: p4.len(),
        ipv4_free: p4.len().saturating_sub(used4.len() as u64),
        ipv6_total: p6.len(),
        ipv6_free: p6.len().saturating_sub(used6.len() as u64),
    };
    for (u, ps) in &units {
        let node = placed.get(u).map(|(n, _)| n.clone()).unwrap_or_default();
        for p in ps {
            let st = plan.policies.get_mut(&(p.kind, p.key.clone())).unwrap();
            st.node = node.clone();
            st.eip = if u.node_ip_of.is_some() {
                PolicyEip {
                    ipv4: view
                        .node_ip(&node, false)
                        .map(|a| a.to_string())
                        .unwrap_or_default(),
                    ipv6: view
                        .node_ip(&node, true)
                        .map(|a| a.to_string())
                        .unwrap_or_default(),
                }
            } else {
                PolicyEip {
                    ipv4: u.v4.clone(),
                    ipv6: u.v6.clone(),
                }
            };
            if node.is_empty() {
                st.conditions.push(cond(
                    "Ready",
                    false,
                    "NoReadyGatewayNode",
                    format!("gateway {gw_name} has no Ready node"),
                ));
            } else {
                st.conditions
                    .push(cond("Ready", true, "Assigned", format!("on node {node}")));
            }
        }
    }
}
