//! What the TestRun tests share: the map contents of a node that is worker
//! and gateway at once, packet builders, and the independent checks
//! (etherparse recomputes every checksum, never the code under test).
//! Each test binary uses its own part of it.
#![allow(dead_code)]

pub use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

pub use egress_common::{config::NatTimeouts, drops::*};
pub use egress_tests::PinDir;
pub use egress_user::{
    datapath::{
        apply, stats, Cidr, Datapath, DesiredMaps, NodeConfig, OwnedEip, PolicyRule,
        PortBlockGrant, ReplySteering,
    },
    EBPF_OBJECT,
};
pub use etherparse::{
    Icmpv4Type, Icmpv6Type, NetSlice, PacketBuilder, SlicedPacket, TcpOptionElement, TransportSlice,
};

pub const TC_ACT_OK: u32 = 0;
pub const TC_ACT_SHOT: u32 = 2;
pub const TC_ACT_REDIRECT: u32 = 7;

pub const POD_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x01, 0x05];
pub const HOST_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x01, 0x01];
pub const PEER_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x0e, 0x0a];
pub const UPLINK_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x0e, 0x99];

pub const POD: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 5);
pub const POD_OTHER: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 6);
pub const SERVER: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 10);
pub const EXCLUDED_DST: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 200);
pub const CLUSTER_DST: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 1);
pub const EIP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 10);
pub const EIP_NO_BLOCKS: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 11);
pub const GW_TUNNEL: Ipv4Addr = Ipv4Addr::new(10, 100, 0, 11);
pub const WORKER_TUNNEL: Ipv4Addr = Ipv4Addr::new(10, 100, 0, 21);
pub const POD6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x244, 1, 0, 0, 0, 0, 5);
pub const SERVER6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0xe, 0, 0, 0, 0, 0x10);
pub const EIP6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0xe, 0, 0, 0, 0, 0x100);

pub const BLOCK_SIZE: u16 = 1024;
pub const BLOCK: u16 = 40; // ports 40960..=41983
pub const BLOCK6: u16 = 41;
pub const MTU: u16 = 1450;
pub const PROBE_PORT: u16 = 13784;
pub const CONTROLLER: Ipv4Addr = Ipv4Addr::new(10, 100, 0, 2);

pub fn cidr(s: &str) -> Cidr {
    s.parse().unwrap()
}

/// A policy on [`EIP_NO_BLOCKS`] (IPv4 only, no port block on this node),
/// through the gateway's tunnel, nothing excluded.
pub fn no_blocks_policy(
    id: u32,
    priority: i32,
    sources: Vec<Cidr>,
    destinations: Vec<Cidr>,
) -> PolicyRule {
    PolicyRule {
        id,
        priority,
        sources,
        destinations,
        excluded: vec![],
        eip_v4: Some(EIP_NO_BLOCKS),
        eip_v6: None,
        gateway_tunnel_ip: GW_TUNNEL.into(),
        spread: vec![],
        local_gateway: false,
        use_node_ip: false,
        no_gateway: false,
    }
}

/// A worker and gateway in one map set (the programs pick their part).
pub fn desired() -> DesiredMaps {
    DesiredMaps {
        config: NodeConfig {
            is_worker: true,
            is_gateway: true,
            vxlan_ifindex: 1,
            vni: 4242,
            uplink_ifindex: 1,
            uplink_mac: UPLINK_MAC,
            tunnel_mtu: MTU,
            port_block_size: BLOCK_SIZE,
            node_tunnel_ip: WORKER_TUNNEL.into(),
            timeouts: NatTimeouts::default(),
            probe_port: PROBE_PORT,
            vxlan_port: 4789,
            ..Default::default()
        },
        policies: vec![
            PolicyRule {
                id: 7,
                priority: 10,
                sources: vec![Cidr::host(POD.into()), Cidr::host(POD6.into())],
                destinations: vec![],
                excluded: vec![cidr("203.0.113.128/25")],
                eip_v4: Some(EIP),
                eip_v6: Some(EIP6),
                gateway_tunnel_ip: GW_TUNNEL.into(),
                spread: vec![],
                local_gateway: false,
                use_node_ip: false,
                no_gateway: false,
            },
            // A policy whose EIP has no port block on this node.
            no_blocks_policy(
                8,
                5,
                vec![Cidr::host(POD.into())],
                vec![cidr("192.0.2.0/24")],
            ),
        ],
        cluster_cidrs: vec![
            cidr("10.96.0.0/12"),
            cidr("10.244.0.0/16"),
            cidr("fd00:244::/32"),
        ],
        port_blocks: vec![
            PortBlockGrant {
                eip: EIP.into(),
                blocks: vec![BLOCK],
            },
            PortBlockGrant {
                eip: EIP6.into(),
                blocks: vec![BLOCK6],
            },
        ],
        reply_steering: vec![
            ReplySteering {
                eip: EIP.into(),
                block: BLOCK,
                worker_tunnel_ip: WORKER_TUNNEL.into(),
                local: false,
            },
            ReplySteering {
                eip: EIP6.into(),
                block: BLOCK6,
                worker_tunnel_ip: WORKER_TUNNEL.into(),
                local: false,
            },
        ],
        owned_eips: vec![
            OwnedEip {
                eip: EIP.into(),
                answer_neigh: true,
                node_ip: false,
                epoch: 1,
            },
            OwnedEip {
                eip: EIP6.into(),
                answer_neigh: true,
                node_ip: false,
                epoch: 1,
            },
        ],
        routes: vec![],
    }
}

pub struct Fixture {
    pub dp: Datapath,
    pub pins: PinDir,
}

pub fn fixture_with(d: &DesiredMaps) -> anyhow::Result<Fixture> {
    let pins = PinDir::new("tr")?;
    let mut dp = Datapath::load(EBPF_OBJECT, pins.path())?;
    apply(&mut dp, d)?;
    Ok(Fixture { dp, pins })
}

pub fn fixture() -> anyhow::Result<Fixture> {
    fixture_with(&desired())
}

impl Fixture {
    pub fn run(&mut self, prog: &str, pkt: &[u8]) -> anyhow::Result<(u32, Vec<u8>)> {
        run_prog(&mut self.dp, prog, pkt)
    }

    /// `run` without the `skb->csum` check, for the two paths where the
    /// running sum means nothing once the program is done: an ARP answer
    /// (ARP has no checksum, nothing reads it) and the ICMP error built
    /// from a pod's packet (`bpf_skb_change_tail` trims the packet, which
    /// turns CHECKSUM_COMPLETE into CHECKSUM_NONE: `__skb_trim_rcsum`; the
    /// kernel's check compares the sum whatever the state).
    pub fn run_sum_unused(&mut self, prog: &str, pkt: &[u8]) -> anyhow::Result<(u32, Vec<u8>)> {
        egress_tests::run_classifier(&mut self.dp.ebpf, prog, pkt)
    }

    pub fn drops(&self, reason: u32) -> u64 {
        stats::read_drops(self.pins.path()).unwrap()[reason as usize]
            .1
            .packets
    }

    /// The gateway field of policy slot `slot`, as pinned.
    pub fn target_gateway(&self, slot: u32) -> [u8; 4] {
        let path = self.pins.path().join("POLICY_TARGETS");
        let data = aya::maps::MapData::from_pin(path).unwrap();
        let m: aya::maps::Array<_, egress_common::policy::EgressTarget> =
            aya::maps::Array::try_from(aya::maps::Map::Array(data)).unwrap();
        m.get(&slot, 0).unwrap().gateway_tunnel_ip
    }

    /// The programs' config, as pinned.
    pub fn config(&self) -> anyhow::Result<egress_common::config::DatapathConfig> {
        let path = self.pins.path().join("CONFIG");
        let m: aya::maps::Array<_, egress_common::config::DatapathConfig> =
            aya::maps::Array::try_from(aya::maps::Map::Array(aya::maps::MapData::from_pin(path)?))?;
        Ok(m.get(&0, 0)?)
    }

    pub fn all_drops(&self) -> u64 {
        stats::read_drops(self.pins.path())
            .unwrap()
            .iter()
            .map(|(_, c)| c.packets)
            .sum()
    }
}

/// Every run gets a CHECKSUM_COMPLETE skb (as from a NIC that sums every
/// packet) and fails unless the program keeps `skb->csum` right: the
/// receiving stack trusts it (see `csum_carry` in egress-ebpf).
pub fn run_prog(dp: &mut Datapath, prog: &str, pkt: &[u8]) -> anyhow::Result<(u32, Vec<u8>)> {
    egress_tests::run_classifier_complete(&mut dp.ebpf, prog, pkt)
}

// ---------- packet builders ----------

pub fn tcp4(src: Ipv4Addr, dst: Ipv4Addr, sport: u16, dport: u16, syn: bool) -> Vec<u8> {
    let b = PacketBuilder::ethernet2(POD_MAC, HOST_MAC)
        .ipv4(src.octets(), dst.octets(), 64)
        .tcp(sport, dport, 1000, 64240);
    let b = if syn {
        b.syn()
            .options(&[
                TcpOptionElement::MaximumSegmentSize(1460),
                TcpOptionElement::Noop,
                TcpOptionElement::WindowScale(7),
            ])
            .unwrap()
    } else {
        b.ack(5)
    };
    let mut v = Vec::new();
    b.write(&mut v, b"hello").unwrap();
    v
}

pub fn udp4(src: Ipv4Addr, dst: Ipv4Addr, sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    PacketBuilder::ethernet2(POD_MAC, HOST_MAC)
        .ipv4(src.octets(), dst.octets(), 64)
        .udp(sport, dport)
        .write(&mut v, payload)
        .unwrap();
    v
}

pub fn icmp4_echo(src: Ipv4Addr, dst: Ipv4Addr, id: u16, reply: bool) -> Vec<u8> {
    let mut v = Vec::new();
    let b = PacketBuilder::ethernet2(POD_MAC, HOST_MAC).ipv4(src.octets(), dst.octets(), 64);
    if reply {
        b.icmpv4(Icmpv4Type::EchoReply(etherparse::IcmpEchoHeader {
            id,
            seq: 1,
        }))
        .write(&mut v, b"ping")
        .unwrap();
    } else {
        b.icmpv4_echo_request(id, 1).write(&mut v, b"ping").unwrap();
    }
    v
}

pub fn tcp6(src: Ipv6Addr, dst: Ipv6Addr, sport: u16, dport: u16) -> Vec<u8> {
    let mut v = Vec::new();
    PacketBuilder::ethernet2(POD_MAC, HOST_MAC)
        .ipv6(src.octets(), dst.octets(), 64)
        .tcp(sport, dport, 1000, 64240)
        .syn()
        .options(&[TcpOptionElement::MaximumSegmentSize(1440)])
        .unwrap()
        .write(&mut v, b"")
        .unwrap();
    v
}

pub fn udp6(src: Ipv6Addr, dst: Ipv6Addr, sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    PacketBuilder::ethernet2(POD_MAC, HOST_MAC)
        .ipv6(src.octets(), dst.octets(), 64)
        .udp(sport, dport)
        .write(&mut v, payload)
        .unwrap();
    v
}

pub fn icmp6_echo(src: Ipv6Addr, dst: Ipv6Addr, id: u16, reply: bool) -> Vec<u8> {
    let mut v = Vec::new();
    let b = PacketBuilder::ethernet2(POD_MAC, HOST_MAC).ipv6(src.octets(), dst.octets(), 64);
    let hdr = etherparse::IcmpEchoHeader { id, seq: 1 };
    let ty = if reply {
        Icmpv6Type::EchoReply(hdr)
    } else {
        Icmpv6Type::EchoRequest(hdr)
    };
    b.icmpv6(ty).write(&mut v, b"ping6").unwrap();
    v
}

// ---------- independent checks ----------

/// What the checks found in a packet.
#[derive(Debug, PartialEq, Eq)]
pub struct Seen {
    pub src: IpAddr,
    pub dst: IpAddr,
    /// Ports, or (identifier, 0) / (0, identifier) for echo request / reply.
    pub sport: u16,
    pub dport: u16,
    pub ttl: u8,
}

/// Parses an Ethernet frame and asserts every checksum in it with etherparse.
pub fn check(frame: &[u8]) -> Seen {
    let p = SlicedPacket::from_ethernet(frame).expect("output parses");
    let (src, dst, ttl) = match &p.net {
        Some(NetSlice::Ipv4(ip)) => {
            let h = ip.header().to_header();
            assert_eq!(
                h.header_checksum,
                h.calc_header_checksum(),
                "IPv4 header checksum"
            );
            (
                IpAddr::from(h.source),
                IpAddr::from(h.destination),
                h.time_to_live,
            )
        }
        Some(NetSlice::Ipv6(ip)) => {
            let h = ip.header().to_header();
            (
                IpAddr::from(h.source),
                IpAddr::from(h.destination),
                h.hop_limit,
            )
        }
        other => panic!("not IP: {other:?}"),
    };
    let (s4, d4) = match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => (Some(s.octets()), Some(d.octets())),
        _ => (None, None),
    };
    let (s6, d6) = match (src, dst) {
        (IpAddr::V6(s), IpAddr::V6(d)) => (s.octets(), d.octets()),
        _ => ([0; 16], [0; 16]),
    };
    let (sport, dport) = match &p.transport {
        Some(TransportSlice::Tcp(t)) => {
            let want = match s4 {
                Some(s) => t.calc_checksum_ipv4(s, d4.unwrap()).unwrap(),
                None => t.calc_checksum_ipv6(s6, d6).unwrap(),
            };
            assert_eq!(t.checksum(), want, "TCP checksum");
            (t.source_port(), t.destination_port())
        }
        Some(TransportSlice::Udp(u)) => {
            let h = u.to_header();
            if s4.is_some() && u.checksum() == 0 {
                // The legal "no checksum" of IPv4 UDP: nothing to verify.
            } else {
                let want = match s4 {
                    Some(s) => h
                        .calc_checksum_ipv4_raw(s, d4.unwrap(), u.payload())
                        .unwrap(),
                    None => h.calc_checksum_ipv6_raw(s6, d6, u.payload()).unwrap(),
                };
                assert_eq!(u.checksum(), want, "UDP checksum");
                assert_ne!(
                    u.checksum(),
                    0,
                    "a computed UDP checksum is never written as 0"
                );
            }
            (u.source_port(), u.destination_port())
        }
        Some(TransportSlice::Icmpv4(i)) => {
            let want = i.icmp_type().calc_checksum(i.payload());
            assert_eq!(i.checksum(), want, "ICMP checksum");
            match i.icmp_type() {
                Icmpv4Type::EchoRequest(e) => (e.id, 0),
                Icmpv4Type::EchoReply(e) => (0, e.id),
                _ => (0, 0),
            }
        }
        Some(TransportSlice::Icmpv6(i)) => {
            assert!(i.is_checksum_valid(s6, d6), "ICMPv6 checksum");
            match i.icmp_type() {
                Icmpv6Type::EchoRequest(e) => (e.id, 0),
                Icmpv6Type::EchoReply(e) => (0, e.id),
                _ => (0, 0),
            }
        }
        other => panic!("no transport: {other:?}"),
    };
    Seen {
        src,
        dst,
        sport,
        dport,
        ttl,
    }
}

pub fn in_block(port: u16, block: u16) -> bool {
    port / BLOCK_SIZE == block
}

/// The MSS option of a TCP SYN in a frame.
pub fn mss_of(frame: &[u8]) -> Option<u16> {
    let p = SlicedPacket::from_ethernet(frame).unwrap();
    let Some(TransportSlice::Tcp(t)) = p.transport else {
        return None;
    };
    t.options_iterator().find_map(|o| match o {
        Ok(TcpOptionElement::MaximumSegmentSize(m)) => Some(m),
        _ => None,
    })
}

/// The quoted packet of an ICMPv6 error (IPv6 and UDP, whole): its source
/// address and port, once its UDP checksum is found right.
pub fn quoted_udp6(frame: &[u8]) -> (Ipv6Addr, u16) {
    let q = SlicedPacket::from_ip(&frame[14 + 40 + 8..]).expect("quoted parses");
    let Some(NetSlice::Ipv6(qip)) = q.net else {
        panic!("quoted not IPv6")
    };
    let qh = qip.header().to_header();
    let Some(TransportSlice::Udp(qu)) = q.transport else {
        panic!("quoted not UDP")
    };
    let want = qu
        .to_header()
        .calc_checksum_ipv6_raw(qh.source, qh.destination, qu.payload())
        .unwrap();
    assert_eq!(qu.checksum(), want, "quoted UDP checksum");
    (qh.source.into(), qu.source_port())
}
