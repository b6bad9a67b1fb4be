//! Whether any prefix of a set covers a given prefix, in a few lookups
//! rather than a scan of the set: the cluster's CIDRs are every node's pod
//! CIDR, and each of them is also a key of the destination trie, so a scan
//! per key grew with the square of the cluster (a million comparisons per
//! pass at 1,000 nodes).

use std::collections::BTreeSet;

use crate::datapath::desired::Cidr;

pub(super) struct PrefixCover {
    prefixes: BTreeSet<Cidr>,
    /// The lengths present, per family (false: IPv4).
    lens: BTreeSet<(bool, u8)>,
}

impl PrefixCover {
    pub(super) fn new(prefixes: &[Cidr]) -> Self {
        let prefixes: BTreeSet<Cidr> = prefixes.iter().map(|c| c.normalized()).collect();
        let lens = prefixes.iter().map(|c| (c.addr.is_ipv6(), c.len)).collect();
        Self { prefixes, lens }
    }

    /// True when some prefix of the set contains `c` (same family only),
    /// as `Cidr::contains` says.
    pub(super) fn covers(&self, c: &Cidr) -> bool {
        let v6 = c.addr.is_ipv6();
        self.lens.range((v6, 0)..=(v6, c.len)).any(|&(_, len)| {
            self.prefixes
                .contains(&Cidr { addr: c.addr, len }.normalized())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cidr(s: &str) -> Cidr {
        s.parse().unwrap()
    }

    #[test]
    fn covers_as_a_scan_of_the_set_would() {
        let set: Vec<Cidr> = [
            "10.244.0.0/16",
            "10.96.0.0/12",
            "192.168.7.0/24",
            "fd00:44::/48",
        ]
        .iter()
        .map(|s| cidr(s))
        .collect();
        let cover = PrefixCover::new(&set);
        let probes = [
            "10.244.3.0/24",
            "10.244.0.0/16",
            "10.244.0.0/15",
            "10.100.1.1/32",
            "10.112.0.0/32",
            "192.168.7.9/32",
            "192.168.8.0/24",
            "0.0.0.0/0",
            "fd00:44:0:1::/64",
            "fd00:45::/64",
            "::/0",
            // An IPv4-mapped address is IPv6: no IPv4 prefix covers it.
            "::ffff:10.244.0.1/128",
        ];
        for p in probes.iter().map(|s| cidr(s)) {
            let scan = set.iter().any(|s| s.contains(&p));
            assert_eq!(cover.covers(&p), scan, "{p:?}");
        }
        assert!(cover.covers(&cidr("10.244.3.0/24")));
        assert!(!cover.covers(&cidr("10.244.0.0/15")));
    }
}
