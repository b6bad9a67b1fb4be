//! The port-block step of a gateway's reconcile: gathers each address's
//! workers (held and draining blocks from their EgressTunnel, use and
//! released blocks from their agent's report, demand and caps from the
//! policies), runs the grant rule ([`super::grants`]) and writes the result
//! into the plan: grants, Events when an address runs out, and the facts
//! the metrics show.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::Hash;
use std::sync::Arc;

use crate::api::{EgressTunnelStatus, EipPortBlocks, EipPortUse};
use crate::datastore::{Event, Kind, ObjectKey};

use super::config::ControllerConfig;
use super::grants::{plan_address, Holding, WorkerPorts};
use super::plan::Plan;
pub use super::plan::{AddressFact, PortFact, PortFacts};
use crate::view::ClusterView;
use holder_index::Entries;
pub use holder_index::HolderIndex;
use memo::AddressOutcome;
pub use memo::GrantMemo;

/// A policy's claim on an address at a worker: its name and its cap (ports).
/// The name is shared: one policy claims at every worker of every address.
pub type Claim = (std::sync::Arc<str>, Option<u32>);

/// Blocks of `size` ports covering `ports` (at least one).
pub fn blocks_for(ports: u32, size: u16) -> u16 {
    ports
        .div_ceil(u32::from(size.max(1)))
        .clamp(1, u32::from(u16::MAX)) as u16
}

/// The cap of a worker for an address: the operator's limit, or the
/// largest cap of the policies using the address there when all have one.
/// Returns the cap in blocks and the policy that sets it, if any.
pub fn cap_of(claims: &[Claim], cfg: &ControllerConfig) -> (u16, Option<String>) {
    let node_max = blocks_for(cfg.max_ports_per_node, cfg.port_block_size);
    let mut best: Option<(u32, &str)> = None;
    for (name, cap) in claims {
        let Some(c) = cap else {
            return (node_max, None);
        };
        if best.is_none_or(|(b, _)| *c > b) {
            best = Some((*c, &**name));
        }
    }
    match best {
        Some((c, name)) if blocks_for(c, cfg.port_block_size) < node_max => {
            (blocks_for(c, cfg.port_block_size), Some(name.to_string()))
        }
        _ => (node_max, None),
    }
}

/// Every worker's EgressTunnel status, and the workers holding blocks of
/// each address of one gateway: built once per gateway pass, so an address
/// reads its own workers only (reading every tunnel for every address cost
/// 1,024 addresses x 1,000 tunnels per pass at the benchmark's large size,
/// seconds of CPU per change).
pub struct Holders<'a> {
    status: HashMap<&'a str, &'a EgressTunnelStatus>,
    /// (node, address) -> that node's blocks and reported use of the address.
    blocks: HashMap<(&'a str, &'a str), &'a EipPortBlocks>,
    usage: HashMap<(&'a str, &'a str), &'a EipPortUse>,
    /// address -> the nodes with an entry for it (blocks, or refused).
    of_addr: HashMap<&'a str, Vec<&'a str>>,
    /// The addresses some worker holds blocks of.
    held: std::collections::BTreeSet<&'a str>,
}

impl<'a> Holders<'a> {
    /// The holders of gateway `gw`'s addresses, or of the addresses in
    /// `only` (every worker's status all the same). With `index` and
    /// `only`, only the entries it places for those addresses are read.
    pub fn new(
        view: &'a ClusterView,
        gw: &str,
        only: Option<&BTreeSet<&str>>,
        index: Option<&HolderIndex>,
    ) -> Self {
        let mut out = Self {
            status: HashMap::new(),
            blocks: HashMap::new(),
            usage: HashMap::new(),
            of_addr: HashMap::new(),
            held: Default::default(),
        };
        for t in &view.tunnels {
            if let (Some(node), Some(st)) = (t.metadata.name.as_deref(), t.status.as_ref()) {
                out.status.insert(node, st);
            }
        }
        match (only, index) {
            (Some(only), Some(index)) => {
                for &addr in only {
                    for (n, at) in index.holders_of(gw, addr) {
                        if let Some((node, st)) = out.status.get_key_value(n) {
                            let (node, st) = (*node, *st);
                            out.read_entries(node, st, gw, addr, at);
                        }
                    }
                }
            }
            _ => {
                for t in &view.tunnels {
                    let (Some(node), Some(st)) = (t.metadata.name.as_deref(), t.status.as_ref())
                    else {
                        continue;
                    };
                    let wanted = |eip: &str| only.is_none_or(|o| o.contains(eip));
                    let uses = st
                        .port_use
                        .iter()
                        .filter(|u| u.gateway == gw && wanted(&u.eip));
                    let blocks = st
                        .port_blocks
                        .iter()
                        .filter(|b| b.gateway == gw && wanted(&b.eip));
                    out.read(node, uses, blocks);
                }
            }
        }
        out
    }

    /// Reads one node's entries of one address, where the index says
    /// (each checked to be of that address all the same).
    fn read_entries(
        &mut self,
        node: &'a str,
        st: &'a EgressTunnelStatus,
        gw: &str,
        addr: &str,
        at: &Entries,
    ) {
        let uses = at.uses.iter().filter_map(|&i| st.port_use.get(i));
        let uses = uses.filter(|u| u.gateway == gw && u.eip == addr);
        let blocks = at.blocks.iter().filter_map(|&i| st.port_blocks.get(i));
        let blocks = blocks.filter(|b| b.gateway == gw && b.eip == addr);
        self.read(node, uses, blocks);
    }

    /// Reads one node's entries, each in the order of its status.
    fn read(
        &mut self,
        node: &'a str,
        uses: impl Iterator<Item = &'a EipPortUse>,
        blocks: impl Iterator<Item = &'a EipPortBlocks>,
    ) {
        for u in uses {
            // The first entry counts, as a search of the list would find.
            self.usage.entry((node, u.eip.as_str())).or_insert(u);
        }
        for b in blocks {
            if self.blocks.insert((node, b.eip.as_str()), b).is_some() {
                continue;
            }
            self.of_addr.entry(b.eip.as_str()).or_default().push(node);
            if !b.blocks.is_empty() {
                self.held.insert(b.eip.as_str());
            }
        }
    }

    /// The addresses some worker holds blocks of.
    pub fn addresses(&self) -> impl Iterator<Item = &'a str> + '_ {
        self.held.iter().copied()
    }

    fn blocks_of(&self, node: &str, addr: &str) -> Option<&'a EipPortBlocks> {
        self.blocks.get(&(node, addr)).copied()
    }
}

/// The workers of `addr` with a status: those holding blocks of it and
/// those with demand for it, in name order.
fn nodes_of_address<'h>(
    holders: &Holders<'h>,
    addr: &str,
    demand: &BTreeMap<&'h str, Vec<Claim>>,
) -> BTreeSet<&'h str> {
    let holding = holders.of_addr.get(addr).into_iter().flatten().copied();
    holding
        .chain(demand.keys().copied())
        .filter(|n| holders.status.contains_key(n))
        .collect()
}

/// What every worker holds and reports for `addr` of the holders' gateway.
fn standings(
    holders: &Holders<'_>,
    addr: &str,
    nodes: &BTreeSet<&str>,
    demand: &BTreeMap<&str, Vec<Claim>>,
    cfg: &ControllerConfig,
) -> BTreeMap<String, WorkerPorts> {
    let mut out = BTreeMap::new();
    for &node in nodes {
        let held = holders.blocks_of(node, addr);
        let claims = demand.get(node);
        let usage = holders.usage.get(&(node, addr));
        out.insert(
            node.to_string(),
            WorkerPorts {
                held: held.map(|b| b.blocks.clone()).unwrap_or_default(),
                draining: held.map(|b| b.draining.clone()).unwrap_or_default(),
                in_use: usage.map(|u| u.in_use).unwrap_or(0),
                released: usage.map(|u| u.released.clone()).unwrap_or_default(),
                demand: claims.is_some(),
                cap: claims.map(|c| cap_of(c, cfg).0).unwrap_or(0),
            },
        );
    }
    out
}

/// A hash of everything [`decide`] reads for `addr`: the range, the
/// settings, and each worker's grant, report and claims.
fn fingerprint(
    holders: &Holders<'_>,
    cfg: &ControllerConfig,
    addr: &str,
    range: &std::ops::Range<u16>,
    nodes: &BTreeSet<&str>,
    demand: &BTreeMap<&str, Vec<Claim>>,
) -> u128 {
    let mut h = memo::Fingerprint::new();
    (
        range.start,
        range.end,
        cfg.port_block_size,
        cfg.max_ports_per_node,
    )
        .hash(&mut h);
    for &node in nodes {
        node.hash(&mut h);
        holders
            .blocks_of(node, addr)
            .map(|b| (&b.blocks, &b.draining, b.exhausted))
            .hash(&mut h);
        holders
            .usage
            .get(&(node, addr))
            .map(|u| (u.in_use, &u.released))
            .hash(&mut h);
        demand.get(node).hash(&mut h);
    }
    h.finish128()
}

/// Runs the grant rule for one address and writes the plan; an address
/// whose inputs have not changed since the last pass gets what they gave
/// then, from `memo`, without being decided again. With `holds_last`, the
/// plan holds the last pass's grants already (a partial pass): those of an
/// address decided again are replaced, those of one whose inputs are the
/// same stay as they are (taking out and putting back thousands of grants
/// per pass was a tenth of the controller's CPU at a thousand nodes).
#[allow(clippy::too_many_arguments)]
pub fn grant_address(
    holders: &Holders<'_>,
    cfg: &ControllerConfig,
    gw: &str,
    addr: &str,
    range: std::ops::Range<u16>,
    demand: &BTreeMap<&str, Vec<Claim>>,
    holds_last: bool,
    memo: &mut GrantMemo,
    plan: &mut Plan,
) {
    let nodes = nodes_of_address(holders, addr, demand);
    let print = fingerprint(holders, cfg, addr, &range, &nodes, demand);
    let same = memo.last_print(gw, addr) == Some(print);
    if holds_last && !same {
        if let Some(old) = memo.last_outcome(gw, addr) {
            old.remove_grants(gw, addr, plan);
        }
    }
    let outcome = memo.outcome(gw, addr, print, || {
        decide(holders, cfg, gw, addr, range, &nodes, demand)
    });
    if holds_last && same {
        outcome.add_facts(plan);
    } else {
        outcome.add_to(cfg, plan);
    }
}

/// The grant rule for one address, and everything it puts into a plan.
fn decide(
    holders: &Holders<'_>,
    cfg: &ControllerConfig,
    gw: &str,
    addr: &str,
    range: std::ops::Range<u16>,
    nodes: &BTreeSet<&str>,
    demand: &BTreeMap<&str, Vec<Claim>>,
) -> AddressOutcome {
    let workers = standings(holders, addr, nodes, demand, cfg);
    let holdings = plan_address(range.clone(), cfg.port_block_size, &workers);
    let used: usize = holdings.values().map(|h| h.held.len()).sum();
    let total = range.len() as u32;
    let (gw_name, eip): (Arc<str>, Arc<str>) = (gw.into(), addr.into());
    let mut ports = Vec::new();
    let mut out = AddressOutcome {
        fact: AddressFact {
            gateway: gw.into(),
            eip: addr.into(),
            total,
            free: total.saturating_sub(used as u32),
        },
        ..Default::default()
    };
    for (node, h) in holdings {
        let s = &workers[&node];
        let was_refused = holders.blocks_of(&node, addr).is_some_and(|b| b.exhausted);
        if h.refused && !was_refused {
            out.events
                .push(exhausted_event(gw, addr, &node, &h, s, cfg, total, used));
        }
        let quota_reached = demand
            .get(node.as_str())
            .and_then(|c| cap_of(c, cfg).1)
            .filter(|_| h.wanted > s.cap);
        ports.push(PortFact {
            gateway: gw_name.clone(),
            eip: eip.clone(),
            node: node.as_str().into(),
            granted: h.held.len() as u32,
            draining: h.draining.len() as u32,
            in_use: s.in_use,
            block_size: cfg.port_block_size,
            quota_reached,
            refused: h.refused,
        });
        if h.held.is_empty() && !s.demand {
            continue;
        }
        let grant = EipPortBlocks {
            gateway: gw.into(),
            eip: addr.into(),
            blocks: h.held,
            draining: h.draining,
            exhausted: h.refused,
        };
        out.grants.push((node, grant));
    }
    out.ports = ports.into();
    out
}

#[allow(clippy::too_many_arguments)]
fn exhausted_event(
    gw: &str,
    addr: &str,
    node: &str,
    h: &Holding,
    s: &WorkerPorts,
    cfg: &ControllerConfig,
    total: u32,
    used: usize,
) -> Event {
    let size = u32::from(cfg.port_block_size);
    Event::warning(
        Kind::EgressGateway,
        ObjectKey::cluster(gw),
        "PortBlocksExhausted",
        format!(
            "EIP {addr}: no free port block for node {node}, which uses {} of its {} granted ports \
             ({} blocks of {size}, {} wanted); {used} of the address's {total} blocks are held",
            s.in_use,
            h.active() as u32 * size,
            h.held.len(),
            h.wanted.min(s.cap),
        ),
    )
}

mod holder_index;
mod memo;

#[cfg(test)]
mod tests;

#[cfg(test)]
mod flow_tests;
