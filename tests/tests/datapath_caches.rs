//! The gateway paths' per-CPU caches (egress-ebpf/src/cache.rs) on the
//! real programs with BPF_PROG_TEST_RUN: a cached result is used, it
//! expires, and a change of the owned EIPs or of the steering (a new
//! `gateway_epoch`) is seen at once, without waiting for anything.
//!
//! Each test pins its thread to one CPU, so that every run sees the same
//! per-CPU cache. That a cached result is really used is shown by changing
//! what the full path reads (a neighbour's MAC, a steering entry) behind
//! the cache's back: the cache still answers the old way.

use std::net::Ipv4Addr;

use aya::maps::HashMap;
use egress_common::{
    drops::DROP_NO_STEERING,
    steering::{SteerKey, SteerTarget},
};
use egress_tests::{Netns, PinDir};
use egress_user::{
    datapath::{apply, stats, Datapath, DesiredMaps, NodeConfig, OwnedEip, ReplySteering},
    EBPF_OBJECT,
};
use etherparse::{NetSlice, PacketBuilder, SlicedPacket};

const TC_ACT_OK: u32 = 0;
const TC_ACT_SHOT: u32 = 2;
const TC_ACT_REDIRECT: u32 = 7;

const EIP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 10);
const SERVER: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 10);
const WORKER_TUNNEL: Ipv4Addr = Ipv4Addr::new(10, 100, 0, 21);
const BLOCK_SIZE: u16 = 1024;
const BLOCK: u16 = 40;
const MAC_A: &str = "02:00:00:00:0e:0a";
const MAC_B: &str = "02:00:00:00:0e:0b";

/// A gateway that owns `EIP` (if `owned`) and steers block `BLOCK` to a
/// remote worker (if `steered`).
fn gateway(owned: bool, steered: bool) -> DesiredMaps {
    DesiredMaps {
        config: NodeConfig {
            is_worker: false,
            is_gateway: true,
            vxlan_ifindex: 1,
            vni: 4242,
            uplink_ifindex: 1,
            tunnel_mtu: 1450,
            port_block_size: BLOCK_SIZE,
            node_tunnel_ip: Ipv4Addr::new(10, 100, 0, 11).into(),
            ..Default::default()
        },
        reply_steering: match steered {
            true => vec![ReplySteering {
                eip: EIP.into(),
                block: BLOCK,
                worker_tunnel_ip: WORKER_TUNNEL.into(),
                local: false,
            }],
            false => vec![],
        },
        owned_eips: match owned {
            true => vec![OwnedEip {
                eip: EIP.into(),
                answer_neigh: true,
                node_ip: false,
                epoch: 1,
            }],
            false => vec![],
        },
        ..Default::default()
    }
}

fn pin_thread_to_one_cpu() {
    // SAFETY: a zeroed cpu_set_t is valid; CPU_SET writes within it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(0, &mut set);
        assert_eq!(
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set),
            0,
            "sched_setaffinity"
        );
    }
}

fn udp4(src: Ipv4Addr, dst: Ipv4Addr, dport: u16, ttl: u8, payload: usize) -> Vec<u8> {
    let mut v = Vec::new();
    PacketBuilder::ethernet2([2, 0, 0, 0, 1, 5], [2, 0, 0, 0, 1, 1])
        .ipv4(src.octets(), dst.octets(), ttl)
        .udp(443, dport)
        .write(&mut v, &vec![0u8; payload])
        .unwrap();
    v
}

fn run(dp: &mut Datapath, prog: &str, pkt: &[u8]) -> anyhow::Result<(u32, Vec<u8>)> {
    egress_tests::run_classifier_complete(&mut dp.ebpf, prog, pkt)
}

/// The destination MAC and TTL of a forwarded frame, its IPv4 header
/// checksum verified by etherparse.
fn forwarded(frame: &[u8]) -> (String, u8) {
    let p = SlicedPacket::from_ethernet(frame).expect("output parses");
    let Some(NetSlice::Ipv4(ip)) = &p.net else {
        panic!("not IPv4")
    };
    let h = ip.header().to_header();
    assert_eq!(
        h.header_checksum,
        h.calc_header_checksum(),
        "IPv4 header checksum"
    );
    let mac = frame[..6]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":");
    (mac, h.time_to_live)
}

#[test]
#[ignore = "needs root: loads BPF programs in a network namespace"]
fn the_forward_cache_is_used_expires_and_follows_ownership() -> anyhow::Result<()> {
    // The FIB the gateway's lookup sees: SERVER on up0 (MTU 1280) at MAC_A.
    let ns = Netns::new("fwdc")?;
    ns.ip(&["link", "add", "up0", "type", "veth", "peer", "name", "up1"])?;
    ns.ip(&["link", "set", "up0", "mtu", "1280"])?;
    ns.ip(&["link", "set", "up1", "up"])?;
    ns.addr("up0", "203.0.113.1/24")?;
    ns.enable_forwarding()?;
    let pins = PinDir::new("fwdc")?;
    let pin_path = pins.path().to_owned();
    ns.enter(move || {
        pin_thread_to_one_cpu();
        // This thread is in the namespace; so is the `ip` it starts.
        let neigh = |mac: &str| -> anyhow::Result<()> {
            let s = SERVER.to_string();
            let st = std::process::Command::new("ip")
                .args([
                    "neigh",
                    "replace",
                    &s,
                    "lladdr",
                    mac,
                    "dev",
                    "up0",
                    "nud",
                    "permanent",
                ])
                .status()?;
            anyhow::ensure!(st.success(), "ip neigh replace");
            Ok(())
        };
        let mut dp = Datapath::load(EBPF_OBJECT, &pin_path)?;
        let pkt = udp4(EIP, SERVER, 53, 64, 18);

        // Without a lifetime (`cache_ticks` 0) no slot is ever used: each
        // packet asks the FIB, which sees a neighbour change at once.
        let mut no_lifetime = gateway(true, true);
        no_lifetime.config.cache_ticks = 0;
        apply(&mut dp, &no_lifetime)?;
        for mac in [MAC_B, MAC_A] {
            neigh(mac)?;
            let (rc, out) = run(&mut dp, "tunnel_ingress", &pkt)?;
            assert_eq!(rc, TC_ACT_REDIRECT);
            assert_eq!(forwarded(&out), (mac.to_string(), 63), "not cached");
        }

        let normal = gateway(true, true);
        apply(&mut dp, &normal)?;

        // The full path: forwarded by the FIB, and cached.
        let (rc, out) = run(&mut dp, "tunnel_ingress", &pkt)?;
        assert_eq!(rc, TC_ACT_REDIRECT);
        assert_eq!(forwarded(&out), (MAC_A.to_string(), 63));

        // The neighbour changes behind the cache's back: the cached MAC is used.
        neigh(MAC_B)?;
        let (rc, out) = run(&mut dp, "tunnel_ingress", &pkt)?;
        assert_eq!(rc, TC_ACT_REDIRECT);
        assert_eq!(
            forwarded(&out),
            (MAC_A.to_string(), 63),
            "answered by the cache"
        );

        // What the full path leaves to the kernel still goes to the kernel,
        // cached or not: an expiring TTL, a packet larger than the MTU.
        let expiring = udp4(EIP, SERVER, 53, 1, 18);
        assert_eq!(
            run(&mut dp, "tunnel_ingress", &expiring)?,
            (TC_ACT_OK, expiring)
        );
        let big = udp4(EIP, SERVER, 53, 64, 1372);
        assert_eq!(
            run(&mut dp, "tunnel_ingress", &big)?.0,
            TC_ACT_OK,
            "1400 bytes over a 1280 MTU: the kernel's answer"
        );

        // A slot lives `cache_ticks` kernel ticks (200 ms); after that the
        // FIB is asked again.
        let lifetime = egress_user::datapath::kernel_tick() * u32::from(normal.config.cache_ticks);
        assert!(lifetime <= std::time::Duration::from_millis(200));
        std::thread::sleep(lifetime + std::time::Duration::from_millis(50));
        let (rc, out) = run(&mut dp, "tunnel_ingress", &pkt)?;
        assert_eq!(rc, TC_ACT_REDIRECT);
        assert_eq!(
            forwarded(&out),
            (MAC_B.to_string(), 63),
            "the cache expired"
        );

        // The EIP is no longer owned: the cached result (just refreshed) is
        // ignored under the new epoch, and the packet is not forwarded.
        apply(&mut dp, &gateway(false, true))?;
        let (rc, _) = run(&mut dp, "tunnel_ingress", &pkt)?;
        assert_ne!(
            rc, TC_ACT_REDIRECT,
            "forwarded for an EIP it no longer owns"
        );
        Ok(())
    })
}

/// Both ways a steering result is read from the cache: by the headers
/// alone (IPv4 UDP/TCP) and after the full parse (here an echo reply,
/// whose identifier is the port).
#[test]
#[ignore = "needs root: loads BPF programs"]
fn the_steering_cache_is_used_and_follows_the_steering_and_ownership() -> anyhow::Result<()> {
    pin_thread_to_one_cpu();
    let mut echo_reply = Vec::new();
    PacketBuilder::ethernet2([2, 0, 0, 0, 1, 5], [2, 0, 0, 0, 1, 1])
        .ipv4(SERVER.octets(), EIP.octets(), 64)
        .icmpv4_echo_reply(BLOCK * BLOCK_SIZE + 9, 1)
        .write(&mut echo_reply, b"ping")?;
    for (what, reply) in [
        ("udp", udp4(SERVER, EIP, BLOCK * BLOCK_SIZE + 5, 64, 18)),
        ("echo reply", echo_reply),
    ] {
        steering_cache_round(what, &reply)?;
    }
    Ok(())
}

fn steering_cache_round(what: &str, reply: &[u8]) -> anyhow::Result<()> {
    let pins = PinDir::new("steerc")?;
    let mut dp = Datapath::load(EBPF_OBJECT, pins.path())?;
    apply(&mut dp, &gateway(true, true))?;
    let (rc, out) = run(&mut dp, "uplink_ingress", reply)?;
    assert_eq!(
        (rc, out.as_slice()),
        (TC_ACT_REDIRECT, reply),
        "{what}: steered, untouched"
    );

    // The steering entry goes behind the cache's back: the cache answers.
    {
        let mut m: HashMap<_, SteerKey, SteerTarget> =
            HashMap::try_from(dp.ebpf.map_mut("REPLY_STEERING").unwrap())?;
        let key = m.keys().next().expect("one steering entry")?;
        m.remove(&key)?;
    }
    assert_eq!(
        run(&mut dp, "uplink_ingress", reply)?.0,
        TC_ACT_REDIRECT,
        "{what}: cached"
    );

    // The same change made by the agent moves the epoch: seen at once.
    apply(&mut dp, &gateway(true, false))?;
    assert_eq!(
        run(&mut dp, "uplink_ingress", reply)?.0,
        TC_ACT_SHOT,
        "{what}"
    );
    let drops = stats::read_drops(pins.path())?[DROP_NO_STEERING as usize]
        .1
        .packets;
    assert_eq!(drops, 1, "{what}: dropped as no_steering");

    // Steered again, then the EIP is given up: not ours any more.
    apply(&mut dp, &gateway(true, true))?;
    assert_eq!(
        run(&mut dp, "uplink_ingress", reply)?.0,
        TC_ACT_REDIRECT,
        "{what}"
    );
    apply(&mut dp, &gateway(false, true))?;
    assert_eq!(
        run(&mut dp, "uplink_ingress", reply)?.0,
        TC_ACT_OK,
        "{what}: not owned"
    );
    Ok(())
}
