//! Worker, pod to outside.

use crate::testrun::*;
use egress_common::steering::{SteerKey, SteerTarget};
use egress_tests::Netns;

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
pub(crate) fn outer_vxlan(frame: &[u8], vni: u32, to: Ipv4Addr) -> Vec<u8> {
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
        d.reply_steering[0].worker_tunnel_ip = other_worker.into();
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

/// `--nat-table-size` sizes the NAT tables the agent creates; a table
/// pinned with another size is kept with its flows (replacing it would
/// break every connection of the node), not resized.
#[test]
#[ignore = "needs root: loads BPF programs"]
fn the_nat_table_size_is_a_setting_and_a_pinned_table_keeps_its_flows() -> anyhow::Result<()> {
    use egress_common::maps::{NAT_FWD, NAT_REV};
    use egress_user::datapath::{loader::pinned_capacity, MapSizes};
    let pins = PinDir::new("natsize")?;
    let small = MapSizes { nat_entries: 2048 };
    let mut dp = Datapath::load_with(EBPF_OBJECT, pins.path(), small)?;
    apply(&mut dp, &desired())?;
    for map in [NAT_FWD, NAT_REV] {
        assert_eq!(pinned_capacity(pins.path(), map), Some(2048), "{map}");
    }
    let (rc, _) = run_prog(&mut dp, "worker_egress", &udp4(POD, SERVER, 5353, 53, b"q"))?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    drop(dp);
    let bigger = MapSizes { nat_entries: 8192 };
    let dp = Datapath::load_with(EBPF_OBJECT, pins.path(), bigger)?;
    assert_eq!(pinned_capacity(pins.path(), NAT_REV), Some(2048), "kept");
    let uses = stats::read_nat_use(pins.path())?;
    assert_eq!(
        uses.iter().map(|u| u.entries).sum::<u64>(),
        1,
        "its flow is still there"
    );
    drop(dp);
    Ok(())
}

/// Every translation made is counted, and a TCP segment other than a SYN
/// that finds none (its entry evicted from a full table, or its connection
/// older than its policy) is counted apart: the server will reset it.
#[test]
#[ignore = "needs root: loads BPF programs"]
fn new_translations_and_tcp_segments_that_found_none_are_counted() -> anyhow::Result<()> {
    let mut fx = fixture()?;
    let events = |fx: &Fixture| -> Vec<u64> {
        stats::read_nat_events(fx.pins.path())
            .unwrap()
            .iter()
            .map(|(_, c)| c.packets)
            .collect()
    };
    let (rc, _) = fx.run("worker_egress", &tcp4(POD, SERVER, 40000, 443, true))?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    let (rc, _) = fx.run("worker_egress", &tcp4(POD, SERVER, 40000, 443, false))?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    assert_eq!(
        events(&fx),
        [1, 0],
        "a SYN made one translation, its ACK reused it"
    );
    // An ACK of a connection with no entry.
    let (rc, _) = fx.run("worker_egress", &tcp4(POD, SERVER, 40001, 443, false))?;
    assert_eq!(
        rc, TC_ACT_REDIRECT,
        "still translated, so the server's reset reaches the pod"
    );
    assert_eq!(events(&fx), [2, 1]);
    let (rc, _) = fx.run("worker_egress", &udp4(POD, SERVER, 5353, 53, b"q"))?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    assert_eq!(events(&fx), [3, 1]);
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
        tunnel_ip: OTHER_GW.into(),
        epoch: 2,
    }];
    apply(&mut fx.dp, &d)?;
    let (rc, out) = fx.run("worker_egress", &tcp4(POD, SERVER, 40000, 443, false))?;
    assert_eq!((rc, check(&out).sport), (TC_ACT_REDIRECT, port));
    assert_eq!(nat_gateways(&fx), [OTHER_GW]);

    // A route naming this node itself is not a tunnel destination.
    d.routes[0].tunnel_ip = WORKER_TUNNEL.into();
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
