//! Port blocks by use: which blocks of one address each worker holds after
//! this pass, from what it held, what its agent reports using and what it
//! has emptied. Plain data in, plain data out; the reconcile pass feeds it
//! one address at a time.
//!
//! The rules:
//! - Headroom: a worker with demand keeps at least twice its ports in use
//!   plus one block active (so a burst does not stall, and the program's
//!   random port probes rarely miss), at least one block, at most its cap.
//! - Growth reactivates the worker's own draining blocks first (not yet
//!   released ones), then takes the lowest free blocks.
//! - Shrinking is lazy (hysteresis): only when the active blocks are more
//!   than twice what the headroom asks, the surplus goes draining; a worker
//!   without demand drains every block.
//! - A draining block leaves the worker only once its agent lists it as
//!   released (no NAT entry uses it, for the agent's quarantine). Until
//!   then it stays in the worker's grant, the gateways keep steering its
//!   replies there, and no other worker can be given it.
//! - A block the worker still lists as released is never granted to that
//!   worker again, so a stale report cannot release a later grant.

use std::collections::{BTreeMap, BTreeSet};

/// One worker's standing for one address.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WorkerPorts {
    /// Every block it holds, the draining ones included.
    pub held: Vec<u16>,
    /// The held blocks it is emptying.
    pub draining: Vec<u16>,
    /// Live NAT entries (ports) its agent reports for the address.
    pub in_use: u32,
    /// Draining blocks its agent reports emptied.
    pub released: Vec<u16>,
    /// Whether a selected pod of a policy using the address runs there.
    pub demand: bool,
    /// Most blocks it may hold (the operator's and the policies' caps).
    pub cap: u16,
}

/// What a worker holds after the pass, and why it holds no more.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Holding {
    pub held: Vec<u16>,
    pub draining: Vec<u16>,
    /// Blocks the headroom asks for; more than `cap` when the cap bites.
    pub wanted: u16,
    /// Fewer active blocks than wanted because no block was free.
    pub refused: bool,
}

impl Holding {
    /// Blocks it may choose new flows' ports in.
    pub fn active(&self) -> usize {
        self.held.len() - self.draining.len()
    }
}

/// Blocks the headroom rule asks for: active ports at least twice the ports
/// in use plus one block; never fewer than one block.
pub fn wanted_blocks(in_use: u32, block_size: u16) -> u16 {
    let size = u64::from(block_size.max(1));
    let blocks = (2 * u64::from(in_use)).div_ceil(size) + 1;
    blocks.min(u64::from(u16::MAX)) as u16
}

/// The whole decision for one address over its range of blocks.
pub fn plan_address(
    range: std::ops::Range<u16>,
    block_size: u16,
    workers: &BTreeMap<String, WorkerPorts>,
) -> BTreeMap<String, Holding> {
    let mut taken: BTreeSet<u16> = BTreeSet::new();
    let mut out: BTreeMap<String, Holding> = BTreeMap::new();
    // What each worker keeps: held blocks still in range, not yet released
    // (a block two workers claim stays with the first in name order).
    for (w, s) in workers {
        let draining: BTreeSet<u16> = s.draining.iter().copied().collect();
        let released: BTreeSet<u16> = s.released.iter().copied().collect();
        let mut h = Holding::default();
        for &b in &s.held {
            let gone = draining.contains(&b) && released.contains(&b);
            if gone || !range.contains(&b) || !taken.insert(b) {
                continue;
            }
            h.held.push(b);
            if draining.contains(&b) || !s.demand {
                h.draining.push(b);
            }
        }
        out.insert(w.clone(), h);
    }
    for (w, s) in workers {
        let h = out.get_mut(w).expect("every worker has a holding");
        if !s.demand {
            continue;
        }
        h.wanted = wanted_blocks(s.in_use, block_size);
        let target = usize::from(h.wanted.min(s.cap).max(1));
        grow(h, target, s, &range, &mut taken);
        shrink(h, target);
    }
    for h in out.values_mut() {
        h.held.sort_unstable();
        h.draining.sort_unstable();
    }
    out
}

/// Reactivates own draining blocks, then takes free ones, up to `target`.
fn grow(
    h: &mut Holding,
    target: usize,
    s: &WorkerPorts,
    range: &std::ops::Range<u16>,
    taken: &mut BTreeSet<u16>,
) {
    while h.active() < target {
        let Some(i) = h.draining.iter().position(|b| !s.released.contains(b)) else {
            break;
        };
        h.draining.remove(i);
    }
    let mut next = range.start;
    while h.active() < target {
        let free = (next..range.end).find(|b| !taken.contains(b) && !s.released.contains(b));
        match free {
            Some(b) => {
                taken.insert(b);
                h.held.push(b);
                next = b + 1;
            }
            None => {
                h.refused = true;
                break;
            }
        }
    }
}

/// More than twice the target active: the highest surplus blocks drain.
fn shrink(h: &mut Holding, target: usize) {
    if h.active() <= 2 * target {
        return;
    }
    let mut active: Vec<u16> = h
        .held
        .iter()
        .copied()
        .filter(|b| !h.draining.contains(b))
        .collect();
    active.sort_unstable();
    h.draining.extend(active.drain(target..));
}

#[cfg(test)]
mod tests;
