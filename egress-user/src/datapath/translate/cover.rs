//! Whether any prefix of a set covers a given prefix, in a few lookups
//! rather than a scan of the set: the cluster's CIDRs are every node's pod
//! CIDR, and each of them is also a key of the destination trie, so a scan
//! per key grew with the square of the cluster (a million comparisons per
//! pass at 1,000 nodes).

use std::{
    collections::BTreeSet,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use crate::datapath::desired::Cidr;

/// The fewest prefixes whose union is exactly the union of `prefixes`:
/// nested ones dropped, adjacent ones merged. Every node adds its pod
/// CIDR and addresses to the cluster's CIDRs, and each becomes a key of
/// the destination trie on every node; nodes numbered in order merge into
/// a few prefixes, so the trie and each pass no longer grow with the
/// cluster. The lookups mean the same: a destination is in the cluster
/// exactly when it was before, and a policy's own prefixes stay keys.
pub(super) fn aggregate(prefixes: &[Cidr]) -> Vec<Cidr> {
    let mut ranges: Vec<(bool, u128, u128)> = prefixes.iter().map(|c| range(*c)).collect();
    ranges.sort_unstable();
    let mut merged: Vec<(bool, u128, u128)> = Vec::with_capacity(ranges.len());
    for (v6, lo, hi) in ranges {
        match merged.last_mut() {
            // Overlapping or adjacent, same family.
            Some((f, _, end)) if *f == v6 && (lo <= *end || lo == *end + 1) => {
                *end = (*end).max(hi)
            }
            _ => merged.push((v6, lo, hi)),
        }
    }
    merged
        .into_iter()
        .flat_map(|(v6, lo, hi)| prefixes_of(v6, lo, hi))
        .collect()
}

/// A prefix as its first and last address (IPv4 in the low 32 bits).
fn range(c: Cidr) -> (bool, u128, u128) {
    let c = c.normalized();
    let (v6, bits, start) = match c.addr {
        IpAddr::V4(a) => (false, 32u32, u128::from(u32::from(a))),
        IpAddr::V6(a) => (true, 128, u128::from(a)),
    };
    let host_bits = bits - u32::from(c.len);
    let span = if host_bits == 128 {
        u128::MAX
    } else {
        (1u128 << host_bits) - 1
    };
    (v6, start, start + span)
}

/// The aligned prefixes that make up `lo..=hi`, largest first.
fn prefixes_of(v6: bool, mut lo: u128, hi: u128) -> Vec<Cidr> {
    let bits = if v6 { 128 } else { 32 };
    let mut out = Vec::new();
    loop {
        // An aligned block of 2^size addresses from `lo` never wraps.
        let end_of = |size: u32| match size {
            128 => u128::MAX,
            s => lo + ((1u128 << s) - 1),
        };
        // The largest aligned block that starts at `lo` and ends by `hi`.
        let mut size = lo.trailing_zeros().min(bits);
        while end_of(size) > hi {
            size -= 1;
        }
        let addr = if v6 {
            IpAddr::V6(Ipv6Addr::from(lo))
        } else {
            IpAddr::V4(Ipv4Addr::from(lo as u32))
        };
        out.push(Cidr {
            addr,
            len: (bits - size) as u8,
        });
        let last = end_of(size);
        if last >= hi {
            return out;
        }
        lo = last + 1;
    }
}

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

    fn cidrs(v: &[&str]) -> Vec<Cidr> {
        v.iter().map(|s| cidr(s)).collect()
    }

    #[test]
    fn aggregation_merges_neighbours_and_drops_nested_prefixes() {
        // A thousand nodes' /24 pod CIDRs and /32 addresses, numbered in order.
        let mut set: Vec<Cidr> = (0..1000u32)
            .map(|i| cidr(&format!("10.{}.{}.0/24", 100 + i / 256, i % 256)))
            .collect();
        set.extend((1..=254).map(|i| cidr(&format!("192.168.0.{i}/32"))));
        set.push(cidr("10.100.7.128/25"));
        let agg = aggregate(&set);
        // Two runs of addresses: 6 and 14 aligned blocks, against 1,255 prefixes.
        assert_eq!(agg.len(), 20, "{agg:?}");
        // Exactly the same addresses, probed at every edge.
        let cover = PrefixCover::new(&agg);
        for p in &set {
            assert!(cover.covers(p), "{p:?} lost");
        }
        for outside in [
            "10.99.255.255/32",
            "10.103.232.0/32",
            "192.168.0.0/32",
            "192.168.0.255/32",
        ] {
            assert!(!cover.covers(&cidr(outside)), "{outside} gained");
        }
        assert!(cover.covers(&cidr("10.103.231.255/32")));
    }

    #[test]
    fn aggregation_keeps_families_apart_and_handles_the_whole_space() {
        assert_eq!(
            aggregate(&cidrs(&["0.0.0.0/1", "128.0.0.0/1", "::/1", "8000::/1"])),
            cidrs(&["0.0.0.0/0", "::/0"])
        );
        assert_eq!(
            aggregate(&cidrs(&["10.0.0.1/32", "10.0.0.2/32", "10.0.0.3/32"])),
            cidrs(&["10.0.0.1/32", "10.0.0.2/31"])
        );
        assert_eq!(
            aggregate(&cidrs(&[
                "fd00::/64",
                "fd00:0:0:1::/64",
                "10.1.0.0/16",
                "10.1.2.0/24"
            ])),
            cidrs(&["10.1.0.0/16", "fd00::/63"])
        );
        assert!(aggregate(&[]).is_empty());
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
