//! Answers the controller's datapath probes here, in the datapath, rather
//! than in the agent: a probe then tests what it claims to (this node's
//! uplink and programs), and an agent restart or crash does not look like a
//! dead gateway. The packet is egress-failover's 24-byte probe on UDP
//! `probe_port` to this node's tunnel address; the answer is what a passive
//! BFD-style session would send, computed from the request alone:
//! Down -> Init, Init/Up -> Up, AdminDown -> Down, with the asker's
//! discriminator echoed and this node's own (its tunnel address).

use aya_ebpf::{helpers::generated::bpf_redirect, programs::TcContext};
use egress_common::config::{DatapathConfig, CFG_UNDERLAY_V6};

use crate::{
    ctx::{fold, ptr_at, sum_words},
    hdr::*,
};

const MAGIC: [u8; 2] = *b"EG";
const VERSION: u8 = 1;
const STATE_DOWN: u8 = 1;
const STATE_INIT: u8 = 2;
const STATE_UP: u8 = 3;
const TTL: u8 = 64;

/// The probe message (egress_failover::probe::Packet on the wire).
#[repr(C)]
struct ProbeMsg {
    magic: [u8; 2],
    version: u8,
    state: u8,
    diag: u8,
    multiplier: u8,
    reserved: [u8; 2],
    my_disc: [u8; 4],
    your_disc: [u8; 4],
    desired_min_tx_ms: [u8; 4],
    required_min_rx_ms: [u8; 4],
}

/// UDP header and message: what the UDP checksum covers besides the
/// pseudo-header.
#[repr(C)]
struct ProbeUdp {
    udp: UdpHdr,
    msg: ProbeMsg,
}
const PROBE_UDP_LEN: usize = core::mem::size_of::<ProbeUdp>();
const IPV4_LEN: usize = core::mem::size_of::<Ipv4Hdr>();

/// The verdict for a probe to this node (answered out of the interface it
/// came in on), or `None` when the packet is not one.
#[inline(always)]
pub fn answer(ctx: &TcContext, cfg: &DatapathConfig) -> Option<i32> {
    // Over an IPv6 underlay the agent's socket answers (this answer is
    // IPv4's); `node_tunnel_ip` is an endpoint index there.
    if cfg.probe_port == 0 || cfg.flags & CFG_UNDERLAY_V6 != 0 {
        return None;
    }
    let eth: *mut EthHdr = ptr_at(ctx, 0).ok()?;
    let ip: *mut Ipv4Hdr = ptr_at(ctx, ETH_LEN).ok()?;
    let pu: *mut ProbeUdp = ptr_at(ctx, ETH_LEN + IPV4_LEN).ok()?;
    // SAFETY: all three bounds-checked by ptr_at; no helper call until the
    // redirect, so the pointers stay valid.
    unsafe {
        if (*eth).proto != ETH_P_IP.to_be_bytes()
            || (*ip).version_ihl != 0x45
            || (*ip).proto != IPPROTO_UDP
            || (*ip).daddr != cfg.node_tunnel_ip
            || u16::from_be_bytes((*ip).frag_off) & 0x3fff != 0
            || u16::from_be_bytes((*pu).udp.dest) != cfg.probe_port
            || u16::from_be_bytes((*pu).udp.len) as usize != PROBE_UDP_LEN
        {
            return None;
        }
        let m = &mut (*pu).msg;
        if m.magic != MAGIC || m.version != VERSION || m.multiplier == 0 || m.my_disc == [0; 4] {
            return None;
        }
        m.state = match m.state {
            STATE_DOWN => STATE_INIT,
            STATE_INIT | STATE_UP => STATE_UP,
            0 => STATE_DOWN,
            _ => return None,
        };
        m.diag = 0;
        m.your_disc = m.my_disc;
        m.my_disc = cfg.node_tunnel_ip;
        // Answer at whatever rate the asker sends.
        m.required_min_rx_ms = m.desired_min_tx_ms;

        let (smac, dmac) = ((*eth).src, (*eth).dst);
        (*eth).src = dmac;
        (*eth).dst = smac;
        let (sip, dip) = ((*ip).saddr, (*ip).daddr);
        (*ip).saddr = dip;
        (*ip).daddr = sip;
        (*ip).ttl = TTL;
        (*ip).check = [0; 2];
        (*ip).check = fold(sum_words(&*(ip as *const [u8; IPV4_LEN]), 0)).to_be_bytes();
        let (sport, dport) = ((*pu).udp.source, (*pu).udp.dest);
        (*pu).udp.source = dport;
        (*pu).udp.dest = sport;
        // A zero UDP checksum (none, legal over IPv4) stays zero.
        if (*pu).udp.check != [0; 2] {
            (*pu).udp.check = [0; 2];
            let mut sum = sum_words(&dip, 0);
            sum = sum_words(&sip, sum);
            sum += u32::from(IPPROTO_UDP) + PROBE_UDP_LEN as u32;
            sum = sum_words(&*(pu as *const [u8; PROBE_UDP_LEN]), sum);
            let mut c = fold(sum);
            if c == 0 {
                c = 0xffff;
            }
            (*pu).udp.check = c.to_be_bytes();
        }
        Some(bpf_redirect((*ctx.skb.skb).ifindex, 0) as i32)
    }
}
