//! IP fragments of translated datagrams (see `frag` in egress-ebpf), IPv4
//! and IPv6, run on crafted packets with BPF_PROG_TEST_RUN: each later
//! fragment must get what its first fragment got, and the datagram the far
//! end reassembles must carry a right UDP checksum (etherparse).

mod testrun;

use testrun::*;

// ---------- IPv4 fragments ----------

/// Splits an Ethernet + IPv4 frame into two fragments of IP id `id`: the
/// first carries `first` bytes of the IP payload (a multiple of 8), the
/// second the rest. Header checksums recomputed (etherparse).
fn fragments(frame: &[u8], id: u16, first: usize) -> (Vec<u8>, Vec<u8>) {
    assert_eq!(first % 8, 0);
    let ip = etherparse::Ipv4HeaderSlice::from_slice(&frame[14..]).unwrap();
    let payload = &frame[14 + ip.slice().len()..14 + usize::from(ip.total_len())];
    let piece = |offset: usize, data: &[u8], more: bool| {
        let mut h = ip.to_header();
        h.identification = id;
        h.more_fragments = more;
        h.dont_fragment = false;
        h.fragment_offset = etherparse::IpFragOffset::try_new((offset / 8) as u16).unwrap();
        h.set_payload_len(data.len()).unwrap();
        h.header_checksum = h.calc_header_checksum();
        let mut v = frame[..14].to_vec();
        h.write(&mut v).unwrap();
        v.extend_from_slice(data);
        v
    };
    (
        piece(0, &payload[..first], true),
        piece(first, &payload[first..], false),
    )
}

/// The IPv4 header of a fragment (checksum verified) and its payload.
fn fragment_parts(frame: &[u8]) -> (etherparse::Ipv4Header, Vec<u8>) {
    let ip = etherparse::Ipv4HeaderSlice::from_slice(&frame[14..]).unwrap();
    let h = ip.to_header();
    assert_eq!(
        h.header_checksum,
        h.calc_header_checksum(),
        "IPv4 header checksum"
    );
    let payload = frame[14 + ip.slice().len()..14 + usize::from(h.total_len)].to_vec();
    (h, payload)
}

/// Joins two translated fragments into their UDP datagram and checks its
/// checksum over the whole datagram (etherparse) with the addresses both
/// fragments carry: (source, destination, source port, destination port).
fn reassembled_udp(first: &[u8], later: &[u8]) -> (Ipv4Addr, Ipv4Addr, u16, u16) {
    let (h1, p1) = fragment_parts(first);
    let (h2, p2) = fragment_parts(later);
    assert_eq!(
        (h1.source, h1.destination),
        (h2.source, h2.destination),
        "both fragments alike"
    );
    assert_eq!(h1.identification, h2.identification);
    let (sport, dport) = checked_udp(&[p1, p2].concat(), |u, payload| {
        u.calc_checksum_ipv4_raw(h1.source, h1.destination, payload)
            .unwrap()
    });
    (h1.source.into(), h1.destination.into(), sport, dport)
}

/// The ports of a reassembled UDP datagram whose checksum (`sum` of its
/// header and payload, with the caller's pseudo-header) is right.
fn checked_udp(
    datagram: &[u8],
    sum: impl FnOnce(&etherparse::UdpHeader, &[u8]) -> u16,
) -> (u16, u16) {
    let udp = etherparse::UdpHeaderSlice::from_slice(datagram)
        .unwrap()
        .to_header();
    assert_eq!(
        udp.checksum,
        sum(&udp, &datagram[8..]),
        "UDP checksum of the reassembled datagram"
    );
    (udp.source_port, udp.destination_port)
}

#[test]
#[ignore = "needs root: loads BPF programs"]
fn ipv4_fragments_follow_their_first_fragment_out_and_back() -> anyhow::Result<()> {
    let mut fx = fixture()?;
    let big = |src, dst, sport, dport| udp4(src, dst, sport, dport, &[0x5a; 2000]);

    // Pod to server: the first fragment is translated, the later one gets
    // the same address; the server can reassemble a datagram whose UDP
    // checksum is right for the EIP.
    let (first, later) = fragments(&big(POD, SERVER, 5353, 53), 0x4242, 1480);
    let (rc, out1) = fx.run("worker_egress", &first)?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    let (rc, out2) = fx.run("worker_egress", &later)?;
    assert_eq!(rc, TC_ACT_REDIRECT, "the later fragment follows");
    let (src, dst, sport, dport) = reassembled_udp(&out1, &out2);
    assert_eq!((src, dst, dport), (EIP, SERVER, 53));
    assert!((BLOCK * BLOCK_SIZE..(BLOCK + 1) * BLOCK_SIZE).contains(&sport));
    assert_eq!(fx.drops(DROP_FRAGMENT), 0);

    // A later fragment of a policy datagram whose first fragment was not
    // seen: dropped and counted. One of traffic no policy selects: passes.
    let (_, orphan) = fragments(&big(POD, SERVER, 5354, 53), 0x5151, 1480);
    let (rc, _) = fx.run("worker_egress", &orphan)?;
    assert_eq!((rc, fx.drops(DROP_FRAGMENT)), (TC_ACT_SHOT, 1));
    let (_, other) = fragments(&big(POD_OTHER, SERVER, 5354, 53), 0x5151, 1480);
    let (rc, out) = fx.run("worker_egress", &other)?;
    assert_eq!(
        (rc, out),
        (TC_ACT_OK, other),
        "not policy traffic: untouched"
    );

    // The server's fragmented answer at the gateway: both fragments go to
    // the worker holding the port's block (the steering is counted nowhere
    // else: an unsteered later fragment would be dropped and counted).
    let (first, later) = fragments(&big(SERVER, EIP, 53, sport), 0x6161, 1480);
    let (rc, _) = fx.run("uplink_ingress", &first)?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    let (rc, _) = fx.run("uplink_ingress", &later)?;
    assert_eq!((rc, fx.drops(DROP_FRAGMENT)), (TC_ACT_REDIRECT, 1));
    let (_, orphan) = fragments(&big(SERVER, EIP, 53, sport), 0x7171, 1480);
    let (rc, _) = fx.run("uplink_ingress", &orphan)?;
    assert_eq!((rc, fx.drops(DROP_FRAGMENT)), (TC_ACT_SHOT, 2));

    // And at the worker, out of the tunnel: both to the pod, the datagram
    // whole and right for the pod's address and port.
    let (rc, out1) = fx.run("tunnel_ingress", &first)?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    let (rc, out2) = fx.run("tunnel_ingress", &later)?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    assert_eq!(reassembled_udp(&out1, &out2), (SERVER, POD, 53, 5353));
    let (rc, _) = fx.run("tunnel_ingress", &orphan)?;
    assert_eq!((rc, fx.drops(DROP_FRAGMENT)), (TC_ACT_SHOT, 3));
    Ok(())
}

/// Splits an Ethernet + IPv6 frame (no extension headers) into two
/// fragments of identification `id` (Fragment header, RFC 8200 4.5).
fn fragments6(frame: &[u8], id: u32, first: usize) -> (Vec<u8>, Vec<u8>) {
    assert_eq!(first % 8, 0);
    let ip = etherparse::Ipv6HeaderSlice::from_slice(&frame[14..]).unwrap();
    let next = ip.next_header().0;
    let payload = &frame[54..54 + usize::from(ip.payload_length())];
    let piece = |offset: usize, data: &[u8], more: bool| {
        let mut h = ip.to_header();
        h.next_header = etherparse::IpNumber(44);
        h.payload_length = (8 + data.len()) as u16;
        let mut v = frame[..14].to_vec();
        h.write(&mut v).unwrap();
        let off_flags = ((offset / 8) as u16) << 3 | u16::from(more);
        v.extend_from_slice(&[next, 0]);
        v.extend_from_slice(&off_flags.to_be_bytes());
        v.extend_from_slice(&id.to_be_bytes());
        v.extend_from_slice(data);
        v
    };
    (
        piece(0, &payload[..first], true),
        piece(first, &payload[first..], false),
    )
}

/// `reassembled_udp` for two IPv6 fragments.
fn reassembled_udp6(first: &[u8], later: &[u8]) -> (Ipv6Addr, Ipv6Addr, u16, u16) {
    let parts = |frame: &[u8]| {
        let ip = etherparse::Ipv6HeaderSlice::from_slice(&frame[14..]).unwrap();
        assert_eq!(ip.next_header().0, 44, "still a fragment");
        let end = 54 + usize::from(ip.payload_length());
        (
            ip.to_header(),
            frame[62..end].to_vec(),
            frame[58..62].to_vec(),
        )
    };
    let (h1, p1, id1) = parts(first);
    let (h2, p2, id2) = parts(later);
    assert_eq!(
        (h1.source, h1.destination),
        (h2.source, h2.destination),
        "both fragments alike"
    );
    assert_eq!(id1, id2);
    let (sport, dport) = checked_udp(&[p1, p2].concat(), |u, payload| {
        u.calc_checksum_ipv6_raw(h1.source, h1.destination, payload)
            .unwrap()
    });
    (h1.source.into(), h1.destination.into(), sport, dport)
}

#[test]
#[ignore = "needs root: loads BPF programs"]
fn ipv6_fragments_follow_their_first_fragment_out_and_back() -> anyhow::Result<()> {
    let mut fx = fixture()?;
    // Small enough for the tunnel: an IPv6 packet is never fragmented on
    // the way, a larger one would get "packet too big".
    let big = |src, dst, sport, dport| udp6(src, dst, sport, dport, &[0x6b; 1800]);

    let (first, later) = fragments6(&big(POD6, SERVER6, 5353, 53), 0x0102_0304, 1232);
    let (rc, out1) = fx.run("worker_egress", &first)?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    let (rc, out2) = fx.run("worker_egress", &later)?;
    assert_eq!(rc, TC_ACT_REDIRECT, "the later fragment follows");
    let (src, dst, sport, dport) = reassembled_udp6(&out1, &out2);
    assert_eq!((src, dst, dport), (EIP6, SERVER6, 53));
    assert!((BLOCK6 * BLOCK_SIZE..(BLOCK6 + 1) * BLOCK_SIZE).contains(&sport));
    let (_, orphan) = fragments6(&big(POD6, SERVER6, 5354, 53), 9, 1232);
    let (rc, _) = fx.run("worker_egress", &orphan)?;
    assert_eq!((rc, fx.drops(DROP_FRAGMENT)), (TC_ACT_SHOT, 1));

    let (first, later) = fragments6(&big(SERVER6, EIP6, 53, sport), 0x0506_0708, 1232);
    let (rc, _) = fx.run("uplink_ingress", &first)?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    let (rc, _) = fx.run("uplink_ingress", &later)?;
    assert_eq!(
        (rc, fx.drops(DROP_FRAGMENT)),
        (TC_ACT_REDIRECT, 1),
        "steered as the first"
    );

    let (rc, out1) = fx.run("tunnel_ingress", &first)?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    let (rc, out2) = fx.run("tunnel_ingress", &later)?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    assert_eq!(reassembled_udp6(&out1, &out2), (SERVER6, POD6, 53, 5353));
    Ok(())
}
