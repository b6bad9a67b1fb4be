//! A member of an update group that cannot take more (Busy): its group goes
//! on without it at once while its changes wait here, one per prefix, until
//! it is ready and rejoins.

use super::*;

fn take(rib: &mut Rib, other_rr: Readiness) -> Vec<(Vec<IpAddr>, Vec<Update>)> {
    let state = |a: IpAddr| {
        if a == ip(OTHER_RR) {
            other_rr
        } else {
            Readiness::Ready
        }
    };
    by_peers(rib.take_outgoing_where(state))
}

fn sent_to(v: &[(Vec<IpAddr>, Vec<Update>)], peer: Ipv4Addr) -> Vec<(Prefix, Ipv4Addr)> {
    v.iter()
        .filter(|(peers, _)| peers.contains(&ip(peer)))
        .flat_map(|(_, ups)| ups.iter())
        .flat_map(|u| u.nlri.iter().map(|p| (*p, u.attrs.next_hop.unwrap())))
        .collect()
}

#[test]
fn a_busy_member_is_left_behind_at_once() {
    // OTHER_RR and UPSTREAM (iBGP non-clients here) share a group.
    let mut rib = reflector(LOCAL_ASN);
    assert!(outgoing(&mut rib).is_empty());
    rib.apply_update(ip(CLIENT), &announce("192.0.2.0/24", CLIENT, |_| {}));

    // Busy: the others go on without it, and its change waits.
    let v = take(&mut rib, Readiness::Busy);
    assert_eq!(sent_to(&v, CLIENT2).len(), 1);
    assert_eq!(sent_to(&v, UPSTREAM), [(p("192.0.2.0/24"), CLIENT)]);
    assert!(sent_to(&v, OTHER_RR).is_empty());
    assert_eq!(rib.pending_len(ip(OTHER_RR)), 1);

    // Churn meanwhile: each change reaches UPSTREAM, and OTHER_RR's
    // backlog stays at one change per prefix.
    let hops = [10, 11, 12, 13].map(|n| Ipv4Addr::new(10, 0, 0, n));
    for nh in hops {
        for prefix in ["192.0.2.0/24", "198.51.100.0/24"] {
            rib.apply_update(ip(CLIENT), &announce(prefix, nh, |_| {}));
        }
        let v = take(&mut rib, Readiness::Busy);
        assert_eq!(sent_to(&v, UPSTREAM).len(), 2);
        assert_eq!(rib.pending_len(ip(OTHER_RR)), 2);
    }

    // Ready again: the latest state of both prefixes, once.
    let v = take(&mut rib, Readiness::Ready);
    let mut got = sent_to(&v, OTHER_RR);
    got.sort();
    let last = hops[3];
    assert_eq!(
        got,
        [(p("192.0.2.0/24"), last), (p("198.51.100.0/24"), last)]
    );
    // Caught up, it shares its group's list again.
    rib.apply_update(ip(CLIENT), &announce("203.0.113.0/24", CLIENT, |_| {}));
    let v = take(&mut rib, Readiness::Ready);
    assert!(v
        .iter()
        .any(|(peers, _)| peers == &vec![ip(OTHER_RR), ip(UPSTREAM)]));
}
