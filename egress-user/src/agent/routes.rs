//! Which BGP-learned routes go into the datapath's `ROUTES` map: EIP host
//! routes whose epoch (LOCAL_PREF - 100, as agents announce them) is at
//! least the datastore's for that EIP. BGP's best path is the highest
//! LOCAL_PREF, so a route names the newest owner BGP knows; when the
//! datastore already knows a newer one (BGP lagging), the slot's gateway
//! from the datastore stays in charge.

use std::collections::BTreeMap;
use std::net::IpAddr;

use egress_bgp::types::Prefix;
use egress_failover::fence::Assignment;

use crate::datapath::EipRoute;

/// Agents announce an EIP with LOCAL_PREF 100 + its assignment's epoch.
pub const EPOCH_PREF_BASE: u32 = 100;

/// A route learned from the reflectors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Learned {
    pub next_hop: IpAddr,
    pub local_pref: Option<u32>,
}

/// The tunnel endpoint a next hop names on an underlay of `underlay_v6`,
/// if it is of that family. Over an IPv4 underlay, IPv6 EIPs are announced
/// with the node's IPv4 address, mapped (RFC 4798); over an IPv6 one, every
/// route carries the node's IPv6 address (IPv4 routes by RFC 8950).
fn tunnel_endpoint(nh: IpAddr, underlay_v6: bool) -> Option<IpAddr> {
    let nh = match nh {
        IpAddr::V6(a) => a.to_ipv4_mapped().map_or(nh, IpAddr::V4),
        v4 => v4,
    };
    (nh.is_ipv6() == underlay_v6).then_some(nh)
}

/// `underlay_v6`: the family of this node's tunnel endpoint; a route whose
/// next hop is of the other family cannot be followed and is left out.
pub fn eip_routes(
    learned: &BTreeMap<Prefix, Learned>,
    datastore: &[Assignment],
    underlay_v6: bool,
) -> Vec<EipRoute> {
    let mut newest: BTreeMap<IpAddr, u64> = BTreeMap::new();
    for a in datastore {
        let e = newest.entry(a.eip).or_insert(a.epoch);
        *e = (*e).max(a.epoch);
    }
    learned
        .iter()
        .filter_map(|(p, l)| {
            let host = if p.addr().is_ipv4() { 32 } else { 128 };
            if p.len() != host {
                return None;
            }
            let known = *newest.get(&p.addr())?;
            let epoch = l.local_pref?.checked_sub(EPOCH_PREF_BASE)?;
            if u64::from(epoch) < known {
                return None;
            }
            Some(EipRoute {
                eip: p.addr(),
                tunnel_ip: tunnel_endpoint(l.next_hop, underlay_v6)?,
                epoch,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn learned(rows: &[(&str, &str, Option<u32>)]) -> BTreeMap<Prefix, Learned> {
        rows.iter()
            .map(|(p, nh, lp)| {
                (
                    p.parse().unwrap(),
                    Learned {
                        next_hop: nh.parse().unwrap(),
                        local_pref: *lp,
                    },
                )
            })
            .collect()
    }

    fn assigned(eip: &str, node: &str, epoch: u64) -> Assignment {
        Assignment {
            eip: eip.parse().unwrap(),
            node: node.into(),
            epoch,
        }
    }

    #[test]
    fn routes_that_are_not_older_than_the_datastore_go_into_the_map() {
        let ds = [
            assigned("10.10.0.200", "g1", 3),
            assigned("fd00:10::200", "g1", 3),
        ];
        // (what, learned rows (prefix, next hop, LOCAL_PREF), wanted (EIP, tunnel, epoch))
        type Case<'a> = (
            &'a str,
            Vec<(&'a str, &'a str, Option<u32>)>,
            Vec<(&'a str, &'a str, u32)>,
        );
        let cases: &[Case] = &[
            (
                "BGP knows a newer owner than the datastore",
                vec![("10.10.0.200/32", "10.10.0.4", Some(104))],
                vec![("10.10.0.200", "10.10.0.4", 4)],
            ),
            (
                "same epoch: the same owner",
                vec![("10.10.0.200/32", "10.10.0.3", Some(103))],
                vec![("10.10.0.200", "10.10.0.3", 3)],
            ),
            (
                "BGP lags the datastore: left out",
                vec![("10.10.0.200/32", "10.10.0.3", Some(102))],
                vec![],
            ),
            (
                "no LOCAL_PREF: not an agent's EIP route",
                vec![("10.10.0.200/32", "10.10.0.3", None)],
                vec![],
            ),
            (
                "not an EIP of the datastore",
                vec![("10.10.0.201/32", "10.10.0.3", Some(110))],
                vec![],
            ),
            (
                "pod CIDRs are not EIP routes",
                vec![("10.244.2.0/24", "10.10.0.2", Some(100))],
                vec![],
            ),
            (
                "IPv6 EIP with an IPv4-mapped next hop",
                vec![("fd00:10::200/128", "::ffff:10.10.0.5", Some(105))],
                vec![("fd00:10::200", "10.10.0.5", 5)],
            ),
            (
                "IPv6 next hop without an IPv4 tunnel endpoint",
                vec![("fd00:10::200/128", "fd00:10::5", Some(105))],
                vec![],
            ),
        ];
        for (what, rows, want) in cases {
            let got = eip_routes(&learned(rows), &ds, false);
            let want: Vec<EipRoute> = want
                .iter()
                .map(|(e, t, ep)| EipRoute {
                    eip: e.parse().unwrap(),
                    tunnel_ip: t.parse().unwrap(),
                    epoch: *ep,
                })
                .collect();
            assert_eq!(got, want, "{what}");
        }
    }

    #[test]
    fn on_an_ipv6_underlay_routes_are_followed_by_their_ipv6_next_hops() {
        let ds = [
            assigned("10.10.0.200", "g1", 3),
            assigned("fd00:10::200", "g1", 3),
        ];
        let rows = [
            // An IPv4 EIP via an IPv6 next hop (RFC 8950) ...
            ("10.10.0.200/32", "fd00:100::4", Some(104)),
            // ... and an IPv6 one; both name the new owner's endpoint.
            ("fd00:10::200/128", "fd00:100::4", Some(104)),
        ];
        let got = eip_routes(&learned(&rows), &ds, true);
        let nh: IpAddr = "fd00:100::4".parse().unwrap();
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(got.iter().all(|r| r.tunnel_ip == nh && r.epoch == 4));
        // IPv4 next hops (plain or mapped) name no endpoint there ...
        let v4 = [
            ("10.10.0.200/32", "10.10.0.4", Some(104)),
            ("fd00:10::200/128", "::ffff:10.10.0.4", Some(104)),
        ];
        assert!(eip_routes(&learned(&v4), &ds, true).is_empty());
        // ... as IPv6 ones name none on an IPv4 underlay.
        assert!(eip_routes(&learned(&rows), &ds, false).is_empty());
    }
}
