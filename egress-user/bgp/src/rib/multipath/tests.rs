use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use super::*;
use crate::codec::PathAttributes;
use crate::rib::PeerSource;
use crate::types::{AsPath, Origin};

/// A route from `peer` with itself as next hop; `f` adjusts it.
fn route(peer: u8, f: impl FnOnce(&mut PathAttributes, &mut PeerSource)) -> Route {
    let addr = Ipv4Addr::new(10, 0, 0, peer);
    let mut attrs = PathAttributes {
        origin: Some(Origin::Igp),
        as_path: AsPath::default(),
        local_pref: Some(100),
        ..Default::default()
    };
    let mut src = PeerSource {
        addr: IpAddr::V4(addr),
        router_id: addr,
        asn: 65000,
        ebgp: false,
        client: true,
        path_id: u32::from(addr),
    };
    f(&mut attrs, &mut src);
    Route {
        prefix: "192.0.2.10/32".parse().unwrap(),
        next_hop: IpAddr::V4(addr),
        attrs: Arc::new(attrs),
        source: RouteSource::Peer(Arc::new(src)),
        stale: false,
        llgr_stale: false,
        best: false,
    }
}

/// The last octets of the set's next hops, in the set's order.
fn set_of(routes: &[Route]) -> Vec<u8> {
    multipath_set(routes)
        .iter()
        .map(|r| match r.next_hop {
            IpAddr::V4(a) => a.octets()[3],
            IpAddr::V6(_) => 0,
        })
        .collect()
}

#[test]
fn equal_paths_are_all_in_the_set_best_first() {
    let routes = [
        route(12, |_, _| {}),
        route(11, |_, _| {}),
        route(13, |_, _| {}),
    ];
    // Lowest router id first: the best path leads.
    assert_eq!(set_of(&routes), vec![11, 12, 13]);
}

#[test]
fn each_step_before_the_tie_breaks_excludes() {
    let cases: Vec<(&str, Route)> = vec![
        (
            "lower LOCAL_PREF",
            route(12, |a, _| a.local_pref = Some(90)),
        ),
        (
            "longer AS_PATH",
            route(12, |a, _| a.as_path = AsPath::sequence(&[65100])),
        ),
        (
            "worse ORIGIN",
            route(12, |a, _| a.origin = Some(Origin::Incomplete)),
        ),
        (
            "higher MED from the same neighbour AS",
            route(12, |a, _| a.med = Some(10)),
        ),
        ("long-lived stale", {
            let mut r = route(12, |_, _| {});
            r.llgr_stale = true;
            r
        }),
    ];
    for (why, loser) in cases {
        let routes = [route(11, |_, _| {}), loser];
        assert_eq!(set_of(&routes), vec![11], "{why}");
    }
}

#[test]
fn med_is_compared_only_within_a_neighbour_as() {
    let a = route(11, |a, _| {
        a.as_path = AsPath::sequence(&[65100]);
        a.med = Some(0);
    });
    let b = route(12, |a, _| {
        a.as_path = AsPath::sequence(&[65200]);
        a.med = Some(50);
    });
    assert_eq!(set_of(&[a, b]), vec![11, 12]);
}

#[test]
fn ebgp_beats_ibgp_in_the_set() {
    let ebgp = route(12, |a, s| {
        a.as_path = AsPath::sequence(&[65100]);
        s.ebgp = true;
        s.asn = 65100;
    });
    let ibgp = route(11, |a, _| a.as_path = AsPath::sequence(&[65100]));
    assert_eq!(set_of(&[ibgp, ebgp]), vec![12]);
}

#[test]
fn the_final_tie_breaks_do_not_exclude() {
    // Different router ids, ORIGINATOR_IDs, CLUSTER_LIST lengths: all in.
    let reflected = route(13, |a, _| {
        a.originator_id = Some(Ipv4Addr::new(10, 0, 0, 99));
        a.cluster_list = vec![Ipv4Addr::new(2, 2, 2, 2)];
    });
    let routes = [route(12, |_, _| {}), reflected, route(11, |_, _| {})];
    assert_eq!(set_of(&routes), vec![11, 12, 13]);
}

#[test]
fn one_path_per_next_hop_and_the_better_one_kept() {
    // A reflected copy with the same next hop as the client's own path.
    let copy = {
        let mut r = route(2, |a, _| {
            a.originator_id = Some(Ipv4Addr::new(10, 0, 0, 11));
            a.cluster_list = vec![Ipv4Addr::new(2, 2, 2, 2)];
        });
        r.next_hop = "10.0.0.11".parse().unwrap();
        r
    };
    let own = route(11, |_, _| {});
    let set = multipath_set(std::slice::from_ref(&copy));
    assert_eq!(set.len(), 1);
    let both = [copy, own.clone()];
    let set = multipath_set(&both);
    assert_eq!(set.len(), 1);
    assert_eq!(set[0], &own, "shorter CLUSTER_LIST wins the next hop");
}

#[test]
fn our_own_announcement_alone_makes_the_set() {
    let mut local = route(1, |_, _| {});
    local.source = RouteSource::Local;
    let routes = [route(11, |_, _| {}), local];
    assert_eq!(set_of(&routes), vec![1]);
    assert_eq!(path_id(&routes[1]), LOCAL_PATH_ID);
}

#[test]
fn selection_is_the_best_alone_without_other_candidates() {
    let mut r = route(11, |_, _| {});
    r.best = true;
    let s = Selection::of(std::slice::from_ref(&r));
    assert_eq!(s.paths(), std::slice::from_ref(&r));
    assert_eq!(Selection::of(&[]).paths(), &[] as &[Route]);
}

#[test]
fn path_ids_are_stable_per_address_and_never_handed_to_another() {
    let mut ids = PathIds::default();
    let a: IpAddr = "10.0.0.11".parse().unwrap();
    let b: IpAddr = "2001:db8::1".parse().unwrap();
    let ida = ids.id_for(a);
    assert_eq!(ida, u32::from(Ipv4Addr::new(10, 0, 0, 11)));
    assert_eq!(ids.id_for(a), ida, "same address, same id");
    let idb = ids.id_for(b);
    assert_ne!(idb, ida);
    // An IPv6 address folding onto a taken id moves on to a free one.
    let clash: IpAddr = IpAddr::V6(std::net::Ipv6Addr::from(u128::from(ida)));
    let idc = ids.id_for(clash);
    assert!(idc != ida && idc != idb);
    // 0 is ours; an address that would map to it gets another.
    let zero: IpAddr = "::".parse().unwrap();
    assert_ne!(ids.id_for(zero), LOCAL_PATH_ID);
}
