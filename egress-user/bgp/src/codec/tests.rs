use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use bytes::{Bytes, BytesMut};

use super::*;
use crate::types::{AfiSafi, AsPath, Family, Origin, Prefix, AS_TRANS};

mod add_path;
mod fuzz;

fn p(s: &str) -> Prefix {
    s.parse().unwrap()
}

/// (code, subcode) of the NOTIFICATION the decoder's refusal of `msg` sends.
fn notification_codes(msg: &[u8]) -> (u8, u8) {
    let n = Message::decode(msg, FOUR).unwrap_err().notification();
    (n.code, n.subcode)
}

/// An UPDATE of origin IGP announcing `prefix` in MP_REACH_NLRI for IPv6
/// unicast through `next_hop` (global only, no link-local next hop).
pub(crate) fn ipv6_announce(next_hop: IpAddr, prefix: &str) -> Update {
    Update {
        attrs: PathAttributes {
            origin: Some(Origin::Igp),
            ..Default::default()
        },
        mp_reach: Some(MpReach {
            family: Family::Ipv6Unicast,
            next_hop,
            link_local: None,
            nlri: vec![p(prefix)],
            path_ids: Vec::new(),
        }),
        ..Default::default()
    }
}

const FOUR: CodecOptions = CodecOptions {
    four_octet_as: true,
    add_path_rx: AddPathFamilies::NONE,
    add_path_tx: AddPathFamilies::NONE,
    ipv4_via_ipv6: crate::codec::Ipv4ViaIpv6::NONE,
};
const TWO: CodecOptions = CodecOptions {
    four_octet_as: false,
    add_path_rx: AddPathFamilies::NONE,
    add_path_tx: AddPathFamilies::NONE,
    ipv4_via_ipv6: crate::codec::Ipv4ViaIpv6::NONE,
};
/// Path ids both ways in both families (RFC 7911).
const ADD_PATH: CodecOptions = CodecOptions {
    four_octet_as: true,
    add_path_rx: AddPathFamilies::ALL,
    add_path_tx: AddPathFamilies::ALL,
    ipv4_via_ipv6: crate::codec::Ipv4ViaIpv6::NONE,
};

fn roundtrip(m: &Message, opts: CodecOptions) -> Message {
    let b = m.to_bytes(opts).unwrap();
    Message::decode(&b, opts).unwrap()
}

/// Builds a raw message from a type and a body.
fn frame(ty: u8, body: &[u8]) -> Vec<u8> {
    let mut v = vec![0xff; 16];
    v.extend_from_slice(&((19 + body.len()) as u16).to_be_bytes());
    v.push(ty);
    v.extend_from_slice(body);
    v
}

/// Builds an UPDATE body from withdrawn, attribute and NLRI bytes.
fn update_body(withdrawn: &[u8], attrs: &[u8], nlri: &[u8]) -> Vec<u8> {
    let mut v = (withdrawn.len() as u16).to_be_bytes().to_vec();
    v.extend_from_slice(withdrawn);
    v.extend_from_slice(&(attrs.len() as u16).to_be_bytes());
    v.extend_from_slice(attrs);
    v.extend_from_slice(nlri);
    v
}

const ORIGIN_IGP: [u8; 4] = [0x40, 1, 1, 0];
const AS_PATH_65001: [u8; 9] = [0x40, 2, 6, 2, 1, 0, 0, 0xfd, 0xe9];
const NEXT_HOP_1: [u8; 7] = [0x40, 3, 4, 192, 0, 2, 1];
const NLRI_10_1: [u8; 3] = [16, 10, 1];

fn good_attrs_plus(extra: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&ORIGIN_IGP);
    v.extend_from_slice(&AS_PATH_65001);
    v.extend_from_slice(&NEXT_HOP_1);
    v.extend_from_slice(extra);
    v
}

fn decode_update(attrs: &[u8], nlri: &[u8]) -> Result<Update, DecodeError> {
    match Message::decode(&frame(MSG_UPDATE, &update_body(&[], attrs, nlri)), FOUR)? {
        Message::Update(u) => Ok(u),
        m => panic!("not an update: {m:?}"),
    }
}

fn full_open() -> Open {
    Open::new(
        4_200_000_001,
        90,
        Ipv4Addr::new(10, 0, 0, 1),
        vec![
            Capability::Multiprotocol(Family::Ipv4Unicast.into()),
            Capability::Multiprotocol(Family::Ipv6Unicast.into()),
            Capability::RouteRefresh,
            Capability::EnhancedRouteRefresh,
            Capability::GracefulRestart(GracefulRestartCap {
                restarting: true,
                notification: false,
                restart_time: 120,
                families: vec![
                    GrFamily {
                        afi_safi: Family::Ipv4Unicast.into(),
                        forwarding_preserved: true,
                    },
                    GrFamily {
                        afi_safi: Family::Ipv6Unicast.into(),
                        forwarding_preserved: false,
                    },
                ],
            }),
            Capability::LongLivedGr(vec![LlgrFamily {
                afi_safi: Family::Ipv4Unicast.into(),
                forwarding_preserved: true,
                stale_time: 86400,
            }]),
            Capability::ExtendedNextHop(vec![NextHopTuple::IPV4_UNICAST_VIA_IPV6]),
            Capability::Unknown {
                code: 200,
                value: Bytes::from_static(&[1, 2, 3]),
            },
        ],
    )
}

fn full_update() -> Update {
    Update {
        withdrawn: vec![p("10.9.0.0/16")],
        withdrawn_ids: vec![],
        attrs: PathAttributes {
            origin: Some(Origin::Egp),
            as_path: AsPath::sequence(&[65001, 4_200_000_000, 65002]),
            next_hop: Some(Ipv4Addr::new(192, 0, 2, 1)),
            med: Some(50),
            local_pref: Some(200),
            atomic_aggregate: true,
            aggregator: Some(Aggregator {
                asn: 4_200_000_000,
                addr: Ipv4Addr::new(1, 1, 1, 1),
            }),
            communities: vec![0xfde8_0001, 0xffff_ff01],
            originator_id: Some(Ipv4Addr::new(10, 0, 0, 50)),
            cluster_list: vec![Ipv4Addr::new(1, 1, 1, 1), Ipv4Addr::new(2, 2, 2, 2)],
            unknown: vec![RawAttribute {
                flags: 0xe0,
                type_code: 99,
                value: Bytes::from_static(&[7; 300]),
            }],
        },
        nlri: vec![p("10.1.0.0/16"), p("192.0.2.10/32"), p("0.0.0.0/0")],
        nlri_ids: vec![],
        mp_reach: Some(MpReach {
            family: Family::Ipv6Unicast,
            next_hop: "2001:db8::1".parse().unwrap(),
            link_local: Some("fe80::1".parse().unwrap()),
            nlri: vec![p("2001:db8:1::/48"), p("2001:db8::10/128")],
            path_ids: Vec::new(),
        }),
        mp_unreach: Some(MpUnreach {
            family: Family::Ipv6Unicast,
            withdrawn: vec![p("2001:db8:9::/48")],
            path_ids: Vec::new(),
        }),
        errors: vec![],
    }
}

#[test]
fn open_with_every_capability_roundtrips() {
    let o = full_open();
    assert_eq!(o.my_as, AS_TRANS as u16);
    let back = roundtrip(&Message::Open(o.clone()), FOUR);
    assert_eq!(back, Message::Open(o.clone()));
    assert_eq!(o.asn(), 4_200_000_001);
    let gr = o.graceful_restart().unwrap();
    assert!(gr.restarting);
    assert!(gr.families[0].forwarding_preserved);
    assert!(!gr.families[1].forwarding_preserved);
    assert!(o.route_refresh() && o.enhanced_route_refresh());
    assert_eq!(o.long_lived_gr().unwrap()[0].stale_time, 86400);
    assert_eq!(o.families().len(), 2);
    assert_eq!(o.extended_next_hop(), [NextHopTuple::IPV4_UNICAST_VIA_IPV6]);
}

#[test]
fn graceful_restart_flag_bits_are_on_the_wire() {
    let o = full_open();
    let b = Message::Open(o).to_bytes(FOUR).unwrap();
    // Find capability 64 and check R bit and time, then the F bit.
    let pos = b.windows(2).position(|w| w == [64, 10]).unwrap();
    assert_eq!(&b[pos + 2..pos + 4], &(0x8000u16 | 120).to_be_bytes());
    assert_eq!(&b[pos + 4..pos + 8], &[0, 1, 1, 0x80]);
    assert_eq!(&b[pos + 8..pos + 12], &[0, 2, 1, 0]);
}

#[test]
fn open_without_multiprotocol_means_ipv4_unicast() {
    let o = Open::new(65000, 90, Ipv4Addr::new(1, 2, 3, 4), vec![]);
    assert_eq!(o.families(), vec![AfiSafi::from(Family::Ipv4Unicast)]);
    assert_eq!(o.asn(), 65000);
}

#[test]
fn open_errors_map_to_open_notifications() {
    let mut body = vec![3, 0xfd, 0xe8, 0, 90, 1, 2, 3, 4, 0];
    let e = Message::decode(&frame(MSG_OPEN, &body), FOUR).unwrap_err();
    assert_eq!(e, DecodeError::UnsupportedVersion(3));
    let n = e.notification();
    assert_eq!((n.code, n.subcode, &n.data[..]), (2, 1, &[0u8, 4][..]));

    body[0] = 4;
    body[4] = 2; // hold time 2
    assert_eq!(notification_codes(&frame(MSG_OPEN, &body)), (2, 6));

    body[4] = 90;
    body[5..9].copy_from_slice(&[0, 0, 0, 0]);
    assert_eq!(notification_codes(&frame(MSG_OPEN, &body)), (2, 3));

    body[5..9].copy_from_slice(&[1, 2, 3, 4]);
    body[9] = 3;
    body.extend_from_slice(&[1, 1, 0]); // optional parameter type 1
    assert_eq!(notification_codes(&frame(MSG_OPEN, &body)), (2, 4));
}

#[test]
fn hold_time_zero_and_three_are_accepted() {
    for hold in [0u16, 3] {
        let o = Open::new(65000, hold, Ipv4Addr::new(1, 2, 3, 4), vec![]);
        assert_eq!(roundtrip(&Message::Open(o.clone()), FOUR), Message::Open(o));
    }
}

#[test]
fn update_with_every_attribute_roundtrips_four_octet() {
    let u = full_update();
    assert_eq!(
        roundtrip(&Message::Update(u.clone()), FOUR),
        Message::Update(u)
    );
}

#[test]
fn update_roundtrips_through_two_octet_session_with_as4_path() {
    let u = full_update();
    let b = Message::Update(u.clone()).to_bytes(TWO).unwrap();
    // AS_TRANS appears in the 2-octet AS_PATH; AS4_PATH (17) is present.
    assert!(b.windows(2).any(|w| w == (AS_TRANS as u16).to_be_bytes()));
    assert!(b.windows(2).any(|w| w == [0xc0, 17]));
    let back = Message::decode(&b, TWO).unwrap();
    assert_eq!(back, Message::Update(u));
}

#[test]
fn as4_path_is_ignored_between_four_octet_speakers() {
    let as4 = [0xc0, 17, 6, 2, 1, 0, 0, 0, 9];
    let u = decode_update(&good_attrs_plus(&as4), &NLRI_10_1).unwrap();
    assert_eq!(u.attrs.as_path, AsPath::sequence(&[65001]));
}

#[test]
fn keepalive_notification_route_refresh_roundtrip() {
    for m in [
        Message::Keepalive,
        Message::Notification(Notification::new(6, 2, Bytes::from_static(b"bye"))),
        Message::RouteRefresh(RouteRefresh {
            afi_safi: Family::Ipv6Unicast.into(),
            subtype: RouteRefreshSubtype::Request,
        }),
        Message::RouteRefresh(RouteRefresh {
            afi_safi: Family::Ipv4Unicast.into(),
            subtype: RouteRefreshSubtype::BeginRefresh,
        }),
        Message::RouteRefresh(RouteRefresh {
            afi_safi: Family::Ipv4Unicast.into(),
            subtype: RouteRefreshSubtype::EndRefresh,
        }),
    ] {
        assert_eq!(roundtrip(&m, FOUR), m);
    }
    assert_eq!(Message::Keepalive.to_bytes(FOUR).unwrap().len(), 19);
}

#[test]
fn route_refresh_with_wrong_length_is_error_7_1() {
    assert_eq!(
        notification_codes(&frame(MSG_ROUTE_REFRESH, &[0, 1, 0, 1, 0])),
        (7, 1)
    );
}

#[test]
fn route_refresh_unknown_subtype_decodes_as_other() {
    let m = Message::decode(&frame(MSG_ROUTE_REFRESH, &[0, 1, 9, 1]), FOUR).unwrap();
    assert!(matches!(
        m,
        Message::RouteRefresh(RouteRefresh {
            subtype: RouteRefreshSubtype::Other(9),
            ..
        })
    ));
}

#[test]
fn end_of_rib_markers() {
    let v4 = Update::end_of_rib(Family::Ipv4Unicast);
    let b = Message::Update(v4.clone()).to_bytes(FOUR).unwrap();
    assert_eq!(b.len(), 23);
    let Message::Update(back) = Message::decode(&b, FOUR).unwrap() else {
        panic!()
    };
    assert_eq!(back.end_of_rib_family(), Some(Family::Ipv4Unicast));
    let v6 = Update::end_of_rib(Family::Ipv6Unicast);
    let Message::Update(back) = roundtrip(&Message::Update(v6), FOUR) else {
        panic!()
    };
    assert_eq!(back.end_of_rib_family(), Some(Family::Ipv6Unicast));
    assert_eq!(full_update().end_of_rib_family(), None);
}

#[test]
fn header_errors() {
    let mut f = frame(MSG_KEEPALIVE, &[]);
    f[3] = 0;
    assert_eq!(notification_codes(&f), (1, 1));

    let f = frame(MSG_KEEPALIVE, &[0]);
    let n = Message::decode(&f, FOUR).unwrap_err().notification();
    assert_eq!((n.code, n.subcode, &n.data[..]), (1, 2, &[0u8, 20][..]));

    let f = frame(9, &[]);
    let n = Message::decode(&f, FOUR).unwrap_err().notification();
    assert_eq!((n.code, n.subcode, &n.data[..]), (1, 3, &[9u8][..]));

    let f = frame(MSG_OPEN, &[4]);
    assert_eq!(notification_codes(&f), (1, 2));
}

#[test]
fn split_frame_waits_for_whole_messages_and_rejects_bad_lengths() {
    let k = frame(MSG_KEEPALIVE, &[]);
    let mut buf = BytesMut::new();
    buf.extend_from_slice(&k[..10]);
    assert_eq!(split_frame(&mut buf).unwrap(), None);
    buf.extend_from_slice(&k[10..]);
    buf.extend_from_slice(&k[..5]);
    assert_eq!(split_frame(&mut buf).unwrap().unwrap().len(), 19);
    assert_eq!(buf.len(), 5);
    let mut bad = BytesMut::from(&frame(MSG_KEEPALIVE, &[])[..]);
    bad[16] = 0x20; // length 8192
    assert_eq!(
        split_frame(&mut bad),
        Err(DecodeError::BadMessageLength(0x2013))
    );
}

#[test]
fn update_length_fields_that_overrun_are_malformed_attribute_list() {
    let mut body = update_body(&[], &good_attrs_plus(&[]), &NLRI_10_1);
    body[1] = 200; // withdrawn length overruns
    assert_eq!(notification_codes(&frame(MSG_UPDATE, &body)), (3, 1));
}

#[test]
fn bad_prefix_length_is_invalid_network_field() {
    let n = decode_update(&good_attrs_plus(&[]), &[33, 10, 0, 0, 0, 0])
        .unwrap_err()
        .notification();
    assert_eq!((n.code, n.subcode), (3, 10));
    let n = decode_update(&good_attrs_plus(&[]), &[24, 10, 0])
        .unwrap_err()
        .notification();
    assert_eq!((n.code, n.subcode), (3, 10));
}

fn assert_withdraw(u: &Update, type_code: u8) {
    assert!(u.treat_as_withdraw(), "{u:?}");
    assert!(u.announced().is_empty());
    assert_eq!(u.withdrawals(), vec![p("10.1.0.0/16")]);
    assert!(u.errors.iter().any(
        |e| matches!(e, AttrOutcome::TreatAsWithdraw { type_code: t, .. } if *t == type_code)
    ));
}

#[test]
fn rfc7606_treat_as_withdraw_cases() {
    // ORIGIN with an undefined value.
    let attrs = [&[0x40, 1, 1, 3][..], &AS_PATH_65001, &NEXT_HOP_1].concat();
    assert_withdraw(&decode_update(&attrs, &NLRI_10_1).unwrap(), 1);
    // ORIGIN with length 2.
    let attrs = [&[0x40, 1, 2, 0, 0][..], &AS_PATH_65001, &NEXT_HOP_1].concat();
    assert_withdraw(&decode_update(&attrs, &NLRI_10_1).unwrap(), 1);
    // AS_PATH segment that overruns.
    let attrs = [&ORIGIN_IGP[..], &[0x40, 2, 4, 2, 2, 0, 1], &NEXT_HOP_1].concat();
    assert_withdraw(&decode_update(&attrs, &NLRI_10_1).unwrap(), 2);
    // AS_PATH with an empty segment.
    let attrs = [&ORIGIN_IGP[..], &[0x40, 2, 2, 2, 0], &NEXT_HOP_1].concat();
    assert_withdraw(&decode_update(&attrs, &NLRI_10_1).unwrap(), 2);
    // NEXT_HOP of 0.0.0.0.
    let attrs = [&ORIGIN_IGP[..], &AS_PATH_65001, &[0x40, 3, 4, 0, 0, 0, 0]].concat();
    assert_withdraw(&decode_update(&attrs, &NLRI_10_1).unwrap(), 3);
    // MED of length 3.
    assert_withdraw(
        &decode_update(&good_attrs_plus(&[0x80, 4, 3, 0, 0, 1]), &NLRI_10_1).unwrap(),
        4,
    );
    // LOCAL_PREF flagged optional.
    assert_withdraw(
        &decode_update(&good_attrs_plus(&[0x80, 5, 4, 0, 0, 0, 100]), &NLRI_10_1).unwrap(),
        5,
    );
    // COMMUNITIES not a multiple of four.
    assert_withdraw(
        &decode_update(&good_attrs_plus(&[0xc0, 8, 3, 0, 0, 1]), &NLRI_10_1).unwrap(),
        8,
    );
    // ORIGINATOR_ID of length 5.
    assert_withdraw(
        &decode_update(&good_attrs_plus(&[0x80, 9, 5, 1, 1, 1, 1, 1]), &NLRI_10_1).unwrap(),
        9,
    );
    // Empty CLUSTER_LIST.
    assert_withdraw(
        &decode_update(&good_attrs_plus(&[0x80, 10, 0]), &NLRI_10_1).unwrap(),
        10,
    );
    // Missing NEXT_HOP with IPv4 NLRI.
    let attrs = [&ORIGIN_IGP[..], &AS_PATH_65001].concat();
    assert_withdraw(&decode_update(&attrs, &NLRI_10_1).unwrap(), 3);
    // Missing ORIGIN.
    let attrs = [&AS_PATH_65001[..], &NEXT_HOP_1].concat();
    assert_withdraw(&decode_update(&attrs, &NLRI_10_1).unwrap(), 1);
    // Last attribute overruns the attribute field.
    assert_withdraw(
        &decode_update(&good_attrs_plus(&[0x80, 4, 9, 0]), &NLRI_10_1).unwrap(),
        0,
    );
}

#[test]
fn rfc7606_attribute_discard_cases() {
    for (extra, code) in [
        (&[0x40, 6, 1, 0][..], 6u8),           // ATOMIC_AGGREGATE with a value
        (&[0xc0, 7, 5, 0, 1, 2, 3, 4][..], 7), // AGGREGATOR wrong length
        (&[0xc0, 17, 3, 2, 1, 0][..], 17),     // AS4_PATH truncated
    ] {
        let u = decode_update(&good_attrs_plus(extra), &NLRI_10_1).unwrap();
        assert!(!u.treat_as_withdraw(), "{code}: {u:?}");
        assert_eq!(u.announced(), vec![p("10.1.0.0/16")]);
        assert!(u
            .errors
            .iter()
            .any(|e| matches!(e, AttrOutcome::Discarded { type_code, .. } if *type_code == code)));
    }
}

#[test]
fn repeated_attribute_keeps_the_first() {
    let u = decode_update(
        &good_attrs_plus(&[0x80, 4, 4, 0, 0, 0, 1, 0x80, 4, 4, 0, 0, 0, 2]),
        &NLRI_10_1,
    )
    .unwrap();
    assert_eq!(u.attrs.med, Some(1));
    assert!(!u.treat_as_withdraw());
}

#[test]
fn repeated_mp_reach_resets_the_session() {
    let mut mp = vec![0x80, 14, 21, 0, 2, 1, 16];
    mp.extend_from_slice(&Ipv6Addr::LOCALHOST.octets());
    mp.push(0);
    let e = decode_update(&good_attrs_plus(&[mp.clone(), mp].concat()), &[]).unwrap_err();
    assert_eq!(e.notification().code, 3);
    assert_eq!(e.notification().subcode, 1);
}

#[test]
fn malformed_mp_reach_is_optional_attribute_error() {
    // IPv6 next hop length 5.
    let mp = [0x80, 14, 10, 0, 2, 1, 5, 1, 2, 3, 4, 5, 0];
    let n = decode_update(&good_attrs_plus(&mp), &[])
        .unwrap_err()
        .notification();
    assert_eq!((n.code, n.subcode), (3, 9));
}

#[test]
fn unrecognized_well_known_attribute_resets() {
    let n = decode_update(&good_attrs_plus(&[0x40, 77, 1, 0]), &NLRI_10_1)
        .unwrap_err()
        .notification();
    assert_eq!((n.code, n.subcode), (3, 2));
}

#[test]
fn unknown_optional_transitive_is_kept_with_partial_bit() {
    let u = decode_update(
        &good_attrs_plus(&[0xc0, 77, 2, 9, 9, 0x80, 78, 1, 1]),
        &NLRI_10_1,
    )
    .unwrap();
    assert_eq!(
        u.attrs.unknown,
        vec![RawAttribute {
            flags: 0xe0,
            type_code: 77,
            value: Bytes::from_static(&[9, 9])
        }]
    );
}

#[test]
fn ipv6_mp_reach_with_global_next_hop_only() {
    let u = ipv6_announce(IpAddr::V6(Ipv6Addr::LOCALHOST), "2001:db8::/32");
    let Message::Update(back) = roundtrip(&Message::Update(u.clone()), FOUR) else {
        panic!()
    };
    assert_eq!(back, u);
    assert_eq!(back.announced(), vec![p("2001:db8::/32")]);
}

#[test]
fn ipv4_routes_via_an_ipv6_next_hop_need_our_extended_next_hop_offer() {
    let with = CodecOptions {
        ipv4_via_ipv6: Ipv4ViaIpv6::BOTH,
        ..FOUR
    };
    for link_local in [None, Some("fe80::1".parse().unwrap())] {
        let mut u = ipv6_announce("2001:db8::7".parse().unwrap(), "10.1.0.0/16");
        let mp = u.mp_reach.as_mut().unwrap();
        mp.family = Family::Ipv4Unicast;
        mp.link_local = link_local;
        let Message::Update(back) = roundtrip(&Message::Update(u.clone()), with) else {
            panic!()
        };
        assert_eq!(back, u);
        assert_eq!(back.announced(), vec![p("10.1.0.0/16")]);
        // Not offered on this session: the next hop's length is an error
        // in MP_REACH_NLRI, which resets the session (RFC 7606 7.11).
        let bytes = Message::Update(u).to_bytes(with).unwrap();
        assert_eq!(notification_codes(&bytes), (3, 9), "{link_local:?}");
    }
}

#[test]
fn oversized_update_is_refused_by_the_encoder() {
    let mut u = full_update();
    u.nlri = (0..2000u32)
        .map(|i| Prefix::new(IpAddr::V4(Ipv4Addr::from(i << 8)), 24).unwrap())
        .collect();
    let mut b = BytesMut::new();
    assert!(matches!(
        Message::Update(u).encode(FOUR, &mut b),
        Err(EncodeError::TooLong { .. })
    ));
    assert!(b.is_empty());
}

/// An MP_REACH without NLRI and without AS_PATH decodes cleanly (nothing
/// is announced, so nothing is missing); the encoder must not add an
/// AS_PATH the decoder did not need, or a full-size message no longer fits.
#[test]
fn full_size_mp_reach_without_nlri_encodes_as_received() {
    let mut attrs = vec![0x80, 14, 21, 0, 2, 1, 16];
    attrs.extend_from_slice(&"2001:db8::1".parse::<Ipv6Addr>().unwrap().octets());
    attrs.push(0);
    let pad = MAX_MESSAGE_LEN - HEADER_LEN - 4 - attrs.len() - 4;
    attrs.extend_from_slice(&[0xf0, 99]);
    attrs.extend_from_slice(&(pad as u16).to_be_bytes());
    attrs.resize(attrs.len() + pad, 7);
    let m = frame(MSG_UPDATE, &update_body(&[], &attrs, &[]));
    assert_eq!(m.len(), MAX_MESSAGE_LEN);
    let u = Message::decode(&m, FOUR).unwrap();
    assert!(matches!(&u, Message::Update(u) if u.errors.is_empty()));
    assert_eq!(u.to_bytes(FOUR).unwrap(), m);
}
