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
    os::fd::{AsRawFd, OwnedFd},
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
/// The CPU the sending thread is pinned to.
const CPU: usize = 1;

struct ReplyBed {
    wire: Netns,
    _gw: Netns,
    _dp: Datapath,
    _pin: PinDir,
    _sink: PeerProgram,
    sender: OwnedFd,
    wire_ifindex: u32,
    frame: Vec<u8>,
    pins: PathBuf,
}

fn mac_text(m: [u8; 6]) -> String {
    m.map(|b| format!("{b:02x}")).join(":")
}

fn reply_bed(xdp: bool) -> Result<ReplyBed> {
    let gw = Netns::new("xgw")?;
    let wire = Netns::new("xwire")?;
    link_veth(&gw, "eth1", &wire, "eth0")?;
    gw.addr("eth1", "203.0.113.2/24")?;
    wire.addr("eth0", "203.0.113.1/24")?;
    gw.enable_forwarding()?;
    let (wire_ifindex, wire_mac) = link_info(&wire, "eth0")?;
    // The worker's tunnel address lies behind the wire, as on a one-NIC node.
    gw.permanent_neighbour("eth1", "203.0.113.1", &mac_text(wire_mac))?;
    gw.route(&["10.100.0.21/32", "via", "203.0.113.1", "dev", "eth1"])?;
    gw.ip(&[
        "link", "add", VXLAN, "type", "vxlan", "external", "dstport", "4789",
    ])?;
    gw.ip(&["link", "set", VXLAN, "up"])?;
    let vx = link_info(&gw, VXLAN)?.0;
    let uplink = link_info(&gw, "eth1")?;
    let d = desired(false, true, vx, uplink);
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
    let mut frame = Vec::new();
    PacketBuilder::ethernet2(wire_mac, uplink.1)
        .ipv4(ip4(SRV).octets(), ip4(EIP).octets(), 64)
        .udp(5201, 5 * BLOCK_SIZE + 7)
        .write(&mut frame, &[0u8; 22])?;
    Ok(ReplyBed {
        wire,
        _gw: gw,
        _dp: dp,
        pins: pin.path().to_owned(),
        _pin: pin,
        _sink: sink,
        sender: veth_xdp::load(Verdict::Tx)?,
        wire_ifindex,
        frame,
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

    /// One run: (replies back, seconds from the first frame sent to the
    /// last reply sunk).
    fn run(&self) -> Result<(u64, f64)> {
        let before = self.sunk()?;
        let (fd, frame, ifindex) = (
            self.sender.as_raw_fd(),
            self.frame.clone(),
            self.wire_ifindex,
        );
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

/// Each path's figures: medians over the rounds.
pub struct ReplyRates {
    pub xdp_mpps: f64,
    pub tc_mpps: f64,
    /// Replies back over frames sent, worst run, per path.
    pub xdp_delivered: f64,
    pub tc_delivered: f64,
    /// Replies `uplink_xdp` counted in the XDP bed, and in the TC bed
    /// (none: it is not attached there).
    pub xdp_counted: u64,
    pub tc_counted: u64,
}

pub fn reply_rates() -> Result<ReplyRates> {
    let beds = [reply_bed(true)?, reply_bed(false)?];
    let mut mpps = [Vec::new(), Vec::new()];
    let mut delivered = [1.0f64, 1.0];
    for round in 0..ROUNDS {
        for (i, bed) in beds.iter().enumerate() {
            let (n, s) = bed.run()?;
            mpps[i].push(n as f64 / s / 1e6);
            delivered[i] = delivered[i].min(n as f64 / f64::from(FRAMES));
        }
        eprintln!(
            "round {round}: gateway replies on one CPU: xdp {:.3} Mpps, tc {:.3} Mpps",
            mpps[0][round], mpps[1][round]
        );
    }
    let counted = |bed: &ReplyBed| -> Result<u64> {
        Ok(egress_user::datapath::stats::read_xdp_replies(&bed.pins)
            .context("XDP_REPLIES")?
            .packets)
    };
    let med = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let r = ReplyRates {
        xdp_mpps: med(&mut mpps[0]),
        tc_mpps: med(&mut mpps[1]),
        xdp_delivered: delivered[0],
        tc_delivered: delivered[1],
        xdp_counted: counted(&beds[0])?,
        tc_counted: counted(&beds[1])?,
    };
    // The figures must be of the paths they name.
    let sent = u64::from(FRAMES) * ROUNDS as u64;
    ensure!(
        r.xdp_counted >= sent * 9 / 10 && r.tc_counted == 0,
        "XDP replies counted: {} in the XDP bed (of {sent} sent), {} in the TC bed",
        r.xdp_counted,
        r.tc_counted
    );
    ensure!(
        r.xdp_delivered > 0.9 && r.tc_delivered > 0.9,
        "replies lost: xdp delivered {:.3}, tc {:.3}",
        r.xdp_delivered,
        r.tc_delivered
    );
    Ok(r)
}
