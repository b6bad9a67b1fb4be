//! The gateway's XDP forward (`uplink_xdp` with `xdp_forward`): a worker's
//! VXLAN packet from an owned EIP, decapsulated and sent back out of the
//! uplink toward the server, byte for byte what the TC path
//! (`tunnel_ingress` behind the kernel's VXLAN device) sends; everything
//! else passed on untouched.

use crate::{
    gateway_xdp::{passed_untouched, Gateway, XDP_TX},
    testrun::*,
};
use egress_tests::run_xdp;
use etherparse::{NetSlice, SlicedPacket};

const ROUTER: &str = "10.100.0.1";
const ROUTER_MAC: &str = "02:00:00:00:01:01";
/// A destination routed out of the other device of the namespace.
const ELSEWHERE: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 5);

/// `inner` as worker `from` sends it to this node (`WORKER_TUNNEL`) in VNI `vni`.
fn in_vxlan(inner: &[u8], from: Ipv4Addr, vni: u32, port: u16) -> Vec<u8> {
    let mut payload = vec![0x08, 0, 0, 0];
    payload.extend_from_slice(&(vni << 8).to_be_bytes());
    payload.extend_from_slice(inner);
    let mut v = Vec::new();
    etherparse::PacketBuilder::ethernet2([2, 0, 0, 0, 0x31, 0x31], UPLINK_MAC)
        .ipv4(from.octets(), WORKER_TUNNEL.octets(), 64)
        .udp(0xc123, port)
        .write(&mut v, &payload)
        .unwrap();
    v
}

/// Runs `uplink_xdp` on the tunnelled `pkt` arriving on `ifindex` and
/// asserts it was sent back out as `inner` forwarded: from the uplink's
/// MAC `uplink_mac`, TTL 63 with a right checksum, the very bytes the TC
/// path (`tunnel_ingress` behind the kernel's VXLAN device) sends. Returns
/// the frame.
pub(crate) fn forwarded_as_tc(
    fx: &mut Fixture,
    ifindex: u32,
    pkt: &[u8],
    inner: &[u8],
    uplink_mac: [u8; 6],
) -> anyhow::Result<Vec<u8>> {
    let (rc, xdp) = run_xdp(&mut fx.dp.ebpf, "uplink_xdp", pkt, ifindex)?;
    assert_eq!(rc, XDP_TX, "sent back out of the uplink");
    assert_eq!(&xdp[6..12], &uplink_mac, "from the uplink's MAC");
    let h = match SlicedPacket::from_ethernet(&xdp)?.net {
        Some(NetSlice::Ipv4(ip)) => ip.header().to_header(),
        _ => panic!("not IPv4"),
    };
    assert_eq!(h.time_to_live, 63);
    assert_eq!(h.header_checksum, h.calc_header_checksum());
    // The kernel's VXLAN device hands the TC program the inner frame.
    let (rc, tc) = fx.run("tunnel_ingress", inner)?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    assert_eq!(xdp, tc, "what the TC path sends");
    Ok(xdp)
}

/// The server behind a router on the uplink, `ELSEWHERE` behind `up1`.
fn routes(gw: &Gateway) -> anyhow::Result<()> {
    gw.ns
        .route(&["203.0.113.0/24", "via", ROUTER, "dev", "up0"])?;
    gw.ns.ip(&["addr", "add", "198.18.1.1/24", "dev", "up1"])?;
    gw.ns
        .route(&["198.18.0.0/24", "via", "198.18.1.2", "dev", "up1"])?;
    gw.ns.permanent_neighbour("up1", "198.18.1.2", ROUTER_MAC)?;
    Ok(())
}

#[test]
#[ignore = "needs root: loads BPF programs in a network namespace"]
fn xdp_forwards_a_workers_packet_as_the_tc_path_does() -> anyhow::Result<()> {
    let gw = Gateway::new()?;
    routes(&gw)?;
    gw.ns.permanent_neighbour("up0", ROUTER, ROUTER_MAC)?;
    let uplink_mac = gw.uplink_mac()?;
    let (ifindex, other) = (gw.ifindex, gw.other_worker);
    let d = gw.desired();
    gw.ns.enter(move || {
        let mut fx = fixture_with(&d)?;
        for inner in [
            udp4(EIP, SERVER, BLOCK * BLOCK_SIZE + 1, 53, b"q"),
            tcp4(EIP, SERVER, BLOCK * BLOCK_SIZE + 7, 443, true),
            // Twice: the second from this CPU's forward cache.
            tcp4(EIP, SERVER, BLOCK * BLOCK_SIZE + 7, 443, false),
        ] {
            let pkt = in_vxlan(&inner, other, d.config.vni, 4789);
            forwarded_as_tc(&mut fx, ifindex, &pkt, &inner, uplink_mac)?;
        }
        assert_eq!(fx.all_drops(), 0);
        Ok(())
    })
}

#[test]
#[ignore = "needs root: loads BPF programs in a network namespace"]
fn xdp_leaves_every_other_tunnel_packet_to_the_kernel() -> anyhow::Result<()> {
    let gw = Gateway::new()?;
    routes(&gw)?;
    let ifindex = gw.ifindex;
    let (other, ns) = (gw.other_worker, gw.ns.name().to_owned());
    let d = gw.desired();
    let vni = d.config.vni;
    gw.ns.enter(move || {
        let mut fx = fixture_with(&d)?;
        let mut pass = |what: &str, pkt: &[u8]| passed_untouched(&mut fx, ifindex, what, pkt);
        let inner = udp4(EIP, SERVER, BLOCK * BLOCK_SIZE + 1, 53, b"q");
        let tunnelled = |i: &[u8]| in_vxlan(i, other, vni, 4789);
        pass("no neighbour entry for the router yet", &tunnelled(&inner))?;
        pass("another VNI", &in_vxlan(&inner, other, vni + 1, 4789))?;
        pass("another UDP port", &in_vxlan(&inner, other, vni, 4790))?;
        let stranger = Ipv4Addr::new(198, 51, 100, 99);
        pass(
            "a source that is no owned EIP",
            &tunnelled(&udp4(stranger, SERVER, 40000, 53, b"q")),
        )?;
        pass(
            "a next hop behind another device",
            &tunnelled(&udp4(EIP, ELSEWHERE, BLOCK * BLOCK_SIZE + 1, 53, b"q")),
        )?;
        pass(
            "ICMP",
            &tunnelled(&icmp4_echo(EIP, SERVER, BLOCK * BLOCK_SIZE + 9, false)),
        )?;
        let mut expiring = inner.clone();
        expiring[14 + 8] = 1;
        pass("a TTL that expires here", &tunnelled(&expiring))?;
        let mut frag = inner.clone();
        frag[14 + 6] |= 0x20;
        pass("an inner fragment", &tunnelled(&frag))?;
        let mut outer_frag = tunnelled(&inner);
        outer_frag[14 + 6] |= 0x20;
        pass("a first fragment of the outer packet", &outer_frag)?;
        let mut options = tunnelled(&inner);
        options[14] = 0x46;
        pass("an outer header with options", &options)?;
        let router = std::process::Command::new("ip")
            .args(["-n", &ns, "neigh", "replace", ROUTER, "lladdr", ROUTER_MAC])
            .args(["dev", "up0"])
            .status()?;
        anyhow::ensure!(router.success(), "ip neigh");
        let (rc, _) = run_xdp(&mut fx.dp.ebpf, "uplink_xdp", &tunnelled(&inner), ifindex)?;
        assert_eq!(rc, XDP_TX, "and the forward once the router is known");
        assert_eq!(fx.all_drops(), 0, "XDP drops nothing itself");
        Ok(())
    })
}
