//! The BGP decision process (RFC 4271 9.1.2.2 with RFC 4456 9).
//!
//! Written as successive filters over the candidate set, as the RFC states
//! it, so that MED is only compared between routes from the same
//! neighbouring AS and the result does not depend on the arrival order.

use std::net::{IpAddr, Ipv4Addr};

use super::{Route, RouteSource};
use crate::types::Origin;

/// The LOCAL_PREF assumed for routes that carry none (eBGP-learned ones).
pub const DEFAULT_LOCAL_PREF: u32 = 100;

pub(crate) fn local_pref(r: &Route) -> u32 {
    match &r.source {
        // LOCAL_PREF from another AS means nothing here (RFC 4271 5.1.5).
        RouteSource::Peer(p) if p.ebgp => DEFAULT_LOCAL_PREF,
        _ => r.attrs.local_pref.unwrap_or(DEFAULT_LOCAL_PREF),
    }
}

/// RFC 4456 9: ORIGINATOR_ID stands in for the BGP identifier of the peer
/// the route came from, so a reflected copy compares as its originator.
fn tie_break_id(r: &Route) -> u32 {
    let id = match (&r.source, r.attrs.originator_id) {
        (_, Some(o)) => o,
        (RouteSource::Peer(p), None) => p.router_id,
        (RouteSource::Local, None) => Ipv4Addr::UNSPECIFIED,
    };
    u32::from(id)
}

fn neighbor_as(r: &Route) -> Option<u32> {
    r.attrs.as_path.neighbor_as()
}

/// RFC 9494 4.3: long-lived stale routes, ours or marked by a peer, are
/// the least preferred of all.
pub(crate) fn is_llgr_stale(r: &Route) -> bool {
    r.llgr_stale || r.attrs.communities.contains(&crate::gr::LLGR_STALE)
}

/// Keeps only the candidates with the best value of `key` (lowest wins).
fn keep_min<K: Ord + Copy>(c: &mut Vec<&Route>, key: impl Fn(&Route) -> K) {
    if let Some(best) = c.iter().map(|r| key(r)).min() {
        c.retain(|r| key(r) == best);
    }
}

/// Chooses the best route for one prefix.
pub fn select_best<'a>(routes: impl IntoIterator<Item = &'a Route>) -> Option<&'a Route> {
    let c = equal_until_tie_break(routes);
    if c.len() <= 1 {
        return c.first().copied();
    }
    c.into_iter().min_by_key(|r| tie_break_key(r))
}

/// The candidates that tie with the best one on every step before the
/// final tie-breaks (steps a-f with our own and the LLGR filters): the
/// multipath set's raw material. The best route is always among them.
pub(crate) fn equal_until_tie_break<'a>(
    routes: impl IntoIterator<Item = &'a Route>,
) -> Vec<&'a Route> {
    let mut c: Vec<&Route> = routes.into_iter().collect();
    if c.len() <= 1 {
        return c;
    }
    if c.iter().any(|r| !is_llgr_stale(r)) {
        c.retain(|r| !is_llgr_stale(r));
    }
    // Our own announcements win over anything learned (as a router's
    // locally originated routes do): an agent owns its EIPs.
    if c.iter().any(|r| r.source == RouteSource::Local) {
        c.retain(|r| r.source == RouteSource::Local);
    }
    // a) highest degree of preference
    keep_min(&mut c, |r| std::cmp::Reverse(local_pref(r)));
    // b) shortest AS_PATH
    keep_min(&mut c, |r| r.attrs.as_path.path_len());
    // c) lowest ORIGIN
    keep_min(&mut c, |r| r.attrs.origin.unwrap_or(Origin::Incomplete));
    // d) lowest MED, only among routes from the same neighbouring AS; a
    //    missing MED counts as 0.
    let snapshot = c.clone();
    c.retain(|r| {
        !snapshot.iter().any(|s| {
            neighbor_as(s) == neighbor_as(r) && s.attrs.med.unwrap_or(0) < r.attrs.med.unwrap_or(0)
        })
    });
    // e) eBGP over iBGP
    keep_min(&mut c, |r| match &r.source {
        RouteSource::Peer(p) if p.ebgp => 0,
        _ => 1,
    });
    // f) interior cost to the next hop: not known here, all equal.
    c
}

/// The final tie-breaks, lowest first: g) BGP identifier with
/// ORIGINATOR_ID taking its place, then (RFC 4456 9) the shorter
/// CLUSTER_LIST, h) the lower peer address.
pub(crate) fn tie_break_key(r: &Route) -> (u32, usize, Option<IpAddr>) {
    let addr = match &r.source {
        RouteSource::Peer(p) => Some(p.addr),
        RouteSource::Local => None,
    };
    (tie_break_id(r), r.attrs.cluster_list.len(), addr)
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};
    use std::sync::Arc;

    use super::*;
    use crate::codec::PathAttributes;
    use crate::rib::PeerSource;
    use crate::types::{AsPath, Origin};

    /// A route from a peer; `f` adjusts its attributes and source.
    fn route(peer: [u8; 4], f: impl FnOnce(&mut PathAttributes, &mut PeerSource)) -> Route {
        let mut attrs = PathAttributes {
            origin: Some(Origin::Igp),
            as_path: AsPath::default(),
            ..Default::default()
        };
        let mut src = PeerSource {
            addr: IpAddr::V4(Ipv4Addr::from(peer)),
            router_id: Ipv4Addr::from(peer),
            asn: 65000,
            ebgp: false,
            client: false,
            path_id: u32::from_be_bytes(peer),
        };
        f(&mut attrs, &mut src);
        Route {
            prefix: "192.0.2.10/32".parse().unwrap(),
            next_hop: IpAddr::V4(Ipv4Addr::from(peer)),
            attrs: Arc::new(attrs),
            source: RouteSource::Peer(Arc::new(src)),
            stale: false,
            llgr_stale: false,
            best: false,
        }
    }

    /// Each case: two routes and the index of the one that must win,
    /// checked in both arrival orders.
    fn check(cases: Vec<(&str, Route, Route, usize)>) {
        for (name, a, b, want) in cases {
            let pair = [a, b];
            let expected = &pair[want];
            let fwd = select_best(pair.iter()).unwrap();
            let rev = select_best(pair.iter().rev()).unwrap();
            assert_eq!(fwd, expected, "{name} (in order)");
            assert_eq!(rev, expected, "{name} (reversed)");
        }
    }

    #[test]
    fn highest_local_pref_wins() {
        check(vec![
            (
                "200 beats 100",
                route([10, 0, 0, 1], |a, _| a.local_pref = Some(100)),
                route([10, 0, 0, 2], |a, _| a.local_pref = Some(200)),
                1,
            ),
            (
                "missing counts as 100, loses to 150",
                route([10, 0, 0, 1], |_, _| {}),
                route([10, 0, 0, 9], |a, _| a.local_pref = Some(150)),
                1,
            ),
            (
                "LOCAL_PREF sent by an eBGP peer is ignored",
                route([10, 0, 0, 1], |a, s| {
                    a.local_pref = Some(500);
                    a.as_path = AsPath::sequence(&[65100]);
                    s.ebgp = true;
                    s.asn = 65100;
                }),
                route([10, 0, 0, 2], |a, _| a.local_pref = Some(200)),
                1,
            ),
            (
                "local preference beats a shorter path",
                route([10, 0, 0, 1], |a, _| {
                    a.as_path = AsPath::sequence(&[1, 2, 3])
                }),
                route([10, 0, 0, 2], |a, _| {
                    a.local_pref = Some(90);
                }),
                0,
            ),
        ]);
    }

    #[test]
    fn shortest_as_path_wins() {
        check(vec![
            (
                "one hop beats two",
                route([10, 0, 0, 1], |a, _| {
                    a.as_path = AsPath::sequence(&[65100, 65200])
                }),
                route([10, 0, 0, 2], |a, _| a.as_path = AsPath::sequence(&[65300])),
                1,
            ),
            (
                "a set counts as one",
                route([10, 0, 0, 1], |a, _| {
                    a.as_path = AsPath {
                        segments: vec![crate::types::AsSegment {
                            kind: crate::types::SegmentKind::Set,
                            asns: vec![1, 2, 3, 4],
                        }],
                    }
                }),
                route([10, 0, 0, 2], |a, _| a.as_path = AsPath::sequence(&[5, 6])),
                0,
            ),
        ]);
    }

    #[test]
    fn lowest_origin_wins() {
        check(vec![
            (
                "IGP beats EGP",
                route([10, 0, 0, 1], |a, _| a.origin = Some(Origin::Egp)),
                route([10, 0, 0, 2], |a, _| a.origin = Some(Origin::Igp)),
                1,
            ),
            (
                "EGP beats INCOMPLETE",
                route([10, 0, 0, 1], |a, _| a.origin = Some(Origin::Egp)),
                route([10, 0, 0, 2], |a, _| a.origin = Some(Origin::Incomplete)),
                0,
            ),
        ]);
    }

    #[test]
    fn lowest_med_wins_only_within_the_same_neighbour_as() {
        check(vec![
            (
                "same neighbour AS: MED 10 beats MED 20",
                route([10, 0, 0, 1], |a, _| {
                    a.as_path = AsPath::sequence(&[65100]);
                    a.med = Some(20);
                }),
                route([10, 0, 0, 2], |a, _| {
                    a.as_path = AsPath::sequence(&[65100]);
                    a.med = Some(10);
                }),
                1,
            ),
            (
                "missing MED counts as 0",
                route([10, 0, 0, 1], |a, _| {
                    a.as_path = AsPath::sequence(&[65100]);
                }),
                route([10, 0, 0, 2], |a, _| {
                    a.as_path = AsPath::sequence(&[65100]);
                    a.med = Some(1);
                }),
                0,
            ),
            (
                "different neighbour AS: MED ignored, lower router id wins",
                route([10, 0, 0, 1], |a, _| {
                    a.as_path = AsPath::sequence(&[65100]);
                    a.med = Some(500);
                }),
                route([10, 0, 0, 2], |a, _| {
                    a.as_path = AsPath::sequence(&[65200]);
                    a.med = Some(1);
                }),
                0,
            ),
        ]);
    }

    #[test]
    fn ebgp_beats_ibgp() {
        check(vec![(
            "eBGP from a higher id beats iBGP from a lower one",
            route([10, 0, 0, 1], |a, _| a.as_path = AsPath::sequence(&[65100])),
            route([10, 0, 0, 9], |a, s| {
                a.as_path = AsPath::sequence(&[65200]);
                s.ebgp = true;
                s.asn = 65200;
            }),
            1,
        )]);
    }

    #[test]
    fn lowest_router_id_with_originator_id_in_its_place() {
        check(vec![
            (
                "plain: lower BGP identifier wins",
                route([10, 0, 0, 7], |_, _| {}),
                route([10, 0, 0, 3], |_, _| {}),
                1,
            ),
            (
                "identifier compared as a number",
                route([10, 0, 0, 10], |_, _| {}),
                route([10, 0, 0, 9], |_, _| {}),
                1,
            ),
            (
                "ORIGINATOR_ID replaces the reflector's lower router id",
                route([10, 0, 0, 2], |a, _| {
                    a.originator_id = Some(Ipv4Addr::new(10, 0, 0, 60));
                    a.cluster_list = vec![Ipv4Addr::new(2, 2, 2, 2)];
                }),
                route([10, 0, 0, 50], |_, _| {}),
                1,
            ),
        ]);
    }

    #[test]
    fn shorter_cluster_list_wins_between_equal_originators() {
        check(vec![
            (
                "client's direct path (no cluster list) beats the reflected copy",
                route([10, 0, 0, 2], |a, _| {
                    a.originator_id = Some(Ipv4Addr::new(10, 0, 0, 50));
                    a.cluster_list = vec![Ipv4Addr::new(2, 2, 2, 2)];
                }),
                route([10, 0, 0, 50], |_, _| {}),
                1,
            ),
            (
                "one cluster beats two",
                route([10, 0, 0, 3], |a, _| {
                    a.originator_id = Some(Ipv4Addr::new(10, 0, 0, 50));
                    a.cluster_list = vec![Ipv4Addr::new(3, 3, 3, 3), Ipv4Addr::new(4, 4, 4, 4)];
                }),
                route([10, 0, 0, 4], |a, _| {
                    a.originator_id = Some(Ipv4Addr::new(10, 0, 0, 50));
                    a.cluster_list = vec![Ipv4Addr::new(2, 2, 2, 2)];
                }),
                1,
            ),
        ]);
    }

    #[test]
    fn lowest_peer_address_is_the_last_resort() {
        check(vec![(
            "same originator and cluster list length: lower address wins",
            route([10, 0, 0, 9], |a, _| {
                a.originator_id = Some(Ipv4Addr::new(10, 0, 0, 50));
                a.cluster_list = vec![Ipv4Addr::new(2, 2, 2, 2)];
            }),
            route([10, 0, 0, 8], |a, _| {
                a.originator_id = Some(Ipv4Addr::new(10, 0, 0, 50));
                a.cluster_list = vec![Ipv4Addr::new(3, 3, 3, 3)];
            }),
            1,
        )]);
    }

    #[test]
    fn local_routes_win_and_single_candidates_are_chosen() {
        let mut local = route([10, 0, 0, 1], |_, _| {});
        local.source = RouteSource::Local;
        let learned = route([10, 0, 0, 2], |a, _| a.local_pref = Some(1000));
        check(vec![(
            "local beats learned",
            local.clone(),
            learned.clone(),
            0,
        )]);
        assert_eq!(select_best([&learned]), Some(&learned));
        assert_eq!(select_best(std::iter::empty()), None);
    }
}
