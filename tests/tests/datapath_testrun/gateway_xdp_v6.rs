//! The gateway's XDP paths over an IPv6 underlay: the reply in the TC
//! path's IPv6 outer headers (checked by etherparse) with the link
//! addresses XDP writes itself, sent back out with XDP_TX, passed to TC
//! untouched until the next hop's neighbour is known; a worker's packet in
//! IPv6 VXLAN decapsulated and forwarded as the TC path forwards it.

use crate::{
    gateway_xdp::{mac_of, passed_untouched, XDP_TX},
    gateway_xdp_forward::forwarded_as_tc,
    testrun::*,
    underlay_v6::{desired_v6, outer_vxlan6, v6_underlay, OTHER_WORKER6, WORKER6},
};
use egress_tests::{run_xdp, Netns};

const NEXT_HOP_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x61, 0x31];

#[test]
#[ignore = "needs root: loads BPF programs in a network namespace"]
fn xdp_steers_replies_back_out_in_ipv6_outer_headers() -> anyhow::Result<()> {
    let ns = Netns::new("xdp6")?;
    let uplink = v6_underlay(&ns)?;
    let uplink_mac = mac_of(&ns, "up0")?;
    let mac = NEXT_HOP_MAC.map(|b| format!("{b:02x}")).join(":");
    let (other, ns_name) = (OTHER_WORKER6.to_string(), ns.name().to_owned());
    let neighbour = move || {
        std::process::Command::new("ip")
            .args(["-n", &ns_name, "-6", "neigh", "replace", &other])
            .args(["lladdr", &mac, "dev", "up0"])
            .status()
    };
    ns.enter(move || {
        let d = desired_v6(uplink);
        let mut fx = fixture_with(&d)?;
        let udp = udp4(SERVER, EIP, 53, BLOCK * BLOCK_SIZE + 1, b"a");
        passed_untouched(&mut fx, uplink, "no neighbour entry yet", &udp)?;
        anyhow::ensure!(neighbour()?.success(), "ip neigh");
        for reply in [udp, tcp4(SERVER, EIP, 443, BLOCK * BLOCK_SIZE + 7, false)] {
            let (rc, xdp) = run_xdp(&mut fx.dp.ebpf, "uplink_xdp", &reply, uplink)?;
            assert_eq!(rc, XDP_TX, "sent back out of the uplink");
            assert_eq!(&xdp[..6], &NEXT_HOP_MAC, "to the next hop's MAC");
            assert_eq!(&xdp[6..12], &uplink_mac, "from the uplink's MAC");
            assert_eq!(outer_vxlan6(&xdp, d.config.vni, OTHER_WORKER6).0, reply);
            // The TC path leaves the link addresses to the neighbour
            // subsystem; everything after them is the same.
            let (rc, tc) = fx.run("uplink_ingress", &reply)?;
            assert_eq!(rc, TC_ACT_REDIRECT);
            assert_eq!(&xdp[12..], &tc[12..], "the TC path's outer headers");
        }
        assert_eq!(fx.all_drops(), 0);
        Ok(())
    })
}

const ROUTER6: &str = "fd00:100::1";
const ROUTER_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x61, 0x01];

/// `inner` as `from` sends it to this node (`WORKER6`) over IPv6 in VXLAN
/// `vni`, outer UDP checksum zero as the workers send it.
fn in_vxlan6(inner: &[u8], from: Ipv6Addr, vni: u32, port: u16) -> Vec<u8> {
    let mut payload = vec![0x08, 0, 0, 0];
    payload.extend_from_slice(&(vni << 8).to_be_bytes());
    payload.extend_from_slice(inner);
    let mut v = Vec::new();
    etherparse::PacketBuilder::ethernet2([2, 0, 0, 0, 0x31, 0x31], UPLINK_MAC)
        .ipv6(from.octets(), WORKER6.octets(), 64)
        .udp(0xc123, port)
        .write(&mut v, &payload)
        .unwrap();
    v[14 + 40 + 6..14 + 40 + 8].fill(0);
    v
}

#[test]
#[ignore = "needs root: loads BPF programs in a network namespace"]
fn xdp_forwards_a_workers_ipv6_tunnelled_packet_as_the_tc_path_does() -> anyhow::Result<()> {
    let ns = Netns::new("xdpf6")?;
    let uplink = v6_underlay(&ns)?;
    let uplink_mac = mac_of(&ns, "up0")?;
    // The server behind a router on the uplink, by an IPv6 next hop.
    let route = [
        "-4",
        "route",
        "add",
        "203.0.113.0/24",
        "via",
        "inet6",
        ROUTER6,
        "dev",
        "up0",
    ];
    ns.ip(&route)?;
    let mac = ROUTER_MAC.map(|b| format!("{b:02x}")).join(":");
    ns.permanent_neighbour("up0", ROUTER6, &mac)?;
    ns.enter(move || {
        let d = desired_v6(uplink);
        let mut fx = fixture_with(&d)?;
        let vni = d.config.vni;
        for inner in [
            udp4(EIP, SERVER, BLOCK * BLOCK_SIZE + 1, 53, b"q"),
            tcp4(EIP, SERVER, BLOCK * BLOCK_SIZE + 7, 443, true),
            // Twice: the second from this CPU's forward cache.
            tcp4(EIP, SERVER, BLOCK * BLOCK_SIZE + 7, 443, false),
        ] {
            let pkt = in_vxlan6(&inner, OTHER_WORKER6, vni, 4789);
            let xdp = forwarded_as_tc(&mut fx, uplink, &pkt, &inner, uplink_mac)?;
            assert_eq!(&xdp[..6], &ROUTER_MAC, "to the router's MAC");
        }
        let inner = udp4(EIP, SERVER, BLOCK * BLOCK_SIZE + 1, 53, b"q");
        let mut pass = |what: &str, pkt: &[u8]| passed_untouched(&mut fx, uplink, what, pkt);
        pass(
            "another VNI",
            &in_vxlan6(&inner, OTHER_WORKER6, vni + 1, 4789),
        )?;
        pass(
            "another UDP port",
            &in_vxlan6(&inner, OTHER_WORKER6, vni, 4790),
        )?;
        let mut elsewhere = in_vxlan6(&inner, OTHER_WORKER6, vni, 4789);
        elsewhere[14 + 24 + 15] ^= 1; // the last byte of the outer destination
        pass("to an address that is not this node's endpoint", &elsewhere)?;
        let stranger = Ipv4Addr::new(198, 51, 100, 99);
        let foreign = udp4(stranger, SERVER, 40000, 53, b"q");
        pass(
            "a source that is no owned EIP",
            &in_vxlan6(&foreign, OTHER_WORKER6, vni, 4789),
        )?;
        assert_eq!(fx.all_drops(), 0);
        Ok(())
    })
}
