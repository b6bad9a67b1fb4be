//! Which policies fit into this node's maps, and what stands in for the
//! ones that do not. Pure; used by [`translate`](super::translate).
//!
//! Policies are taken in priority order. One whose prefixes no longer fit
//! into a trie is not applied; in its place goes a fail-closed rule
//! (`no_gateway`: the program drops what it matches) whose prefixes are
//! shortened until they fit, down to `0.0.0.0/0` and `::/0`, which are
//! always in both tries. So a policy that does not fit never lets its
//! pods' traffic leave untranslated; the price is that the stand-in may
//! drop more than the policy covers (neighbouring addresses, its
//! exclusions). When the slots run out, the last slot is one shared
//! fail-closed rule for every policy past it (they come last in priority
//! order, so no applied policy loses to it).

use std::collections::BTreeSet;

use super::desired::{Cidr, PolicyRule};

/// The policy id of the shared fail-closed slot (real ids are never 0).
pub const OVERFLOW_POLICY_ID: u32 = 0;

/// A stand-in adds at most this many prefixes to a trie.
pub const STAND_IN_PREFIXES: usize = 256;

/// The map limit a policy exceeds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Limit {
    /// More policies than policy slots on the node.
    PolicySlots,
    /// Its destination and excluded prefixes do not fit the destination trie.
    DestinationCidrs,
    /// Its source prefixes (pods, pod subnets) do not fit the source trie.
    SourcePods,
    /// Its EIPs are more than the port-block table holds besides those of
    /// the policies before it.
    Eips,
}

impl Limit {
    /// The metric label and the published name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::PolicySlots => "policySlots",
            Self::DestinationCidrs => "destinationCIDRs",
            Self::SourcePods => "sourcePods",
            Self::Eips => "eips",
        }
    }
}

/// A policy left out of the maps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OverCapacity {
    pub policy_id: u32,
    pub limit: Limit,
    /// What the policy needs: its prefixes, or the node's policy count.
    pub count: usize,
    /// What the datapath holds in all.
    pub max: usize,
}

/// Sizes of the maps a placement must fit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caps {
    pub slots: usize,
    pub src_entries: usize,
    pub dst_entries: usize,
    /// Distinct EIPs the node's port-block table holds.
    pub eips: usize,
}

/// The rules to write, in slot order, and the policies left out.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Placement {
    pub rules: Vec<PolicyRule>,
    pub over: Vec<OverCapacity>,
}

/// The prefixes that are in each trie whatever the policies.
pub fn always_present() -> [Cidr; 2] {
    [
        "0.0.0.0/0".parse().expect("valid"),
        "::/0".parse().expect("valid"),
    ]
}

/// Places `sorted` (priority order) into `caps`; `cluster` prefixes go
/// into the destination trie first.
pub fn place(sorted: &[&PolicyRule], cluster: &[Cidr], caps: Caps) -> Placement {
    let mut src: BTreeSet<Cidr> = always_present().into();
    let mut dst: BTreeSet<Cidr> = always_present().into();
    dst.extend(cluster.iter().map(|c| c.normalized()));
    let mut eips: BTreeSet<std::net::IpAddr> = BTreeSet::new();
    let mut out = Placement::default();
    for p in sorted {
        let new_e: BTreeSet<std::net::IpAddr> =
            rule_eips(p).filter(|e| !eips.contains(e)).collect();
        let s = p.sources.iter().map(|c| c.normalized());
        let d = p
            .destinations
            .iter()
            .chain(&p.excluded)
            .map(|c| c.normalized());
        let new_s: BTreeSet<Cidr> = s.filter(|c| !src.contains(c)).collect();
        let new_d: BTreeSet<Cidr> = d.filter(|c| !dst.contains(c)).collect();
        let over = if dst.len() + new_d.len() > caps.dst_entries {
            Some((
                Limit::DestinationCidrs,
                p.destinations.len() + p.excluded.len(),
                caps.dst_entries,
            ))
        } else if src.len() + new_s.len() > caps.src_entries {
            Some((Limit::SourcePods, p.sources.len(), caps.src_entries))
        } else if eips.len() + new_e.len() > caps.eips {
            Some((Limit::Eips, eips.len() + new_e.len(), caps.eips))
        } else {
            None
        };
        let rule = match over {
            None => {
                src.extend(new_s);
                dst.extend(new_d);
                eips.extend(new_e);
                (*p).clone()
            }
            Some((limit, count, max)) => {
                out.over.push(OverCapacity {
                    policy_id: p.id,
                    limit,
                    count,
                    max,
                });
                stand_in(p, &mut src, &mut dst, caps)
            }
        };
        out.rules.push(rule);
    }
    share_last_slot(&mut out, caps.slots);
    out
}

/// The EIPs (IPv4, IPv6) rule `p` translates to.
pub fn rule_eips(p: &PolicyRule) -> impl Iterator<Item = std::net::IpAddr> {
    [
        p.eip_v4.map(std::net::IpAddr::V4),
        p.eip_v6.map(std::net::IpAddr::V6),
    ]
    .into_iter()
    .flatten()
}

/// The fail-closed rule standing in for `p`; its prefixes are added to the sets.
fn stand_in(
    p: &PolicyRule,
    src: &mut BTreeSet<Cidr>,
    dst: &mut BTreeSet<Cidr>,
    caps: Caps,
) -> PolicyRule {
    let room_s = caps
        .src_entries
        .saturating_sub(src.len())
        .min(STAND_IN_PREFIXES);
    let room_d = caps
        .dst_entries
        .saturating_sub(dst.len())
        .min(STAND_IN_PREFIXES);
    let sources = summarize(&p.sources, src, room_s);
    let destinations = summarize(&p.destinations, dst, room_d);
    src.extend(sources.iter().copied());
    dst.extend(destinations.iter().copied());
    fail_closed(p.id, p.priority, sources, destinations)
}

fn fail_closed(id: u32, priority: i32, sources: Vec<Cidr>, destinations: Vec<Cidr>) -> PolicyRule {
    PolicyRule::fail_closed(id, priority, sources, destinations, Vec::new())
}

/// `prefixes` shortened by as few bits as needed for at most `room` of
/// them to be missing from `have`. An empty list stays empty (it means
/// "everything" for destinations). Always succeeds: shortened by 128 bits
/// every prefix is `0.0.0.0/0` or `::/0`, which `have` holds.
pub fn summarize(prefixes: &[Cidr], have: &BTreeSet<Cidr>, room: usize) -> Vec<Cidr> {
    for cut in 0..=128u8 {
        let short: BTreeSet<Cidr> = prefixes
            .iter()
            .map(|c| {
                Cidr {
                    addr: c.addr,
                    len: c.len.saturating_sub(cut),
                }
                .normalized()
            })
            .collect();
        if short.iter().filter(|c| !have.contains(c)).count() <= room {
            return short.into_iter().collect();
        }
    }
    unreachable!("a 128-bit cut leaves only the prefixes every trie holds")
}

/// Past `slots` rules, the last slot becomes one fail-closed rule for all
/// of the rest; each of them is reported once.
fn share_last_slot(out: &mut Placement, slots: usize) {
    if out.rules.len() <= slots || slots == 0 {
        return;
    }
    let total = out.rules.len();
    let rest = out.rules.split_off(slots - 1);
    let reported: BTreeSet<u32> = out.over.iter().map(|o| o.policy_id).collect();
    for r in rest.iter().filter(|r| !reported.contains(&r.id)) {
        out.over.push(OverCapacity {
            policy_id: r.id,
            limit: Limit::PolicySlots,
            count: total,
            max: slots,
        });
    }
    let mut sources: BTreeSet<Cidr> = BTreeSet::new();
    let mut dests: BTreeSet<Cidr> = BTreeSet::new();
    let mut everywhere = false;
    for r in &rest {
        sources.extend(r.sources.iter().map(|c| c.normalized()));
        everywhere |= r.destinations.is_empty();
        dests.extend(r.destinations.iter().map(|c| c.normalized()));
    }
    if everywhere {
        dests.clear();
    }
    let priority = rest[0].priority;
    out.rules.push(fail_closed(
        OVERFLOW_POLICY_ID,
        priority,
        sources.into_iter().collect(),
        dests.into_iter().collect(),
    ));
}

#[cfg(test)]
mod tests;
