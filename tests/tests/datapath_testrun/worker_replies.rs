//! Worker, replies.

use crate::open_flow;
use crate::testrun::*;
use etherparse::icmpv4::DestUnreachableHeader;

#[test]
#[ignore = "needs root: loads BPF programs"]
fn worker_reverse_nat_tcp_udp_icmp_v4_and_v6() -> anyhow::Result<()> {
    let mut fx = fixture()?;
    let p = open_flow(&mut fx, &tcp4(POD, SERVER, 40000, 443, true));
    // The server's SYN(-ACK) comes back with MSS 1460: clamped for the pod.
    let (rc, out) = fx.run("tunnel_ingress", &tcp4(SERVER, EIP, 443, p, true))?;
    assert_eq!(rc, TC_ACT_REDIRECT, "delivered to the pod's veth");
    let s = check(&out);
    assert_eq!(
        (s.src, s.dst, s.sport, s.dport),
        (SERVER.into(), POD.into(), 443, 40000)
    );
    assert_eq!(mss_of(&out), Some(MTU - 40), "SYN-ACK MSS clamped");

    let p = open_flow(&mut fx, &udp4(POD, SERVER, 5353, 53, b"q"));
    let (rc, out) = fx.run("tunnel_ingress", &udp4(SERVER, EIP, 53, p, b"answer"))?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    let s = check(&out);
    assert_eq!((s.dst, s.dport), (POD.into(), 5353));

    let id = open_flow(&mut fx, &icmp4_echo(POD, SERVER, 77, false));
    let (rc, out) = fx.run("tunnel_ingress", &icmp4_echo(SERVER, EIP, id, true))?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    let s = check(&out);
    assert_eq!((s.dst, s.dport), (POD.into(), 77));

    let p = open_flow(&mut fx, &udp6(POD6, SERVER6, 5353, 53, b"q"));
    let (rc, out) = fx.run("tunnel_ingress", &udp6(SERVER6, EIP6, 53, p, b"a6"))?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    let s = check(&out);
    assert_eq!((s.dst, s.dport), (POD6.into(), 5353));

    let id = open_flow(&mut fx, &icmp6_echo(POD6, SERVER6, 99, false));
    let (rc, out) = fx.run("tunnel_ingress", &icmp6_echo(SERVER6, EIP6, id, true))?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    let s = check(&out);
    assert_eq!((s.dst, s.dport), (POD6.into(), 99));

    assert_eq!(
        stats::read_policy_stats(fx.pins.path())?[&7].reply_packets,
        5
    );
    assert_eq!(fx.all_drops(), 0);
    Ok(())
}

#[test]
#[ignore = "needs root: loads BPF programs"]
fn worker_translates_icmp_frag_needed_by_the_quoted_packet() -> anyhow::Result<()> {
    let mut fx = fixture()?;
    let p = open_flow(&mut fx, &udp4(POD, SERVER, 5353, 53, b"quoted-query"));
    // What the server (or a router) saw: EIP:p -> SERVER:53, quoted whole.
    let mut quoted = Vec::new();
    PacketBuilder::ipv4(EIP.octets(), SERVER.octets(), 63)
        .udp(p, 53)
        .write(&mut quoted, b"quoted-query")?;
    let mut err = Vec::new();
    PacketBuilder::ethernet2(PEER_MAC, UPLINK_MAC)
        .ipv4(SERVER.octets(), EIP.octets(), 64)
        .icmpv4(Icmpv4Type::DestinationUnreachable(
            DestUnreachableHeader::FragmentationNeeded { next_hop_mtu: 1400 },
        ))
        .write(&mut err, &quoted)?;
    let (rc, out) = fx.run("tunnel_ingress", &err)?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    let s = check(&out); // outer IPv4 + ICMP checksums
    assert_eq!(s.dst, IpAddr::from(POD));
    // The quoted packet now reads POD:5353 -> SERVER:53 with valid checksums.
    let icmp_payload = &out[14 + 20 + 8..];
    let q = SlicedPacket::from_ip(icmp_payload).expect("quoted packet parses");
    let Some(NetSlice::Ipv4(qip)) = q.net else {
        panic!("quoted not IPv4")
    };
    let qh = qip.header().to_header();
    assert_eq!(
        qh.header_checksum,
        qh.calc_header_checksum(),
        "quoted IPv4 checksum"
    );
    assert_eq!(qh.source, POD.octets());
    let Some(TransportSlice::Udp(qu)) = q.transport else {
        panic!("quoted not UDP")
    };
    assert_eq!(qu.source_port(), 5353);
    let want = qu
        .to_header()
        .calc_checksum_ipv4_raw(qh.source, qh.destination, qu.payload())?;
    assert_eq!(qu.checksum(), want, "quoted UDP checksum");
    Ok(())
}

#[test]
#[ignore = "needs root: loads BPF programs"]
fn worker_translates_icmpv6_packet_too_big() -> anyhow::Result<()> {
    let mut fx = fixture()?;
    let p = open_flow(&mut fx, &udp6(POD6, SERVER6, 5353, 53, b"q6"));
    let mut quoted = Vec::new();
    PacketBuilder::ipv6(EIP6.octets(), SERVER6.octets(), 63)
        .udp(p, 53)
        .write(&mut quoted, b"q6")?;
    let mut err = Vec::new();
    PacketBuilder::ethernet2(PEER_MAC, UPLINK_MAC)
        .ipv6(SERVER6.octets(), EIP6.octets(), 64)
        .icmpv6(Icmpv6Type::PacketTooBig { mtu: 1280 })
        .write(&mut err, &quoted)?;
    let (rc, out) = fx.run("tunnel_ingress", &err)?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    let s = check(&out);
    assert_eq!(s.dst, IpAddr::from(POD6));
    assert_eq!(quoted_udp6(&out), (POD6, 5353));
    Ok(())
}

#[test]
#[ignore = "needs root: loads BPF programs"]
fn drop_no_nat_entry() -> anyhow::Result<()> {
    let mut fx = fixture()?;
    let (rc, _) = fx.run("tunnel_ingress", &udp4(SERVER, EIP, 53, 41000, b"stray"))?;
    assert_eq!(rc, TC_ACT_SHOT);
    assert_eq!(fx.drops(DROP_NO_NAT_ENTRY), 1);
    Ok(())
}

/// `frame` as a pod with MAC `pod` would send it to next hop `gateway`.
fn from_macs(mut frame: Vec<u8>, pod: [u8; 6], gateway: [u8; 6]) -> Vec<u8> {
    frame[0..6].copy_from_slice(&gateway);
    frame[6..12].copy_from_slice(&pod);
    frame
}

/// Replies reach the pod by the MACs its own frames carried (learned per
/// pod address on each new flow), not by a neighbour lookup on its veth:
/// on a bridge, the bridge answers the pod's ARP, so the veth has none.
#[test]
#[ignore = "needs root: loads BPF programs"]
fn replies_carry_the_macs_the_pod_sends_with() -> anyhow::Result<()> {
    let mut fx = fixture()?;
    let pod_mac = [0x0a, 0x58, 0, 0, 0, 0x05];
    let bridge_mac = [0x0a, 0x58, 0, 0, 0, 0x01];
    let out4 = from_macs(udp4(POD, SERVER, 5353, 53, b"q"), pod_mac, bridge_mac);
    let p = crate::open_flow(&mut fx, &out4);
    let (rc, out) = fx.run("tunnel_ingress", &udp4(SERVER, EIP, 53, p, b"a"))?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    assert_eq!((&out[0..6], &out[6..12]), (&pod_mac[..], &bridge_mac[..]));
    assert_eq!(check(&out).dst, IpAddr::from(POD));

    let out6 = from_macs(udp6(POD6, SERVER6, 5353, 53, b"q"), pod_mac, bridge_mac);
    let p = crate::open_flow(&mut fx, &out6);
    let (_, out) = fx.run("tunnel_ingress", &udp6(SERVER6, EIP6, 53, p, b"a"))?;
    assert_eq!((&out[0..6], &out[6..12]), (&pod_mac[..], &bridge_mac[..]));

    // The pod re-created with the same address and a new MAC: its next
    // flow teaches the new one, and replies of every flow follow it.
    let new_mac = [0x0a, 0x58, 0, 0, 0, 0x55];
    let first = p;
    let again = from_macs(udp6(POD6, SERVER6, 5354, 53, b"q"), new_mac, bridge_mac);
    crate::open_flow(&mut fx, &again);
    let (_, out) = fx.run("tunnel_ingress", &udp6(SERVER6, EIP6, 53, first, b"a"))?;
    assert_eq!(&out[0..6], &new_mac[..]);
    assert_eq!(fx.all_drops(), 0);
    Ok(())
}
