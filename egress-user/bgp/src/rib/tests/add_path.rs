//! ADD-PATH (RFC 7911) peers get the multipath set of each prefix, each
//! path under a stable path id; everyone else keeps getting the best path.

use super::*;
use crate::codec::AddPathFamilies;

const EIP: &str = "192.0.2.10/32";

/// What one peer was sent: (prefix, path id, next hop) announced, and
/// (prefix, path id) withdrawn; ids are None on plain sessions.
#[derive(Debug, Default, PartialEq, Eq)]
struct Sent {
    announced: Vec<(Prefix, Option<u32>, IpAddr)>,
    withdrawn: Vec<(Prefix, Option<u32>)>,
}

fn ids(prefixes: &[Prefix], ids: &[u32]) -> Vec<(Prefix, Option<u32>)> {
    prefixes
        .iter()
        .enumerate()
        .map(|(i, p)| (*p, ids.get(i).copied()))
        .collect()
}

fn sent_to(v: &[(Vec<IpAddr>, Vec<Update>)], peer: Ipv4Addr) -> Sent {
    let mut s = Sent::default();
    for (_, ups) in v.iter().filter(|(peers, _)| peers.contains(&ip(peer))) {
        for u in ups {
            s.withdrawn.extend(ids(&u.withdrawn, &u.withdrawn_ids));
            let nh = u.attrs.next_hop.map(IpAddr::V4);
            for (p, id) in ids(&u.nlri, &u.nlri_ids) {
                s.announced.push((p, id, nh.expect("IPv4 next hop")));
            }
            if let Some(m) = &u.mp_unreach {
                s.withdrawn.extend(ids(&m.withdrawn, &m.path_ids));
            }
            if let Some(m) = &u.mp_reach {
                for (p, id) in ids(&m.nlri, &m.path_ids) {
                    s.announced.push((p, id, m.next_hop));
                }
            }
        }
    }
    s.announced.sort();
    s.withdrawn.sort();
    s
}

fn id(a: Ipv4Addr) -> Option<u32> {
    Some(u32::from(a))
}

/// [`reflector`] with the upstream's session agreeing ADD-PATH Send for
/// both families; the sibling reflector (also a non-client) stays plain.
fn add_path_reflector() -> Rib {
    let mut rib = reflector(LOCAL_ASN);
    rib.peer_up_with(
        ip(UPSTREAM),
        UPSTREAM,
        ip(ME),
        SessionOptions {
            llgr: false,
            add_path: AddPathFamilies::ALL,
            ..Default::default()
        },
    );
    outgoing(&mut rib); // the (empty) initial tables
    rib
}

fn both_clients_announce(rib: &mut Rib) {
    announce_with_pref(rib, CLIENT, EIP, 100);
    announce_with_pref(rib, CLIENT2, EIP, 100);
}

#[test]
fn an_add_path_peer_gets_every_equal_path_and_a_plain_one_the_best() {
    let mut rib = add_path_reflector();
    both_clients_announce(&mut rib);
    let out = outgoing(&mut rib);
    let eip = p(EIP);
    assert_eq!(
        sent_to(&out, UPSTREAM).announced,
        vec![
            (eip, id(CLIENT), ip(CLIENT)),
            (eip, id(CLIENT2), ip(CLIENT2))
        ]
    );
    // The sibling: the best path only (the lower router id), no path id.
    assert_eq!(
        sent_to(&out, OTHER_RR).announced,
        vec![(eip, None, ip(CLIENT))]
    );
    // Each client: the other's path when it is the best, never its own.
    assert!(sent_to(&out, CLIENT).announced.is_empty());
    assert_eq!(
        sent_to(&out, CLIENT2).announced,
        vec![(eip, None, ip(CLIENT))]
    );
}

#[test]
fn every_path_of_the_set_is_reflected_with_originator_id_and_cluster_list() {
    let mut rib = add_path_reflector();
    both_clients_announce(&mut rib);
    let out = outgoing(&mut rib);
    let (_, ups) = out
        .iter()
        .find(|(peers, _)| peers.contains(&ip(UPSTREAM)))
        .expect("sent upstream");
    let mut originators: Vec<_> = ups.iter().map(|u| u.attrs.originator_id).collect();
    originators.sort();
    assert_eq!(originators, vec![Some(CLIENT), Some(CLIENT2)]);
    assert!(ups.iter().all(|u| u.attrs.cluster_list == vec![CLUSTER]));
}

#[test]
fn a_withdrawn_path_leaves_the_set_under_its_own_id() {
    let mut rib = add_path_reflector();
    both_clients_announce(&mut rib);
    outgoing(&mut rib);
    rib.apply_update(ip(CLIENT), &withdraw(EIP));
    let out = outgoing(&mut rib);
    let up = sent_to(&out, UPSTREAM);
    assert_eq!(up.withdrawn, vec![(p(EIP), id(CLIENT))]);
    assert!(up.announced.is_empty(), "the other path did not change");
    // The plain peer sees the best move to the other client.
    assert_eq!(
        sent_to(&out, OTHER_RR).announced,
        vec![(p(EIP), None, ip(CLIENT2))]
    );
}

#[test]
fn a_path_beaten_on_local_pref_is_withdrawn_and_comes_back_when_equal() {
    let mut rib = add_path_reflector();
    both_clients_announce(&mut rib);
    outgoing(&mut rib);
    announce_with_pref(&mut rib, CLIENT2, EIP, 200);
    let up = sent_to(&outgoing(&mut rib), UPSTREAM);
    assert_eq!(up.withdrawn, vec![(p(EIP), id(CLIENT))]);
    assert_eq!(up.announced, vec![(p(EIP), id(CLIENT2), ip(CLIENT2))]);
    announce_with_pref(&mut rib, CLIENT, EIP, 200);
    let up = sent_to(&outgoing(&mut rib), UPSTREAM);
    assert!(up.withdrawn.is_empty());
    assert_eq!(up.announced, vec![(p(EIP), id(CLIENT), ip(CLIENT))]);
}

#[test]
fn a_path_keeps_its_id_when_its_attributes_change() {
    let mut rib = add_path_reflector();
    both_clients_announce(&mut rib);
    outgoing(&mut rib);
    // Same LOCAL_PREF, a community added: replaced in place, same id.
    rib.apply_update(
        ip(CLIENT),
        &announce(EIP, CLIENT, |a| a.communities = vec![0xfde8_0001]),
    );
    let up = sent_to(&outgoing(&mut rib), UPSTREAM);
    assert!(up.withdrawn.is_empty());
    assert_eq!(up.announced, vec![(p(EIP), id(CLIENT), ip(CLIENT))]);
}

#[test]
fn a_session_coming_up_and_a_refresh_get_the_whole_set() {
    let mut rib = reflector(LOCAL_ASN);
    both_clients_announce(&mut rib);
    outgoing(&mut rib);
    let opts = SessionOptions {
        llgr: false,
        add_path: AddPathFamilies::ALL,
        ..Default::default()
    };
    rib.peer_down(ip(UPSTREAM), false);
    rib.peer_up_with(ip(UPSTREAM), UPSTREAM, ip(ME), opts);
    let want = vec![
        (p(EIP), id(CLIENT), ip(CLIENT)),
        (p(EIP), id(CLIENT2), ip(CLIENT2)),
    ];
    assert_eq!(sent_to(&outgoing(&mut rib), UPSTREAM).announced, want);
    rib.refresh(ip(UPSTREAM), Family::Ipv4Unicast);
    assert_eq!(sent_to(&outgoing(&mut rib), UPSTREAM).announced, want);
}

#[test]
fn stale_paths_of_a_restarting_client_stay_in_the_set() {
    let mut rib = add_path_reflector();
    both_clients_announce(&mut rib);
    outgoing(&mut rib);
    rib.peer_down(ip(CLIENT), true);
    let up = sent_to(&outgoing(&mut rib), UPSTREAM);
    assert!(up.withdrawn.is_empty(), "{up:?}");
    rib.purge_stale(ip(CLIENT), None);
    let up = sent_to(&outgoing(&mut rib), UPSTREAM);
    assert_eq!(up.withdrawn, vec![(p(EIP), id(CLIENT))]);
}

#[test]
fn add_path_is_per_family() {
    let mut rib = reflector(LOCAL_ASN);
    rib.peer_up_with(
        ip(UPSTREAM),
        UPSTREAM,
        ip(ME),
        SessionOptions {
            llgr: false,
            add_path: AddPathFamilies::NONE.with(Family::Ipv6Unicast),
            ..Default::default()
        },
    );
    outgoing(&mut rib);
    both_clients_announce(&mut rib);
    let v6 = "2001:db8::10/128";
    for c in [CLIENT, CLIENT2] {
        let nh: IpAddr = format!("2001:db8::{}", c.octets()[3]).parse().unwrap();
        let mut u = crate::codec::tests::ipv6_announce(nh, v6);
        u.attrs.local_pref = Some(100);
        rib.apply_update(ip(c), &u);
    }
    let up = sent_to(&outgoing(&mut rib), UPSTREAM);
    let v4: Vec<_> = up.announced.iter().filter(|a| a.0 == p(EIP)).collect();
    assert_eq!(v4, vec![&(p(EIP), None, ip(CLIENT))], "IPv4: best only");
    let six: Vec<_> = up.announced.iter().filter(|a| a.0 == p(v6)).collect();
    assert_eq!(six.len(), 2, "IPv6: both paths: {up:?}");
    assert!(six.iter().all(|a| a.1.is_some()));
}

#[test]
fn an_add_path_client_never_gets_its_own_path() {
    let mut rib = reflector(LOCAL_ASN);
    let opts = SessionOptions {
        llgr: false,
        add_path: AddPathFamilies::ALL,
        ..Default::default()
    };
    rib.peer_up_with(ip(CLIENT2), CLIENT2, ip(ME), opts);
    outgoing(&mut rib);
    both_clients_announce(&mut rib);
    let c2 = sent_to(&outgoing(&mut rib), CLIENT2);
    assert_eq!(c2.announced, vec![(p(EIP), id(CLIENT), ip(CLIENT))]);
}

#[test]
fn packed_updates_with_path_ids_fit_in_one_message() {
    let mut rib = add_path_reflector();
    for i in 0..2000u32 {
        let prefix = format!("10.{}.{}.0/24", i / 256, i % 256);
        announce_with_pref(&mut rib, CLIENT, &prefix, 100);
        announce_with_pref(&mut rib, CLIENT2, &prefix, 100);
    }
    let out = outgoing(&mut rib);
    let (_, ups) = out
        .iter()
        .find(|(peers, _)| peers.contains(&ip(UPSTREAM)))
        .expect("sent upstream");
    let opts = CodecOptions::default().with_add_path(AddPathFamilies::ALL);
    let mut n = 0;
    for u in ups {
        n += u.nlri.len();
        Message::Update(u.clone()).to_bytes(opts).expect("fits");
    }
    assert_eq!(n, 4000);
}
