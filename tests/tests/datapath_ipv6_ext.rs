//! IPv6 extension headers (RFC 8200 4.1) in front of the transport header,
//! run on crafted packets with BPF_PROG_TEST_RUN: Hop-by-Hop and
//! Destination Options are stepped over, so policy traffic that carries
//! them is translated (before, it left with the pod's own address); a
//! Routing header with segments left, or a chain too long, passes
//! untouched. Checksums are recomputed by etherparse.

mod testrun;

use testrun::*;

const HOPOPTS: u8 = 0;
const ROUTING: u8 = 43;
const DSTOPTS: u8 = 60;

/// An options header (Hop-by-Hop or Destination Options) of `len` bytes in
/// all, a multiple of 8, filled with one PadN option. Its next-header byte
/// is set by `with_ext`.
fn options(kind: u8, len: usize) -> (u8, Vec<u8>) {
    assert!(len.is_multiple_of(8) && len >= 8);
    let mut h = vec![0u8; len];
    h[1] = (len / 8 - 1) as u8;
    h[2] = 1; // PadN
    h[3] = (len - 4) as u8;
    (kind, h)
}

/// A segment routing header (Routing type 4) with one segment.
fn routing(segments_left: u8) -> (u8, Vec<u8>) {
    let mut h = vec![0u8; 24];
    h[1] = 2;
    h[2] = 4;
    h[3] = segments_left;
    h[8..24].copy_from_slice(&SERVER6.octets());
    (ROUTING, h)
}

/// `frame` (Ethernet + IPv6) with `exts` put, in order, between the fixed
/// header and what followed it.
fn with_ext(frame: &[u8], exts: &[(u8, Vec<u8>)]) -> Vec<u8> {
    let mut out = frame[..54].to_vec();
    let last_next = out[14 + 6];
    out[14 + 6] = exts[0].0;
    for (i, (_, h)) in exts.iter().enumerate() {
        let mut h = h.clone();
        h[0] = exts.get(i + 1).map_or(last_next, |e| e.0);
        out.extend_from_slice(&h);
    }
    out.extend_from_slice(&frame[54..]);
    let added: usize = exts.iter().map(|(_, h)| h.len()).sum();
    let plen = u16::from_be_bytes([out[18], out[19]]) + added as u16;
    out[18..20].copy_from_slice(&plen.to_be_bytes());
    out
}

/// The kinds of the extension headers of a frame, in order.
fn ext_kinds(frame: &[u8]) -> Vec<u8> {
    let p = SlicedPacket::from_ethernet(frame).expect("parses");
    let Some(NetSlice::Ipv6(ip)) = p.net else {
        panic!("not IPv6")
    };
    let mut kinds = vec![ip.header().next_header().0];
    for e in ip.extensions().clone().into_iter() {
        let next = match e {
            etherparse::Ipv6ExtensionSlice::HopByHop(h) => h.next_header(),
            etherparse::Ipv6ExtensionSlice::Routing(h) => h.next_header(),
            etherparse::Ipv6ExtensionSlice::DestinationOptions(h) => h.next_header(),
            other => panic!("unexpected {other:?}"),
        };
        kinds.push(next.0);
    }
    kinds
}

#[test]
#[ignore = "needs root: loads BPF programs"]
fn policy_traffic_past_options_headers_is_translated_out_and_back() -> anyhow::Result<()> {
    let mut fx = fixture()?;
    let exts = [options(HOPOPTS, 8), options(DSTOPTS, 16)];
    let pkt = with_ext(&udp6(POD6, SERVER6, 5353, 53, b"opts"), &exts);
    let (rc, out) = fx.run("worker_egress", &pkt)?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    let s = check(&out); // UDP checksum with the EIP, by etherparse
    assert_eq!(
        (s.src, s.dst, s.dport),
        (IpAddr::from(EIP6), IpAddr::from(SERVER6), 53)
    );
    assert!(in_block(s.sport, BLOCK6), "port {} from the block", s.sport);
    assert_eq!(ext_kinds(&out), [HOPOPTS, DSTOPTS, 17], "headers kept");

    // A SYN behind a Destination Options header: translated, MSS clamped.
    let syn = with_ext(&tcp6(POD6, SERVER6, 40000, 443), &[options(DSTOPTS, 8)]);
    let (rc, out) = fx.run("worker_egress", &syn)?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    assert_eq!(check(&out).src, IpAddr::from(EIP6));
    assert_eq!(mss_of(&out), Some(MTU - 60));

    // The server's answer, with its own options: steered by the gateway,
    // then given back to the pod by the worker.
    let reply = with_ext(
        &udp6(SERVER6, EIP6, 53, s.sport, b"answer"),
        &[options(DSTOPTS, 8)],
    );
    let (rc, _) = fx.run("uplink_ingress", &reply)?;
    assert_eq!(rc, TC_ACT_REDIRECT, "steered to the worker");
    let (rc, out) = fx.run("tunnel_ingress", &reply)?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    let s = check(&out);
    assert_eq!(
        (s.src, s.dst, s.sport, s.dport),
        (IpAddr::from(SERVER6), IpAddr::from(POD6), 53, 5353)
    );
    assert_eq!(fx.all_drops(), 0);
    Ok(())
}

/// A selected pod's IPv6 whose headers the walk does not get past cannot
/// be translated: it fails closed (dropped, counted, the pod told
/// "administratively prohibited"), never leaving with the pod's address.
#[test]
#[ignore = "needs root: loads BPF programs"]
fn routing_headers_with_segments_left_and_long_chains_fail_closed() -> anyhow::Result<()> {
    let mut fx = fixture()?;
    let prohibited = |out: &[u8]| {
        let p = SlicedPacket::from_ethernet(out).unwrap();
        let Some(TransportSlice::Icmpv6(i)) = p.transport else {
            panic!("not ICMPv6")
        };
        assert_eq!(
            i.icmp_type(),
            Icmpv6Type::DestinationUnreachable(etherparse::icmpv6::DestUnreachableCode::Prohibited)
        );
        assert_eq!(check(out).dst, IpAddr::from(POD6));
    };
    let udp = udp6(POD6, SERVER6, 5353, 53, b"sr");
    // Segments left: the fixed header's destination is not the final one
    // (the policy would be matched, and the checksum computed, against the
    // wrong address).
    let pkt = with_ext(&udp, &[routing(1)]);
    let (rc, out) = fx.run_sum_unused("worker_egress", &pkt)?;
    assert_eq!(rc, TC_ACT_REDIRECT, "the error goes back to the pod");
    prohibited(&out);
    // None left: the destination is final; translated.
    let (rc, out) = fx.run("worker_egress", &with_ext(&udp, &[routing(0)]))?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    assert_eq!(check(&out).src, IpAddr::from(EIP6));
    assert_eq!(ext_kinds(&out), [ROUTING, 17]);
    // More headers than the walk steps over.
    let long: Vec<_> = (0..6).map(|_| options(DSTOPTS, 8)).collect();
    let pkt = with_ext(&udp6(POD6, SERVER6, 5354, 53, b"long"), &long);
    let (rc, out) = fx.run_sum_unused("worker_egress", &pkt)?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    prohibited(&out);
    assert_eq!(fx.drops(DROP_UNTRANSLATED_V6_EXT), 2);
    assert_eq!(fx.all_drops(), 2);
    Ok(())
}

#[test]
#[ignore = "needs root: loads BPF programs"]
fn icmpv6_errors_quoting_extension_headers_reach_the_pod() -> anyhow::Result<()> {
    let mut fx = fixture()?;
    let (rc, out) = fx.run("worker_egress", &udp6(POD6, SERVER6, 5353, 53, b"q6"))?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    let port = check(&out).sport;
    let error = |quoted: &[u8]| {
        let mut err = Vec::new();
        PacketBuilder::ethernet2(PEER_MAC, UPLINK_MAC)
            .ipv6(SERVER6.octets(), EIP6.octets(), 64)
            .icmpv6(Icmpv6Type::PacketTooBig { mtu: 1280 })
            .write(&mut err, quoted)
            .unwrap();
        err
    };

    // The quoted packet carries Destination Options: translated back,
    // quoted addresses, port and UDP checksum included.
    let sent = with_ext(
        &udp6(EIP6, SERVER6, port, 53, b"q6"),
        &[options(DSTOPTS, 8)],
    );
    let (rc, out) = fx.run("tunnel_ingress", &error(&sent[14..]))?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    assert_eq!(check(&out).dst, IpAddr::from(POD6));
    assert_eq!(quoted_udp6(&out), (POD6, 5353));

    // The quoted packet is a first fragment (a datagram the tunnel could
    // not carry whole): its ports are behind the Fragment header.
    let big = udp6(EIP6, SERVER6, port, 53, &[7; 1800]);
    let mut frag = big[..54].to_vec();
    frag[14 + 6] = 44;
    frag.extend_from_slice(&[17, 0, 0, 1, 0, 0, 0x12, 0x34]); // offset 0, M
    frag.extend_from_slice(&big[54..54 + 1000]);
    let plen = (frag.len() - 54) as u16;
    frag[18..20].copy_from_slice(&plen.to_be_bytes());
    let (rc, out) = fx.run("tunnel_ingress", &error(&frag[14..]))?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    assert_eq!(check(&out).dst, IpAddr::from(POD6)); // ICMPv6 checksum too
    let quote = &out[14 + 40 + 8..];
    assert_eq!(&quote[8..24], &POD6.octets(), "quoted source");
    assert_eq!(&quote[48..50], &5353u16.to_be_bytes(), "quoted port");
    assert_eq!(fx.all_drops(), 0);
    Ok(())
}

#[test]
#[ignore = "needs root: loads BPF programs"]
fn packet_too_big_for_the_pod_quotes_past_its_extension_headers() -> anyhow::Result<()> {
    let mut fx = fixture()?;
    let exts = [options(HOPOPTS, 8), options(DSTOPTS, 24)];
    let big = with_ext(&udp6(POD6, SERVER6, 5353, 53, &[0xcd; 1440]), &exts);
    let (rc, out) = fx.run_sum_unused("worker_egress", &big)?;
    assert_eq!(rc, TC_ACT_REDIRECT, "back out of the pod's veth");
    let s = check(&out); // ICMPv6 checksum by etherparse
    assert_eq!((s.src, s.dst), (IpAddr::from(SERVER6), IpAddr::from(POD6)));
    assert_eq!(fx.drops(DROP_TOO_BIG), 1);
    // The pod's kernel finds the socket by the quoted ports, which lie
    // past both extension headers.
    let quote = &out[14 + 40 + 8..];
    let l4 = 40 + 8 + 24;
    assert!(quote.len() >= l4 + 8, "quote of {} bytes", quote.len());
    assert_eq!((quote[6], quote[40], quote[48]), (HOPOPTS, DSTOPTS, 17));
    assert_eq!(&quote[l4..l4 + 4], &[0x14, 0xe9, 0, 53], "quoted ports");
    Ok(())
}
