//! `uplink_xdp`, XDP on a gateway's uplink (native mode, where the driver
//! has it): the common reply, an IPv4 TCP or UDP packet to an owned EIP
//! whose port block is steered to another node, is encapsulated toward
//! that node and sent back out of the uplink with `XDP_TX`, before the
//! kernel allocates an skb (as a load balancer like Katran does). Anything
//! else (ARP, NDP, probes, fragments, IPv6, ICMP, a local pod, a next hop
//! whose neighbour is not resolved or that lies behind another device, a
//! frame too large for the tunnel) is passed on to `uplink_ingress`, the
//! TC program, which decides it as it always has; so does every packet
//! this program would drop, so drops stay counted in one place. Over an
//! IPv6 underlay the reply goes in IPv6 outer headers (`xdp_reply6`). The
//! gateway's forward (a worker's VXLAN packet from an owned EIP, out to
//! the server) is taken here too, over either underlay: `xdp_forward`.

use aya_ebpf::{
    bindings::{
        bpf_fib_lookup as FibParams,
        xdp_action::{XDP_PASS, XDP_TX},
        BPF_FIB_LKUP_RET_SUCCESS,
    },
    btf_maps::PerCpuArray,
    helpers::generated::{bpf_fib_lookup, bpf_xdp_adjust_head},
    macros::{btf_map, xdp},
    programs::XdpContext,
};
use egress_common::{
    config::{DatapathConfig, CFG_GATEWAY, CFG_UNDERLAY_V6},
    maps::XDP_TX_PATHS,
    steering::STEER_LOCAL,
    TrafficCounter,
};

use core::mem::{offset_of, size_of};

use crate::{
    cache::{cached_steering_v4, remember_steering},
    hdr::*,
    maps::{CONFIG, OWNED_EIPS, REPLY_STEERING},
    pkt,
    uplink::{steer_key, PlainReplyV4},
    vxlan::{write_outer_ip, write_udp_vxlan, Outer, GROW, OUTER_LEN},
    xdp_forward,
};

const AF_INET: u8 = 2;

/// A remote tunnel endpoint's next hop with its link addresses, which XDP
/// must write itself (there is no neighbour subsystem to do it).
#[repr(C)]
pub struct XdpHop {
    /// `clock::ticks()` from which the slot is no longer used.
    pub expires_tick: u64,
    pub remote: [u8; 4],
    pub ifindex: u32,
    pub smac: [u8; 6],
    pub dmac: [u8; 6],
}

#[btf_map]
static XDP_HOPS: PerCpuArray<XdpHop, { crate::cache::SLOTS }> = PerCpuArray::new();

/// What this program sent back out by `XDP_TX` (packets, bytes as sent),
/// by path: `egress_common::maps::XDP_TX_PATHS`.
#[btf_map]
pub static XDP_TX_COUNT: PerCpuArray<TrafficCounter, { XDP_TX_PATHS.len() }> = PerCpuArray::new();

pub const TX_REPLY: u32 = 0;
pub const TX_FORWARD: u32 = 1;

/// Counts the frame `ctx` holds now under `path`.
#[inline(always)]
pub fn count_tx(path: u32, ctx: &XdpContext) {
    if let Some(c) = XDP_TX_COUNT.get_ptr_mut(path) {
        // SAFETY: this CPU's slot.
        unsafe {
            (*c).packets += 1;
            (*c).bytes += (ctx.data_end() - ctx.data()) as u64;
        }
    }
}

#[xdp]
pub fn uplink_xdp(ctx: XdpContext) -> u32 {
    uplink_xdp_verdict(&ctx)
}

#[inline(always)]
pub fn uplink_xdp_verdict(ctx: &XdpContext) -> u32 {
    try_uplink_xdp(ctx).unwrap_or(XDP_PASS)
}

#[inline(always)]
fn try_uplink_xdp(ctx: &XdpContext) -> Option<u32> {
    let cfg = CONFIG.get(0)?;
    let bs = cfg.port_block_size;
    if cfg.flags & CFG_GATEWAY == 0 || bs == 0 || cfg.gateway_epoch == 0 {
        return None;
    }
    let v6_underlay = cfg.flags & CFG_UNDERLAY_V6 != 0;
    if v6_underlay {
        if xdp_forward::is_tunnel_packet_v6(ctx, cfg) {
            return xdp_forward::forward::<{ xdp_forward::STRIP_V6 }>(ctx, cfg);
        }
    } else if xdp_forward::is_tunnel_packet(ctx, cfg) {
        return xdp_forward::forward::<{ xdp_forward::STRIP_V4 }>(ctx, cfg);
    }
    let frame_len = (ctx.data_end() - ctx.data()) as u32;
    if cfg.tunnel_mtu != 0 && frame_len > u32::from(cfg.tunnel_mtu) + ETH_LEN as u32 {
        // The TC path sends it to the device, which fragments the outer packet.
        return None;
    }
    let r = PlainReplyV4::read(ctx.data(), ctx.data_end())?;
    let (flags, worker) = steering_of(cfg, r.daddr, r.dport / bs)?;
    if flags & STEER_LOCAL != 0 {
        return None;
    }
    if v6_underlay {
        return crate::xdp_reply6::reply(ctx, cfg, worker, r.entropy(), frame_len);
    }
    let hop = next_hop(ctx, cfg, worker)?;
    // XDP_TX leaves by the device the frame came in on, nothing else.
    if hop.ifindex as usize != ctx.ingress_ifindex() {
        return None;
    }
    let (smac, dmac) = (hop.smac, hop.dmac);
    encapsulate(ctx, cfg, worker, r.entropy(), frame_len, smac, dmac)
}

/// The steering of (EIP, block): this CPU's cache, else the tables (an
/// owned EIP and a steering entry for the block), cached for next time.
#[inline(always)]
fn steering_of(cfg: &DatapathConfig, daddr: u32, block: u16) -> Option<(u32, [u8; 4])> {
    if let Some(s) = cached_steering_v4(daddr, block, cfg.gateway_epoch) {
        return Some(s);
    }
    let eip = crate::mem::v4_mapped(&daddr.to_ne_bytes());
    OWNED_EIPS.get_ptr(&eip)?;
    // SAFETY: valid map value pointer, copied at once.
    let t = unsafe { *REPLY_STEERING.get_ptr(&steer_key(&eip, block))? };
    remember_steering(&eip, block, cfg.gateway_epoch, t.flags, t.worker_tunnel_ip);
    Some((t.flags, t.worker_tunnel_ip))
}

/// This CPU's live next hop for `remote`, asking the FIB on a miss. Only a
/// resolved neighbour is used: the TC path sends the first packets and
/// the kernel resolves it meanwhile.
#[inline(always)]
fn next_hop<'a>(ctx: &XdpContext, cfg: &DatapathConfig, remote: [u8; 4]) -> Option<&'a XdpHop> {
    let r = u32::from_ne_bytes(remote);
    let slot = XDP_HOPS.get_ptr_mut(crate::cache::slot(r, 0))?;
    // SAFETY: this CPU's slot; programs do not nest on one CPU.
    unsafe {
        if (*slot).remote == remote && crate::clock::ticks() < (*slot).expires_tick {
            return Some(&*slot);
        }
    }
    let mut p = core::mem::MaybeUninit::<FibParams>::uninit();
    // SAFETY: a zeroed parameter block is valid; it is made of 32-bit words.
    let p = unsafe { crate::mem::zeroed_in(&mut p) };
    p.family = AF_INET;
    p.l4_protocol = IPPROTO_UDP;
    p.ifindex = ctx.ingress_ifindex() as u32;
    p.__bindgen_anon_3.ipv4_src = u32::from_ne_bytes(cfg.node_tunnel_ip);
    p.__bindgen_anon_4.ipv4_dst = r;
    // SAFETY: helper with the program's context and a valid stack block.
    let rc = unsafe { bpf_fib_lookup(ctx.ctx as *mut _, p, size_of::<FibParams>() as i32, 0) };
    if rc as u32 != BPF_FIB_LKUP_RET_SUCCESS {
        return None;
    }
    // SAFETY: as above.
    unsafe {
        (*slot).remote = remote;
        (*slot).ifindex = p.ifindex;
        (*slot).smac = p.smac;
        (*slot).dmac = p.dmac;
        (*slot).expires_tick = crate::cache::expiry(cfg);
        Some(&*slot)
    }
}

/// Puts the outer Ethernet, IPv4, UDP and VXLAN headers in front of the
/// frame (which becomes the inner frame as it is) and sends it back out.
#[inline(always)]
fn encapsulate(
    ctx: &XdpContext,
    cfg: &DatapathConfig,
    remote: [u8; 4],
    entropy: u32,
    frame_len: u32,
    smac: [u8; 6],
    dmac: [u8; 6],
) -> Option<u32> {
    // The outer Ethernet header and `OUTER_LEN`; the frame's own Ethernet
    // header becomes the inner one where it is.
    let d = grow_head::<GROW, { size_of::<Outer>() }>(ctx)?;
    let ip_len = (OUTER_LEN as u32 + frame_len) as u16;
    let sport = 0xc000 | (entropy as u16 & 0x3fff);
    // SAFETY: `d .. d + size_of::<Outer>()` was bounds-checked above.
    unsafe {
        write_outer_eth(d, smac, dmac, ETH_P_IP);
        write_outer_ip(d, ip_len, cfg.node_tunnel_ip, remote);
        write_udp_vxlan(d + offset_of!(Outer, udp), ip_len - 20, sport, cfg);
    }
    count_tx(TX_REPLY, ctx);
    Some(XDP_TX)
}

/// Makes room for `HEAD` bytes of outer headers in front of the frame;
/// the new start, where `WRITTEN` bytes (the outer headers and the inner
/// Ethernet header) lie inside the frame. `None`: nothing was changed.
#[inline(always)]
pub fn grow_head<const HEAD: usize, const WRITTEN: usize>(ctx: &XdpContext) -> Option<usize> {
    // SAFETY: helper with the program's context.
    if unsafe { bpf_xdp_adjust_head(ctx.ctx, -(HEAD as i32)) } != 0 {
        return None;
    }
    let d = ctx.data();
    if d + WRITTEN > ctx.data_end() {
        // Cannot happen (the frame held at least its own headers); give
        // the room back and let TC decide.
        // SAFETY: as above.
        unsafe { bpf_xdp_adjust_head(ctx.ctx, HEAD as i32) };
        return None;
    }
    Some(d)
}

/// The outer Ethernet header at `d`: to the next hop, from the uplink,
/// of the underlay's `ethertype`.
///
/// # Safety
/// `d .. d + ETH_LEN` is inside the packet.
#[inline(always)]
pub unsafe fn write_outer_eth(d: usize, smac: [u8; 6], dmac: [u8; 6], ethertype: u16) {
    let w = u32::from_ne_bytes;
    let h = u16::from_ne_bytes;
    let e = d + offset_of!(Outer, eth);
    // SAFETY: see the function's contract.
    unsafe {
        pkt::store32(e, w([dmac[0], dmac[1], dmac[2], dmac[3]]));
        pkt::store32(e + 4, w([dmac[4], dmac[5], smac[0], smac[1]]));
        pkt::store32(e + 8, w([smac[2], smac[3], smac[4], smac[5]]));
        pkt::store16(e + 12, h(ethertype.to_be_bytes()));
    }
}
