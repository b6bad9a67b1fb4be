use std::net::{IpAddr, Ipv4Addr};

use super::*;
use crate::codec::{CodecOptions, Message, Update};
use crate::types::{AsPath, Family, Origin};

const LOCAL_ASN: u32 = 65000;
const ME: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const CLUSTER: Ipv4Addr = Ipv4Addr::new(1, 1, 1, 1);
const CLIENT: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 50);
const CLIENT2: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 51);
const OTHER_RR: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
const UPSTREAM: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 254);

fn ip(a: Ipv4Addr) -> IpAddr {
    IpAddr::V4(a)
}

fn p(s: &str) -> Prefix {
    s.parse().unwrap()
}

/// A reflector with a client, a second client, a sibling reflector
/// (non-client) and an upstream router, all sessions up.
fn reflector(upstream_asn: u32) -> Rib {
    let mut rib = Rib::new(RibConfig {
        local_asn: LOCAL_ASN,
        router_id: ME,
        cluster_id: CLUSTER,
    });
    for (addr, asn, client) in [
        (CLIENT, LOCAL_ASN, true),
        (CLIENT2, LOCAL_ASN, true),
        (OTHER_RR, LOCAL_ASN, false),
        (UPSTREAM, upstream_asn, false),
    ] {
        rib.add_peer(PeerConfig {
            addr: ip(addr),
            asn,
            client,
            next_hop_self: false,
        });
        rib.peer_up(ip(addr), addr, ip(ME));
    }
    rib
}

fn announce(prefix: &str, next_hop: Ipv4Addr, f: impl FnOnce(&mut PathAttributes)) -> Update {
    let mut attrs = PathAttributes {
        origin: Some(Origin::Igp),
        next_hop: Some(next_hop),
        local_pref: Some(100),
        ..Default::default()
    };
    f(&mut attrs);
    Update {
        attrs,
        nlri: vec![p(prefix)],
        ..Update::default()
    }
}

fn withdraw(prefix: &str) -> Update {
    Update {
        withdrawn: vec![p(prefix)],
        ..Update::default()
    }
}

fn out_attrs(rib: &Rib, peer: Ipv4Addr, prefix: &str) -> Option<(IpAddr, PathAttributes)> {
    rib.adj_rib_out(ip(peer))
        .into_iter()
        .find(|(k, _, _)| *k == p(prefix))
        .map(|(_, nh, a)| (nh, a))
}

fn from_of(rib: &Rib, prefix: &str) -> Option<IpAddr> {
    rib.best(&p(prefix)).and_then(|r| r.source.peer_addr())
}

/// `peer` announces `prefix` with itself as next hop and the given LOCAL_PREF.
fn announce_with_pref(rib: &mut Rib, peer: Ipv4Addr, prefix: &str, local_pref: u32) {
    rib.apply_update(
        ip(peer),
        &announce(prefix, peer, |a| a.local_pref = Some(local_pref)),
    );
}

/// The incident, first form: a sibling reflector with our cluster id
/// reflects the client's route back to us. Its copy must be discarded on
/// receipt, and the client's path must go to the upstream non-client.
#[test]
fn incident_same_cluster_copy_is_discarded_and_client_path_goes_upstream() {
    let mut rib = reflector(LOCAL_ASN);
    let client_nh = CLIENT;
    rib.apply_update(ip(CLIENT), &announce("192.0.2.10/32", client_nh, |_| {}));
    let report = rib.apply_update(
        ip(OTHER_RR),
        &announce("192.0.2.10/32", client_nh, |a| {
            a.originator_id = Some(CLIENT);
            a.cluster_list = vec![CLUSTER];
        }),
    );
    assert_eq!(report.looped, 1);
    assert_eq!(rib.adj_rib_in(ip(OTHER_RR)).count(), 0);
    assert_eq!(from_of(&rib, "192.0.2.10/32"), Some(ip(CLIENT)));
    let (nh, a) = out_attrs(&rib, UPSTREAM, "192.0.2.10/32").expect("client path must go upstream");
    assert_eq!(nh, ip(CLIENT));
    assert_eq!(a.originator_id, Some(CLIENT));
    assert_eq!(a.cluster_list, vec![CLUSTER]);
}

/// The incident, second form: the sibling uses another cluster id, has a
/// lower router id than the client, and its copy carries ORIGINATOR_ID = C.
/// ORIGINATOR_ID replaces the router id, so both compare as 10.0.0.50; the
/// shorter CLUSTER_LIST (the client's direct path) wins and goes upstream.
#[test]
fn incident_reflected_copy_with_lower_router_id_loses_to_client_path() {
    for order in [true, false] {
        let mut rib = reflector(LOCAL_ASN);
        let direct = announce("192.0.2.10/32", CLIENT, |_| {});
        let reflected = announce("192.0.2.10/32", CLIENT, |a| {
            a.originator_id = Some(CLIENT);
            a.cluster_list = vec![Ipv4Addr::new(2, 2, 2, 2)];
        });
        if order {
            rib.apply_update(ip(CLIENT), &direct);
            assert_eq!(rib.apply_update(ip(OTHER_RR), &reflected).accepted, 1);
        } else {
            assert_eq!(rib.apply_update(ip(OTHER_RR), &reflected).accepted, 1);
            rib.apply_update(ip(CLIENT), &direct);
        }
        assert!(
            u32::from(OTHER_RR) < u32::from(CLIENT),
            "the trap: sibling has the lower id"
        );
        assert_eq!(
            from_of(&rib, "192.0.2.10/32"),
            Some(ip(CLIENT)),
            "order {order}"
        );
        let (_, a) = out_attrs(&rib, UPSTREAM, "192.0.2.10/32").expect("advertised upstream");
        assert_eq!(a.originator_id, Some(CLIENT));
        assert_eq!(a.cluster_list, vec![CLUSTER]);
        // The sibling reflector is a non-client too: it gets the client path.
        assert!(out_attrs(&rib, OTHER_RR, "192.0.2.10/32").is_some());
        // The updates that would go on the wire carry the prefix.
        let ups = rib.take_updates(ip(UPSTREAM));
        assert!(ups.iter().any(|u| u.nlri.contains(&p("192.0.2.10/32"))));
    }
}

#[test]
fn route_from_non_client_goes_to_clients_only() {
    let mut rib = reflector(LOCAL_ASN);
    rib.apply_update(ip(OTHER_RR), &announce("198.51.100.0/24", OTHER_RR, |_| {}));
    assert!(out_attrs(&rib, CLIENT, "198.51.100.0/24").is_some());
    assert!(out_attrs(&rib, UPSTREAM, "198.51.100.0/24").is_none());
    let (_, a) = out_attrs(&rib, CLIENT, "198.51.100.0/24").unwrap();
    assert_eq!(a.originator_id, Some(OTHER_RR));
    assert_eq!(a.cluster_list, vec![CLUSTER]);
}

#[test]
fn route_from_client_goes_to_other_clients_and_non_clients_not_back() {
    let mut rib = reflector(LOCAL_ASN);
    rib.apply_update(ip(CLIENT), &announce("10.244.1.0/24", CLIENT, |_| {}));
    assert!(out_attrs(&rib, CLIENT2, "10.244.1.0/24").is_some());
    assert!(out_attrs(&rib, OTHER_RR, "10.244.1.0/24").is_some());
    assert!(out_attrs(&rib, UPSTREAM, "10.244.1.0/24").is_some());
    assert!(out_attrs(&rib, CLIENT, "10.244.1.0/24").is_none());
}

#[test]
fn route_with_our_originator_id_is_discarded() {
    let mut rib = reflector(LOCAL_ASN);
    let r = rib.apply_update(
        ip(OTHER_RR),
        &announce("10.9.0.0/16", OTHER_RR, |a| {
            a.originator_id = Some(ME);
            a.cluster_list = vec![Ipv4Addr::new(2, 2, 2, 2)];
        }),
    );
    assert_eq!((r.accepted, r.looped), (0, 1));
    assert!(rib.best(&p("10.9.0.0/16")).is_none());
}

#[test]
fn looped_copy_replaces_an_earlier_accepted_one() {
    let mut rib = reflector(LOCAL_ASN);
    rib.apply_update(ip(OTHER_RR), &announce("10.9.0.0/16", OTHER_RR, |_| {}));
    assert!(rib.best(&p("10.9.0.0/16")).is_some());
    rib.apply_update(
        ip(OTHER_RR),
        &announce("10.9.0.0/16", OTHER_RR, |a| a.cluster_list = vec![CLUSTER]),
    );
    assert!(rib.best(&p("10.9.0.0/16")).is_none());
}

#[test]
fn ebgp_upstream_gets_our_as_prepended_and_no_ibgp_attributes() {
    let mut rib = reflector(65100);
    rib.apply_update(
        ip(CLIENT),
        &announce("192.0.2.10/32", CLIENT, |a| {
            a.med = Some(7);
        }),
    );
    let (nh, a) = out_attrs(&rib, UPSTREAM, "192.0.2.10/32").unwrap();
    assert_eq!(
        nh,
        ip(CLIENT),
        "third-party next hop kept without next-hop-self"
    );
    assert_eq!(a.as_path, AsPath::sequence(&[LOCAL_ASN]));
    assert_eq!(a.local_pref, None);
    assert_eq!(a.originator_id, None);
    assert!(a.cluster_list.is_empty());
    assert_eq!(a.med, None);
}

#[test]
fn ebgp_route_is_not_sent_back_into_its_as_and_own_as_loop_is_dropped() {
    let mut rib = reflector(65100);
    let r = rib.apply_update(
        ip(UPSTREAM),
        &announce("203.0.113.0/24", UPSTREAM, |a| {
            a.as_path = AsPath::sequence(&[65100, LOCAL_ASN]);
        }),
    );
    assert_eq!(r.looped, 1);
    rib.apply_update(
        ip(UPSTREAM),
        &announce("0.0.0.0/0", UPSTREAM, |a| {
            a.as_path = AsPath::sequence(&[65100]);
            a.local_pref = Some(999);
        }),
    );
    let (_, a) = out_attrs(&rib, CLIENT, "0.0.0.0/0").unwrap();
    assert_eq!(
        a.local_pref,
        Some(DEFAULT_LOCAL_PREF),
        "eBGP LOCAL_PREF is replaced"
    );
    assert_eq!(a.originator_id, None, "eBGP routes are not reflections");
    assert!(out_attrs(&rib, UPSTREAM, "0.0.0.0/0").is_none());
}

#[test]
fn withdrawal_removes_best_and_withdraws_from_peers() {
    let mut rib = reflector(LOCAL_ASN);
    rib.apply_update(ip(CLIENT), &announce("10.244.1.0/24", CLIENT, |_| {}));
    rib.take_updates(ip(UPSTREAM));
    rib.take_best_changes();
    rib.apply_update(ip(CLIENT), &withdraw("10.244.1.0/24"));
    assert!(rib.best(&p("10.244.1.0/24")).is_none());
    assert_eq!(
        rib.take_best_changes(),
        vec![BestChange::Removed {
            prefix: p("10.244.1.0/24")
        }]
    );
    let ups = rib.take_updates(ip(UPSTREAM));
    assert_eq!(ups.len(), 1);
    assert_eq!(ups[0].withdrawn, vec![p("10.244.1.0/24")]);
}

#[test]
fn failover_to_second_path_when_best_is_withdrawn() {
    let mut rib = reflector(LOCAL_ASN);
    rib.apply_update(ip(CLIENT), &announce("192.0.2.10/32", CLIENT, |_| {}));
    rib.apply_update(ip(CLIENT2), &announce("192.0.2.10/32", CLIENT2, |_| {}));
    assert_eq!(from_of(&rib, "192.0.2.10/32"), Some(ip(CLIENT)));
    rib.take_best_changes();
    rib.apply_update(ip(CLIENT), &withdraw("192.0.2.10/32"));
    assert_eq!(
        rib.take_best_changes(),
        vec![BestChange::Set {
            prefix: p("192.0.2.10/32"),
            next_hop: ip(CLIENT2),
            from: Some(ip(CLIENT2)),
            local_pref: Some(100),
        }]
    );
}

#[test]
fn treat_as_withdraw_update_removes_the_previous_route() {
    let mut rib = reflector(LOCAL_ASN);
    rib.apply_update(ip(CLIENT), &announce("10.244.1.0/24", CLIENT, |_| {}));
    let mut bad = announce("10.244.1.0/24", CLIENT, |_| {});
    bad.errors.push(crate::codec::AttrOutcome::TreatAsWithdraw {
        type_code: 1,
        reason: "test",
    });
    let r = rib.apply_update(ip(CLIENT), &bad);
    assert_eq!((r.accepted, r.withdrawn), (0, 1));
    assert!(rib.best(&p("10.244.1.0/24")).is_none());
}

#[test]
fn local_announce_goes_to_every_peer_and_wins() {
    let mut rib = reflector(LOCAL_ASN);
    rib.apply_update(ip(CLIENT), &announce("192.0.2.10/32", CLIENT, |_| {}));
    rib.announce_local(p("192.0.2.10/32"), ip(ME));
    assert_eq!(from_of(&rib, "192.0.2.10/32"), None);
    for peer in [CLIENT, CLIENT2, OTHER_RR, UPSTREAM] {
        let (nh, a) = out_attrs(&rib, peer, "192.0.2.10/32").unwrap();
        assert_eq!(nh, ip(ME));
        assert_eq!(a.originator_id, None, "our own routes are not reflected");
    }
    assert!(rib.withdraw_local(p("192.0.2.10/32")));
    assert_eq!(from_of(&rib, "192.0.2.10/32"), Some(ip(CLIENT)));
}

#[test]
fn session_up_sends_the_whole_table() {
    let mut rib = reflector(LOCAL_ASN);
    rib.apply_update(ip(CLIENT), &announce("10.244.1.0/24", CLIENT, |_| {}));
    let late = Ipv4Addr::new(10, 0, 0, 60);
    rib.add_peer(PeerConfig {
        addr: ip(late),
        asn: LOCAL_ASN,
        client: true,
        next_hop_self: false,
    });
    assert!(rib.take_updates(ip(late)).is_empty());
    rib.peer_up(ip(late), late, ip(ME));
    let ups = rib.take_updates(ip(late));
    assert_eq!(ups.iter().map(|u| u.nlri.len()).sum::<usize>(), 1);
}

#[test]
fn hard_peer_down_removes_its_routes_soft_keeps_them_stale() {
    let mut rib = reflector(LOCAL_ASN);
    rib.apply_update(ip(CLIENT), &announce("10.244.1.0/24", CLIENT, |_| {}));
    rib.peer_down(ip(CLIENT), true);
    let r = rib.best(&p("10.244.1.0/24")).unwrap();
    assert!(r.stale);
    assert!(
        out_attrs(&rib, UPSTREAM, "10.244.1.0/24").is_some(),
        "still advertised"
    );
    // The peer comes back and re-announces: no longer stale.
    rib.peer_up(ip(CLIENT), CLIENT, ip(ME));
    rib.apply_update(ip(CLIENT), &announce("10.244.1.0/24", CLIENT, |_| {}));
    assert!(!rib.best(&p("10.244.1.0/24")).unwrap().stale);
    rib.peer_down(ip(CLIENT), false);
    assert!(rib.best(&p("10.244.1.0/24")).is_none());
}

#[test]
fn purge_stale_removes_only_routes_not_refreshed() {
    let mut rib = reflector(LOCAL_ASN);
    rib.apply_update(ip(CLIENT), &announce("10.244.1.0/24", CLIENT, |_| {}));
    rib.apply_update(ip(CLIENT), &announce("10.244.2.0/24", CLIENT, |_| {}));
    rib.peer_down(ip(CLIENT), true);
    rib.peer_up(ip(CLIENT), CLIENT, ip(ME));
    rib.apply_update(ip(CLIENT), &announce("10.244.1.0/24", CLIENT, |_| {}));
    assert_eq!(rib.purge_stale(ip(CLIENT), Some(Family::Ipv4Unicast)), 1);
    assert!(rib.best(&p("10.244.1.0/24")).is_some());
    assert!(rib.best(&p("10.244.2.0/24")).is_none());
}

#[test]
fn deferral_holds_selection_until_released() {
    let mut rib = reflector(LOCAL_ASN);
    rib.set_deferral(true);
    rib.apply_update(ip(CLIENT), &announce("10.244.1.0/24", CLIENT, |_| {}));
    assert!(rib.best(&p("10.244.1.0/24")).is_none());
    assert!(rib.take_updates(ip(UPSTREAM)).is_empty());
    rib.set_deferral(false);
    assert!(rib.best(&p("10.244.1.0/24")).is_some());
    assert_eq!(rib.take_updates(ip(UPSTREAM)).len(), 1);
}

#[test]
fn ipv6_routes_travel_in_mp_reach() {
    let mut rib = reflector(LOCAL_ASN);
    let u = crate::codec::tests::ipv6_announce("2001:db8::50".parse().unwrap(), "2001:db8:10::/64");
    assert_eq!(rib.apply_update(ip(CLIENT), &u).accepted, 1);
    let ups = rib.take_updates(ip(UPSTREAM));
    let m = ups[0].mp_reach.as_ref().unwrap();
    assert_eq!(m.nlri, vec![p("2001:db8:10::/64")]);
    assert_eq!(m.next_hop, "2001:db8::50".parse::<IpAddr>().unwrap());
}

#[test]
fn many_routes_pack_into_few_updates_within_size_limit() {
    let mut rib = reflector(LOCAL_ASN);
    let prefixes: Vec<Prefix> = (0..5000u32)
        .map(|i| Prefix::new(IpAddr::V4(Ipv4Addr::from(0x0a00_0000 | (i << 8))), 24).unwrap())
        .collect();
    let mut u = announce("10.0.0.0/24", CLIENT, |_| {});
    u.nlri = prefixes.clone();
    assert_eq!(rib.apply_update(ip(CLIENT), &u).accepted, 5000);
    let ups = rib.take_updates(ip(UPSTREAM));
    assert!(ups.len() <= 8, "{} updates", ups.len());
    let mut total = 0;
    for u in &ups {
        let b = Message::Update(u.clone())
            .to_bytes(CodecOptions {
                four_octet_as: false,
                ..CodecOptions::default()
            })
            .expect("fits in 4096 octets");
        assert!(b.len() <= 4096);
        total += u.nlri.len();
    }
    assert_eq!(total, 5000);
    assert_eq!(rib.prefix_counts(ip(CLIENT)).0, 5000);
    assert_eq!(rib.prefix_counts(ip(UPSTREAM)).1, 5000);
}

#[test]
fn route_refresh_requeues_the_adj_rib_out() {
    let mut rib = reflector(LOCAL_ASN);
    rib.apply_update(ip(CLIENT), &announce("10.244.1.0/24", CLIENT, |_| {}));
    rib.take_updates(ip(UPSTREAM));
    assert!(rib.take_updates(ip(UPSTREAM)).is_empty());
    rib.refresh(ip(UPSTREAM), Family::Ipv4Unicast);
    assert_eq!(
        rib.take_updates(ip(UPSTREAM))[0].nlri,
        vec![p("10.244.1.0/24")]
    );
}

#[test]
fn attribute_only_change_is_readvertised_but_not_reported_to_agent() {
    let mut rib = reflector(LOCAL_ASN);
    rib.apply_update(ip(CLIENT), &announce("10.244.1.0/24", CLIENT, |_| {}));
    rib.take_best_changes();
    rib.take_updates(ip(UPSTREAM));
    rib.apply_update(
        ip(CLIENT),
        &announce("10.244.1.0/24", CLIENT, |a| a.med = Some(5)),
    );
    assert!(rib.take_best_changes().is_empty());
    assert_eq!(rib.take_updates(ip(UPSTREAM))[0].attrs.med, Some(5));
}

#[test]
fn long_lived_stale_routes_are_least_preferred_and_marked() {
    let mut rib = reflector(LOCAL_ASN);
    rib.peer_up_llgr(ip(UPSTREAM), UPSTREAM, ip(ME), true);
    announce_with_pref(&mut rib, CLIENT, "192.0.2.10/32", 500);
    announce_with_pref(&mut rib, CLIENT2, "192.0.2.10/32", 50);
    assert_eq!(from_of(&rib, "192.0.2.10/32"), Some(ip(CLIENT)));
    rib.peer_down(ip(CLIENT), true);
    assert_eq!(rib.mark_llgr_stale(ip(CLIENT)), 1);
    // Even with a far better LOCAL_PREF, the long-lived stale path loses.
    assert_eq!(from_of(&rib, "192.0.2.10/32"), Some(ip(CLIENT2)));
    rib.apply_update(ip(CLIENT2), &withdraw("192.0.2.10/32"));
    let r = rib.best(&p("192.0.2.10/32")).unwrap();
    assert!(r.llgr_stale);
    // Sent with LLGR_STALE to a peer that does LLGR, not to the others.
    let (_, a) = out_attrs(&rib, UPSTREAM, "192.0.2.10/32").unwrap();
    assert!(a.communities.contains(&crate::gr::LLGR_STALE));
    assert!(out_attrs(&rib, CLIENT2, "192.0.2.10/32").is_none());
}

#[test]
fn no_llgr_routes_are_dropped_instead_of_kept_long_lived() {
    let mut rib = reflector(LOCAL_ASN);
    rib.apply_update(
        ip(CLIENT),
        &announce("192.0.2.10/32", CLIENT, |a| {
            a.communities = vec![crate::gr::NO_LLGR]
        }),
    );
    rib.apply_update(ip(CLIENT), &announce("192.0.2.11/32", CLIENT, |_| {}));
    rib.peer_down(ip(CLIENT), true);
    rib.mark_llgr_stale(ip(CLIENT));
    assert!(rib.best(&p("192.0.2.10/32")).is_none());
    assert!(rib.best(&p("192.0.2.11/32")).unwrap().llgr_stale);
}

#[test]
fn route_carrying_llgr_stale_from_a_peer_is_least_preferred() {
    let mut rib = reflector(LOCAL_ASN);
    rib.apply_update(
        ip(CLIENT),
        &announce("192.0.2.10/32", CLIENT, |a| {
            a.local_pref = Some(900);
            a.communities = vec![crate::gr::LLGR_STALE];
        }),
    );
    rib.apply_update(ip(CLIENT2), &announce("192.0.2.10/32", CLIENT2, |_| {}));
    assert_eq!(from_of(&rib, "192.0.2.10/32"), Some(ip(CLIENT2)));
}

#[test]
fn local_announcement_with_a_chosen_local_pref_is_sent_with_it() {
    let mut rib = reflector(LOCAL_ASN);
    rib.announce_local_with_pref(p("192.0.2.10/32"), ip(ME), 1007);
    let (_, a) = out_attrs(&rib, CLIENT, "192.0.2.10/32").unwrap();
    assert_eq!(a.local_pref, Some(1007));
    // At another reflector, the newer owner (higher LOCAL_PREF) wins.
    announce_with_pref(&mut rib, CLIENT, "198.51.100.7/32", 1001);
    announce_with_pref(&mut rib, CLIENT2, "198.51.100.7/32", 1002);
    assert_eq!(from_of(&rib, "198.51.100.7/32"), Some(ip(CLIENT2)));
}

#[test]
fn next_hop_of_the_other_family_is_mapped_or_not_sent() {
    let mut rib = reflector(LOCAL_ASN);
    rib.announce_local(p("2001:db8:10::/64"), ip(ME));
    rib.announce_local(p("198.51.100.0/24"), "2001:db8::1".parse().unwrap());
    let ups = rib.take_updates(ip(UPSTREAM));
    let v6: Vec<_> = ups.iter().filter_map(|u| u.mp_reach.as_ref()).collect();
    assert_eq!(v6.len(), 1);
    assert_eq!(v6[0].next_hop, "::ffff:10.0.0.1".parse::<IpAddr>().unwrap());
    assert!(ups.iter().all(|u| !u.nlri.contains(&p("198.51.100.0/24"))));
    for u in &ups {
        Message::Update(u.clone())
            .to_bytes(CodecOptions::default())
            .unwrap();
    }
}

/// RFC 8950: an IPv4 route via an IPv6 next hop (a node with no IPv4
/// address) goes, in MP_REACH of AFI 1, to sessions that agreed on it, and
/// only to them; reflected, it keeps its IPv6 next hop.
#[test]
fn ipv4_routes_via_ipv6_go_only_to_sessions_that_agreed() {
    let mut rib = reflector(LOCAL_ASN);
    let agreed = SessionOptions {
        ipv4_via_ipv6: true,
        ..Default::default()
    };
    rib.peer_down(ip(CLIENT2), false);
    rib.peer_up_with(ip(CLIENT2), CLIENT2, ip(ME), agreed);
    rib.take_outgoing();
    let mut u = crate::codec::tests::ipv6_announce("fd00::50".parse().unwrap(), "10.244.5.0/24");
    u.mp_reach.as_mut().unwrap().family = Family::Ipv4Unicast;
    u.attrs.local_pref = Some(100);
    assert_eq!(rib.apply_update(ip(CLIENT), &u).accepted, 1);
    let nh: IpAddr = "fd00::50".parse().unwrap();
    assert_eq!(
        out_attrs(&rib, CLIENT2, "10.244.5.0/24").map(|o| o.0),
        Some(nh)
    );
    for not_agreed in [OTHER_RR, UPSTREAM] {
        assert_eq!(out_attrs(&rib, not_agreed, "10.244.5.0/24"), None);
    }
    let sent = outgoing(&mut rib);
    let to_client2: Vec<&Update> = sent
        .iter()
        .filter(|(peers, _)| peers.contains(&ip(CLIENT2)))
        .flat_map(|(_, ups)| ups)
        .collect();
    let mp = to_client2[0].mp_reach.as_ref().expect("MP_REACH");
    assert_eq!((mp.family, mp.next_hop), (Family::Ipv4Unicast, nh));
    assert_eq!(mp.nlri, vec![p("10.244.5.0/24")]);
    assert!(
        sent.iter()
            .filter(|(peers, _)| !peers.contains(&ip(CLIENT2)))
            .all(|(_, ups)| ups.is_empty()),
        "{sent:?}"
    );
    let both = CodecOptions {
        ipv4_via_ipv6: crate::codec::Ipv4ViaIpv6::BOTH,
        ..CodecOptions::default()
    };
    let back = Message::decode(
        &Message::Update(to_client2[0].clone())
            .to_bytes(both)
            .unwrap(),
        both,
    );
    assert!(back.is_ok(), "{back:?}");
}

/// The peers sent the same UPDATEs, as [`Rib::take_outgoing`] lists them.
fn outgoing(rib: &mut Rib) -> Vec<(Vec<IpAddr>, Vec<Update>)> {
    by_peers(rib.take_outgoing())
}

/// Each group's peers and UPDATEs, peers sorted and groups in the order of
/// their peers, so that tests can compare them whatever order they came in.
fn by_peers(out: Vec<Outgoing>) -> Vec<(Vec<IpAddr>, Vec<Update>)> {
    let mut v: Vec<_> = out
        .into_iter()
        .map(|mut o| {
            o.peers.sort();
            (o.peers, o.updates)
        })
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

fn announced_to(v: &[(Vec<IpAddr>, Vec<Update>)], peer: Ipv4Addr) -> Vec<Prefix> {
    v.iter()
        .filter(|(peers, _)| peers.contains(&ip(peer)))
        .flat_map(|(_, ups)| ups.iter().flat_map(|u| u.nlri.clone()))
        .collect()
}

fn withdrawn_to(v: &[(Vec<IpAddr>, Vec<Update>)], peer: Ipv4Addr) -> Vec<Prefix> {
    v.iter()
        .filter(|(peers, _)| peers.contains(&ip(peer)))
        .flat_map(|(_, ups)| ups.iter().flat_map(|u| u.withdrawn.clone()))
        .collect()
}

/// Update groups: once the initial tables are out, iBGP peers with the same
/// export share one list of UPDATEs (encoded once by the speaker); the
/// source of a route decides alone and is not sent its own route back.
#[test]
fn peers_with_the_same_export_share_one_list_and_the_source_gets_nothing_back() {
    let mut rib = reflector(LOCAL_ASN);
    // Initial tables (empty here) go out; then the groups merge.
    assert!(outgoing(&mut rib).is_empty());
    let mut u = announce("192.0.2.0/24", CLIENT, |_| {});
    u.nlri.push(p("192.0.2.128/25"));
    rib.apply_update(ip(CLIENT), &u);
    let v = outgoing(&mut rib);
    // The two non-clients share one list; CLIENT2 (the other client)
    // another; CLIENT, the source, gets nothing.
    let shared: Vec<_> = v.iter().filter(|(peers, _)| peers.len() == 2).collect();
    assert_eq!(shared.len(), 1, "{v:?}");
    assert_eq!(shared[0].0, vec![ip(OTHER_RR), ip(UPSTREAM)]);
    assert_eq!(
        shared[0].1.len(),
        1,
        "two prefixes, one attribute set: one UPDATE"
    );
    assert_eq!(v.len(), 2, "{v:?}");
    assert!(announced_to(&v, CLIENT).is_empty());
    assert!(withdrawn_to(&v, CLIENT).is_empty());
    assert_eq!(rib.prefix_counts(ip(CLIENT)), (2, 0));
    assert_eq!(rib.prefix_counts(ip(CLIENT2)), (0, 2));
    assert_eq!(rib.prefix_counts(ip(UPSTREAM)), (0, 2));
}

/// The best route moves from one member's route to another's: the new
/// source is sent a withdrawal of the route it had been given, the old
/// source is sent the new route, everyone else the new route.
#[test]
fn best_moving_between_members_withdraws_from_the_new_source_only() {
    let mut rib = reflector(LOCAL_ASN);
    outgoing(&mut rib);
    rib.apply_update(ip(CLIENT), &announce("192.0.2.0/24", CLIENT, |_| {}));
    outgoing(&mut rib);
    // CLIENT2's copy is preferred (higher LOCAL_PREF).
    announce_with_pref(&mut rib, CLIENT2, "192.0.2.0/24", 200);
    let v = outgoing(&mut rib);
    assert_eq!(withdrawn_to(&v, CLIENT2), vec![p("192.0.2.0/24")], "{v:?}");
    assert!(announced_to(&v, CLIENT2).is_empty());
    assert_eq!(announced_to(&v, CLIENT), vec![p("192.0.2.0/24")]);
    assert_eq!(announced_to(&v, UPSTREAM), vec![p("192.0.2.0/24")]);
    assert!(withdrawn_to(&v, UPSTREAM).is_empty());
    assert_eq!(rib.prefix_counts(ip(CLIENT)).1, 1);
    assert_eq!(rib.prefix_counts(ip(CLIENT2)).1, 0);
    // Both changes within one batch: CLIENT2 never had the prefix (it came
    // and went before anything was sent), so it gets nothing at all.
    rib.apply_update(ip(CLIENT), &announce("198.51.100.0/24", CLIENT, |_| {}));
    announce_with_pref(&mut rib, CLIENT2, "198.51.100.0/24", 200);
    let v = outgoing(&mut rib);
    assert!(
        !withdrawn_to(&v, CLIENT2).contains(&p("198.51.100.0/24")),
        "{v:?}"
    );
    assert!(!announced_to(&v, CLIENT2).contains(&p("198.51.100.0/24")));
    assert_eq!(announced_to(&v, CLIENT), vec![p("198.51.100.0/24")]);
}

/// A peer whose session comes up gets its whole table on its own, then
/// joins the others' group; an eBGP peer never shares with iBGP ones.
#[test]
fn a_new_session_gets_its_table_alone_then_joins_the_group() {
    let mut rib = reflector(65100);
    outgoing(&mut rib);
    rib.apply_update(ip(CLIENT), &announce("192.0.2.0/24", CLIENT, |_| {}));
    outgoing(&mut rib);
    let late = Ipv4Addr::new(10, 0, 0, 60);
    rib.add_peer(PeerConfig {
        addr: ip(late),
        asn: LOCAL_ASN,
        client: true,
        next_hop_self: false,
    });
    rib.peer_up(ip(late), late, ip(ME));
    rib.apply_update(ip(CLIENT), &announce("198.51.100.0/24", CLIENT, |_| {}));
    let v = outgoing(&mut rib);
    let mut table = announced_to(&v, late);
    table.sort();
    assert_eq!(table, vec![p("192.0.2.0/24"), p("198.51.100.0/24")]);
    assert_eq!(announced_to(&v, CLIENT2), vec![p("198.51.100.0/24")]);
    // Next change: the late peer shares CLIENT2's list; UPSTREAM (eBGP,
    // AS_PATH prepended) has its own.
    rib.apply_update(ip(CLIENT), &announce("203.0.113.0/24", CLIENT, |_| {}));
    let v = outgoing(&mut rib);
    assert!(
        v.iter()
            .any(|(peers, _)| peers.contains(&ip(late)) && peers.contains(&ip(CLIENT2))),
        "{v:?}"
    );
    assert!(
        v.iter().any(|(peers, _)| peers == &vec![ip(UPSTREAM)]),
        "{v:?}"
    );
    assert_eq!(rib.prefix_counts(ip(late)), (0, 3));
}

mod add_path;
mod fresh;
mod readiness;
