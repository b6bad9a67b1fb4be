//! The gateway's XDP reply path (`uplink_xdp`): the same outer headers as
//! the TC path's, with the link addresses it writes itself, sent back out
//! with XDP_TX; everything else passed on to TC untouched.

use crate::{gateway::arp_request, testrun::*, worker::outer_vxlan};
use egress_tests::{run_xdp, Netns};

pub(crate) const XDP_PASS: u32 = 2;
pub(crate) const XDP_TX: u32 = 3;
const NEXT_HOP_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x31, 0x31];

/// A namespace whose `up0` is on the underlay (10.100.0.21/24) and the
/// fixture's maps, replies of the EIP's block steered to `other_worker`.
pub(crate) struct Gateway {
    pub(crate) ns: Netns,
    pub(crate) ifindex: u32,
    pub(crate) other_worker: Ipv4Addr,
}

impl Gateway {
    pub(crate) fn new() -> anyhow::Result<Self> {
        let ns = Netns::new("xdpgw")?;
        ns.ip(&["link", "add", "up0", "type", "veth", "peer", "name", "up1"])?;
        ns.ip(&["link", "set", "up1", "up"])?;
        ns.ip(&["link", "set", "up0", "up"])?;
        ns.ip(&["addr", "add", &format!("{WORKER_TUNNEL}/24"), "dev", "up0"])?;
        // The FIB lookup answers only where the node forwards.
        ns.enable_forwarding()?;
        let link: serde_json::Value =
            serde_json::from_str(&ns.ip(&["-j", "link", "show", "dev", "up0"])?)?;
        let ifindex = link[0]["ifindex"].as_u64().unwrap() as u32;
        Ok(Self {
            ns,
            ifindex,
            other_worker: Ipv4Addr::new(10, 100, 0, 31),
        })
    }

    pub(crate) fn desired(&self) -> DesiredMaps {
        let mut d = desired();
        d.config.uplink_ifindex = self.ifindex;
        d.reply_steering[0].worker_tunnel_ip = self.other_worker.into();
        d
    }

    /// `ip neigh replace` for the other worker, runnable from any thread.
    fn neighbour_command(&self) -> std::process::Command {
        let mac = NEXT_HOP_MAC.map(|b| format!("{b:02x}")).join(":");
        let mut c = std::process::Command::new("ip");
        c.args(["-n", self.ns.name(), "neigh", "replace"])
            .arg(self.other_worker.to_string())
            .args(["lladdr", &mac, "dev", "up0"]);
        c
    }

    pub(crate) fn uplink_mac(&self) -> anyhow::Result<[u8; 6]> {
        mac_of(&self.ns, "up0")
    }
}

/// The Ethernet address of `dev` in `ns`.
pub(crate) fn mac_of(ns: &Netns, dev: &str) -> anyhow::Result<[u8; 6]> {
    let link: serde_json::Value =
        serde_json::from_str(&ns.ip(&["-j", "link", "show", "dev", dev])?)?;
    let s = link[0]["address"].as_str().unwrap_or_default();
    let b: Vec<u8> = s
        .split(':')
        .map(|x| u8::from_str_radix(x, 16))
        .collect::<Result<_, _>>()?;
    b.try_into().map_err(|_| anyhow::anyhow!("MAC {s}"))
}

/// Runs `uplink_xdp` on `pkt` arriving on `ifindex` and asserts it was
/// passed on as it came (`what` names the case).
pub(crate) fn passed_untouched(
    fx: &mut Fixture,
    ifindex: u32,
    what: &str,
    pkt: &[u8],
) -> anyhow::Result<()> {
    let (rc, out) = run_xdp(&mut fx.dp.ebpf, "uplink_xdp", pkt, ifindex)?;
    assert_eq!(
        (rc, out.as_slice()),
        (XDP_PASS, pkt),
        "{what}: passed untouched"
    );
    Ok(())
}

#[test]
#[ignore = "needs root: loads BPF programs in a network namespace"]
fn xdp_steers_replies_back_out_with_the_tc_paths_headers() -> anyhow::Result<()> {
    let gw = Gateway::new()?;
    let uplink_mac = gw.uplink_mac()?;
    let (ifindex, other) = (gw.ifindex, gw.other_worker);
    let d = gw.desired();
    anyhow::ensure!(gw.neighbour_command().status()?.success(), "ip neigh");
    gw.ns.enter(move || {
        let mut fx = fixture_with(&d)?;
        for reply in [
            udp4(SERVER, EIP, 53, BLOCK * BLOCK_SIZE + 1, b"a"),
            tcp4(SERVER, EIP, 443, BLOCK * BLOCK_SIZE + 7, false),
        ] {
            let (rc, xdp) = run_xdp(&mut fx.dp.ebpf, "uplink_xdp", &reply, ifindex)?;
            assert_eq!(rc, XDP_TX, "sent back out of the uplink");
            assert_eq!(&xdp[..6], &NEXT_HOP_MAC, "to the next hop's MAC");
            assert_eq!(&xdp[6..12], &uplink_mac, "from the uplink's MAC");
            assert_eq!(outer_vxlan(&xdp, d.config.vni, other), reply);
            // The TC path leaves the link addresses to the neighbour
            // subsystem; everything after them is the same.
            let (rc, tc) = fx.run("uplink_ingress", &reply)?;
            assert_eq!(rc, TC_ACT_REDIRECT);
            assert_eq!(&xdp[12..], &tc[12..], "the TC path's outer headers");
        }
        // With the steering entry gone behind the cache's back, the
        // cached steering still sends the next reply.
        let mut m: aya::maps::HashMap<
            _,
            egress_common::steering::SteerKey,
            egress_common::steering::SteerTarget,
        > = aya::maps::HashMap::try_from(fx.dp.ebpf.map_mut("REPLY_STEERING").unwrap())?;
        let keys: Vec<_> = m.keys().collect::<Result<_, _>>()?;
        for k in keys {
            m.remove(&k)?;
        }
        let reply = udp4(SERVER, EIP, 53, BLOCK * BLOCK_SIZE + 1, b"b");
        let (rc, xdp) = run_xdp(&mut fx.dp.ebpf, "uplink_xdp", &reply, ifindex)?;
        assert_eq!(rc, XDP_TX, "steered by the cache");
        assert_eq!(outer_vxlan(&xdp, d.config.vni, other), reply);
        assert_eq!(fx.all_drops(), 0);
        Ok(())
    })
}

#[test]
#[ignore = "needs root: loads BPF programs in a network namespace"]
fn xdp_passes_everything_else_to_tc_untouched() -> anyhow::Result<()> {
    let gw = Gateway::new()?;
    let ifindex = gw.ifindex;
    let mut d = gw.desired();
    // A block whose replies go to a pod of this node.
    d.port_blocks[0].blocks.push(BLOCK + 1);
    d.reply_steering.push(ReplySteering {
        eip: EIP.into(),
        block: BLOCK + 1,
        worker_tunnel_ip: WORKER_TUNNEL.into(),
        local: true,
    });
    let steered = udp4(SERVER, EIP, 53, BLOCK * BLOCK_SIZE + 1, b"a");
    let mut neighbour = gw.neighbour_command();
    gw.ns.enter(move || {
        let mut fx = fixture_with(&d)?;
        let mut pass = |what: &str, pkt: &[u8]| passed_untouched(&mut fx, ifindex, what, pkt);
        pass("no neighbour entry for the next hop yet", &steered)?;
        let big = udp4(SERVER, EIP, 53, BLOCK * BLOCK_SIZE + 1, &[7; 1500 - 28]);
        pass("larger than the tunnel's MTU", &big)?;
        pass(
            "not an owned EIP",
            &udp4(SERVER, Ipv4Addr::new(198, 51, 100, 99), 53, 41000, b"x"),
        )?;
        pass("a port in no block", &udp4(SERVER, EIP, 53, 80, b"x"))?;
        pass(
            "a block of a local pod",
            &udp4(SERVER, EIP, 53, (BLOCK + 1) * BLOCK_SIZE, b"x"),
        )?;
        pass(
            "ICMP",
            &icmp4_echo(SERVER, EIP, BLOCK * BLOCK_SIZE + 9, true),
        )?;
        pass(
            "IPv6",
            &udp6(SERVER6, EIP6, 53, BLOCK6 * BLOCK_SIZE + 1, b"r"),
        )?;
        pass("ARP", &arp_request(EIP))?;
        let mut frag = steered.clone();
        frag[14 + 6] |= 0x20; // more fragments
        pass("a fragment", &frag)?;
        anyhow::ensure!(neighbour.status()?.success(), "ip neigh");
        let (rc, _) = run_xdp(&mut fx.dp.ebpf, "uplink_xdp", &steered, ifindex)?;
        assert_eq!(
            rc, XDP_TX,
            "and the steered reply once the neighbour is known"
        );
        assert_eq!(fx.all_drops(), 0, "XDP drops nothing itself");
        Ok(())
    })
}
