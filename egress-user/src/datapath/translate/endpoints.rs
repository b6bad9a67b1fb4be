//! The 4-byte tunnel endpoint fields of the maps (see
//! `egress_common::endpoints`): the IPv4 address itself on an IPv4
//! underlay, an index into `TUNNEL_ENDPOINTS` on an IPv6 one.
//!
//! An address keeps its index for as long as it is named, and across agent
//! restarts (read back from the pinned table): NAT entries carry indexes
//! and outlive both. New addresses take free indexes in turn from a cursor
//! that only moves forward, so an index just given up is the last to be
//! handed out again; an index given up keeps its address in the table
//! until then.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, Ipv6Addr},
};

use egress_common::endpoints::{field_of, TunnelEndpoint, TUNNEL_ENDPOINTS_SIZE};

/// IPv6 endpoint -> index, and where the search for a free index starts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EndpointIndex {
    pub by_addr: BTreeMap<Ipv6Addr, u32>,
    pub next: u32,
}

impl EndpointIndex {
    /// The indexes of `addrs`: each keeps its index here, the others take
    /// free ones (never 0). Addresses past the table's size get none.
    pub fn assign(&self, addrs: &BTreeSet<Ipv6Addr>) -> EndpointIndex {
        let size = TUNNEL_ENDPOINTS_SIZE;
        let mut by_addr = BTreeMap::new();
        let mut used = BTreeSet::new();
        for a in addrs {
            if let Some(&i) = self.by_addr.get(a) {
                if (1..size).contains(&i) && used.insert(i) {
                    by_addr.insert(*a, i);
                }
            }
        }
        let mut next = self.next.clamp(1, size - 1);
        for a in addrs {
            if by_addr.contains_key(a) || used.len() as u32 >= size - 1 {
                continue;
            }
            while used.contains(&next) {
                next = wrap(next + 1);
            }
            used.insert(next);
            by_addr.insert(*a, next);
            next = wrap(next + 1);
        }
        EndpointIndex { by_addr, next }
    }

    /// What a pinned table holds (an earlier agent's assignment, the
    /// addresses it gave up included: they get their old index back if
    /// they return); the search goes on after the highest index.
    pub fn from_table(table: &[TunnelEndpoint]) -> EndpointIndex {
        let mut by_addr = BTreeMap::new();
        for (i, e) in table.iter().enumerate().skip(1) {
            if e.addr != [0; 16] {
                by_addr.entry(Ipv6Addr::from(e.addr)).or_insert(i as u32);
            }
        }
        let next = by_addr.values().max().map_or(1, |i| wrap(i + 1));
        EndpointIndex { by_addr, next }
    }

    /// The table entries this assignment needs written: index -> address.
    pub fn entries(&self) -> BTreeMap<u32, TunnelEndpoint> {
        self.by_addr
            .iter()
            .map(|(a, i)| (*i, TunnelEndpoint { addr: a.octets() }))
            .collect()
    }
}

/// The index after `i`, skipping 0.
fn wrap(i: u32) -> u32 {
    if i >= TUNNEL_ENDPOINTS_SIZE {
        1
    } else {
        i
    }
}

/// Every IPv6 tunnel endpoint `d` names: this node's, the policies'
/// gateways (and their ActiveActive sets), the routes' next hops and the
/// reply steering's workers.
pub fn named_v6(d: &crate::datapath::DesiredMaps) -> BTreeSet<Ipv6Addr> {
    let policies = d
        .policies
        .iter()
        .flat_map(|p| std::iter::once(p.gateway_tunnel_ip).chain(p.spread.iter().copied()));
    std::iter::once(d.config.node_tunnel_ip)
        .chain(policies)
        .chain(d.routes.iter().map(|r| r.tunnel_ip))
        .chain(d.reply_steering.iter().map(|s| s.worker_tunnel_ip))
        .filter_map(|ip| match ip {
            IpAddr::V6(v6) if !v6.is_unspecified() => Some(v6),
            _ => None,
        })
        .collect()
}

/// How the maps name tunnel endpoints on this node's underlay.
#[derive(Clone, Copy, Debug)]
pub enum Underlay<'a> {
    V4,
    V6(&'a EndpointIndex),
}

impl Underlay<'_> {
    /// The 4-byte field naming `ip`; zero ("no endpoint") for an address
    /// of the other family, unspecified, or without an index.
    pub fn field(&self, ip: IpAddr) -> [u8; 4] {
        match (self, ip) {
            (_, ip) if ip.is_unspecified() => [0; 4],
            (Underlay::V4, IpAddr::V4(v4)) => v4.octets(),
            (Underlay::V6(ix), IpAddr::V6(v6)) => {
                ix.by_addr.get(&v6).copied().map_or([0; 4], field_of)
            }
            _ => [0; 4],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(n: u16) -> Ipv6Addr {
        Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, n)
    }

    fn set(ns: &[u16]) -> BTreeSet<Ipv6Addr> {
        ns.iter().map(|n| a(*n)).collect()
    }

    #[test]
    fn indexes_start_at_one_and_are_kept() {
        let first = EndpointIndex::default().assign(&set(&[1, 2, 3]));
        let mut got: Vec<u32> = first.by_addr.values().copied().collect();
        got.sort();
        assert_eq!(got, vec![1, 2, 3], "0 means no endpoint: never given out");
        let second = first.assign(&set(&[2, 3, 4]));
        assert_eq!(second.by_addr[&a(2)], first.by_addr[&a(2)]);
        assert_eq!(second.by_addr[&a(3)], first.by_addr[&a(3)]);
        assert_eq!(second.by_addr[&a(4)], 4, "a new one after the cursor");
    }

    #[test]
    fn an_index_given_up_is_handed_out_last() {
        let first = EndpointIndex::default().assign(&set(&[1, 2]));
        let freed = first.by_addr[&a(1)];
        let second = first.assign(&set(&[2, 9]));
        assert_ne!(second.by_addr[&a(9)], freed);
        // Round the whole table: only then does the freed index come back.
        let mut ix = second;
        let mut seen_freed_at = None;
        for n in 0..(TUNNEL_ENDPOINTS_SIZE as u16 - 1) {
            ix = ix.assign(&set(&[2, 100 + n]));
            if ix.by_addr[&a(100 + n)] == freed {
                seen_freed_at = Some(n);
                break;
            }
        }
        assert!(seen_freed_at.unwrap() > 8000, "{seen_freed_at:?}");
    }

    #[test]
    fn a_pinned_table_is_read_back_with_its_indexes() {
        let ix = EndpointIndex::default().assign(&set(&[5, 6, 7]));
        let mut table = vec![TunnelEndpoint::default(); TUNNEL_ENDPOINTS_SIZE as usize];
        for (i, e) in ix.entries() {
            table[i as usize] = e;
        }
        let back = EndpointIndex::from_table(&table);
        assert_eq!(back.by_addr, ix.by_addr);
        let again = back.assign(&set(&[5, 6, 7, 8]));
        assert_eq!(again.by_addr[&a(8)], 4, "after the highest index read back");
    }

    #[test]
    fn a_full_table_gives_no_index_and_the_field_reads_absent() {
        let many: BTreeSet<Ipv6Addr> = (0..TUNNEL_ENDPOINTS_SIZE)
            .map(|n| Ipv6Addr::from((0xfd00_u128 << 112) | (u128::from(n) + 1)))
            .collect();
        let ix = EndpointIndex::default().assign(&many);
        assert_eq!(ix.by_addr.len() as u32, TUNNEL_ENDPOINTS_SIZE - 1);
        let left_out = many.iter().find(|m| !ix.by_addr.contains_key(m)).unwrap();
        assert_eq!(Underlay::V6(&ix).field((*left_out).into()), [0; 4]);
    }

    #[test]
    fn a_field_of_the_other_family_reads_absent() {
        let ix = EndpointIndex::default().assign(&set(&[1]));
        let v4: IpAddr = "10.0.0.1".parse().unwrap();
        assert_eq!(Underlay::V4.field(v4), [10, 0, 0, 1]);
        assert_eq!(Underlay::V4.field(a(1).into()), [0; 4]);
        assert_eq!(Underlay::V6(&ix).field(v4), [0; 4]);
        assert_eq!(Underlay::V6(&ix).field(a(1).into()), field_of(1));
    }
}
