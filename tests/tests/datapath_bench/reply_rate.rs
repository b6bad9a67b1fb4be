//! The gateway's reply path on one CPU: `uplink_xdp` in native XDP
//! against `uplink_ingress` alone (TC), in packets per second.
//!
//! Two beds alike: a gateway namespace whose uplink veth faces a "wire"
//! namespace. The wire end sends 64-byte UDP replies from the server to the
//! EIP (an `XDP_TX` program run in BPF_PROG_TEST_RUN's live-frames mode:
//! real frames into the veth, no skb on the sending side), and drops what
//! comes back with an `XDP_DROP` program, whose counter is the veth's
//! `xdp_drops`. The gateway steers each reply to the worker behind the wire
//! and sends it back out encapsulated: by `XDP_TX` in one bed (the agent's
//! own attach, `--uplink-xdp=native`), by the TC program's redirect in the
//! other (GRO on its uplink, which gives the veth NAPI to take the frames
//! in). The sending thread is pinned to one CPU and the veths' NAPI runs
//! in its softirqs, so the rate is what one CPU does: the sender and the
//! sink (the same in both beds) and the gateway's path (the difference).

use std::{
    os::fd::{AsFd, AsRawFd},
    time::Instant,
};

use anyhow::{ensure, Context, Result};
use egress_tests::{
    run_xdp_live,
    veth_xdp::{self, gro_on, rx_queues_sum, PeerProgram, Verdict},
};
use egress_user::datapath::uplink_xdp::{self, UplinkXdpMode};

use super::*;

/// Frames per run, runs per path (the paths take turns).
const FRAMES: u32 = 1_000_000;
pub const ROUNDS: usize = 5;
/// Live-frames batch (the kernel's default).
const BATCH: u32 = 64;
/// Words of the generator's frame template (`BENCH_FRAME_LEN` / 8 in
/// egress-ebpf/src/bench.rs).
const FRAME_WORDS: usize = 17;
/// The CPU the sending thread is pinned to.
const CPU: usize = 1;

struct ReplyBed {
    wire: Netns,
    _gw: Netns,
    _dp: Datapath,
    _pin: PinDir,
    _sink: PeerProgram,
    /// The benchmark object, for its traffic generator `bench_xdp_send`.
    sender: std::sync::Mutex<aya::Ebpf>,
    wire_ifindex: u32,
    /// A reply to the EIP, and a worker's packet through the tunnel.
    frames: [Vec<u8>; 2],
    pins: PathBuf,
}

const REPLY: usize = 0;
const FORWARD: usize = 1;

fn mac_text(m: [u8; 6]) -> String {
    m.map(|b| format!("{b:02x}")).join(":")
}

fn reply_bed(xdp: bool, underlay: Underlay) -> Result<ReplyBed> {
    let gw = Netns::new("xgw")?;
    let wire = Netns::new("xwire")?;
    link_veth(&gw, "eth1", &wire, "eth0")?;
    gw.addr("eth1", "203.0.113.2/24")?;
    wire.addr("eth0", "203.0.113.1/24")?;
    gw.enable_forwarding()?;
    let (wire_ifindex, wire_mac) = link_info(&wire, "eth0")?;
    // The worker's tunnel address lies behind the wire, as on a one-NIC node.
    gw.permanent_neighbour("eth1", "203.0.113.1", &mac_text(wire_mac))?;
    match underlay {
        Underlay::V4 => {
            // The gateway's tunnel endpoint, where workers send.
            gw.addr("eth1", "10.100.0.11/32")?;
            gw.route(&["10.100.0.21/32", "via", "203.0.113.1", "dev", "eth1"])?;
        }
        Underlay::V6 => {
            // On-link: the worker's endpoint is the wire's neighbour.
            let worker = underlay.node_addr(WORKER_NODE);
            gw.ip(&[
                "-6",
                "addr",
                "add",
                &underlay.node_cidr(GATEWAY_NODE),
                "dev",
                "eth1",
                "nodad",
            ])?;
            gw.permanent_neighbour("eth1", &worker, &mac_text(wire_mac))?;
        }
    }
    // And so is the server, to which the forward goes.
    gw.permanent_neighbour("eth1", SRV, &mac_text(wire_mac))?;
    gw.vxlan_external(VXLAN)?;
    let vx = link_info(&gw, VXLAN)?.0;
    let uplink = link_info(&gw, "eth1")?;
    let d = desired(false, true, vx, uplink, underlay);
    let pin = PinDir::new("xg")?;
    let path = pin.path().to_owned();
    let dp = gw.enter(move || {
        let mut dp = Datapath::load(EBPF_OBJECT, &path)?;
        apply(&mut dp, &d)?;
        dp.attach_vxlan(VXLAN)?;
        dp.attach_uplink("eth1")?;
        if xdp {
            let r = uplink_xdp::attach(&mut dp, UplinkXdpMode::Native, "eth1", uplink.0);
            ensure!(r.is_xdp(), "uplink_xdp not attached: {}", r.reason);
        }
        Ok(dp)
    })?;
    if !xdp {
        gro_on(&gw, "eth1")?;
    }
    let sink = PeerProgram::attach(&wire, "eth0", Verdict::Drop)?;
    let mut reply = Vec::new();
    PacketBuilder::ethernet2(wire_mac, uplink.1)
        .ipv4(ip4(SRV).octets(), ip4(EIP).octets(), 64)
        .udp(5201, 5 * BLOCK_SIZE + 7)
        .write(&mut reply, &[0u8; 22])?;
    let mut inner = vec![0x08, 0, 0, 0, 0, 0, 7, 0];
    PacketBuilder::ethernet2([2, 0, 0, 0, 0, 0x21], [2, 0, 0, 0, 0, 0x11])
        .ipv4(ip4(EIP).octets(), ip4(SRV).octets(), 64)
        .udp(5 * BLOCK_SIZE + 7, 5201)
        .write(&mut inner, &[0u8; 22])?;
    let mut forward = Vec::new();
    let outer = PacketBuilder::ethernet2(wire_mac, uplink.1);
    let outer = match underlay {
        Underlay::V4 => outer.ipv4([10, 100, 0, 21], [10, 100, 0, 11], 64),
        Underlay::V6 => outer.ipv6(
            underlay
                .node_addr(WORKER_NODE)
                .parse::<std::net::Ipv6Addr>()?
                .octets(),
            underlay
                .node_addr(GATEWAY_NODE)
                .parse::<std::net::Ipv6Addr>()?
                .octets(),
            64,
        ),
    };
    outer.udp(0xc001, 4789).write(&mut forward, &inner)?;
    // No outer UDP checksum, as the workers send it (RFC 7348, RFC 6935).
    let check = ETH_LEN + underlay.outer_ip_len() + 6;
    forward[check..check + 2].fill(0);
    let mut sender = aya::EbpfLoader::new().load(&bench_object()?)?;
    let p: &mut aya::programs::Xdp = sender
        .program_mut("bench_xdp_send")
        .context("bench_xdp_send")?
        .try_into()?;
    p.load()?;
    Ok(ReplyBed {
        wire,
        _gw: gw,
        _dp: dp,
        pins: pin.path().to_owned(),
        _pin: pin,
        _sink: sink,
        sender: std::sync::Mutex::new(sender),
        wire_ifindex,
        frames: [reply, forward],
    })
}

impl ReplyBed {
    /// Frames the wire's sink has dropped so far: the gateway's replies.
    fn sunk(&self) -> Result<u64> {
        Ok(rx_queues_sum(
            &veth_xdp::stats(&self.wire, "eth0")?,
            "xdp_drops",
        ))
    }

    /// One run of `frames[kind]`: (packets back, seconds from the first
    /// frame sent to the last one sunk).
    fn run(&self, kind: usize) -> Result<(u64, f64)> {
        let before = self.sunk()?;
        let frame = self.frames[kind].clone();
        let fd = {
            let mut sender = self.sender.lock().unwrap();
            let mut tpl = [0u8; FRAME_WORDS * 8];
            tpl[..frame.len()].copy_from_slice(&frame);
            let mut words = [0u64; FRAME_WORDS];
            for (w, b) in words.iter_mut().zip(tpl.chunks(8)) {
                *w = u64::from_ne_bytes(b.try_into().unwrap());
            }
            let mut m: aya::maps::Array<_, [u64; FRAME_WORDS]> =
                aya::maps::Array::try_from(sender.map_mut("BENCH_FRAME").context("BENCH_FRAME")?)?;
            m.set(0, words, 0)?;
            let p: &mut aya::programs::Xdp = sender
                .program_mut("bench_xdp_send")
                .context("bench_xdp_send")?
                .try_into()?;
            p.fd()?.as_fd().as_raw_fd()
        };
        let ifindex = self.wire_ifindex;
        let start = Instant::now();
        self.wire.enter(move || {
            pin_to_cpu(CPU)?;
            run_xdp_live(fd, &frame, ifindex, FRAMES, BATCH)
        })?;
        // What the softirqs had left for ksoftirqd is sunk within a few
        // milliseconds: the run ends at the first poll that sees no more.
        let mut last = self.sunk()?;
        loop {
            std::thread::sleep(Duration::from_millis(1));
            let now = self.sunk()?;
            if now == last {
                break;
            }
            last = now;
        }
        Ok((last - before, start.elapsed().as_secs_f64()))
    }
}

fn pin_to_cpu(cpu: usize) -> Result<()> {
    // SAFETY: a zeroed cpu_set_t with one bit set, for this thread only.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) != 0 {
            anyhow::bail!("sched_setaffinity: {}", std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// One direction's figures, medians over the rounds.
pub struct Rates {
    pub xdp_mpps: f64,
    pub tc_mpps: f64,
    /// Packets back over frames sent, worst run, per path.
    pub xdp_delivered: f64,
    pub tc_delivered: f64,
}

/// The reply's and the forward's rates.
pub struct GatewayRates {
    pub reply: Rates,
    pub forward: Rates,
}

impl GatewayRates {
    /// Figures of a machine whose kernel refuses the live-frames test run
    /// (`null` in the JSON line), so that the rest of the benchmark still
    /// reports.
    pub fn unmeasured() -> Self {
        let none = || Rates {
            xdp_mpps: f64::NAN,
            tc_mpps: f64::NAN,
            xdp_delivered: f64::NAN,
            tc_delivered: f64::NAN,
        };
        Self {
            reply: none(),
            forward: none(),
        }
    }
}

/// The rates on `underlay`.
pub fn gateway_rates(underlay: Underlay) -> Result<GatewayRates> {
    let beds = [reply_bed(true, underlay)?, reply_bed(false, underlay)?];
    // [kind][bed]: each round's rate.
    let mut mpps = [[Vec::new(), Vec::new()], [Vec::new(), Vec::new()]];
    let mut delivered = [[1.0f64; 2]; 2];
    for round in 0..ROUNDS {
        for kind in [REPLY, FORWARD] {
            for (i, bed) in beds.iter().enumerate() {
                let (n, s) = bed.run(kind)?;
                mpps[kind][i].push(n as f64 / s / 1e6);
                delivered[kind][i] = delivered[kind][i].min(n as f64 / f64::from(FRAMES));
            }
        }
        eprintln!(
            "round {round} ({underlay:?} underlay): gateway on one CPU: replies xdp {:.3} Mpps, \
             tc {:.3}; forwards xdp {:.3}, tc {:.3}",
            mpps[REPLY][0][round],
            mpps[REPLY][1][round],
            mpps[FORWARD][0][round],
            mpps[FORWARD][1][round]
        );
    }
    // The figures must be of the paths they name: every packet of the
    // XDP bed counted by `uplink_xdp` on its path, none of the TC bed's.
    let sent = u64::from(FRAMES) * ROUNDS as u64;
    let counted = |bed: &ReplyBed| -> Result<Vec<u64>> {
        let c = egress_user::datapath::stats::read_xdp_tx(&bed.pins).context("XDP_TX_COUNT")?;
        Ok(c.iter().map(|(_, c)| c.packets).collect())
    };
    let (x, t) = (counted(&beds[0])?, counted(&beds[1])?);
    ensure!(
        x.iter().all(|n| *n >= sent * 9 / 10) && t.iter().all(|n| *n == 0),
        "XDP_TX counted (reply, forward): {x:?} in the XDP bed (of {sent} each), {t:?} in the TC bed"
    );
    let mut rates = |kind: usize| -> Result<Rates> {
        let med = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let [x, t] = delivered[kind];
        ensure!(
            x > 0.9 && t > 0.9,
            "{} lost: xdp delivered {x:.3}, tc {t:.3}",
            ["replies", "forwards"][kind]
        );
        let [mx, mt] = &mut mpps[kind];
        Ok(Rates {
            xdp_mpps: med(mx),
            tc_mpps: med(mt),
            xdp_delivered: x,
            tc_delivered: t,
        })
    };
    Ok(GatewayRates {
        reply: rates(REPLY)?,
        forward: rates(FORWARD)?,
    })
}
