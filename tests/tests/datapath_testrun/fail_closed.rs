//! Fail closed: a selected pod's packet to a policy destination that the
//! datapath cannot translate is dropped under its own reason and answered
//! with "administratively prohibited"; it never leaves with the pod's
//! address. What needs no translation (other pods, cluster destinations,
//! neighbour discovery, link-local and multicast) passes untouched.

use crate::testrun::*;
use etherparse::{icmpv4::DestUnreachableHeader, icmpv6::DestUnreachableCode, IpNumber};

const SCTP: IpNumber = IpNumber(132);
const GRE: IpNumber = IpNumber(47);

/// An IPv4 packet of protocol `proto` from the pod's MACs.
fn ip4_raw(src: Ipv4Addr, dst: Ipv4Addr, proto: IpNumber, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    PacketBuilder::ethernet2(POD_MAC, HOST_MAC)
        .ipv4(src.octets(), dst.octets(), 64)
        .write(&mut v, proto, payload)
        .unwrap();
    v
}

fn ip6_raw(src: Ipv6Addr, dst: Ipv6Addr, proto: IpNumber, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    PacketBuilder::ethernet2(POD_MAC, HOST_MAC)
        .ipv6(src.octets(), dst.octets(), 64)
        .write(&mut v, proto, payload)
        .unwrap();
    v
}

/// An SCTP common header and an INIT chunk's start (what `connect` sends).
fn sctp_init() -> Vec<u8> {
    let mut p = vec![0x9c, 0x40, 0x00, 0x50, 0, 0, 0, 0, 0, 0, 0, 0];
    p.extend_from_slice(&[
        1, 0, 0, 20, 0xde, 0xad, 0xbe, 0xef, 0, 1, 0, 0, 0, 10, 0, 10,
    ]);
    p.extend_from_slice(&[0, 0, 0, 1]);
    p
}

fn icmp4_timestamp(src: Ipv4Addr, dst: Ipv4Addr) -> Vec<u8> {
    let mut v = Vec::new();
    PacketBuilder::ethernet2(POD_MAC, HOST_MAC)
        .ipv4(src.octets(), dst.octets(), 64)
        .icmpv4(Icmpv4Type::TimestampRequest(
            etherparse::icmpv4::TimestampMessage {
                id: 9,
                seq: 1,
                originate_timestamp: 1,
                receive_timestamp: 0,
                transmit_timestamp: 0,
            },
        ))
        .write(&mut v, &[])
        .unwrap();
    v
}

fn icmp6_of_type(src: Ipv6Addr, dst: Ipv6Addr, type_u8: u8) -> Vec<u8> {
    let mut v = Vec::new();
    PacketBuilder::ethernet2(POD_MAC, HOST_MAC)
        .ipv6(src.octets(), dst.octets(), 255)
        .icmpv6(Icmpv6Type::Unknown {
            type_u8,
            code_u8: 0,
            bytes5to8: [0; 4],
        })
        .write(&mut v, &[0; 16])
        .unwrap();
    v
}

/// Asserts that `out` is "administratively prohibited" from `dst` to the
/// pod, checksums right, quoting the pod's packet.
pub(crate) fn assert_prohibited_v4(out: &[u8], dst: Ipv4Addr, proto: IpNumber) {
    assert_eq!(&out[0..6], &POD_MAC, "addressed to the pod");
    let s = check(out);
    assert_eq!((s.src, s.dst), (IpAddr::from(dst), IpAddr::from(POD)));
    let p = SlicedPacket::from_ethernet(out).unwrap();
    let Some(TransportSlice::Icmpv4(i)) = p.transport else {
        panic!("not ICMP")
    };
    assert_eq!(
        i.icmp_type(),
        Icmpv4Type::DestinationUnreachable(DestUnreachableHeader::FilterProhibited)
    );
    let q = etherparse::Ipv4HeaderSlice::from_slice(i.payload()).unwrap();
    assert_eq!(
        (q.source(), q.destination(), q.protocol()),
        (POD.octets(), dst.octets(), proto)
    );
}

fn assert_prohibited_v6(out: &[u8], dst: Ipv6Addr) {
    assert_eq!(&out[0..6], &POD_MAC, "addressed to the pod");
    let s = check(out);
    assert_eq!((s.src, s.dst), (IpAddr::from(dst), IpAddr::from(POD6)));
    let p = SlicedPacket::from_ethernet(out).unwrap();
    let Some(TransportSlice::Icmpv6(i)) = p.transport else {
        panic!("not ICMPv6")
    };
    assert_eq!(
        i.icmp_type(),
        Icmpv6Type::DestinationUnreachable(DestUnreachableCode::Prohibited)
    );
    let q = etherparse::Ipv6HeaderSlice::from_slice(i.payload()).unwrap();
    assert_eq!((q.source_addr(), q.destination_addr()), (POD6, dst));
}

#[test]
#[ignore = "needs root: loads BPF programs"]
fn untranslated_ipv4_protocols_are_dropped_and_answered() -> anyhow::Result<()> {
    let mut fx = fixture()?;
    let (rc, out) =
        fx.run_sum_unused("worker_egress", &ip4_raw(POD, SERVER, SCTP, &sctp_init()))?;
    assert_eq!(
        rc, TC_ACT_REDIRECT,
        "the error goes back out of the pod's veth"
    );
    assert_prohibited_v4(&out, SERVER, SCTP);
    assert_eq!(fx.drops(DROP_UNTRANSLATED_PROTO), 1);

    // A GRE packet shorter than the quote the error carries.
    let (rc, out) = fx.run_sum_unused(
        "worker_egress",
        &ip4_raw(POD, SERVER, GRE, &[0, 0, 0x08, 0]),
    )?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    assert_prohibited_v4(&out, SERVER, GRE);
    assert_eq!(fx.drops(DROP_UNTRANSLATED_PROTO), 2);

    let (rc, out) = fx.run_sum_unused("worker_egress", &icmp4_timestamp(POD, SERVER))?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    assert_prohibited_v4(&out, SERVER, IpNumber::ICMP);
    assert_eq!(fx.drops(DROP_UNTRANSLATED_ICMP), 1);
    Ok(())
}

#[test]
#[ignore = "needs root: loads BPF programs"]
fn untranslated_ipv6_protocols_and_headers_are_dropped_and_answered() -> anyhow::Result<()> {
    let mut fx = fixture()?;
    let (rc, out) =
        fx.run_sum_unused("worker_egress", &ip6_raw(POD6, SERVER6, SCTP, &sctp_init()))?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    assert_prohibited_v6(&out, SERVER6);
    assert_eq!(fx.drops(DROP_UNTRANSLATED_PROTO), 1);

    // ICMPv6 node information query (RFC 4620).
    let (rc, out) = fx.run_sum_unused("worker_egress", &icmp6_of_type(POD6, SERVER6, 139))?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    assert_prohibited_v6(&out, SERVER6);
    assert_eq!(fx.drops(DROP_UNTRANSLATED_ICMP), 1);

    // UDP behind a Routing header with a segment left: the fixed header's
    // destination is not the final one, so nothing can be translated.
    let mut udp = Vec::new();
    PacketBuilder::ipv4([0; 4], [0; 4], 1)
        .udp(5353, 53)
        .write(&mut udp, b"q")?;
    let mut routed = vec![17, 2, 0, 1, 0, 0, 0, 0];
    routed.extend_from_slice(&SERVER6.octets());
    routed.extend_from_slice(&udp[20..]);
    let pkt = ip6_raw(POD6, SERVER6, IpNumber::IPV6_ROUTE_HEADER, &routed);
    let (rc, out) = fx.run_sum_unused("worker_egress", &pkt)?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    assert_prohibited_v6(&out, SERVER6);
    assert_eq!(fx.drops(DROP_UNTRANSLATED_V6_EXT), 1);
    Ok(())
}

#[test]
#[ignore = "needs root: loads BPF programs"]
fn untranslated_traffic_outside_the_policies_passes_untouched() -> anyhow::Result<()> {
    let mut fx = fixture()?;
    let cases = [
        (
            "a pod no policy selects",
            ip4_raw(POD_OTHER, SERVER, SCTP, &sctp_init()),
        ),
        (
            "a cluster destination",
            ip4_raw(POD, CLUSTER_DST, SCTP, &sctp_init()),
        ),
        (
            "an excluded destination",
            icmp4_timestamp(POD, EXCLUDED_DST),
        ),
        (
            "IGMP to a link-local group",
            ip4_raw(
                POD,
                Ipv4Addr::new(224, 0, 0, 22),
                IpNumber(2),
                &[0x16, 0, 0, 0, 0, 0, 0, 0],
            ),
        ),
        (
            "a neighbour solicitation",
            icmp6_of_type(POD6, "ff02::1:ff00:1".parse()?, 135),
        ),
        (
            "a router solicitation",
            icmp6_of_type(POD6, "ff02::2".parse()?, 133),
        ),
        (
            "an MLDv2 report",
            icmp6_of_type(POD6, "ff02::16".parse()?, 143),
        ),
        (
            "SCTP to a link-local address",
            ip6_raw(POD6, "fe80::1".parse()?, SCTP, &sctp_init()),
        ),
    ];
    for (what, pkt) in cases {
        let (rc, out) = fx.run("worker_egress", &pkt)?;
        assert_eq!(rc, TC_ACT_OK, "{what} passes");
        assert_eq!(out, pkt, "{what} is not changed");
    }
    assert_eq!(fx.all_drops(), 0);
    Ok(())
}

#[test]
#[ignore = "needs root: loads BPF programs"]
fn a_policy_waiting_for_its_gateway_drops_untranslated_traffic_too() -> anyhow::Result<()> {
    let mut d = desired();
    d.policies[0].no_gateway = true;
    let mut fx = fixture_with(&d)?;
    let (rc, out) =
        fx.run_sum_unused("worker_egress", &ip4_raw(POD, SERVER, SCTP, &sctp_init()))?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    assert_prohibited_v4(&out, SERVER, SCTP);
    assert_eq!(fx.drops(DROP_UNTRANSLATED_PROTO), 1);
    Ok(())
}
