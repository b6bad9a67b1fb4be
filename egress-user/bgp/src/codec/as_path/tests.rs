//! RFC 6793 on sessions without 4-octet AS numbers: the path rebuilt from
//! AS_PATH and AS4_PATH, and the AS4_PATH we send back.

use crate::codec::{AttrOutcome, CodecOptions, Message, Update};
use crate::types::{AsPath, AsSegment, SegmentKind};

const TWO: CodecOptions = CodecOptions {
    four_octet_as: false,
    add_path_rx: crate::codec::AddPathFamilies::NONE,
    add_path_tx: crate::codec::AddPathFamilies::NONE,
    ipv4_via_ipv6: crate::codec::Ipv4ViaIpv6::NONE,
};

const AS4_PATH: u8 = 17;

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn seg(kind: SegmentKind, asns: &[u32]) -> AsSegment {
    AsSegment {
        kind,
        asns: asns.to_vec(),
    }
}

fn decode_two(msg: &[u8]) -> Update {
    match Message::decode(msg, TWO) {
        Ok(Message::Update(u)) => u,
        other => panic!("not an UPDATE: {other:?}"),
    }
}

/// (type code, value) of each path attribute of a whole UPDATE message.
fn attributes(msg: &[u8]) -> Vec<(u8, Vec<u8>)> {
    let body = &msg[19..];
    let wlen = u16::from_be_bytes([body[0], body[1]]) as usize;
    let at = 2 + wlen;
    let alen = u16::from_be_bytes([body[at], body[at + 1]]) as usize;
    let mut a = &body[at + 2..at + 2 + alen];
    let mut out = Vec::new();
    while !a.is_empty() {
        let (flags, code) = (a[0], a[1]);
        let (len, head) = if flags & 0x10 != 0 {
            (u16::from_be_bytes([a[2], a[3]]) as usize, 4)
        } else {
            (a[2] as usize, 3)
        };
        out.push((code, a[head..head + len].to_vec()));
        a = &a[head + len..];
    }
    out
}

/// Decodes `msg` as a 2-octet session does, checks the rebuilt path, then
/// encodes and decodes it again and checks nothing changed. Returns the
/// attributes of the re-encoded message.
fn check(msg_hex: &str, want: &[AsSegment]) -> Vec<(u8, Vec<u8>)> {
    let u = decode_two(&hex(msg_hex));
    assert_eq!(u.errors, vec![], "the message is clean");
    assert_eq!(u.attrs.as_path.segments, want, "rebuilt AS path");
    let again = Message::Update(u.clone()).to_bytes(TWO).unwrap();
    let attrs = attributes(&again);
    for (code, value) in &attrs {
        if *code == AS4_PATH {
            assert!(!value.is_empty(), "an empty AS4_PATH was sent");
        }
    }
    assert_eq!(decode_two(&again), u, "encode then decode changed it");
    attrs
}

fn as4_path_of(attrs: &[(u8, Vec<u8>)]) -> Option<&[u8]> {
    attrs
        .iter()
        .find(|(c, _)| *c == AS4_PATH)
        .map(|(_, v)| v.as_slice())
}

/// Confederation segments in a 2-octet session's AS_PATH and AS4_PATH:
/// the path rebuilt and the AS4_PATH we send in its place, if any.
#[test]
fn confederation_segments_of_as_path_and_as4_path() {
    // What we send carries no confederation segment in AS4_PATH (4.2.2).
    let kept_as4: &[u8] = &[2, 2, 0, 0, 0, 1, 0, 1, 0x11, 0x70];
    let cases = [
        (
            // AS_PATH (1), AS4_PATH (AS_CONFED_SEQUENCE 70000): RFC 6793 6
            // discards the confederation segment, which leaves nothing to
            // merge.
            "confederation segment of AS4_PATH is discarded",
            "ffffffffffffffffffffffffffffffff0036020000001b40010100400204020100014003040a000001c01106030100011170180a0102",
            vec![seg(SegmentKind::Sequence, &[1])],
            None,
        ),
        (
            // AS_PATH ((65000) 1 AS_TRANS), AS4_PATH (70000): the leading
            // confederation segment stays (RFC 6793 4.2.3) and the cut
            // sequence is whole again.
            "leading confederation segment of AS_PATH is kept",
            "ffffffffffffffffffffffffffffffff003c02000000214001010040020a0301fde8020200015ba04003040a000001c01106020100011170180a0102",
            vec![
                seg(SegmentKind::ConfedSequence, &[65000]),
                seg(SegmentKind::Sequence, &[1, 70000]),
            ],
            Some(kept_as4),
        ),
        (
            // AS_PATH ((AS_TRANS)), AS4_PATH ((70000)): all AS4_PATH had was
            // a confederation segment, so the path is AS_PATH's and no
            // AS4_PATH is sent.
            "confederation-only path sends no AS4_PATH",
            "ffffffffffffffffffffffffffffffff0036020000001b4001010040020403015ba04003040a000001c01106030100011170180a0102",
            vec![seg(SegmentKind::ConfedSequence, &[23456])],
            None,
        ),
    ];
    for (name, hex, want_path, want_as4) in cases {
        // `check` asserts on its own: the case it fails in is the last one
        // named in the test's output.
        println!("case: {name}");
        let attrs = check(hex, &want_path);
        assert_eq!(as4_path_of(&attrs), want_as4, "{name}: AS4_PATH sent");
    }
}

fn path(segments: &[AsSegment]) -> AsPath {
    AsPath {
        segments: segments.to_vec(),
    }
}

/// A confederation segment right after a segment taken whole from AS_PATH
/// comes along; the walk stops at the next segment that is not wanted.
#[test]
fn confederation_segment_next_to_a_taken_segment_is_kept() {
    use SegmentKind::*;
    let as_path = path(&[
        seg(Sequence, &[1]),
        seg(ConfedSequence, &[2]),
        seg(Sequence, &[3, 23456]),
        seg(ConfedSet, &[4]),
    ]);
    let merged = super::merge(&as_path, path(&[seg(Sequence, &[70000])]));
    let want = [
        seg(Sequence, &[1]),
        seg(ConfedSequence, &[2]),
        seg(Sequence, &[3, 70000]),
    ];
    assert_eq!(merged.segments, want);
    // The AS4_PATH we send lets the other end rebuild exactly that.
    let v = super::as4_path(&merged).unwrap();
    let as2 = super::decode(&super::encode(&merged.segments, 2), 2).unwrap();
    let back = super::merge(&as2, super::decode_as4(&v).unwrap());
    assert_eq!(back, merged);
}

/// A confederation segment after a cut sequence is not next to anything
/// taken whole: it is left out with the rest of that sequence.
#[test]
fn confederation_segment_after_a_cut_is_dropped() {
    use SegmentKind::*;
    let as_path = path(&[seg(Sequence, &[1, 2, 23456]), seg(ConfedSequence, &[9])]);
    let merged = super::merge(&as_path, path(&[seg(Set, &[70000, 5])]));
    assert_eq!(
        merged.segments,
        [seg(Sequence, &[1, 2]), seg(Set, &[70000, 5])]
    );
}

/// An AS_SET counts as one AS number and is never cut.
#[test]
fn set_counts_as_one() {
    use SegmentKind::*;
    let as_path = path(&[seg(Set, &[7, 8, 9]), seg(Sequence, &[23456])]);
    let merged = super::merge(&as_path, path(&[seg(Sequence, &[70000])]));
    assert_eq!(
        merged.segments,
        [seg(Set, &[7, 8, 9]), seg(Sequence, &[70000])]
    );
}

/// RFC 6793 4.2.3: an AS4_PATH with more AS numbers than AS_PATH is wrong
/// and ignored.
#[test]
fn longer_as4_path_is_ignored() {
    use SegmentKind::*;
    let as_path = path(&[seg(Sequence, &[23456])]);
    let as4 = path(&[seg(Sequence, &[70000, 70001])]);
    assert_eq!(super::merge(&as_path, as4), as_path);
}

/// RFC 6793 6: an AS4_PATH that carries no AS number is malformed and
/// discarded; AS_PATH is used as it came.
#[test]
fn empty_as4_path_is_discarded() {
    // The first message with AS4_PATH's value cut to nothing.
    let mut m = hex("ffffffffffffffffffffffffffffffff0030020000001540010100400204020100014003040a000001c01100180a0102");
    let n = m.len() as u16;
    m[16..18].copy_from_slice(&n.to_be_bytes());
    let u = decode_two(&m);
    assert_eq!(
        u.errors,
        vec![AttrOutcome::Discarded {
            type_code: AS4_PATH,
            reason: "malformed AS4_PATH"
        }]
    );
    assert_eq!(u.attrs.as_path.segments, [seg(SegmentKind::Sequence, &[1])]);
}
