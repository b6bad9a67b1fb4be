//! The multipath set sent to ADD-PATH peers (RFC 7911), and the path ids
//! that name its members on the wire.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

use super::decision::{equal_until_tie_break, tie_break_key};
use super::{flagged, Route, RouteSource};

/// Our own announcement's path id (no peer has the address 0.0.0.0).
pub(crate) const LOCAL_PATH_ID: u32 = 0;

/// Every candidate that ties with the best route up to the final
/// tie-breaks (router id / ORIGINATOR_ID, CLUSTER_LIST length, peer
/// address), best first and then in tie-break order, one per next hop:
/// a second path to the same next hop adds nothing to an ECMP route.
pub(crate) fn multipath_set(routes: &[Route]) -> Vec<&Route> {
    let mut c = equal_until_tie_break(routes);
    c.sort_by_key(|r| tie_break_key(r));
    let mut seen: Vec<IpAddr> = Vec::with_capacity(c.len());
    c.retain(|r| {
        let fresh = !seen.contains(&r.next_hop);
        seen.push(r.next_hop);
        fresh
    });
    c
}

/// The path id of a route: its source's, which stays the same while the
/// source has the route (a source has at most one route per prefix).
pub(crate) fn path_id(r: &Route) -> u32 {
    match &r.source {
        RouteSource::Local => LOCAL_PATH_ID,
        RouteSource::Peer(p) => p.path_id,
    }
}

/// A prefix's selection: the best route and, when the prefix has more
/// than one candidate, its multipath set (best first). Held from before a
/// change so that what was sent can be told from what is to be sent.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Selection {
    pub(crate) best: Option<Route>,
    /// Empty when the set is the best route alone (the common case, kept
    /// free of an allocation).
    set: Vec<Route>,
}

impl Selection {
    /// The selection as it stands on `routes` (whose flags are current).
    pub(crate) fn of(routes: &[Route]) -> Selection {
        let best = flagged(routes).cloned();
        let set = if best.is_some() && routes.len() > 1 {
            multipath_set(routes).into_iter().cloned().collect()
        } else {
            Vec::new()
        };
        Selection { best, set }
    }

    /// The multipath set, best first.
    pub(crate) fn paths(&self) -> &[Route] {
        if self.set.is_empty() {
            self.best.as_slice()
        } else {
            &self.set
        }
    }
}

/// Hands out the path id of each peer: stable for an address (an IPv4
/// peer's is its address, so it survives our restart and a helper's
/// stale paths are replaced, not doubled), and never given to another
/// address, even after the peer is removed, so an id still in some peer's
/// table never names a different path.
#[derive(Debug, Default)]
pub(crate) struct PathIds {
    by_addr: HashMap<IpAddr, u32>,
    used: HashSet<u32>,
}

impl PathIds {
    pub(crate) fn id_for(&mut self, addr: IpAddr) -> u32 {
        if let Some(id) = self.by_addr.get(&addr) {
            return *id;
        }
        let mut id = natural_id(addr);
        while id == LOCAL_PATH_ID || self.used.contains(&id) {
            id = id.wrapping_add(1);
        }
        self.used.insert(id);
        self.by_addr.insert(addr, id);
        id
    }
}

fn natural_id(addr: IpAddr) -> u32 {
    match addr {
        IpAddr::V4(a) => u32::from(a),
        IpAddr::V6(a) => {
            let b = a.octets();
            let word = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
            word(0) ^ word(4) ^ word(8) ^ word(12)
        }
    }
}

#[cfg(test)]
mod tests;
