//! VXLAN over an IPv6 underlay (`CFG_UNDERLAY_V6`), written as `vxlan`
//! writes it over IPv4: the outer Ethernet, IPv6, UDP and VXLAN headers go
//! in front of the frame with `bpf_skb_adjust_room` and the packet leaves
//! by `bpf_redirect_neigh` toward the FIB's next hop, kept per CPU; when
//! that cannot be done, the VXLAN device encapsulates (an IPv6 tunnel key).
//!
//! The 4-byte endpoint the callers pass is an index into
//! `TUNNEL_ENDPOINTS` (see `egress_common::endpoints`); this node's own
//! address is the index in `DatapathConfig::node_tunnel_ip`.

use aya_ebpf::{
    bindings::{
        bpf_adj_room_mode::BPF_ADJ_ROOM_MAC, bpf_fib_lookup as FibParams, bpf_redir_neigh,
        bpf_tunnel_key, BPF_FIB_LKUP_RET_NO_NEIGH, BPF_FIB_LKUP_RET_SUCCESS,
        BPF_F_ADJ_ROOM_ENCAP_L3_IPV6, BPF_F_TUNINFO_IPV6, BPF_F_ZERO_CSUM_TX,
    },
    btf_maps::{Array, PerCpuArray},
    helpers::generated::{
        bpf_fib_lookup, bpf_redirect, bpf_redirect_neigh, bpf_skb_set_tunnel_key,
    },
    macros::btf_map,
    programs::TcContext,
};
use egress_common::{
    config::DatapathConfig,
    drops::{DROP_HELPER, DROP_NO_TUNNEL_ENDPOINT},
    endpoints::{index_of, TunnelEndpoint, TUNNEL_ENDPOINTS_SIZE},
};

use core::mem::{offset_of, size_of};

use crate::{hdr::*, pkt, verdict::Packed, vxlan};

/// Outer IPv6 + UDP + VXLAN, and the inner Ethernet header that follows.
pub const OUTER_LEN: usize = IPV6_LEN + 8 + 8;
pub const GROW: usize = OUTER_LEN + ETH_LEN;
const AF_INET6: u8 = 10;

/// The outer headers, in wire order.
#[repr(C)]
pub struct Outer {
    pub eth: EthHdr,
    pub ip: Ipv6Hdr,
    pub udp: UdpHdr,
    pub vxlan_flags: [u8; 4],
    pub vni: [u8; 4],
    pub inner_eth: EthHdr,
}

/// See `egress_common::endpoints`.
#[btf_map]
pub static TUNNEL_ENDPOINTS: Array<TunnelEndpoint, { TUNNEL_ENDPOINTS_SIZE as usize }> =
    Array::new();

/// A remote endpoint's next hop over IPv6.
#[repr(C)]
pub struct Hop {
    /// `clock::ticks()` from which the slot is no longer used.
    pub expires_tick: u64,
    /// The endpoint's index.
    pub remote: u32,
    pub ifindex: u32,
    /// The next-hop address as the FIB writes it (the endpoint itself
    /// when it is on-link).
    pub via: [u32; 4],
}

#[btf_map]
static TUNNEL_HOPS6: PerCpuArray<Hop, { crate::cache::SLOTS }> = PerCpuArray::new();

/// "Not here": the VXLAN device must do it.
const USE_DEVICE: u32 = 0xffff;

/// Sends the frame through the tunnel to the endpoint of index `remote`:
/// in our own headers, else by the VXLAN device. The three steps are out
/// of line and called one after the other, not one inside the next: the
/// FIB's and the tunnel key's parameter blocks would otherwise add up on
/// the callers' 512-byte stack.
#[inline(always)]
pub fn encap(ctx: &TcContext, cfg: &DatapathConfig, remote: [u8; 4], entropy: u32) -> Packed {
    let index = index_of(remote);
    let r = match prepare_hop(ctx, cfg, index).get() {
        Ok(_) => encapsulate_packed(ctx, cfg, index, entropy),
        Err(reason) => Packed::err(reason),
    };
    match r.get() {
        Err(USE_DEVICE) => via_vxlan_device(ctx, cfg, index, entropy),
        _ => r,
    }
}

/// Checks that the frame may go in our own headers to endpoint `index`
/// and that this CPU's slot holds its next hop (asking the FIB on a miss).
#[inline(never)]
fn prepare_hop(ctx: &TcContext, cfg: &DatapathConfig, index: u32) -> Packed {
    let (Some(to), Some(from)) = (endpoint(index), endpoint(index_of(cfg.node_tunnel_ip))) else {
        return Packed::err(DROP_NO_TUNNEL_ENDPOINT);
    };
    if !vxlan::fits_tunnel(ctx, cfg, ctx.len()) {
        return Packed::err(USE_DEVICE);
    }
    if hop_is_live(index) || (cfg.uplink_ifindex != 0 && fib_hop(ctx, cfg, index, from, to)) {
        return Packed::ok(0);
    }
    Packed::err(USE_DEVICE)
}

/// Writes the outer headers toward endpoint `index`, whose next hop
/// `prepare_hop` put in this CPU's slot, and sends the packet on.
#[inline(never)]
fn encapsulate_packed(ctx: &TcContext, cfg: &DatapathConfig, index: u32, entropy: u32) -> Packed {
    let (Some(to), Some(from), Some(hop)) = (
        endpoint(index),
        endpoint(index_of(cfg.node_tunnel_ip)),
        cached_hop(index),
    ) else {
        return Packed::err(USE_DEVICE);
    };
    let frame_len = ctx.len();
    if ctx
        .adjust_room(
            GROW as i32,
            BPF_ADJ_ROOM_MAC,
            vxlan::room_flags(ctx, BPF_F_ADJ_ROOM_ENCAP_L3_IPV6),
        )
        .is_err()
    {
        return Packed::err(USE_DEVICE);
    }
    let d = ctx.data();
    if d + size_of::<Outer>() > ctx.data_end() {
        // As over IPv4: the room is there, the headers cannot be written.
        return Packed::err(DROP_HELPER);
    }
    // Placeholders for a GSO packet, as over IPv4.
    let udp_len = ((OUTER_LEN - IPV6_LEN) as u32 + frame_len) as u16;
    let sport = 0xc000 | (entropy as u16 & 0x3fff);
    // SAFETY: `d .. d + size_of::<Outer>()` was bounds-checked above; no
    // helper call until the checksum update.
    let added = unsafe {
        vxlan::move_inner_eth(d, offset_of!(Outer, inner_eth), ETH_P_IPV6);
        write_outer_ip(d, udp_len, from, to, entropy);
        vxlan::write_udp_vxlan(d + offset_of!(Outer, udp), udp_len, sport, cfg);
        sum_of_new_bytes(d)
    };
    crate::ctx::csum_carry(ctx, added);
    // SAFETY: this CPU's slot, filled by `prepare_hop`.
    Packed::ok(i64::from(unsafe {
        redirect_neigh((*hop).ifindex, &(*hop).via)
    }))
}

/// The entry of endpoint `index` (read in place: copies would take the
/// stack this path does not have); `None` for index 0 or an unused one.
#[inline(always)]
pub(crate) fn endpoint(index: u32) -> Option<&'static [u8; 16]> {
    if index == 0 {
        return None;
    }
    let e = TUNNEL_ENDPOINTS.get_ptr(index)?;
    // SAFETY: a valid map value, 8-byte aligned, read as its four words.
    let w = unsafe { crate::mem::addr_words(&(*e).addr) };
    if w == [0; 4] {
        return None;
    }
    // SAFETY: as above; map values live as long as the program runs.
    Some(unsafe { &(*e).addr })
}

/// The four words of an address, in memory order.
#[inline(always)]
fn words(a: &[u8; 16]) -> [u32; 4] {
    // SAFETY: a map value's field at offset 0, 8-byte aligned.
    unsafe { crate::mem::addr_words(a) }
}

/// Version, traffic class 0 and the flow's entropy as the flow label (so
/// an IPv6 underlay's ECMP can spread flows on the label alone), the
/// payload length, UDP, hop limit 64, the addresses.
///
/// # Safety
/// `d .. d + size_of::<Outer>()` is inside the packet.
#[inline(always)]
pub(crate) unsafe fn write_outer_ip(
    d: usize,
    payload_len: u16,
    from: &[u8; 16],
    to: &[u8; 16],
    entropy: u32,
) {
    let (from, to) = (from.as_ptr() as *const u32, to.as_ptr() as *const u32);
    let ip = d + offset_of!(Outer, ip);
    let len = payload_len.to_be_bytes();
    let vtc_flow = (6u32 << 28) | (entropy & 0x000f_ffff);
    // SAFETY: see the function's contract.
    unsafe {
        pkt::store32(ip, u32::from_ne_bytes(vtc_flow.to_be_bytes()));
        pkt::store32(
            ip + 4,
            u32::from_ne_bytes([len[0], len[1], IPPROTO_UDP, 64]),
        );
        let mut i = 0;
        while i < 4 {
            pkt::store32(ip + IPV6_SADDR + 4 * i, *from.add(i));
            pkt::store32(ip + IPV6_DADDR + 4 * i, *to.add(i));
            i += 1;
        }
    }
}

/// What the new bytes add to skb->csum: the whole IPv6 header (it has no
/// checksum of its own to cancel its sum, unlike IPv4's), the UDP and VXLAN
/// headers and the inner Ethernet header.
///
/// # Safety
/// As `write_outer_ip`.
#[inline(always)]
unsafe fn sum_of_new_bytes(d: usize) -> u32 {
    let mut added = 0u64;
    let mut off = offset_of!(Outer, ip);
    // SAFETY: see the function's contract.
    unsafe {
        while off + 4 <= size_of::<Outer>() {
            added += u64::from(pkt::load32(d + off));
            off += 4;
        }
        added += u64::from(pkt::load16(d + off));
    }
    added = (added & 0xffff_ffff) + (added >> 32);
    ((added & 0xffff_ffff) + (added >> 32)) as u32
}

const _: () = assert!((size_of::<Outer>() - offset_of!(Outer, ip)) % 4 == 2);

/// This CPU's next-hop slot for endpoint `index`.
#[inline(always)]
fn cached_hop(index: u32) -> Option<*mut Hop> {
    TUNNEL_HOPS6.get_ptr_mut(hop_slot(index))
}

/// Whether this CPU's slot holds endpoint `index`'s next hop, unexpired.
#[inline(always)]
fn hop_is_live(index: u32) -> bool {
    let Some(slot) = cached_hop(index) else {
        return false;
    };
    // SAFETY: this CPU's slot; programs do not nest on one CPU.
    unsafe { (*slot).remote == index && crate::clock::ticks() < (*slot).expires_tick }
}

#[inline(always)]
fn hop_slot(index: u32) -> u32 {
    crate::cache::slot(index, 6)
}

/// Asks the FIB for the next hop of endpoint `index` and fills this CPU's
/// slot; false when there is no route. Out of line: the parameter block
/// stays off the packet path's frame.
#[inline(never)]
fn fib_hop(
    ctx: &TcContext,
    cfg: &DatapathConfig,
    index: u32,
    from: &[u8; 16],
    to: &[u8; 16],
) -> bool {
    let Some(slot) = TUNNEL_HOPS6.get_ptr_mut(hop_slot(index)) else {
        return false;
    };
    let mut p = core::mem::MaybeUninit::<FibParams>::uninit();
    // SAFETY: a zeroed parameter block is valid; it is made of 32-bit words.
    let p = unsafe { crate::mem::zeroed_in(&mut p) };
    p.family = AF_INET6;
    p.l4_protocol = IPPROTO_UDP;
    // As a packet arriving on the uplink would be routed.
    p.ifindex = cfg.uplink_ifindex;
    p.__bindgen_anon_3.ipv6_src = words(from);
    p.__bindgen_anon_4.ipv6_dst = words(to);
    // SAFETY: helper with a valid stack parameter block.
    let rc = unsafe { bpf_fib_lookup(ctx.skb.skb as *mut _, p, size_of::<FibParams>() as i32, 0) }
        as u32;
    // Without a neighbour entry the route is still known: the neighbour
    // subsystem resolves it when the packet leaves.
    if rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH {
        return false;
    }
    // SAFETY: the IPv6 member is the one the lookup wrote; this CPU's slot.
    unsafe {
        (*slot).remote = index;
        (*slot).ifindex = p.ifindex;
        (*slot).via = p.__bindgen_anon_4.ipv6_dst;
        (*slot).expires_tick = crate::cache::expiry(cfg);
    }
    true
}

/// Sends the packet out of `ifindex` toward the IPv6 next hop `via`.
#[inline(always)]
fn redirect_neigh(ifindex: u32, via: &[u32; 4]) -> i32 {
    let mut nh = core::mem::MaybeUninit::<bpf_redir_neigh>::uninit();
    // SAFETY: a zeroed block is valid, made of 32-bit words; the IPv6
    // member matches the family.
    let nh = unsafe { crate::mem::zeroed_in(&mut nh) };
    nh.nh_family = u32::from(AF_INET6);
    nh.__bindgen_anon_1.ipv6_nh = *via;
    // SAFETY: helper with a valid stack parameter block.
    unsafe { bpf_redirect_neigh(ifindex, nh, size_of::<bpf_redir_neigh>() as i32, 0) as i32 }
}

/// The VXLAN device's way over IPv6: the tunnel key names the remote
/// address (memory order words, as the kernel copies them) and the flow
/// label; the outer UDP checksum is left zero, as on our own headers.
#[inline(never)]
fn via_vxlan_device(ctx: &TcContext, cfg: &DatapathConfig, index: u32, entropy: u32) -> Packed {
    let Some(to) = endpoint(index) else {
        return Packed::err(DROP_NO_TUNNEL_ENDPOINT);
    };
    let mut key = core::mem::MaybeUninit::<bpf_tunnel_key>::uninit();
    // SAFETY: a zeroed bpf_tunnel_key is a valid value, 4-byte aligned.
    let key = unsafe { crate::mem::zeroed_in(&mut key) };
    key.tunnel_id = cfg.vni;
    key.__bindgen_anon_1.remote_ipv6 = words(to);
    key.tunnel_ttl = 64;
    key.tunnel_label = entropy & 0x000f_ffff;
    // SAFETY: skb pointer from the context; key is a valid stack buffer.
    let rc = unsafe {
        bpf_skb_set_tunnel_key(
            ctx.skb.skb,
            key,
            size_of::<bpf_tunnel_key>() as u32,
            u64::from(BPF_F_TUNINFO_IPV6 | BPF_F_ZERO_CSUM_TX),
        )
    };
    if rc != 0 {
        return Packed::err(DROP_HELPER);
    }
    // SAFETY: plain helper call.
    Packed::ok(unsafe { bpf_redirect(cfg.vxlan_ifindex, 0) })
}
