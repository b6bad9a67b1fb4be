//! Extended Next Hop Encoding (RFC 8950): IPv4 routes whose next hop is an
//! IPv6 address, carried in MP_REACH_NLRI of AFI 1. Used where the nodes
//! have only IPv6 addresses but the pods still route IPv4.

use bytes::{BufMut, BytesMut};

use super::reader::Reader;
use super::DecodeError;

pub const CAP_EXTENDED_NEXT_HOP: u8 = 5;

const AFI_IPV4: u16 = 1;
const AFI_IPV6: u16 = 2;
const SAFI_UNICAST: u16 = 1;

/// One <NLRI AFI, NLRI SAFI, Nexthop AFI> tuple of the capability
/// (RFC 8950 3). The SAFI is 16 bits here, unlike elsewhere.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NextHopTuple {
    pub nlri_afi: u16,
    pub nlri_safi: u16,
    pub next_hop_afi: u16,
}

impl NextHopTuple {
    /// IPv4 unicast routes with IPv6 next hops: the one tuple we use.
    pub const IPV4_UNICAST_VIA_IPV6: NextHopTuple = NextHopTuple {
        nlri_afi: AFI_IPV4,
        nlri_safi: SAFI_UNICAST,
        next_hop_afi: AFI_IPV6,
    };
}

/// The capability's tuples; a length that is not a multiple of six (or
/// none at all) is a malformed OPEN.
pub(super) fn decode(value: &[u8]) -> Result<Vec<NextHopTuple>, DecodeError> {
    if value.is_empty() || !value.len().is_multiple_of(6) {
        return Err(DecodeError::MalformedOpen(
            "extended next hop capability length is not a multiple of 6",
        ));
    }
    let mut r = Reader::new(value);
    let mut out = Vec::with_capacity(value.len() / 6);
    while !r.is_empty() {
        let bad = || DecodeError::MalformedOpen("extended next hop capability truncated");
        out.push(NextHopTuple {
            nlri_afi: r.u16().ok_or_else(bad)?,
            nlri_safi: r.u16().ok_or_else(bad)?,
            next_hop_afi: r.u16().ok_or_else(bad)?,
        });
    }
    Ok(out)
}

pub(super) fn encode(tuples: &[NextHopTuple], out: &mut BytesMut) {
    for t in tuples {
        out.put_u16(t.nlri_afi);
        out.put_u16(t.nlri_safi);
        out.put_u16(t.next_hop_afi);
    }
}

/// What one side's tuples allow for IPv4 unicast over IPv6 next hops: a
/// speaker that lists the tuple can receive such routes (RFC 8950 3), so we
/// may send them when the peer listed it and may take them when we did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Ipv4ViaIpv6 {
    /// We offered the tuple: the peer's IPv4 routes may carry IPv6 next hops.
    pub receive: bool,
    /// The peer offered it (and so did we): ours may too.
    pub send: bool,
}

impl Ipv4ViaIpv6 {
    pub const NONE: Ipv4ViaIpv6 = Ipv4ViaIpv6 {
        receive: false,
        send: false,
    };
    pub const BOTH: Ipv4ViaIpv6 = Ipv4ViaIpv6 {
        receive: true,
        send: true,
    };
}

pub fn negotiate(ours: &[NextHopTuple], theirs: &[NextHopTuple]) -> Ipv4ViaIpv6 {
    let has = |v: &[NextHopTuple]| v.contains(&NextHopTuple::IPV4_UNICAST_VIA_IPV6);
    Ipv4ViaIpv6 {
        receive: has(ours),
        // Only on sessions where we chose to use it ourselves.
        send: has(ours) && has(theirs),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tuples_round_trip() {
        let t = vec![
            NextHopTuple::IPV4_UNICAST_VIA_IPV6,
            NextHopTuple {
                nlri_afi: 1,
                nlri_safi: 128,
                next_hop_afi: 2,
            },
        ];
        let mut b = BytesMut::new();
        encode(&t, &mut b);
        assert_eq!(&b[..6], &[0, 1, 0, 1, 0, 2]);
        assert_eq!(decode(&b).unwrap(), t);
    }

    #[test]
    fn a_length_that_is_not_whole_tuples_is_malformed() {
        for bad in [&[][..], &[0, 1, 0, 1, 0][..], &[0, 1, 0, 1, 0, 2, 0][..]] {
            assert!(
                matches!(decode(bad), Err(DecodeError::MalformedOpen(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn sending_needs_both_sides_and_receiving_needs_our_offer() {
        let v = [NextHopTuple::IPV4_UNICAST_VIA_IPV6];
        let other = [NextHopTuple {
            nlri_afi: 1,
            nlri_safi: 2,
            next_hop_afi: 2,
        }];
        let both = negotiate(&v, &v);
        assert!(both.receive && both.send);
        let only_ours = negotiate(&v, &[]);
        assert!(only_ours.receive && !only_ours.send);
        let only_theirs = negotiate(&[], &v);
        assert_eq!(only_theirs, Ipv4ViaIpv6::default());
        assert!(!negotiate(&v, &other).send, "multicast is another tuple");
    }
}
