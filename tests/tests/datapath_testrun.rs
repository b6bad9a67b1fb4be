//! Every datapath program run on crafted packets with BPF_PROG_TEST_RUN:
//! one test per path and per drop reason. Output bytes are parsed and their
//! checksums recomputed by etherparse, never by the code under test.
//!
//! Each test loads the embedded object with its own pin folder, so tests
//! run in parallel without sharing maps.

mod testrun;

use egress_common::steering::{SteerKey, SteerTarget};
use egress_tests::Netns;
use etherparse::icmpv4::DestUnreachableHeader;
use testrun::*;

// ---------- worker, pod to outside ----------

#[test]
#[ignore = "needs root: loads BPF programs"]
fn worker_snat_tcp_v4_first_packet_and_established_flow() -> anyhow::Result<()> {
    let mut fx = fixture()?;
    let (rc, out) = fx.run("worker_egress", &tcp4(POD, SERVER, 40000, 443, true))?;
    assert_eq!(rc, TC_ACT_REDIRECT, "redirected into the tunnel");
    let s = check(&out);
    assert_eq!(s.src, IpAddr::from(EIP));
    assert_eq!(s.dst, IpAddr::from(SERVER));
    assert!(in_block(s.sport, BLOCK), "port {} from the block", s.sport);
    assert_eq!(s.dport, 443);
    assert_eq!(
        mss_of(&out),
        Some(MTU - 40),
        "SYN MSS clamped to the tunnel"
    );

    // Established flow: the same translation, no new port.
    let (rc, out2) = fx.run("worker_egress", &tcp4(POD, SERVER, 40000, 443, false))?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    let s2 = check(&out2);
    assert_eq!((s2.src, s2.sport), (s.src, s.sport));
    // A second connection gets another port.
    let (_, out3) = fx.run("worker_egress", &tcp4(POD, SERVER, 40001, 443, true))?;
    let s3 = check(&out3);
    assert_ne!(s3.sport, s.sport);
    assert!(in_block(s3.sport, BLOCK));

    let per_policy = stats::read_policy_stats(fx.pins.path())?;
    assert_eq!(per_policy[&7].egress_packets, 3);
    let nat = stats::read_nat_use(fx.pins.path())?;
    assert_eq!(nat.len(), 1);
    assert_eq!(
        (nat[0].eip, nat[0].entries, nat[0].ports_in_use),
        (IpAddr::from(EIP), 2, 2)
    );
    assert_eq!(fx.all_drops(), 0);
    Ok(())
}

/// The outer headers of a frame the worker encapsulated itself, checked
/// (IPv4 header checksum by etherparse; DF, TTL 64, this node's and the
/// gateway's tunnel addresses; UDP to the VXLAN port, zero checksum, a
/// length that covers the rest; the VXLAN header with the VNI), and the
/// inner frame. (The outer MACs are the neighbour subsystem's to write.)
fn outer_vxlan(frame: &[u8], vni: u32, to: Ipv4Addr) -> Vec<u8> {
    let p = SlicedPacket::from_ethernet(frame).expect("outer frame parses");
    let Some(NetSlice::Ipv4(ip)) = &p.net else {
        panic!("outer not IPv4")
    };
    let h = ip.header().to_header();
    assert_eq!(
        h.header_checksum,
        h.calc_header_checksum(),
        "outer IPv4 checksum"
    );
    assert!(h.dont_fragment, "outer DF");
    assert_eq!(h.time_to_live, 64);
    assert_eq!(
        (Ipv4Addr::from(h.source), Ipv4Addr::from(h.destination)),
        (WORKER_TUNNEL, to)
    );
    assert_eq!(
        usize::from(h.total_len),
        frame.len() - 14,
        "outer IPv4 length"
    );
    let Some(TransportSlice::Udp(u)) = &p.transport else {
        panic!("outer not UDP")
    };
    assert_eq!(u.destination_port(), 4789);
    assert!(
        u.source_port() >= 0xc000,
        "source port from the entropy range"
    );
    assert_eq!(u.checksum(), 0, "zero outer UDP checksum");
    assert_eq!(usize::from(u.length()), frame.len() - 34, "UDP length");
    let vx = u.payload();
    let v = vni.to_be_bytes();
    assert_eq!(
        &vx[..8],
        &[0x08, 0, 0, 0, v[1], v[2], v[3], 0],
        "VXLAN header"
    );
    vx[8..].to_vec()
}

/// When the FIB has a route to the gateway's tunnel endpoint, the worker
/// writes the VXLAN headers itself and the packet leaves by the uplink
/// (the neighbour subsystem resolves the next hop); without one it hands
/// the packet to the VXLAN device. Both carry the same translated packet.
#[test]
#[ignore = "needs root: loads BPF programs in a network namespace"]
fn worker_encapsulates_itself_when_the_gateway_is_routable() -> anyhow::Result<()> {
    let ns = Netns::new("encap")?;
    ns.ip(&["link", "add", "up0", "type", "veth", "peer", "name", "up1"])?;
    ns.ip(&["link", "set", "up1", "up"])?;
    ns.ip(&["link", "set", "up0", "up"])?;
    ns.enable_forwarding()?;
    let uplink: serde_json::Value =
        serde_json::from_str(&ns.ip(&["-j", "link", "show", "dev", "up0"])?)?;
    let uplink_ifindex = uplink[0]["ifindex"].as_u64().unwrap() as u32;
    let name = ns.name().to_string();
    ns.enter(move || {
        let mut d = desired();
        d.config.uplink_ifindex = uplink_ifindex;
        // Replies to the EIP go to another worker on this underlay.
        let other_worker = Ipv4Addr::new(10, 100, 0, 31);
        d.reply_steering[0].worker_tunnel_ip = other_worker;
        let mut fx = fixture_with(&d)?;
        let pkt = udp4(POD, SERVER, 5353, 53, b"q");

        // No route to the gateway's tunnel endpoint: the device's way.
        let (rc, out) = fx.run("worker_egress", &pkt)?;
        assert_eq!(rc, TC_ACT_REDIRECT);
        let plain = check(&out);
        assert_eq!(plain.src, IpAddr::from(EIP));

        // The underlay is routable (no neighbour entry needed): the same
        // translation, in our own headers.
        let cidr = format!("{WORKER_TUNNEL}/24");
        let st = std::process::Command::new("ip")
            .args(["-n", &name, "addr", "add", &cidr, "dev", "up0"])
            .status()?;
        anyhow::ensure!(st.success(), "ip addr add");
        let (rc, out) = fx.run("worker_egress", &pkt)?;
        assert_eq!(rc, TC_ACT_REDIRECT);
        let inner = outer_vxlan(&out, d.config.vni, GW_TUNNEL);
        assert_eq!(check(&inner), plain, "the same translated packet inside");
        assert_eq!(&inner[..12], &pkt[..12], "the pod's own MACs inside");

        // An IPv4 packet without DF that does not fit the tunnel: the device
        // (which fragments the outer packet; ours carry DF).
        let mut big = udp4(POD, SERVER, 5353, 53, &[0xab; 1500 - 20 - 8]);
        big[14 + 6] &= !0x40;
        let ip = etherparse::Ipv4HeaderSlice::from_slice(&big[14..])?.to_header();
        big[14 + 10..14 + 12].copy_from_slice(&ip.calc_header_checksum().to_be_bytes());
        let (rc, out) = fx.run("worker_egress", &big)?;
        assert_eq!(rc, TC_ACT_REDIRECT);
        assert_eq!(out.len(), big.len(), "no outer header: the device's way");
        assert_eq!(check(&out).src, IpAddr::from(EIP));

        // An IPv6 pod's packet over the IPv4 underlay.
        let (rc, out) = fx.run("worker_egress", &udp6(POD6, SERVER6, 5353, 53, b"q"))?;
        assert_eq!(rc, TC_ACT_REDIRECT);
        let s6 = check(&outer_vxlan(&out, d.config.vni, GW_TUNNEL));
        assert_eq!(
            (s6.src, s6.dst),
            (IpAddr::from(EIP6), IpAddr::from(SERVER6))
        );

        // The server's replies at the gateway, steered to the other worker
        // in our own headers: the first by the full path, which caches the
        // steering; then, with the steering entry gone behind the cache's
        // back, the next from its headers alone. The same bytes both times:
        // one outer source port per flow, whichever path its packets take
        // (the underlay's ECMP keeps the flow on one path, in order).
        let reply = udp4(SERVER, EIP, 53, plain.sport, b"a");
        let (rc, full) = fx.run("uplink_ingress", &reply)?;
        assert_eq!(rc, TC_ACT_REDIRECT);
        assert_eq!(outer_vxlan(&full, d.config.vni, other_worker), reply);
        {
            let mut m: aya::maps::HashMap<_, SteerKey, SteerTarget> =
                aya::maps::HashMap::try_from(fx.dp.ebpf.map_mut("REPLY_STEERING").unwrap())?;
            let keys: Vec<_> = m.keys().collect::<Result<_, _>>()?;
            for k in keys {
                m.remove(&k)?;
            }
        }
        let (rc, cached) = fx.run("uplink_ingress", &reply)?;
        assert_eq!(rc, TC_ACT_REDIRECT, "steered by the cache");
        assert_eq!(cached, full, "the same outer headers from the cache");
        assert_eq!(fx.all_drops(), 0);
        Ok(())
    })
}

/// A CONFIG map pinned by an older object with another layout is replaced
/// when the datapath loads (a reused one would not fit the programs).
#[test]
#[ignore = "needs root: loads BPF programs"]
fn a_config_pinned_with_another_layout_is_replaced_on_load() -> anyhow::Result<()> {
    let pins = PinDir::new("cfgpin")?;
    let path = pins.path().join("CONFIG");
    let path_s = path.to_str().unwrap();
    std::fs::create_dir_all(pins.path())?;
    egress_tests::run(&[
        "bpftool", "map", "create", path_s, "type", "array", "key", "4", "value", "56", "entries",
        "1", "name", "CONFIG",
    ])?;
    let mut dp = Datapath::load(EBPF_OBJECT, pins.path())?;
    apply(&mut dp, &desired())?;
    let size = aya::maps::MapData::from_pin(&path)?.info()?.value_size();
    assert_eq!(
        size as usize,
        std::mem::size_of::<egress_common::config::DatapathConfig>()
    );
    Ok(())
}

/// The tunnel endpoint the forward NAT entries send to (all of them).
fn nat_gateways(fx: &Fixture) -> Vec<Ipv4Addr> {
    use egress_common::nat::{NatEntry, NatKey};
    let data = aya::maps::MapData::from_pin(fx.pins.path().join("NAT_FWD")).unwrap();
    let m: aya::maps::HashMap<_, NatKey, NatEntry> =
        aya::maps::HashMap::try_from(aya::maps::Map::LruHashMap(data)).unwrap();
    m.iter()
        .map(|r| Ipv4Addr::from(r.unwrap().1.ifindex.to_ne_bytes()))
        .collect()
}

#[test]
#[ignore = "needs root: loads BPF programs"]
fn a_bgp_route_for_the_eip_sends_flows_to_its_node() -> anyhow::Result<()> {
    use egress_user::datapath::EipRoute;
    const OTHER_GW: Ipv4Addr = Ipv4Addr::new(10, 100, 0, 12);
    let mut d = desired();
    let mut fx = fixture_with(&d)?;
    let syn = tcp4(POD, SERVER, 40000, 443, true);
    let (rc, out) = fx.run("worker_egress", &syn)?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    let port = check(&out).sport;
    assert_eq!(
        nat_gateways(&fx),
        [GW_TUNNEL],
        "no route: the slot's gateway"
    );

    // BGP learned that the EIP's owner moved: the established flow follows
    // on its next packet, keeping its port.
    d.routes = vec![EipRoute {
        eip: EIP.into(),
        tunnel_ip: OTHER_GW,
        epoch: 2,
    }];
    apply(&mut fx.dp, &d)?;
    let (rc, out) = fx.run("worker_egress", &tcp4(POD, SERVER, 40000, 443, false))?;
    assert_eq!((rc, check(&out).sport), (TC_ACT_REDIRECT, port));
    assert_eq!(nat_gateways(&fx), [OTHER_GW]);

    // A route naming this node itself is not a tunnel destination.
    d.routes[0].tunnel_ip = WORKER_TUNNEL;
    apply(&mut fx.dp, &d)?;
    let (rc, _) = fx.run("worker_egress", &tcp4(POD, SERVER, 40000, 443, false))?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    assert_eq!(nat_gateways(&fx), [GW_TUNNEL]);
    assert_eq!(fx.all_drops(), 0);
    Ok(())
}

#[test]
#[ignore = "needs root: loads BPF programs"]
fn worker_snat_udp_v4_with_and_without_checksum() -> anyhow::Result<()> {
    let mut fx = fixture()?;
    let (rc, out) = fx.run("worker_egress", &udp4(POD, SERVER, 5353, 53, b"query"))?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    let s = check(&out);
    assert_eq!(s.src, IpAddr::from(EIP));
    assert!(in_block(s.sport, BLOCK));

    let mut zero = udp4(POD, SERVER, 5354, 53, b"query");
    let udp_csum = 14 + 20 + 6;
    zero[udp_csum] = 0;
    zero[udp_csum + 1] = 0;
    let (rc, out) = fx.run("worker_egress", &zero)?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    assert_eq!(
        &out[udp_csum..udp_csum + 2],
        &[0, 0],
        "a zero IPv4 UDP checksum stays zero"
    );
    let s = check(&out);
    assert_eq!(s.src, IpAddr::from(EIP));
    Ok(())
}

#[test]
#[ignore = "needs root: loads BPF programs"]
fn worker_snat_icmp_echo_v4_uses_identifier_as_port() -> anyhow::Result<()> {
    let mut fx = fixture()?;
    let (rc, out) = fx.run("worker_egress", &icmp4_echo(POD, SERVER, 77, false))?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    let s = check(&out);
    assert_eq!(s.src, IpAddr::from(EIP));
    assert!(
        in_block(s.sport, BLOCK),
        "identifier {} from the block",
        s.sport
    );
    Ok(())
}

#[test]
#[ignore = "needs root: loads BPF programs"]
fn worker_snat_v6_tcp_udp_icmpv6() -> anyhow::Result<()> {
    let mut fx = fixture()?;
    let (rc, out) = fx.run("worker_egress", &tcp6(POD6, SERVER6, 40000, 443))?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    let s = check(&out);
    assert_eq!(s.src, IpAddr::from(EIP6));
    assert!(in_block(s.sport, BLOCK6));
    assert_eq!(mss_of(&out), Some(MTU - 60), "IPv6 SYN MSS clamped");

    let (rc, out) = fx.run("worker_egress", &udp6(POD6, SERVER6, 5353, 53, b"q6"))?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    let s = check(&out);
    assert_eq!(s.src, IpAddr::from(EIP6));

    let (rc, out) = fx.run("worker_egress", &icmp6_echo(POD6, SERVER6, 99, false))?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    let s = check(&out);
    assert_eq!(s.src, IpAddr::from(EIP6));
    assert!(in_block(s.sport, BLOCK6));
    Ok(())
}

#[test]
#[ignore = "needs root: loads BPF programs"]
fn worker_passes_non_policy_excluded_and_cluster_traffic_untouched() -> anyhow::Result<()> {
    let mut fx = fixture()?;
    for (i, pkt) in [
        tcp4(POD_OTHER, SERVER, 40000, 443, true),
        tcp4(POD, EXCLUDED_DST, 40000, 443, true),
        tcp4(POD, CLUSTER_DST, 40000, 443, true),
        udp6(
            POD6,
            Ipv6Addr::new(0xfd00, 0x244, 2, 0, 0, 0, 0, 1),
            1,
            2,
            b"x",
        ),
    ]
    .iter()
    .enumerate()
    {
        let (rc, out) = fx.run("worker_egress", pkt)?;
        assert_eq!(rc, TC_ACT_OK, "packet {i}");
        assert_eq!(&out, pkt, "packet {i}: bytes untouched");
    }
    assert_eq!(stats::read_nat_use(fx.pins.path())?.len(), 0);
    Ok(())
}

// ---------- worker drops ----------

#[test]
#[ignore = "needs root: loads BPF programs"]
fn drop_no_port_block() -> anyhow::Result<()> {
    let mut fx = fixture()?;
    // Policy 8 wins for 192.0.2.0/24 and its EIP has no block here.
    let (rc, _) = fx.run(
        "worker_egress",
        &udp4(POD, Ipv4Addr::new(192, 0, 2, 1), 1, 2, b"x"),
    )?;
    assert_eq!(rc, TC_ACT_SHOT);
    assert_eq!(fx.drops(DROP_NO_PORT_BLOCK), 1);
    Ok(())
}

#[test]
#[ignore = "needs root: loads BPF programs"]
fn too_big_non_tcp_with_df_gets_icmp_back_to_the_pod() -> anyhow::Result<()> {
    let mut fx = fixture()?;
    let big = vec![0xab; 1500 - 20 - 8];
    let (rc, out) = fx.run_sum_unused("worker_egress", &udp4(POD, SERVER, 5353, 53, &big))?;
    assert_eq!(
        rc, TC_ACT_REDIRECT,
        "the error goes back out of the pod's veth"
    );
    assert_eq!(fx.drops(DROP_TOO_BIG), 1, "counted under too_big");
    assert_eq!(&out[0..6], &POD_MAC, "addressed to the pod");
    let s = check(&out); // IPv4 and ICMP checksums by etherparse
    assert_eq!((s.src, s.dst), (IpAddr::from(SERVER), IpAddr::from(POD)));
    let p = SlicedPacket::from_ethernet(&out)?;
    let Some(TransportSlice::Icmpv4(i)) = p.transport else {
        panic!("not ICMP")
    };
    assert_eq!(
        i.icmp_type(),
        Icmpv4Type::DestinationUnreachable(DestUnreachableHeader::FragmentationNeeded {
            next_hop_mtu: MTU
        })
    );
    // The quote starts with the pod's own packet.
    let q = etherparse::Ipv4HeaderSlice::from_slice(i.payload())?;
    assert_eq!(
        (q.source(), q.destination()),
        (POD.octets(), SERVER.octets())
    );

    let big6 = vec![0xcd; 1500 - 40 - 8];
    let (rc, out) = fx.run_sum_unused("worker_egress", &udp6(POD6, SERVER6, 5353, 53, &big6))?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    let s = check(&out); // ICMPv6 checksum by etherparse
    assert_eq!((s.src, s.dst), (IpAddr::from(SERVER6), IpAddr::from(POD6)));
    let p = SlicedPacket::from_ethernet(&out)?;
    let Some(TransportSlice::Icmpv6(i)) = p.transport else {
        panic!("not ICMPv6")
    };
    assert_eq!(
        i.icmp_type(),
        Icmpv6Type::PacketTooBig {
            mtu: u32::from(MTU)
        }
    );
    assert_eq!(fx.drops(DROP_TOO_BIG), 2);
    // TCP of the same size is not answered: its MSS is clamped instead.
    Ok(())
}

/// One port per block and one block (port 50000), UDP entries idle after
/// `udp_timeout` seconds.
fn one_port(udp_timeout: u32) -> anyhow::Result<Fixture> {
    let mut d = desired();
    d.config.port_block_size = 1;
    d.port_blocks[0].blocks = vec![50000];
    d.config.timeouts.udp = udp_timeout;
    fixture_with(&d)
}

#[test]
#[ignore = "needs root: loads BPF programs"]
fn drop_ports_exhausted() -> anyhow::Result<()> {
    // A second flow to the same server and port finds no free port.
    let mut fx = one_port(NatTimeouts::default().udp)?;
    let (rc, out) = fx.run("worker_egress", &udp4(POD, SERVER, 1000, 53, b"a"))?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    assert_eq!(check(&out).sport, 50000);
    let (rc, _) = fx.run("worker_egress", &udp4(POD, SERVER, 1001, 53, b"b"))?;
    assert_eq!(rc, TC_ACT_SHOT);
    assert_eq!(fx.drops(DROP_PORTS_EXHAUSTED), 1);
    // Another destination port may reuse the same EIP port.
    let (rc, out) = fx.run("worker_egress", &udp4(POD, SERVER, 1001, 54, b"c"))?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    assert_eq!(check(&out).sport, 50000);
    Ok(())
}

#[test]
#[ignore = "needs root: loads BPF programs"]
fn an_idle_translation_past_its_protocol_timeout_frees_its_port() -> anyhow::Result<()> {
    // UDP entries expire at once.
    let mut fx = one_port(0)?;
    let (rc, out) = fx.run("worker_egress", &udp4(POD, SERVER, 1000, 53, b"a"))?;
    assert_eq!((rc, check(&out).sport), (TC_ACT_REDIRECT, 50000));
    let (rc, out) = fx.run("worker_egress", &udp4(POD, SERVER, 1001, 53, b"b"))?;
    assert_eq!(rc, TC_ACT_REDIRECT, "the idle flow's port is taken over");
    assert_eq!(check(&out).sport, 50000);
    assert_eq!(fx.drops(DROP_PORTS_EXHAUSTED), 0);
    // The reply now belongs to the new flow.
    let (rc, out) = fx.run("tunnel_ingress", &udp4(SERVER, EIP, 53, 50000, b"r"))?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    assert_eq!(check(&out).dport, 1001);
    // TCP keeps its own (long) timeout: a second TCP flow finds no port.
    let (rc, _) = fx.run("worker_egress", &tcp4(POD, SERVER, 2000, 53, true))?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    let (rc, _) = fx.run("worker_egress", &tcp4(POD, SERVER, 2001, 53, true))?;
    assert_eq!(rc, TC_ACT_SHOT);
    assert_eq!(fx.drops(DROP_PORTS_EXHAUSTED), 1);
    Ok(())
}

/// The NAT's clock moves (the programs read the coarse clock once per tick
/// and CPU, `clock::coarse_ns`): a UDP translation idle for its 1 s
/// timeout gives its port up; before, the port is still taken.
#[test]
#[ignore = "needs root: loads BPF programs"]
fn a_translation_frees_its_port_once_idle_for_its_timeout() -> anyhow::Result<()> {
    let mut fx = one_port(1)?;
    let (rc, out) = fx.run("worker_egress", &udp4(POD, SERVER, 1000, 53, b"a"))?;
    assert_eq!((rc, check(&out).sport), (TC_ACT_REDIRECT, 50000));
    let (rc, _) = fx.run("worker_egress", &udp4(POD, SERVER, 1001, 53, b"b"))?;
    assert_eq!(rc, TC_ACT_SHOT, "still in use");
    assert_eq!(fx.drops(DROP_PORTS_EXHAUSTED), 1);
    // The timeout itself is what is tested: wait it out (plus a tick).
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let (rc, out) = fx.run("worker_egress", &udp4(POD, SERVER, 1001, 53, b"b"))?;
    assert_eq!(rc, TC_ACT_REDIRECT, "the idle flow's port is taken over");
    assert_eq!(check(&out).sport, 50000);
    Ok(())
}

// ---------- worker, replies ----------

/// Sends a flow out and returns the EIP port it got.
fn open_flow(fx: &mut Fixture, pkt: &[u8]) -> u16 {
    let (rc, out) = fx.run("worker_egress", pkt).unwrap();
    assert_eq!(rc, TC_ACT_REDIRECT);
    check(&out).sport
}

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

// ---------- gateway ----------

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
fn arp_request(tpa: Ipv4Addr) -> Vec<u8> {
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

#[test]
#[ignore = "needs root: creates a namespace and loads BPF programs"]
fn gateway_forwards_decapsulated_packets_by_the_fib() -> anyhow::Result<()> {
    // A namespace with an on-link route and a permanent neighbour for the
    // server, so the FIB lookup succeeds with known MACs.
    let ns = Netns::new("fib")?;
    ns.ip(&["link", "add", "up0", "type", "veth", "peer", "name", "up1"])?;
    ns.ip(&["link", "set", "up1", "up"])?;
    ns.ip(&["link", "set", "up0", "address", "02:00:00:00:0e:01"])?;
    ns.addr("up0", "203.0.113.1/24")?;
    ns.addr("up0", "2001:db8:e::1/64")?;
    ns.ip(&[
        "neigh",
        "add",
        "203.0.113.10",
        "lladdr",
        "02:00:00:00:0e:10",
        "dev",
        "up0",
        "nud",
        "permanent",
    ])?;
    ns.ip(&[
        "-6",
        "neigh",
        "add",
        "2001:db8:e::10",
        "lladdr",
        "02:00:00:00:0e:10",
        "dev",
        "up0",
        "nud",
        "permanent",
    ])?;
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
    let ns = Netns::new("local")?;
    ns.ip(&["link", "add", "up0", "type", "veth", "peer", "name", "up1"])?;
    ns.ip(&["link", "set", "up1", "up"])?;
    ns.ip(&["link", "set", "up0", "address", "02:00:00:00:0e:01"])?;
    ns.addr("up0", "203.0.113.1/24")?;
    ns.ip(&[
        "neigh",
        "add",
        "203.0.113.10",
        "lladdr",
        "02:00:00:00:0e:10",
        "dev",
        "up0",
        "nud",
        "permanent",
    ])?;
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

// ---------- userspace apply ----------

#[test]
#[ignore = "needs root: loads BPF programs"]
fn apply_writes_only_the_difference() -> anyhow::Result<()> {
    let mut fx = fixture()?;
    // The same desired state again: nothing is written or removed.
    let again = apply(&mut fx.dp, &desired())?;
    assert_eq!(
        (again.total_written(), again.total_removed()),
        (0, 0),
        "{again:?}"
    );
    // An established flow keeps working across a resync that changes nothing.
    let p = open_flow(&mut fx, &udp4(POD, SERVER, 5353, 53, b"q"));
    // One more owned EIP and one steering entry fewer: exactly those change.
    let mut d = desired();
    d.owned_eips.push(OwnedEip {
        eip: Ipv4Addr::new(198, 51, 100, 77).into(),
        answer_neigh: true,
        node_ip: false,
        epoch: 3,
    });
    d.reply_steering.pop();
    let r = apply(&mut fx.dp, &d)?;
    assert_eq!(r.written[egress_common::maps::OWNED_EIPS], 1, "{r:?}");
    assert_eq!(r.removed[egress_common::maps::REPLY_STEERING], 1, "{r:?}");
    // ... and the config, for its new gateway epoch (the gateway caches).
    assert_eq!(r.written[egress_common::maps::CONFIG], 1, "{r:?}");
    assert_eq!((r.total_written(), r.total_removed()), (2, 1), "{r:?}");
    let (rc, out) = fx.run("tunnel_ingress", &udp4(SERVER, EIP, 53, p, b"a"))?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    assert_eq!(check(&out).dport, 5353);
    // A policy change rewrites the tables it touches and bumps the epoch.
    let mut d2 = d.clone();
    d2.policies[0].excluded.push(cidr("203.0.113.0/28"));
    let r = apply(&mut fx.dp, &d2)?;
    assert!(r.written[egress_common::maps::POLICY_DST] >= 1, "{r:?}");
    assert_eq!(
        r.written[egress_common::maps::CONFIG],
        1,
        "new policy epoch: {r:?}"
    );
    assert_eq!(r.written[egress_common::maps::PORT_BLOCKS], 0, "{r:?}");
    // The established flow now goes to an excluded destination: normal path.
    let pkt = udp4(POD, SERVER, 5353, 53, b"q");
    let (rc, out) = fx.run("worker_egress", &pkt)?;
    assert_eq!(
        (rc, out),
        (TC_ACT_OK, pkt),
        "an old NAT entry does not outlive the policy"
    );
    Ok(())
}

#[test]
#[ignore = "needs root: loads BPF programs"]
fn no_gateway_policies_fail_closed() -> anyhow::Result<()> {
    // Policy 9 (highest precedence) has no EIP and no gateway yet: what it
    // matches is dropped and counted, never sent out with the pod's address.
    let mut d = desired();
    d.policies.push(PolicyRule {
        id: 9,
        priority: 1,
        sources: vec![Cidr::host(POD.into()), Cidr::host(POD6.into())],
        destinations: vec![cidr("198.18.0.0/15"), cidr("2001:db8:f::/48")],
        excluded: vec![],
        eip_v4: None,
        eip_v6: None,
        gateway_tunnel_ip: Ipv4Addr::UNSPECIFIED,
        local_gateway: false,
        use_node_ip: false,
        no_gateway: true,
    });
    let mut fx = fixture_with(&d)?;
    let pending4 = Ipv4Addr::new(198, 18, 0, 1);
    let pending6 = Ipv6Addr::new(0x2001, 0xdb8, 0xf, 0, 0, 0, 0, 1);
    let (rc, _) = fx.run("worker_egress", &udp4(POD, pending4, 5000, 53, b"q"))?;
    assert_eq!(rc, TC_ACT_SHOT, "IPv4 to the pending policy's destination");
    let (rc, _) = fx.run("worker_egress", &tcp6(POD6, pending6, 5001, 443))?;
    assert_eq!(rc, TC_ACT_SHOT, "IPv6 too, whatever the family");
    assert_eq!(fx.drops(DROP_NO_GATEWAY), 2);
    assert_eq!(fx.all_drops(), 2, "counted under no_gateway only");
    assert_eq!(
        stats::read_drops(fx.pins.path())?[DROP_NO_GATEWAY as usize].0,
        "no_gateway"
    );
    // Pods it does not select and destinations it does not cover are untouched.
    let (rc, out) = fx.run("worker_egress", &udp4(POD_OTHER, pending4, 5000, 53, b"q"))?;
    assert_eq!(rc, TC_ACT_OK);
    assert_eq!(check(&out).src, IpAddr::from(POD_OTHER));
    let (rc, out) = fx.run("worker_egress", &udp4(POD, SERVER, 5002, 53, b"q"))?;
    assert_eq!(rc, TC_ACT_REDIRECT, "policy 7 still applies");
    assert_eq!(check(&out).src, IpAddr::from(EIP));

    // An established flow whose policy loses its gateway (its endpoint is
    // gone): the next packet is dropped, not sent untranslated, even though
    // its NAT entry is still there; it is translated again once the gateway is back.
    let flow = udp4(POD, SERVER, 5003, 53, b"e");
    let (rc, out) = fx.run("worker_egress", &flow)?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    let port = check(&out).sport;
    let mut lost = d.clone();
    let p7 = lost.policies.iter_mut().find(|p| p.id == 7).unwrap();
    p7.no_gateway = true;
    p7.eip_v4 = None;
    p7.eip_v6 = None;
    apply(&mut fx.dp, &lost)?;
    let (rc, _) = fx.run("worker_egress", &flow)?;
    assert_eq!(rc, TC_ACT_SHOT);
    assert_eq!(fx.drops(DROP_NO_GATEWAY), 3);
    apply(&mut fx.dp, &d)?;
    let (rc, out) = fx.run("worker_egress", &flow)?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    let s = check(&out);
    assert_eq!(
        (s.src, s.sport),
        (IpAddr::from(EIP), port),
        "same translation"
    );
    Ok(())
}
