//! BGP identifiers two established peers share. Within an AS each must be
//! unique (RFC 6286): a reflector stamps a client's routes with that
//! client's identifier as ORIGINATOR_ID, and another client holding the
//! same identifier drops them as looped (RFC 4456), without a word. Agents
//! on an IPv6 underlay take the last 32 bits of their address as
//! identifier, which two nodes may share; the reflector names them.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};

/// For each peer whose identifier another peer also has: those others.
pub fn sharing(
    peers: impl IntoIterator<Item = (IpAddr, Ipv4Addr)>,
) -> BTreeMap<IpAddr, Vec<IpAddr>> {
    let mut by_id: BTreeMap<Ipv4Addr, Vec<IpAddr>> = BTreeMap::new();
    for (addr, id) in peers {
        by_id.entry(id).or_default().push(addr);
    }
    let mut out = BTreeMap::new();
    for addrs in by_id.values().filter(|a| a.len() > 1) {
        for &a in addrs {
            let mut others: Vec<IpAddr> = addrs.iter().copied().filter(|&o| o != a).collect();
            others.sort();
            out.insert(a, others);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn distinct_identifiers_share_nothing() {
        let id = |n| Ipv4Addr::new(0, 0, 0, n);
        assert!(sharing([(a("fd00::1"), id(1)), (a("fd00::2"), id(2))]).is_empty());
    }

    #[test]
    fn each_holder_of_a_shared_identifier_names_the_others() {
        let same = Ipv4Addr::new(0, 0, 0, 5);
        let s = sharing([
            (a("fd00:1::5"), same),
            (a("fd00:2::5"), same),
            (a("fd00:3::5"), same),
            (a("fd00::9"), Ipv4Addr::new(0, 0, 0, 9)),
        ]);
        assert_eq!(s.len(), 3);
        assert_eq!(s[&a("fd00:1::5")], vec![a("fd00:2::5"), a("fd00:3::5")]);
        assert_eq!(s[&a("fd00:3::5")], vec![a("fd00:1::5"), a("fd00:2::5")]);
        assert!(!s.contains_key(&a("fd00::9")));
    }
}
