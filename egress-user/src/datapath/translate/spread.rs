//! The flow buckets of an ActiveActive policy: which gateway each of the
//! `SPREAD_WAYS` buckets sends to, by rendezvous hashing. Each bucket goes
//! to the gateway with the highest score for (bucket, gateway), so when a
//! gateway leaves, only its own buckets move (each to the next best), and
//! when it comes back it takes back exactly those: no other flow changes
//! gateway. Every worker computes the same table from the same set.

use std::net::Ipv4Addr;

use egress_common::policy::GatewaySpread;

/// The table for `gateways` (order and duplicates do not matter); all
/// zeroes when there is none.
pub fn spread_table(gateways: &[Ipv4Addr]) -> GatewaySpread {
    let mut t = GatewaySpread::default();
    for (bucket, slot) in t.tunnel_ips.iter_mut().enumerate() {
        let best = gateways
            .iter()
            .max_by_key(|g| (score(bucket, **g), u32::from(**g)));
        if let Some(g) = best {
            *slot = g.octets();
        }
    }
    t
}

/// The pair's score: the gateway mixed alone first, so that addresses
/// one apart do not give correlated scores across buckets.
fn score(bucket: usize, gateway: Ipv4Addr) -> u64 {
    mix(mix(u64::from(u32::from(gateway))) ^ bucket as u64)
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
            let t = spread_table(&gws);
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
        let before = spread_table(&all);
        let without: Vec<_> = all.iter().copied().filter(|g| *g != gw(3)).collect();
        let after = spread_table(&without);
        for b in 0..SPREAD_WAYS {
            if before.tunnel_ips[b] == gw(3).octets() {
                assert_ne!(after.tunnel_ips[b], gw(3).octets());
            } else {
                assert_eq!(after.tunnel_ips[b], before.tunnel_ips[b], "bucket {b}");
            }
        }
        assert_eq!(buckets_of(&after, gw(3)), 0);
        assert_eq!(spread_table(&all), before, "back: the same table");
    }

    #[test]
    fn order_and_duplicates_do_not_matter_and_none_gives_zeroes() {
        let a = spread_table(&[gw(1), gw(2), gw(3)]);
        assert_eq!(spread_table(&[gw(3), gw(1), gw(2), gw(1)]), a);
        assert_eq!(spread_table(&[]), GatewaySpread::default());
        let one = spread_table(&[gw(7)]);
        assert_eq!(buckets_of(&one, gw(7)), SPREAD_WAYS);
    }
}
