//! ADD-PATH (RFC 7911): the capability's tuples, what a session agrees on
//! from both OPENs, and the set of families that carry path identifiers.

use bytes::{BufMut, BytesMut};

use super::reader::Reader;
use super::DecodeError;
use crate::types::{AfiSafi, Family};

pub const CAP_ADD_PATH: u8 = 69;

/// One <AFI, SAFI, Send/Receive> tuple of the capability (RFC 7911 4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AddPathFamily {
    pub afi_safi: AfiSafi,
    /// The sender is willing to receive path identifiers (value 1 or 3).
    pub receive: bool,
    /// The sender would like to send path identifiers (value 2 or 3).
    pub send: bool,
}

impl AddPathFamily {
    pub fn new(family: Family, send: bool, receive: bool) -> AddPathFamily {
        AddPathFamily {
            afi_safi: family.into(),
            receive,
            send,
        }
    }
}

/// What the capability value held. A Send/Receive value outside 1..=3
/// makes the whole capability "not understood" (RFC 7911 4: it SHOULD be
/// ignored), which the caller keeps as an unknown capability; a length
/// that is not a multiple of four is a malformed OPEN.
pub(super) enum Decoded {
    Tuples(Vec<AddPathFamily>),
    Ignored,
}

pub(super) fn decode(value: &[u8]) -> Result<Decoded, DecodeError> {
    if value.is_empty() || !value.len().is_multiple_of(4) {
        return Err(DecodeError::MalformedOpen(
            "ADD-PATH capability length is not a multiple of 4",
        ));
    }
    let mut r = Reader::new(value);
    let mut out = Vec::with_capacity(value.len() / 4);
    while !r.is_empty() {
        // The length check above makes these reads infallible; stay checked.
        let bad = || DecodeError::MalformedOpen("ADD-PATH capability truncated");
        let afi = r.u16().ok_or_else(bad)?;
        let safi = r.u8().ok_or_else(bad)?;
        let mode = r.u8().ok_or_else(bad)?;
        if !(1..=3).contains(&mode) {
            return Ok(Decoded::Ignored);
        }
        out.push(AddPathFamily {
            afi_safi: AfiSafi { afi, safi },
            receive: mode & 1 != 0,
            send: mode & 2 != 0,
        });
    }
    Ok(Decoded::Tuples(out))
}

pub(super) fn encode(tuples: &[AddPathFamily], v: &mut BytesMut) {
    for t in tuples {
        v.put_u16(t.afi_safi.afi);
        v.put_u8(t.afi_safi.safi);
        v.put_u8(u8::from(t.receive) | (u8::from(t.send) << 1));
    }
}

/// A set of our families, as a bit per [`Family`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AddPathFamilies(u8);

impl AddPathFamilies {
    pub const NONE: AddPathFamilies = AddPathFamilies(0);
    /// IPv4 and IPv6 unicast.
    pub const ALL: AddPathFamilies = AddPathFamilies(0b11);

    fn bit(f: Family) -> u8 {
        1 << (f as u8)
    }

    pub fn has(self, f: Family) -> bool {
        self.0 & Self::bit(f) != 0
    }

    pub fn with(self, f: Family) -> AddPathFamilies {
        AddPathFamilies(self.0 | Self::bit(f))
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub fn of(families: &[Family]) -> AddPathFamilies {
        families.iter().fold(Self::NONE, |s, f| s.with(*f))
    }
}

/// The families where path identifiers travel on a session, per
/// direction (RFC 7911 4).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AddPathNegotiated {
    /// We advertised Send and the peer Receive: we put ids on what we send.
    pub send: AddPathFamilies,
    /// We advertised Receive and the peer Send: ids come on what we read.
    pub receive: AddPathFamilies,
}

/// Agrees per family from our tuples and the peer's. Only the first
/// tuple of a family counts, and families we do not carry are skipped.
pub fn negotiate(ours: &[AddPathFamily], theirs: &[AddPathFamily]) -> AddPathNegotiated {
    let first = |list: &[AddPathFamily], f: Family| {
        list.iter()
            .find(|t| t.afi_safi.family() == Some(f))
            .copied()
    };
    let mut n = AddPathNegotiated::default();
    for f in Family::ALL {
        let (Some(o), Some(t)) = (first(ours, f), first(theirs, f)) else {
            continue;
        };
        if o.send && t.receive {
            n.send = n.send.with(f);
        }
        if o.receive && t.send {
            n.receive = n.receive.with(f);
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Family::{Ipv4Unicast as V4, Ipv6Unicast as V6};

    fn t(f: Family, send: bool, receive: bool) -> AddPathFamily {
        AddPathFamily::new(f, send, receive)
    }

    #[test]
    fn negotiation_is_per_family_and_per_direction() {
        // We send on both; the peer receives IPv4 only and sends IPv6.
        let ours = [t(V4, true, false), t(V6, true, false)];
        let theirs = [t(V4, false, true), t(V6, true, false)];
        let n = negotiate(&ours, &theirs);
        assert!(n.send.has(V4));
        assert!(!n.send.has(V6), "the peer did not offer Receive for IPv6");
        assert!(n.receive.is_empty(), "we never offered Receive");

        let both = [t(V4, true, true)];
        let n = negotiate(&both, &both);
        assert!(n.send.has(V4) && n.receive.has(V4));
        assert!(!n.send.has(V6) && !n.receive.has(V6));
    }

    #[test]
    fn negotiation_needs_the_capability_on_both_sides() {
        let ours = [t(V4, true, true)];
        assert_eq!(negotiate(&ours, &[]), AddPathNegotiated::default());
        assert_eq!(negotiate(&[], &ours), AddPathNegotiated::default());
        // Send against Send: nobody receives.
        let send = [t(V4, true, false)];
        assert_eq!(negotiate(&send, &send), AddPathNegotiated::default());
    }

    #[test]
    fn only_the_first_tuple_of_a_family_counts_and_unknown_ones_are_skipped() {
        let ours = [t(V4, true, false)];
        let theirs = [
            AddPathFamily {
                afi_safi: AfiSafi { afi: 25, safi: 65 },
                receive: true,
                send: true,
            },
            t(V4, false, false),
            t(V4, false, true),
        ];
        assert!(negotiate(&ours, &theirs).send.is_empty());
    }

    #[test]
    fn tuples_round_trip_and_bad_values_are_classified() {
        let tuples = vec![t(V4, true, false), t(V6, true, true), t(V4, false, true)];
        let mut v = BytesMut::new();
        encode(&tuples, &mut v);
        assert_eq!(&v[..4], &[0, 1, 1, 2]);
        assert_eq!(&v[4..8], &[0, 2, 1, 3]);
        match decode(&v).unwrap() {
            Decoded::Tuples(got) => assert_eq!(got, tuples),
            Decoded::Ignored => panic!("valid tuples ignored"),
        }
        for bad_len in [&[][..], &[0, 1, 1][..], &[0, 1, 1, 2, 0][..]] {
            assert!(
                matches!(decode(bad_len), Err(DecodeError::MalformedOpen(_))),
                "{bad_len:?}"
            );
        }
        for bad_mode in [0u8, 4, 255] {
            assert!(matches!(decode(&[0, 1, 1, bad_mode]), Ok(Decoded::Ignored)));
        }
    }
}
