//! A gateway's port-block step, after the rest of its pass: per address,
//! the workers of the policies using it and what they hold and report
//! (see `ports`). What it reads of the rest of the pass is owned
//! ([`GrantInput`]), so a pass in which only pods, grants and agents'
//! reports changed reuses it and runs this step alone; such a pass also
//! keeps the last outcome of every address those changes do not reach.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::datastore::{Kind, ObjectKey};
use crate::view::ClusterView;

use super::config::{whole_blocks, ControllerConfig};
use super::dirty::Dirty;
use super::plan::Plan;
use super::ports::{grant_address, Claim, GrantMemo, Holders};
use super::workers::{WorkersMemo, WorkersOf};

/// What a gateway's port-block step reads of the rest of its pass.
#[derive(Clone, Debug, Default)]
pub struct GrantInput {
    pub gateway: String,
    pub units: Vec<UnitUse>,
    /// The addresses that are a gateway node's own (useNodeIP).
    pub node_ips: BTreeSet<String>,
    /// Every address some unit uses.
    pub addresses: BTreeSet<String>,
    /// policy -> the indices of the units it uses.
    pub units_of: HashMap<(Kind, ObjectKey), Vec<usize>>,
}

/// One unit's addresses and the policies using it, with their claims.
#[derive(Clone, Debug, Default)]
pub struct UnitUse {
    pub addresses: Vec<String>,
    pub policies: Vec<((Kind, ObjectKey), Claim)>,
}

/// address -> worker -> the policies using it there, with their caps.
type Demand<'a> = BTreeMap<String, BTreeMap<&'a str, Vec<Claim>>>;

/// Port blocks per (address, worker) of one gateway, by use (see
/// `grants`): an EIP's from the first port on, a node address's only from
/// the reserved range. With `since` (only pods, grants and reports changed
/// since the last pass), an address none of those changes reach keeps its
/// last outcome.
pub fn grant_ports(
    view: &ClusterView,
    cfg: &ControllerConfig,
    input: &GrantInput,
    workers: &WorkersMemo,
    since: Option<&Dirty>,
    memo: &mut GrantMemo,
    plan: &mut Plan,
) {
    let workers_of = workers.of();
    let eip_blocks = whole_blocks(cfg.first_port, u16::MAX, cfg.port_block_size);
    let node_ip_blocks = whole_blocks(
        cfg.node_ip_ports.0,
        cfg.node_ip_ports.1,
        cfg.port_block_size,
    );
    let name = input.gateway.as_str();
    let dirty = since.map(|s| reached(input, workers.changed(), s, memo));
    let demand = demand(input, workers_of, dirty.as_ref());
    let holders = Holders::new(view, name, dirty.as_ref(), memo.holders.as_ref());
    // Addresses a partial pass keeps that no unit uses any more (still
    // held, draining), owned: the memo is changed below.
    let kept_unused: Vec<String> = match &dirty {
        Some(d) => memo
            .last_addresses(name)
            .filter(|a| !d.contains(a) && !input.addresses.contains(*a))
            .map(str::to_string)
            .collect(),
        None => Vec::new(),
    };
    // Addresses some worker still holds (draining) though no policy uses
    // them any more: they stay until released.
    let mut addrs: BTreeSet<&str> = input.addresses.iter().map(String::as_str).collect();
    addrs.extend(holders.addresses());
    addrs.extend(kept_unused.iter().map(String::as_str));
    if let Some(d) = &dirty {
        // The plan holds the last pass's grants: out with those of the
        // addresses no longer looked at (those looked at are replaced when
        // decided again, below).
        for a in d.iter().filter(|a| !addrs.contains(*a)) {
            if let Some(old) = memo.last_outcome(name, a) {
                old.remove_grants(name, a, plan);
            }
        }
    }
    let none = BTreeMap::new();
    for &addr in &addrs {
        if dirty.as_ref().is_some_and(|d| !d.contains(addr)) {
            memo.carry(name, addr)
                .expect("an address not reached was looked at by the last pass")
                .add_facts(plan);
            continue;
        }
        let range = if input.node_ips.contains(addr) {
            node_ip_blocks.clone()
        } else {
            eip_blocks.clone()
        };
        let d = demand.get(addr).unwrap_or(&none);
        let holds_last = dirty.is_some();
        grant_address(&holders, cfg, name, addr, range, d, holds_last, memo, plan);
    }
}

/// The addresses whose inputs may have changed since the last pass: those
/// of policies whose workers changed, those whose grants or reports
/// changed, and any the last pass did not look at.
fn reached<'i>(
    input: &'i GrantInput,
    changed_workers: &BTreeSet<(Kind, ObjectKey)>,
    since: &'i Dirty,
    memo: &GrantMemo,
) -> BTreeSet<&'i str> {
    let mut out: BTreeSet<&str> = since.addresses_of(&input.gateway).collect();
    for key in changed_workers {
        for &i in input.units_of.get(key).into_iter().flatten() {
            out.extend(input.units[i].addresses.iter().map(String::as_str));
        }
    }
    let unseen = input.addresses.iter().map(String::as_str);
    out.extend(unseen.filter(|a| !memo.looked_at(&input.gateway, a)));
    out
}

/// Who wants ports of which address (of those in `only`, if given).
fn demand<'w>(
    input: &GrantInput,
    workers_of: &'w WorkersOf,
    only: Option<&BTreeSet<&str>>,
) -> Demand<'w> {
    let mut demand = Demand::new();
    for u in &input.units {
        let addrs: Vec<&String> = u
            .addresses
            .iter()
            .filter(|a| only.is_none_or(|o| o.contains(a.as_str())))
            .collect();
        if addrs.is_empty() {
            continue;
        }
        for (key, claim) in &u.policies {
            let Some(w) = workers_of.get(key).filter(|w| !w.is_empty()) else {
                continue;
            };
            for a in &addrs {
                let at = demand.entry((*a).clone()).or_default();
                for n in w {
                    at.entry(n.as_str()).or_default().push(claim.clone());
                }
            }
        }
    }
    demand
}
