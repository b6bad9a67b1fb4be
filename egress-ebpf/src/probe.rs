//! Answers the controller's datapath probes here, in the datapath, rather
//! than in the agent: a probe then tests what it claims to (this node's
//! uplink and programs), and an agent restart or crash does not look like a
//! dead gateway. The packet is egress-failover's 24-byte probe on UDP
//! `probe_port` to this node's tunnel address; the answer is what a passive
//! BFD-style session would send, computed from the request alone:
//! Down -> Init, Init/Up -> Up, AdminDown -> Down, with the asker's
//! discriminator echoed and this node's own (its tunnel address; over an
//! IPv6 underlay the XOR of the address's four words).

use aya_ebpf::{helpers::generated::bpf_redirect, programs::TcContext};
use egress_common::config::{DatapathConfig, CFG_UNDERLAY_V6};

use crate::{
    ctx::{fold, ptr_at, sum_words},
    hdr::*,
    pkt,
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
/// came in on), or `None` when the packet is not one. Not inlined: the
/// uplink program's own frame has no room for this rare path's.
#[inline(never)]
pub fn answer(ctx: &TcContext, cfg: &DatapathConfig) -> Option<i32> {
    if cfg.probe_port == 0 {
        return None;
    }
    if cfg.flags & CFG_UNDERLAY_V6 != 0 {
        answer_v6(ctx, cfg)
    } else {
        answer_v4(ctx, cfg)
    }
}

#[inline(always)]
fn answer_v4(ctx: &TcContext, cfg: &DatapathConfig) -> Option<i32> {
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
            || !is_probe(pu, cfg)
            || !rewrite(&mut (*pu).msg, cfg.node_tunnel_ip)
        {
            return None;
        }
        swap_macs(eth);
        let (sip, dip) = ((*ip).saddr, (*ip).daddr);
        (*ip).saddr = dip;
        (*ip).daddr = sip;
        (*ip).ttl = TTL;
        (*ip).check = [0; 2];
        (*ip).check = fold(sum_words(&*(ip as *const [u8; IPV4_LEN]), 0)).to_be_bytes();
        swap_ports(pu);
        // A zero UDP checksum (none, legal over IPv4) stays zero.
        if (*pu).udp.check != [0; 2] {
            let pseudo = sum_words(&dip, sum_words(&sip, 0));
            (*pu).udp.check = udp_checksum(pu, pseudo);
        }
        Some(bpf_redirect((*ctx.skb.skb).ifindex, 0) as i32)
    }
}

/// The same over IPv6: a UDP header right after the fixed header (the
/// prober sends no extension headers) to this node's endpoint, which the
/// config names by its index in `TUNNEL_ENDPOINTS`. The UDP checksum is
/// required over IPv6, so it is always written.
#[inline(always)]
fn answer_v6(ctx: &TcContext, cfg: &DatapathConfig) -> Option<i32> {
    let me = crate::vxlan6::endpoint(egress_common::endpoints::index_of(cfg.node_tunnel_ip))?;
    // SAFETY: a map value, 8-byte aligned; lives while the program runs.
    let mine = unsafe { crate::mem::addr_words(me) };
    let eth: *mut EthHdr = ptr_at(ctx, 0).ok()?;
    let ip: *mut Ipv6Hdr = ptr_at(ctx, ETH_LEN).ok()?;
    let pu: *mut ProbeUdp = ptr_at(ctx, ETH_LEN + IPV6_LEN).ok()?;
    let daddr = ip as usize + IPV6_DADDR;
    let saddr = ip as usize + IPV6_SADDR;
    // SAFETY: bounds-checked by ptr_at; the map lookup above was the last
    // helper call before the redirect, so the pointers stay valid.
    unsafe {
        let to = [
            pkt::load32(daddr),
            pkt::load32(daddr + 4),
            pkt::load32(daddr + 8),
            pkt::load32(daddr + 12),
        ];
        if (*eth).proto != ETH_P_IPV6.to_be_bytes()
            || (*ip).vtc_flow[0] >> 4 != 6
            || (*ip).nexthdr != IPPROTO_UDP
            || to != mine
            || !is_probe(pu, cfg)
        {
            return None;
        }
        let disc = mine[0] ^ mine[1] ^ mine[2] ^ mine[3];
        let disc = if disc == 0 { 1 } else { disc };
        if !rewrite(&mut (*pu).msg, disc.to_ne_bytes()) {
            return None;
        }
        swap_macs(eth);
        let mut i = 0;
        while i < 16 {
            let from = pkt::load32(saddr + i);
            pkt::store32(daddr + i, from);
            pkt::store32(saddr + i, mine[i / 4]);
            i += 4;
        }
        // No header checksum absorbs the new hop limit: skb->csum does.
        let old = u16::from_ne_bytes([(*ip).nexthdr, (*ip).hop_limit]);
        (*ip).hop_limit = TTL;
        crate::ctx::csum_carry(
            ctx,
            crate::ctx::word_delta(old, u16::from_ne_bytes([IPPROTO_UDP, TTL])),
        );
        swap_ports(pu);
        let pseudo = sum_words(&*(saddr as *const [u8; 32]), 0);
        (*pu).udp.check = udp_checksum(pu, pseudo);
        Some(bpf_redirect((*ctx.skb.skb).ifindex, 0) as i32)
    }
}

/// Whether the UDP header and message are a probe on the probe port.
///
/// # Safety
/// `pu` is bounds-checked.
#[inline(always)]
unsafe fn is_probe(pu: *const ProbeUdp, cfg: &DatapathConfig) -> bool {
    // SAFETY: see the function's contract.
    unsafe {
        u16::from_be_bytes((*pu).udp.dest) == cfg.probe_port
            && u16::from_be_bytes((*pu).udp.len) as usize == PROBE_UDP_LEN
    }
}

/// Turns the request into the answer in place; false when the message is
/// not a valid request.
#[inline(always)]
fn rewrite(m: &mut ProbeMsg, my_disc: [u8; 4]) -> bool {
    if m.magic != MAGIC || m.version != VERSION || m.multiplier == 0 || m.my_disc == [0; 4] {
        return false;
    }
    m.state = match m.state {
        STATE_DOWN => STATE_INIT,
        STATE_INIT | STATE_UP => STATE_UP,
        0 => STATE_DOWN,
        _ => return false,
    };
    m.diag = 0;
    m.your_disc = m.my_disc;
    m.my_disc = my_disc;
    // Answer at whatever rate the asker sends.
    m.required_min_rx_ms = m.desired_min_tx_ms;
    true
}

/// # Safety
/// `eth` is bounds-checked.
#[inline(always)]
unsafe fn swap_macs(eth: *mut EthHdr) {
    // SAFETY: see the function's contract.
    unsafe {
        let (smac, dmac) = ((*eth).src, (*eth).dst);
        (*eth).src = dmac;
        (*eth).dst = smac;
    }
}

/// # Safety
/// `pu` is bounds-checked.
#[inline(always)]
unsafe fn swap_ports(pu: *mut ProbeUdp) {
    // SAFETY: see the function's contract.
    unsafe {
        let (sport, dport) = ((*pu).udp.source, (*pu).udp.dest);
        (*pu).udp.source = dport;
        (*pu).udp.dest = sport;
    }
}

/// The UDP checksum of the answer over `pseudo`, the sum of the two
/// addresses (the length and protocol are added here).
///
/// # Safety
/// `pu` is bounds-checked.
#[inline(always)]
unsafe fn udp_checksum(pu: *mut ProbeUdp, pseudo: u32) -> [u8; 2] {
    // SAFETY: see the function's contract.
    unsafe {
        (*pu).udp.check = [0; 2];
        let mut sum = pseudo + u32::from(IPPROTO_UDP) + PROBE_UDP_LEN as u32;
        sum = sum_words(&*(pu as *const [u8; PROBE_UDP_LEN]), sum);
        match fold(sum) {
            0 => [0xff; 2],
            c => c.to_be_bytes(),
        }
    }
}
