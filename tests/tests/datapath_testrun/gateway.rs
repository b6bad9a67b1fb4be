//! Gateway.

use crate::testrun::*;
use egress_tests::Netns;

#[test]
#[ignore = "needs root: loads BPF programs"]
fn gateway_steers_replies_by_port_block_into_the_tunnel() -> anyhow::Result<()> {
    let mut fx = fixture()?;
    for pkt in [
        tcp4(SERVER, EIP, 443, BLOCK * BLOCK_SIZE + 7, false),
        icmp4_echo(SERVER, EIP, BLOCK * BLOCK_SIZE + 9, true),
        udp6(SERVER6, EIP6, 53, BLOCK6 * BLOCK_SIZE + 1, b"r"),
    ] {
        let (rc, out) = fx.run("uplink_ingress", &pkt)?;
        assert_eq!(rc, TC_ACT_REDIRECT, "steered into the tunnel");
        assert_eq!(out, pkt, "the gateway does not touch the packet");
    }
    // Traffic to addresses that are not owned EIPs is not ours.
    let other = udp4(SERVER, Ipv4Addr::new(198, 51, 100, 99), 53, 41000, b"x");
    assert_eq!(fx.run("uplink_ingress", &other)?.0, TC_ACT_OK);
    assert_eq!(fx.all_drops(), 0);
    Ok(())
}

#[test]
#[ignore = "needs root: loads BPF programs"]
fn drop_no_steering_port_in_no_block() -> anyhow::Result<()> {
    let mut fx = fixture()?;
    let (rc, _) = fx.run("uplink_ingress", &udp4(SERVER, EIP, 53, 80, b"x"))?;
    assert_eq!(rc, TC_ACT_SHOT);
    assert_eq!(fx.drops(DROP_NO_STEERING), 1);
    Ok(())
}

#[test]
#[ignore = "needs root: loads BPF programs"]
fn use_node_ip_unsteered_ports_go_to_the_stack() -> anyhow::Result<()> {
    let mut d = desired();
    d.owned_eips[0].node_ip = true;
    d.owned_eips[0].answer_neigh = false;
    let mut fx = fixture_with(&d)?;
    let pkt = tcp4(SERVER, EIP, 443, 22, false);
    let (rc, out) = fx.run("uplink_ingress", &pkt)?;
    assert_eq!(rc, TC_ACT_OK, "the node's own connection");
    assert_eq!(out, pkt);
    let (rc, _) = fx.run(
        "uplink_ingress",
        &tcp4(SERVER, EIP, 443, BLOCK * BLOCK_SIZE, false),
    )?;
    assert_eq!(
        rc, TC_ACT_REDIRECT,
        "ports of the reserved blocks are steered"
    );
    Ok(())
}

#[test]
#[ignore = "needs root: loads BPF programs"]
fn drop_no_config_without_block_size() -> anyhow::Result<()> {
    let mut fx = fixture()?;
    // Bypass the translation's validation: write a config with block size 0.
    let mut m = egress_user::datapath::translate::translate(&desired())?;
    m.config.port_block_size = 0;
    egress_user::datapath::apply::apply_contents(&mut fx.dp, &m)?;
    let (rc, _) = fx.run("uplink_ingress", &udp4(SERVER, EIP, 53, 41000, b"x"))?;
    assert_eq!(rc, TC_ACT_SHOT);
    assert_eq!(fx.drops(DROP_NO_CONFIG), 1);
    Ok(())
}

#[test]
#[ignore = "needs root: loads BPF programs"]
fn gateway_answers_arp_for_owned_eips_only() -> anyhow::Result<()> {
    let mut fx = fixture()?;
    let arp = arp_request;
    let (rc, out) = fx.run_sum_unused("uplink_ingress", &arp(EIP))?;
    assert_eq!(rc, TC_ACT_REDIRECT, "reply sent back out of the uplink");
    let p = SlicedPacket::from_ethernet(&out)?;
    let Some(NetSlice::Arp(a)) = p.net else {
        panic!("not ARP: {:?}", p.net)
    };
    assert_eq!(a.operation(), etherparse::ArpOperation::REPLY);
    assert_eq!(a.sender_hw_addr(), &UPLINK_MAC);
    assert_eq!(a.sender_protocol_addr(), &EIP.octets());
    assert_eq!(a.target_hw_addr(), &PEER_MAC);
    assert_eq!(a.target_protocol_addr(), &SERVER.octets());
    assert_eq!(&out[0..6], &PEER_MAC);
    assert_eq!(&out[6..12], &UPLINK_MAC);

    let req = arp(Ipv4Addr::new(198, 51, 100, 99));
    let (rc, out) = fx.run_sum_unused("uplink_ingress", &req)?;
    assert_eq!((rc, out), (TC_ACT_OK, req), "not an owned EIP: untouched");
    Ok(())
}

/// A broadcast ARP request from the server for `tpa`.
pub(crate) fn arp_request(tpa: Ipv4Addr) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&[0xff; 6]);
    v.extend_from_slice(&PEER_MAC);
    v.extend_from_slice(&[0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, 1]);
    v.extend_from_slice(&PEER_MAC);
    v.extend_from_slice(&SERVER.octets());
    v.extend_from_slice(&[0; 6]);
    v.extend_from_slice(&tpa.octets());
    v
}

#[test]
#[ignore = "needs root: loads BPF programs"]
fn an_expired_announce_lease_silences_arp_answers() -> anyhow::Result<()> {
    use egress_user::datapath::lease;
    use std::time::{Duration, Instant};
    let mut fx = fixture()?;
    let req = arp_request(EIP);
    lease::write(
        fx.pins.path(),
        Some(Instant::now() + Duration::from_secs(60)),
    )?;
    let (rc, _) = fx.run_sum_unused("uplink_ingress", &req)?;
    assert_eq!(rc, TC_ACT_REDIRECT, "lease valid: answered");
    // The agent stopped renewing (crashed): past the deadline the node no
    // longer answers for its EIP, though the EIP is still in OWNED_EIPS.
    let past = Instant::now()
        .checked_sub(Duration::from_millis(1))
        .expect("the monotonic clock is past 1 ms");
    lease::write(fx.pins.path(), Some(past))?;
    assert!(matches!(lease::read(fx.pins.path())?, lease::Lease::Until(t) if t <= Instant::now()));
    let (rc, out) = fx.run_sum_unused("uplink_ingress", &req)?;
    assert_eq!(
        (rc, out),
        (TC_ACT_OK, req.clone()),
        "lease expired: untouched"
    );
    lease::write(fx.pins.path(), None)?;
    let (rc, _) = fx.run_sum_unused("uplink_ingress", &req)?;
    assert_eq!(rc, TC_ACT_REDIRECT, "no limit: answered");
    Ok(())
}

/// The controller's probe as a frame from the controller to this node.
fn probe_frame(pkt: &egress_failover::probe::Packet, dst: Ipv4Addr, dport: u16) -> Vec<u8> {
    let mut v = Vec::new();
    PacketBuilder::ethernet2(PEER_MAC, UPLINK_MAC)
        .ipv4(CONTROLLER.octets(), dst.octets(), 255)
        .udp(40000, dport)
        .write(&mut v, &pkt.encode())
        .unwrap();
    v
}

#[test]
#[ignore = "needs root: loads BPF programs"]
fn the_datapath_answers_controller_probes_and_the_session_comes_up() -> anyhow::Result<()> {
    use egress_failover::probe::{Packet, Session, SessionConfig, SessionState};
    use std::time::Instant;
    let mut fx = fixture()?;
    let now = Instant::now();
    let cfg = SessionConfig {
        desired_min_tx_ms: 100,
        required_min_rx_ms: 100,
        detect_multiplier: 3,
    };
    // The controller's side of the session: the real state machine.
    let mut controller = Session::new(cfg, 77, now);
    for round in 0..3 {
        let ask = controller
            .packet_to_send(now, 0)
            .expect("a Down/Init session sends");
        let (rc, out) = fx.run(
            "uplink_ingress",
            &probe_frame(&ask, WORKER_TUNNEL, PROBE_PORT),
        )?;
        assert_eq!(
            rc, TC_ACT_REDIRECT,
            "round {round}: answered out of the uplink"
        );
        let seen = check(&out); // IPv4 and UDP checksums verified
        assert_eq!(
            (seen.src, seen.dst, seen.sport, seen.dport),
            (
                IpAddr::V4(WORKER_TUNNEL),
                IpAddr::V4(CONTROLLER),
                PROBE_PORT,
                40000
            )
        );
        assert_eq!((&out[0..6], &out[6..12]), (&PEER_MAC[..], &UPLINK_MAC[..]));
        let reply = Packet::decode(&out[out.len() - 24..])?;
        assert_eq!(
            reply.your_discriminator, 77,
            "the asker's discriminator echoed"
        );
        assert_eq!(
            reply.my_discriminator,
            u32::from_be_bytes(WORKER_TUNNEL.octets())
        );
        controller.on_packet(now, &reply)?;
        if controller.state() == SessionState::Up {
            break;
        }
    }
    assert_eq!(controller.state(), SessionState::Up);
    // Not to this node, or not the probe port: left to the stack.
    let ask = controller.packet_to_send(now, 0).unwrap();
    for frame in [
        probe_frame(&ask, GW_TUNNEL, PROBE_PORT),
        probe_frame(&ask, WORKER_TUNNEL, PROBE_PORT + 1),
    ] {
        let (rc, out) = fx.run("uplink_ingress", &frame)?;
        assert_eq!((rc, out), (TC_ACT_OK, frame));
    }
    Ok(())
}

#[test]
#[ignore = "needs root: loads BPF programs"]
fn gateway_answers_ndp_for_owned_eips() -> anyhow::Result<()> {
    let mut fx = fixture()?;
    let peer = Ipv6Addr::new(0x2001, 0xdb8, 0xe, 0, 0, 0, 0, 0x1);
    let t = EIP6.octets();
    let snm = Ipv6Addr::new(
        0xff02,
        0,
        0,
        0,
        0,
        1,
        0xff00 | u16::from(t[13]),
        u16::from_be_bytes([t[14], t[15]]),
    );
    let mut body = Vec::new();
    body.extend_from_slice(&EIP6.octets());
    body.extend_from_slice(&[1, 1]);
    body.extend_from_slice(&PEER_MAC);
    let mut ns = Vec::new();
    PacketBuilder::ethernet2(PEER_MAC, [0x33, 0x33, 0xff, t[13], t[14], t[15]])
        .ipv6(peer.octets(), snm.octets(), 255)
        .icmpv6(Icmpv6Type::Unknown {
            type_u8: 135,
            code_u8: 0,
            bytes5to8: [0; 4],
        })
        .write(&mut ns, &body)?;
    let (rc, out) = fx.run("uplink_ingress", &ns)?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    let s = check(&out); // ICMPv6 checksum by etherparse
    assert_eq!((s.src, s.dst, s.ttl), (EIP6.into(), peer.into(), 255));
    let icmp = &out[14 + 40..];
    assert_eq!(icmp[0], 136, "neighbour advertisement");
    assert_eq!(icmp[4] & 0x60, 0x60, "solicited + override");
    assert_eq!(&icmp[8..24], &EIP6.octets());
    assert_eq!(&icmp[24..26], &[2, 1], "target link-layer address option");
    assert_eq!(&icmp[26..32], &UPLINK_MAC);
    Ok(())
}

/// A namespace with an uplink `up0` (02:00:00:00:0e:01, 203.0.113.1/24): an
/// on-link route and a permanent neighbour for the server 203.0.113.10, so
/// the FIB lookup succeeds with known MACs.
fn uplink_with_server(name: &str) -> anyhow::Result<Netns> {
    let ns = Netns::new(name)?;
    ns.ip(&["link", "add", "up0", "type", "veth", "peer", "name", "up1"])?;
    ns.ip(&["link", "set", "up1", "up"])?;
    ns.ip(&["link", "set", "up0", "address", "02:00:00:00:0e:01"])?;
    ns.addr("up0", "203.0.113.1/24")?;
    ns.permanent_neighbour("up0", "203.0.113.10", "02:00:00:00:0e:10")?;
    Ok(ns)
}

#[test]
#[ignore = "needs root: creates a namespace and loads BPF programs"]
fn gateway_forwards_decapsulated_packets_by_the_fib() -> anyhow::Result<()> {
    let ns = uplink_with_server("fib")?;
    ns.addr("up0", "2001:db8:e::1/64")?;
    ns.permanent_neighbour("up0", "2001:db8:e::10", "02:00:00:00:0e:10")?;
    ns.enable_forwarding()?;
    let pins = PinDir::new("trfib")?;
    let pin_path = pins.path().to_owned();
    let results = ns.enter(move || {
        let mut dp = Datapath::load(EBPF_OBJECT, &pin_path)?;
        apply(&mut dp, &desired())?;
        let v4 = run_prog(
            &mut dp,
            "tunnel_ingress",
            &udp4(EIP, SERVER, 41000, 53, b"fwd"),
        )?;
        let v6 = run_prog(
            &mut dp,
            "tunnel_ingress",
            &udp6(EIP6, SERVER6, 41000, 53, b"fwd6"),
        )?;
        // Not from an owned EIP and no NAT entry: dropped, never forwarded.
        let stray = run_prog(
            &mut dp,
            "tunnel_ingress",
            &udp4(POD_OTHER, SERVER, 1, 53, b"x"),
        )?;
        Ok((v4, v6, stray))
    })?;
    let ((rc4, out4), (rc6, out6), (rc_stray, _)) = results;
    for (rc, out) in [(rc4, &out4), (rc6, &out6)] {
        assert_eq!(rc, TC_ACT_REDIRECT);
        assert_eq!(&out[0..6], &[2, 0, 0, 0, 0x0e, 0x10], "next hop MAC");
        assert_eq!(&out[6..12], &[2, 0, 0, 0, 0x0e, 0x01], "uplink MAC");
        let s = check(out);
        assert_eq!(s.ttl, 63, "TTL / hop limit decremented");
    }
    assert_eq!(check(&out4).src, IpAddr::from(EIP), "source stays the EIP");
    assert_eq!(rc_stray, TC_ACT_SHOT);
    Ok(())
}

// ---------- a node that is worker and gateway ----------

#[test]
#[ignore = "needs root: creates a namespace and loads BPF programs"]
fn worker_and_gateway_in_one_node_skip_the_tunnel() -> anyhow::Result<()> {
    let ns = uplink_with_server("local")?;
    ns.enable_forwarding()?;
    let pins = PinDir::new("trlocal")?;
    let pin_path = pins.path().to_owned();
    let mut d = desired();
    d.policies[0].local_gateway = true;
    d.reply_steering[0].local = true;
    let (fwd, reply, port) = ns.enter(move || {
        let mut dp = Datapath::load(EBPF_OBJECT, &pin_path)?;
        apply(&mut dp, &d)?;
        // SNAT and out by the FIB, no tunnel.
        let fwd = run_prog(
            &mut dp,
            "worker_egress",
            &udp4(POD, SERVER, 5353, 53, b"local"),
        )?;
        let port = check(&fwd.1).sport;
        // The reply on the uplink: reverse-translated right there.
        let reply = run_prog(
            &mut dp,
            "uplink_ingress",
            &udp4(SERVER, EIP, 53, port, b"back"),
        )?;
        Ok((fwd, reply, port))
    })?;
    assert_eq!(fwd.0, TC_ACT_REDIRECT);
    assert_eq!(
        &fwd.1[0..6],
        &[2, 0, 0, 0, 0x0e, 0x10],
        "next hop MAC: out by the FIB"
    );
    let s = check(&fwd.1);
    assert_eq!((s.src, s.ttl), (IpAddr::from(EIP), 63));
    assert!(in_block(port, BLOCK));
    assert_eq!(reply.0, TC_ACT_REDIRECT, "delivered to the pod");
    let r = check(&reply.1);
    assert_eq!((r.dst, r.dport), (IpAddr::from(POD), 5353));
    Ok(())
}
