//! The XDP reply path over an IPv6 underlay (`CFG_UNDERLAY_V6`): a reply
//! `uplink_xdp` has steered to another node is put in outer IPv6, UDP and
//! VXLAN headers, the same bytes `vxlan6` writes on the TC path, with the
//! link addresses XDP must write itself, and sent back out by `XDP_TX`.
//! What it cannot send (no endpoint address, no route, an unresolved
//! neighbour, a next hop behind another device) is passed to TC.
//!
//! The worker endpoint the steering names is an index into
//! `TUNNEL_ENDPOINTS` (see `egress_common::endpoints`).

use aya_ebpf::{
    bindings::{bpf_fib_lookup as FibParams, xdp_action::XDP_TX, BPF_FIB_LKUP_RET_SUCCESS},
    btf_maps::PerCpuArray,
    helpers::generated::bpf_fib_lookup,
    macros::btf_map,
    programs::XdpContext,
};
use egress_common::{config::DatapathConfig, endpoints::index_of};

use core::mem::{offset_of, size_of};

use crate::{
    hdr::*,
    uplink_xdp::{count_tx, grow_head, write_outer_eth, TX_REPLY},
    vxlan6::{self, Outer, GROW, OUTER_LEN},
};

const AF_INET6: u8 = 10;

/// An IPv6 endpoint's next hop with its link addresses.
#[repr(C)]
pub struct XdpHop6 {
    /// `clock::ticks()` from which the slot is no longer used.
    pub expires_tick: u64,
    /// The endpoint's index.
    pub remote: u32,
    pub ifindex: u32,
    pub smac: [u8; 6],
    pub dmac: [u8; 6],
}

#[btf_map]
static XDP_HOPS6: PerCpuArray<XdpHop6, { crate::cache::SLOTS }> = PerCpuArray::new();

/// Encapsulates the steered reply toward the endpoint `worker` names and
/// sends it back out; `None`: nothing was changed, TC decides.
#[inline(always)]
pub fn reply(
    ctx: &XdpContext,
    cfg: &DatapathConfig,
    worker: [u8; 4],
    entropy: u32,
    frame_len: u32,
) -> Option<u32> {
    let index = index_of(worker);
    if !hop_is_live(index) && !fib_hop(ctx, cfg, index) {
        return None;
    }
    let hop = XDP_HOPS6.get_ptr(slot_of(index))?;
    // SAFETY: this CPU's slot, filled for `index` just now or before.
    let (ifindex, smac, dmac) = unsafe { ((*hop).ifindex, (*hop).smac, (*hop).dmac) };
    // XDP_TX leaves by the device the frame came in on, nothing else.
    if ifindex as usize != ctx.ingress_ifindex() {
        return None;
    }
    encapsulate(ctx, cfg, index, entropy, frame_len, smac, dmac)
}

#[inline(always)]
fn slot_of(index: u32) -> u32 {
    crate::cache::slot(index, 6)
}

/// Whether this CPU's slot holds endpoint `index`'s next hop, unexpired.
#[inline(always)]
fn hop_is_live(index: u32) -> bool {
    let Some(slot) = XDP_HOPS6.get_ptr(slot_of(index)) else {
        return false;
    };
    // SAFETY: this CPU's slot; programs do not nest on one CPU.
    unsafe { (*slot).remote == index && crate::clock::ticks() < (*slot).expires_tick }
}

/// Asks the FIB for endpoint `index`'s next hop and fills this CPU's slot;
/// false without an address for either end, a route or a resolved
/// neighbour (the TC path sends meanwhile, and the kernel resolves it).
/// Out of line: the parameter block stays off the program's frame.
#[inline(never)]
fn fib_hop(ctx: &XdpContext, cfg: &DatapathConfig, index: u32) -> bool {
    let (Some(to), Some(from)) = (
        vxlan6::endpoint(index),
        vxlan6::endpoint(index_of(cfg.node_tunnel_ip)),
    ) else {
        return false;
    };
    let Some(slot) = XDP_HOPS6.get_ptr_mut(slot_of(index)) else {
        return false;
    };
    let mut p = core::mem::MaybeUninit::<FibParams>::uninit();
    // SAFETY: a zeroed parameter block is valid; it is made of 32-bit words.
    let p = unsafe { crate::mem::zeroed_in(&mut p) };
    p.family = AF_INET6;
    p.l4_protocol = IPPROTO_UDP;
    p.ifindex = ctx.ingress_ifindex() as u32;
    // SAFETY: map values' fields at offset 0, 8-byte aligned.
    unsafe {
        p.__bindgen_anon_3.ipv6_src = crate::mem::addr_words(from);
        p.__bindgen_anon_4.ipv6_dst = crate::mem::addr_words(to);
    }
    // SAFETY: helper with the program's context and a valid stack block.
    let rc = unsafe { bpf_fib_lookup(ctx.ctx as *mut _, p, size_of::<FibParams>() as i32, 0) };
    if rc as u32 != BPF_FIB_LKUP_RET_SUCCESS {
        return false;
    }
    // SAFETY: this CPU's slot.
    unsafe {
        (*slot).remote = index;
        (*slot).ifindex = p.ifindex;
        (*slot).smac = p.smac;
        (*slot).dmac = p.dmac;
        (*slot).expires_tick = crate::cache::expiry(cfg);
    }
    true
}

/// Puts the outer Ethernet, IPv6, UDP and VXLAN headers in front of the
/// frame (which becomes the inner frame as it is) and sends it back out.
#[inline(always)]
fn encapsulate(
    ctx: &XdpContext,
    cfg: &DatapathConfig,
    index: u32,
    entropy: u32,
    frame_len: u32,
    smac: [u8; 6],
    dmac: [u8; 6],
) -> Option<u32> {
    let (to, from) = (
        vxlan6::endpoint(index)?,
        vxlan6::endpoint(index_of(cfg.node_tunnel_ip))?,
    );
    let d = grow_head::<GROW, { size_of::<Outer>() }>(ctx)?;
    let udp_len = ((OUTER_LEN - IPV6_LEN) as u32 + frame_len) as u16;
    let sport = 0xc000 | (entropy as u16 & 0x3fff);
    // SAFETY: `d .. d + size_of::<Outer>()` was bounds-checked above.
    unsafe {
        write_outer_eth(d, smac, dmac, ETH_P_IPV6);
        vxlan6::write_outer_ip(d, udp_len, from, to, entropy);
        crate::vxlan::write_udp_vxlan(d + offset_of!(Outer, udp), udp_len, sport, cfg);
    }
    count_tx(TX_REPLY, ctx);
    Some(XDP_TX)
}
