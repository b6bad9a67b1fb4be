//! The gateway's XDP reply path over an IPv6 underlay: the TC path's IPv6
//! outer headers (checked by etherparse) with the link addresses XDP
//! writes itself, sent back out with XDP_TX; passed to TC untouched until
//! the next hop's neighbour is known.

use crate::{
    gateway_xdp::{mac_of, passed_untouched, XDP_TX},
    testrun::*,
    underlay_v6::{desired_v6, outer_vxlan6, v6_underlay, OTHER_WORKER6},
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
        // IPv6 VXLAN frames are the device's to decapsulate (no XDP forward).
        let (rc, tc) = fx.run(
            "uplink_ingress",
            &udp4(SERVER, EIP, 53, BLOCK * BLOCK_SIZE + 2, b"b"),
        )?;
        assert_eq!(rc, TC_ACT_REDIRECT);
        passed_untouched(&mut fx, uplink, "an IPv6-encapsulated frame", &tc)?;
        assert_eq!(fx.all_drops(), 0);
        Ok(())
    })
}
