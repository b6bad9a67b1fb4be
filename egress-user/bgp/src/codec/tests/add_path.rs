//! RFC 7911 in the codec: the capability in OPEN, and NLRI with path ids
//! only where the session carries them.

use super::*;

/// An UPDATE with path ids on every NLRI field of both families.
pub(crate) fn update_with_ids() -> Update {
    let mut u = full_update();
    u.withdrawn_ids = vec![7];
    u.nlri_ids = vec![1, 0xffff_ffff, 3];
    u.mp_reach.as_mut().unwrap().path_ids = vec![10, 11];
    u.mp_unreach.as_mut().unwrap().path_ids = vec![12];
    u
}

fn v4_only() -> CodecOptions {
    FOUR.with_add_path(AddPathFamilies::NONE.with(Family::Ipv4Unicast))
}

fn add_path_tuples() -> Vec<AddPathFamily> {
    vec![
        AddPathFamily::new(Family::Ipv4Unicast, true, false),
        AddPathFamily::new(Family::Ipv6Unicast, true, true),
    ]
}

/// An OPEN offering ADD-PATH Send for IPv4 and both ways for IPv6.
pub(crate) fn open_with_add_path() -> Open {
    Open::new(
        65000,
        90,
        Ipv4Addr::new(10, 0, 0, 1),
        vec![Capability::AddPath(add_path_tuples())],
    )
}

#[test]
fn open_with_add_path_roundtrips_and_is_read_back() {
    let tuples = add_path_tuples();
    let o = open_with_add_path();
    let Message::Open(back) = roundtrip(&Message::Open(o.clone()), FOUR) else {
        panic!("not an OPEN")
    };
    assert_eq!(back, o);
    assert_eq!(back.add_path(), tuples.as_slice());
}

/// An OPEN whose only capability is code 69 with `value`.
fn open_with_cap_69(value: &[u8]) -> Vec<u8> {
    let mut cap = vec![69, value.len() as u8];
    cap.extend_from_slice(value);
    let mut param = vec![2, cap.len() as u8];
    param.extend_from_slice(&cap);
    let mut body = vec![4, 0xfd, 0xe8, 0, 90, 10, 0, 0, 1, param.len() as u8];
    body.extend_from_slice(&param);
    frame(MSG_OPEN, &body)
}

#[test]
fn malformed_add_path_is_an_open_message_error_and_a_bad_mode_is_ignored() {
    for value in [&[][..], &[0, 1, 1][..], &[0, 1, 1, 1, 0, 2][..]] {
        assert_eq!(
            notification_codes(&open_with_cap_69(value)),
            (notif::OPEN, 0),
            "{value:?}"
        );
    }
    // RFC 7911 4: a Send/Receive value other than 1-3 makes the
    // capability "not understood": kept as unknown, not negotiated.
    let Ok(Message::Open(o)) = Message::decode(&open_with_cap_69(&[0, 1, 1, 9]), FOUR) else {
        panic!("refused")
    };
    assert!(o.add_path().is_empty());
    assert!(matches!(
        o.capabilities[0],
        Capability::Unknown { code: 69, .. }
    ));
}

#[test]
fn update_with_path_ids_roundtrips_in_both_families() {
    let u = update_with_ids();
    let back = roundtrip(&Message::Update(u.clone()), ADD_PATH);
    assert_eq!(back, Message::Update(u));
}

#[test]
fn path_ids_go_on_the_wire_only_where_negotiated() {
    let u = Update {
        nlri: vec![p("10.1.0.0/16")],
        nlri_ids: vec![5],
        attrs: PathAttributes {
            origin: Some(Origin::Igp),
            next_hop: Some(Ipv4Addr::new(192, 0, 2, 1)),
            ..Default::default()
        },
        ..Default::default()
    };
    let plain = Message::Update(u.clone()).to_bytes(FOUR).unwrap();
    let with = Message::Update(u.clone()).to_bytes(v4_only()).unwrap();
    assert_eq!(with.len(), plain.len() + 4);
    assert_eq!(&with[with.len() - 7..], &[0, 0, 0, 5, 16, 10, 1]);
    // Read without ids, the ids go missing; with them, they come back.
    let Message::Update(a) = Message::decode(&plain, FOUR).unwrap() else {
        panic!()
    };
    assert!(a.nlri_ids.is_empty());
    let Message::Update(b) = Message::decode(&with, v4_only()).unwrap() else {
        panic!()
    };
    assert_eq!((b.nlri, b.nlri_ids), (u.nlri, vec![5]));
    // An IPv6 MP_REACH on a session with IPv4 ids only carries none.
    let v6 = ipv6_announce("2001:db8::1".parse().unwrap(), "2001:db8:1::/48");
    let a = Message::Update(v6.clone()).to_bytes(FOUR).unwrap();
    let b = Message::Update(v6).to_bytes(v4_only()).unwrap();
    assert_eq!(a, b);
}

#[test]
fn a_missing_id_is_sent_as_zero() {
    let mut u = update_with_ids();
    u.nlri_ids.clear();
    let Message::Update(back) = roundtrip(&Message::Update(u), ADD_PATH) else {
        panic!()
    };
    assert_eq!(back.nlri_ids, vec![0, 0, 0]);
}

#[test]
fn truncated_path_ids_reset_the_session() {
    // IPv4 NLRI: an id without a prefix, and a cut id.
    for nlri in [&[0, 0, 0, 1][..], &[0, 0, 1][..], &[0, 0, 0, 1, 16, 10][..]] {
        let m = frame(MSG_UPDATE, &update_body(&[], &good_attrs_plus(&[]), nlri));
        let e = Message::decode(&m, ADD_PATH).unwrap_err();
        assert_eq!(e, DecodeError::InvalidNetworkField, "{nlri:?}");
        assert_eq!(
            (e.notification().code, e.notification().subcode),
            (notif::UPDATE, notif::UPDATE_INVALID_NETWORK)
        );
    }
    // Withdrawn routes with a cut id.
    let m = frame(MSG_UPDATE, &update_body(&[0, 0], &[], &[]));
    assert_eq!(
        Message::decode(&m, ADD_PATH).unwrap_err(),
        DecodeError::InvalidNetworkField
    );
    // MP_UNREACH for IPv6 with a cut id: an MP error resets (RFC 7606 7.11).
    let attr = [0x80, 15, 5, 0, 2, 1, 0, 0];
    let m = frame(MSG_UPDATE, &update_body(&[], &attr, &[]));
    let n = Message::decode(&m, ADD_PATH).unwrap_err().notification();
    assert_eq!(
        (n.code, n.subcode),
        (notif::UPDATE, notif::UPDATE_OPTIONAL_ATTR)
    );
}

#[test]
fn the_same_bytes_read_with_and_without_ids_differ() {
    // 0.0.0.1 as an id then 10.1/16, versus four prefixes of length 0
    // and a /1 ... : the flag decides, so the session must pass it.
    let nlri = [0, 0, 0, 1, 16, 10, 1];
    let m = frame(MSG_UPDATE, &update_body(&[], &good_attrs_plus(&[]), &nlri));
    let Message::Update(with) = Message::decode(&m, ADD_PATH).unwrap() else {
        panic!()
    };
    assert_eq!(with.nlri, vec![p("10.1.0.0/16")]);
    assert_ne!(Message::decode(&m, FOUR).ok(), Some(Message::Update(with)));
}
