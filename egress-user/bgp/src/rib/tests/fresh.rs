//! Sessions that come up before the table of a new update group is packed
//! join that group: the table is packed and encoded once for all of them.

use super::*;

const CLIENT3: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 52);

/// Three route reflector clients, no session up.
fn three_clients() -> Rib {
    let mut rib = Rib::new(RibConfig {
        local_asn: LOCAL_ASN,
        router_id: ME,
        cluster_id: CLUSTER,
    });
    for addr in [CLIENT, CLIENT2, CLIENT3] {
        rib.add_peer(PeerConfig {
            addr: ip(addr),
            asn: LOCAL_ASN,
            client: true,
            next_hop_self: false,
        });
    }
    rib
}

fn up(rib: &mut Rib, addr: Ipv4Addr) {
    rib.peer_up(ip(addr), addr, ip(ME));
}

#[test]
fn sessions_up_before_the_table_is_packed_share_one_list() {
    let mut rib = three_clients();
    rib.announce_local(p("192.0.2.0/24"), ip(ME));
    up(&mut rib, CLIENT);
    up(&mut rib, CLIENT2);
    // A change after both came up is theirs too.
    rib.announce_local(p("198.51.100.0/24"), ip(ME));
    let v = outgoing(&mut rib);
    assert_eq!(v.len(), 1, "{v:?}");
    assert_eq!(v[0].0, vec![ip(CLIENT), ip(CLIENT2)]);
    let mut sent = announced_to(&v, CLIENT);
    sent.sort();
    assert_eq!(sent, vec![p("192.0.2.0/24"), p("198.51.100.0/24")]);
    // Once that table is out, a new session gets its own.
    up(&mut rib, CLIENT3);
    let v = outgoing(&mut rib);
    assert_eq!(v.len(), 1, "{v:?}");
    assert_eq!(v[0].0, vec![ip(CLIENT3)]);
    assert_eq!(announced_to(&v, CLIENT3).len(), 2);
}

#[test]
fn a_joining_session_is_not_sent_its_own_stale_routes() {
    let mut rib = three_clients();
    up(&mut rib, CLIENT);
    rib.apply_update(ip(CLIENT), &announce("192.0.2.0/24", CLIENT, |_| {}));
    outgoing(&mut rib);
    // CLIENT restarts gracefully: its route stays, stale.
    rib.peer_down(ip(CLIENT), true);
    up(&mut rib, CLIENT2);
    up(&mut rib, CLIENT);
    assert_eq!(rib.prefix_counts(ip(CLIENT)), (1, 0));
    assert_eq!(rib.prefix_counts(ip(CLIENT2)), (0, 1));
    let v = outgoing(&mut rib);
    assert_eq!(announced_to(&v, CLIENT2), vec![p("192.0.2.0/24")]);
    assert!(announced_to(&v, CLIENT).is_empty(), "{v:?}");
    assert!(withdrawn_to(&v, CLIENT).is_empty(), "{v:?}");
}

#[test]
fn a_joining_session_withdrawn_from_before_packing_is_sent_nothing_of_it() {
    let mut rib = three_clients();
    rib.announce_local(p("192.0.2.0/24"), ip(ME));
    up(&mut rib, CLIENT);
    up(&mut rib, CLIENT2);
    rib.withdraw_local(p("192.0.2.0/24"));
    assert!(outgoing(&mut rib).is_empty());
}

#[test]
fn members_announcing_before_the_table_is_packed_share_it_and_skip_their_own() {
    let mut rib = three_clients();
    rib.announce_local(p("192.0.2.0/24"), ip(ME));
    up(&mut rib, CLIENT);
    up(&mut rib, CLIENT2);
    up(&mut rib, CLIENT3);
    rib.apply_update(ip(CLIENT), &announce("198.51.100.0/24", CLIENT, |_| {}));
    rib.apply_update(ip(CLIENT2), &announce("203.0.113.0/24", CLIENT2, |_| {}));
    let v = outgoing(&mut rib);
    // The table none of them sourced: once, for all three.
    let all = vec![ip(CLIENT), ip(CLIENT2), ip(CLIENT3)];
    let shared: Vec<_> = v.iter().filter(|(peers, _)| *peers == all).collect();
    assert_eq!(shared.len(), 1, "{v:?}");
    assert_eq!(shared[0].1.len(), 1, "{v:?}");
    assert_eq!(shared[0].1[0].nlri, vec![p("192.0.2.0/24")]);
    // Then each is sent the others' routes, never its own.
    let to = |peer| {
        let mut s = announced_to(&v, peer);
        s.sort();
        s
    };
    let (a, b, c) = (p("192.0.2.0/24"), p("198.51.100.0/24"), p("203.0.113.0/24"));
    assert_eq!(to(CLIENT), vec![a, c]);
    assert_eq!(to(CLIENT2), vec![a, b]);
    assert_eq!(to(CLIENT3), vec![a, b, c]);
    assert!(v
        .iter()
        .all(|(_, ups)| ups.iter().all(|u| u.withdrawn.is_empty())));
}
