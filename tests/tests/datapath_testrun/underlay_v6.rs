//! The tunnel over an IPv6 underlay: the worker's and the gateway's own
//! outer IPv6 headers (checked by etherparse), the device's way when the
//! FIB has no route, the endpoint table and its indexes over a restart.

use crate::testrun::*;
use egress_common::endpoints::{index_of, TunnelEndpoint};
use egress_tests::Netns;

pub(crate) const WORKER6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x100, 0, 0, 0, 0, 0, 0x21);
const GW6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x100, 0, 0, 0, 0, 0, 0x11);
pub(crate) const OTHER_WORKER6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x100, 0, 0, 0, 0, 0, 0x31);
/// 1500 less the 70 bytes of outer IPv6, UDP, VXLAN and inner Ethernet.
const MTU6: u16 = 1430;

/// The shared set-up with every tunnel endpoint on the IPv6 underlay;
/// replies to the IPv4 EIP go to another worker.
pub(crate) fn desired_v6(uplink_ifindex: u32) -> DesiredMaps {
    let mut d = desired();
    d.config.node_tunnel_ip = WORKER6.into();
    d.config.tunnel_mtu = MTU6;
    d.config.uplink_ifindex = uplink_ifindex;
    for p in &mut d.policies {
        p.gateway_tunnel_ip = GW6.into();
    }
    d.reply_steering[0].worker_tunnel_ip = OTHER_WORKER6.into();
    d.reply_steering[1].worker_tunnel_ip = WORKER6.into();
    d
}

/// The outer headers of a frame encapsulated over IPv6, checked: version,
/// UDP next header, hop limit 64, this node's and `to`'s addresses, a
/// payload length that covers the rest; UDP to the VXLAN port with a zero
/// checksum (RFC 6935) and the right length; the VXLAN header. Returns the
/// inner frame and the flow label.
pub(crate) fn outer_vxlan6(frame: &[u8], vni: u32, to: Ipv6Addr) -> (Vec<u8>, u32) {
    assert_eq!(&frame[12..14], &[0x86, 0xdd], "outer EtherType IPv6");
    let p = SlicedPacket::from_ethernet(frame).expect("outer frame parses");
    let Some(NetSlice::Ipv6(ip)) = &p.net else {
        panic!("outer not IPv6")
    };
    let h = ip.header().to_header();
    assert_eq!(h.next_header, etherparse::IpNumber::UDP);
    assert_eq!(h.hop_limit, 64);
    assert_eq!(
        (Ipv6Addr::from(h.source), Ipv6Addr::from(h.destination)),
        (WORKER6, to)
    );
    assert_eq!(usize::from(h.payload_length), frame.len() - 14 - 40);
    let Some(TransportSlice::Udp(u)) = &p.transport else {
        panic!("outer not UDP")
    };
    assert_eq!(u.destination_port(), 4789);
    assert!(
        u.source_port() >= 0xc000,
        "source port from the entropy range"
    );
    assert_eq!(u.checksum(), 0, "zero outer UDP checksum");
    assert_eq!(usize::from(u.length()), frame.len() - 14 - 40);
    let v = vni.to_be_bytes();
    assert_eq!(&u.payload()[..8], &[0x08, 0, 0, 0, v[1], v[2], v[3], 0]);
    (u.payload()[8..].to_vec(), h.flow_label.value())
}

/// A namespace whose `up0` has this node's IPv6 tunnel address (so the FIB
/// routes the other endpoints, on-link); its ifindex.
pub(crate) fn v6_underlay(ns: &Netns) -> anyhow::Result<u32> {
    ns.ip(&["link", "add", "up0", "type", "veth", "peer", "name", "up1"])?;
    ns.ip(&["link", "set", "up1", "up"])?;
    ns.ip(&["link", "set", "up0", "up"])?;
    ns.enable_forwarding()?;
    let cidr = format!("{WORKER6}/64");
    ns.ip(&["-6", "addr", "add", &cidr, "dev", "up0", "nodad"])?;
    let link: serde_json::Value =
        serde_json::from_str(&ns.ip(&["-j", "link", "show", "dev", "up0"])?)?;
    Ok(link[0]["ifindex"].as_u64().unwrap() as u32)
}

#[test]
#[ignore = "needs root: loads BPF programs in a network namespace"]
fn the_worker_and_the_gateway_write_ipv6_outer_headers() -> anyhow::Result<()> {
    let ns = Netns::new("u6")?;
    let uplink = v6_underlay(&ns)?;
    ns.enter(move || {
        let d = desired_v6(uplink);
        let mut fx = fixture_with(&d)?;

        // IPv4 and IPv6 pods' packets, in IPv6 outer headers to the gateway.
        let (rc, out) = fx.run("worker_egress", &tcp4(POD, SERVER, 40000, 443, true))?;
        assert_eq!(rc, TC_ACT_REDIRECT);
        let (inner, label) = outer_vxlan6(&out, d.config.vni, GW6);
        let s = check(&inner);
        assert_eq!((s.src, s.dst), (IpAddr::from(EIP), IpAddr::from(SERVER)));
        assert_eq!(
            mss_of(&inner),
            Some(MTU6 - 40),
            "MSS clamped to the IPv6 tunnel"
        );
        let (rc, again) = fx.run("worker_egress", &tcp4(POD, SERVER, 40000, 443, false))?;
        assert_eq!(rc, TC_ACT_REDIRECT);
        let (_, label_again) = outer_vxlan6(&again, d.config.vni, GW6);
        assert_eq!(label_again, label, "one flow label per flow");
        let (rc, out6) = fx.run("worker_egress", &udp6(POD6, SERVER6, 5353, 53, b"q"))?;
        assert_eq!(rc, TC_ACT_REDIRECT);
        let s6 = check(&outer_vxlan6(&out6, d.config.vni, GW6).0);
        assert_eq!(s6.src, IpAddr::from(EIP6));

        // The gateway steers the reply to the worker that holds the block.
        let reply = tcp4(SERVER, EIP, 443, s.sport, false);
        let (rc, steered) = fx.run("uplink_ingress", &reply)?;
        assert_eq!(rc, TC_ACT_REDIRECT);
        assert_eq!(outer_vxlan6(&steered, d.config.vni, OTHER_WORKER6).0, reply);
        assert_eq!(fx.all_drops(), 0);
        Ok(())
    })
}

#[test]
#[ignore = "needs root: loads BPF programs in a network namespace"]
fn without_a_route_the_device_encapsulates_and_without_an_address_nothing_leaves(
) -> anyhow::Result<()> {
    let ns = Netns::new("u6dev")?;
    ns.enter(|| {
        // No address, no route: the FIB knows no way to the gateway.
        let mut fx = fixture_with(&desired_v6(1))?;
        let pkt = udp4(POD, SERVER, 5353, 53, b"q");
        let (rc, out) = fx.run("worker_egress", &pkt)?;
        assert_eq!(
            rc, TC_ACT_REDIRECT,
            "to the VXLAN device, with an IPv6 tunnel key"
        );
        assert_eq!(out.len(), pkt.len(), "no outer headers of our own");
        assert_eq!(check(&out).src, IpAddr::from(EIP));

        // The gateway's index names no address (cleared behind the
        // agent's back): the packet is dropped, counted, never sent raw.
        let gw = index_of(fx.target_gateway(0));
        let mut m: aya::maps::Array<_, TunnelEndpoint> =
            aya::maps::Array::try_from(fx.dp.ebpf.map_mut("TUNNEL_ENDPOINTS").unwrap())?;
        m.set(gw, TunnelEndpoint::default(), 0)?;
        let (rc, _) = fx.run("worker_egress", &udp4(POD, SERVER, 5354, 53, b"q"))?;
        assert_eq!(rc, TC_ACT_SHOT);
        assert_eq!(fx.drops(DROP_NO_TUNNEL_ENDPOINT), 1);
        Ok(())
    })
}

#[test]
#[ignore = "needs root: loads BPF programs"]
fn a_restarted_agent_keeps_every_endpoints_index() -> anyhow::Result<()> {
    let d = desired_v6(1);
    let fx = fixture_with(&d)?;
    let table_before = endpoints(&fx)?;
    let gw_before = fx.target_gateway(0);
    let epoch_before = fx.config()?.policy_epoch;
    assert_ne!(index_of(gw_before), 0);
    assert_eq!(
        table_before[index_of(gw_before) as usize].addr,
        GW6.octets(),
        "the policy's gateway field names the gateway's address"
    );

    // A new agent on the same pins, whose state names one endpoint more,
    // one that sorts before every other.
    let mut d2 = d.clone();
    d2.reply_steering[1].worker_tunnel_ip = Ipv6Addr::new(0xfd00, 0x100, 0, 0, 0, 0, 0, 5).into();
    let mut dp = Datapath::load(EBPF_OBJECT, fx.pins.path())?;
    apply(&mut dp, &d2)?;
    let fx2 = Fixture { dp, pins: fx.pins };
    assert_eq!(fx2.target_gateway(0), gw_before, "the same index");
    assert_eq!(
        fx2.config()?.policy_epoch,
        epoch_before,
        "no established flow needs revalidating"
    );
    let table_after = endpoints(&fx2)?;
    for (i, e) in table_before.iter().enumerate() {
        if e.addr != [0; 16] {
            assert_eq!(table_after[i], *e, "index {i} kept its address");
        }
    }
    Ok(())
}

fn endpoints(fx: &Fixture) -> anyhow::Result<Vec<TunnelEndpoint>> {
    let path = fx.pins.path().join("TUNNEL_ENDPOINTS");
    let m: aya::maps::Array<_, TunnelEndpoint> =
        aya::maps::Array::try_from(aya::maps::Map::Array(aya::maps::MapData::from_pin(path)?))?;
    Ok(m.iter().collect::<Result<_, _>>()?)
}

/// The controller's probe over IPv6, from the controller to `dst`.
fn probe_frame6(pkt: &egress_failover::probe::Packet, dst: Ipv6Addr, dport: u16) -> Vec<u8> {
    let mut v = Vec::new();
    PacketBuilder::ethernet2(PEER_MAC, UPLINK_MAC)
        .ipv6(CONTROLLER6.octets(), dst.octets(), 255)
        .udp(40000, dport)
        .write(&mut v, &pkt.encode())
        .unwrap();
    v
}

const CONTROLLER6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x100, 0, 0, 0, 0, 0, 0x99);

#[test]
#[ignore = "needs root: loads BPF programs"]
fn the_datapath_answers_probes_over_ipv6_and_the_session_comes_up() -> anyhow::Result<()> {
    use egress_failover::probe::{Packet, Session, SessionConfig, SessionState};
    use std::time::Instant;
    let mut fx = fixture_with(&desired_v6(1))?;
    let now = Instant::now();
    let cfg = SessionConfig {
        desired_min_tx_ms: 100,
        required_min_rx_ms: 100,
        detect_multiplier: 3,
    };
    // The discriminator the node gives: its address's words XORed.
    let o = WORKER6.octets();
    let disc = (0..4).fold(0u32, |d, i| {
        d ^ u32::from_be_bytes([o[4 * i], o[4 * i + 1], o[4 * i + 2], o[4 * i + 3]])
    });
    let mut controller = Session::new(cfg, 77, now);
    for round in 0..3 {
        let ask = controller.packet_to_send(now, 0).expect("Down/Init sends");
        let (rc, out) = fx.run("uplink_ingress", &probe_frame6(&ask, WORKER6, PROBE_PORT))?;
        assert_eq!(rc, TC_ACT_REDIRECT, "round {round}: answered");
        let seen = check(&out); // the UDP checksum over IPv6, by etherparse
        assert_eq!(
            (seen.src, seen.dst, seen.sport, seen.dport, seen.ttl),
            (WORKER6.into(), CONTROLLER6.into(), PROBE_PORT, 40000, 64)
        );
        assert_eq!((&out[0..6], &out[6..12]), (&PEER_MAC[..], &UPLINK_MAC[..]));
        let reply = Packet::decode(&out[out.len() - 24..])?;
        assert_eq!(
            (reply.your_discriminator, reply.my_discriminator),
            (77, disc)
        );
        controller.on_packet(now, &reply)?;
        if controller.state() == SessionState::Up {
            break;
        }
    }
    assert_eq!(controller.state(), SessionState::Up);
    // To another address, another port, or over IPv4: left to the stack.
    let ask = controller.packet_to_send(now, 0).unwrap();
    let mut v4 = Vec::new();
    PacketBuilder::ethernet2(PEER_MAC, UPLINK_MAC)
        .ipv4(CONTROLLER.octets(), WORKER_TUNNEL.octets(), 64)
        .udp(40000, PROBE_PORT)
        .write(&mut v4, &ask.encode())?;
    for frame in [
        probe_frame6(&ask, GW6, PROBE_PORT),
        probe_frame6(&ask, WORKER6, PROBE_PORT + 1),
        v4,
    ] {
        let (rc, out) = fx.run("uplink_ingress", &frame)?;
        assert_eq!((rc, out), (TC_ACT_OK, frame));
    }
    Ok(())
}
