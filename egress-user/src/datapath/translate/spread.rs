//! The flow buckets of an ActiveActive policy: which gateway each of the
//! `SPREAD_WAYS` buckets sends to, by rendezvous hashing. Each bucket goes
//! to the gateway with the highest score for (bucket, gateway), so when a
//! gateway leaves, only its own buckets move (each to the next best), and
//! when it comes back it takes back exactly those: no other flow changes
//! gateway. Every worker computes the same table from the same set.

use std::net::IpAddr;

use egress_common::policy::GatewaySpread;

/// The table for `gateways` (order and duplicates do not matter), each
/// named by `field` (see `endpoints::Underlay`); all zeroes when there is
/// none.
pub fn spread_table(gateways: &[IpAddr], field: impl Fn(IpAddr) -> [u8; 4]) -> GatewaySpread {
    let mut t = GatewaySpread::default();
    for (bucket, slot) in t.tunnel_ips.iter_mut().enumerate() {
        let best = gateways
            .iter()
            .max_by_key(|g| (score(bucket, **g), key(**g)));
        if let Some(g) = best {
            *slot = field(*g);
        }
    }
    t
}

/// A gateway as a number: its IPv4 address (so an IPv4 underlay's buckets
/// stay where earlier agents put them), or its IPv6 address folded.
fn key(g: IpAddr) -> u64 {
    match g {
        IpAddr::V4(v4) => u64::from(u32::from(v4)),
        IpAddr::V6(v6) => {
            let n = u128::from(v6);
            mix((n >> 64) as u64) ^ n as u64
        }
    }
}

/// The pair's score: the gateway mixed alone first, so that addresses
/// one apart do not give correlated scores across buckets.
fn score(bucket: usize, gateway: IpAddr) -> u64 {
    mix(mix(key(gateway)) ^ bucket as u64)
}

/// splitmix64's finaliser: every input bit reaches every output bit.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use egress_common::policy::SPREAD_WAYS;
    use std::net::Ipv4Addr;

    fn v4_field(ip: IpAddr) -> [u8; 4] {
        match ip {
            IpAddr::V4(v4) => v4.octets(),
            IpAddr::V6(_) => [0; 4],
        }
    }

    fn table(gws: &[Ipv4Addr]) -> GatewaySpread {
        let gws: Vec<IpAddr> = gws.iter().map(|g| IpAddr::V4(*g)).collect();
        spread_table(&gws, v4_field)
    }

    fn buckets_of(t: &GatewaySpread, gateway: Ipv4Addr) -> usize {
        t.tunnel_ips
            .iter()
            .filter(|ip| **ip == gateway.octets())
            .count()
    }

    fn gw(i: u8) -> Ipv4Addr {
        Ipv4Addr::new(192, 168, 0, i)
    }

    #[test]
    fn every_bucket_has_a_gateway_and_the_share_is_near_even() {
        for n in 1..=8u8 {
            let gws: Vec<_> = (1..=n).map(gw).collect();
            let t = table(&gws);
            let counts: Vec<usize> = gws.iter().map(|g| buckets_of(&t, *g)).collect();
            assert_eq!(counts.iter().sum::<usize>(), SPREAD_WAYS, "{counts:?}");
            // Rendezvous hashing is even only on average: with 256
            // buckets every gateway of up to eight gets 75%-145% of its share.
            let even = SPREAD_WAYS as f64 / f64::from(n);
            assert!(
                counts
                    .iter()
                    .all(|c| (0.75..=1.45).contains(&(*c as f64 / even))),
                "{n} gateways: {counts:?}"
            );
        }
    }

    #[test]
    fn a_gateway_leaving_moves_only_its_own_buckets_and_takes_them_back() {
        let all: Vec<_> = (1..=4).map(gw).collect();
        let before = table(&all);
        let without: Vec<_> = all.iter().copied().filter(|g| *g != gw(3)).collect();
        let after = table(&without);
        for b in 0..SPREAD_WAYS {
            if before.tunnel_ips[b] == gw(3).octets() {
                assert_ne!(after.tunnel_ips[b], gw(3).octets());
            } else {
                assert_eq!(after.tunnel_ips[b], before.tunnel_ips[b], "bucket {b}");
            }
        }
        assert_eq!(buckets_of(&after, gw(3)), 0);
        assert_eq!(table(&all), before, "back: the same table");
    }

    #[test]
    fn order_and_duplicates_do_not_matter_and_none_gives_zeroes() {
        let a = table(&[gw(1), gw(2), gw(3)]);
        assert_eq!(table(&[gw(3), gw(1), gw(2), gw(1)]), a);
        assert_eq!(table(&[]), GatewaySpread::default());
        let one = table(&[gw(7)]);
        assert_eq!(buckets_of(&one, gw(7)), SPREAD_WAYS);
    }
}
