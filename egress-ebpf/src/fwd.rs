//! Leaving the program: into the VXLAN tunnel, out by the FIB, or to a pod.

use aya_ebpf::{
    bindings::{
        bpf_fib_lookup as FibParams, bpf_redir_neigh, bpf_tunnel_key, BPF_FIB_LKUP_RET_NO_NEIGH,
        BPF_FIB_LKUP_RET_SUCCESS, BPF_F_ZERO_CSUM_TX, TC_ACT_OK,
    },
    helpers::generated::{
        bpf_fib_lookup, bpf_redirect, bpf_redirect_neigh, bpf_skb_set_tunnel_key,
    },
    programs::TcContext,
};
use egress_common::{
    config::{DatapathConfig, CFG_UNDERLAY_V6},
    drops::*,
};

use crate::{
    ctx::{csum_update16, ptr_at},
    flow::Flow,
    hdr::*,
    verdict::Packed,
};

const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;

/// Sends the frame through the tunnel to `remote`: in VXLAN headers the
/// program writes itself (see `vxlan`), or, when that cannot be done, by
/// the node's VXLAN device.
#[inline(always)]
pub fn encap(
    ctx: &TcContext,
    cfg: &DatapathConfig,
    remote: [u8; 4],
    entropy: u32,
) -> Result<i32, u32> {
    if cfg.flags & CFG_UNDERLAY_V6 != 0 {
        return crate::vxlan6::encap(ctx, cfg, remote, entropy)
            .get()
            .map(|v| v as i32);
    }
    if let Some(v) = crate::vxlan::encapsulate(ctx, cfg, remote, entropy) {
        return Ok(v);
    }
    via_vxlan_device(ctx, cfg.vni, remote, cfg.vxlan_ifindex)
}

/// Sets the VXLAN metadata (remote endpoint, VNI) and redirects to the
/// VXLAN device `ifindex`, which encapsulates. The outer UDP checksum is
/// left zero, as RFC 7348 recommends for VXLAN over IPv4 and as a kernel
/// VXLAN device does by default: the inner packet has its own checksums,
/// and a GSO packet with an outer checksum must be segmented in software
/// by devices that cannot compute one per segment.
#[inline(always)]
pub fn via_vxlan_device(
    ctx: &TcContext,
    vni: u32,
    remote: [u8; 4],
    ifindex: u32,
) -> Result<i32, u32> {
    let mut key = core::mem::MaybeUninit::<bpf_tunnel_key>::uninit();
    // SAFETY: a zeroed bpf_tunnel_key is a valid value, 4-byte aligned.
    let key = unsafe { crate::mem::zeroed_in(&mut key) };
    key.tunnel_id = vni;
    key.__bindgen_anon_1.remote_ipv4 = u32::from_be_bytes(remote);
    key.tunnel_ttl = 64;
    // SAFETY: skb pointer from the context; key is a valid stack buffer.
    let rc = unsafe {
        bpf_skb_set_tunnel_key(
            ctx.skb.skb,
            key,
            core::mem::size_of::<bpf_tunnel_key>() as u32,
            u64::from(BPF_F_ZERO_CSUM_TX),
        )
    };
    if rc != 0 {
        return Err(DROP_HELPER);
    }
    // SAFETY: plain helper call.
    Ok(unsafe { bpf_redirect(ifindex, 0) } as i32)
}

/// Delivers a reply (already translated back: its destination is the
/// pod) to the pod. With the MACs learned from the pod's own frames (see
/// `egress_common::pod_link`) it is written and sent out of the device the
/// pod's frames came in on, whatever the wiring; without (the pod has sent
/// nothing since the table lost it) the kernel's neighbour table of
/// `ifindex`, the NAT entry's device, fills the MACs in.
#[inline(never)]
pub fn to_pod(ctx: &TcContext, v6: bool, ifindex: u32) -> i32 {
    if let Some(v) = to_pod_by_link(ctx, v6) {
        return v;
    }
    // SAFETY: NULL params: the kernel looks the next hop up itself.
    unsafe { bpf_redirect_neigh(ifindex, core::ptr::null_mut(), 0, 0) as i32 }
}

#[inline(always)]
fn to_pod_by_link(ctx: &TcContext, v6: bool) -> Option<i32> {
    let pod: egress_common::addr::Addr = if v6 {
        ctx.load(ETH_LEN + IPV6_DADDR).ok()?
    } else {
        egress_common::addr::v4_mapped(ctx.load(ETH_LEN + IPV4_DADDR).ok()?)
    };
    // SAFETY: valid map value pointer, copied at once.
    let link = unsafe { *crate::maps::POD_LINKS.get_ptr(&pod)? };
    let mut macs = [0u8; 12];
    macs[..6].copy_from_slice(&link.pod_mac);
    macs[6..].copy_from_slice(&link.gateway_mac);
    ctx.store(0, &macs, 0).ok()?;
    // SAFETY: plain helper call.
    Some(unsafe { bpf_redirect(link.ifindex, 0) } as i32)
}

/// Learns (or refreshes) how to reach the pod that sent this frame: its
/// MAC, the MAC it sent to, and the device it came in on. Run on a new
/// flow, so a pod that moved to another bridge port or was re-created
/// with the same address is found again at its next connection.
#[inline(always)]
pub fn learn_pod_link(ctx: &TcContext, pod: &egress_common::addr::Addr) {
    let macs: [u8; 12] = match ctx.load(0) {
        Ok(m) => m,
        Err(_) => return,
    };
    // SAFETY: skb pointer from the context.
    let ifindex = unsafe { (*ctx.skb.skb).ifindex };
    let mut link = egress_common::pod_link::PodLink {
        ifindex,
        ..Default::default()
    };
    link.gateway_mac.copy_from_slice(&macs[..6]);
    link.pod_mac.copy_from_slice(&macs[6..]);
    if let Some(old) = crate::maps::POD_LINKS.get_ptr(pod) {
        // SAFETY: valid map value pointer.
        if unsafe { *old } == link {
            return;
        }
    }
    let _ = crate::maps::POD_LINKS.insert(pod, &link, 0);
}

/// Hands the packet to the kernel's own forwarding. A frame decapsulated
/// from the tunnel carries the inner MAC of the pod's side, so it is marked
/// as addressed to this host first (the stack drops "other host" frames).
#[inline(always)]
pub fn to_stack(ctx: &TcContext) -> i32 {
    let _ = ctx.change_type(0); // PACKET_HOST
    TC_ACT_OK as i32
}

/// Forwards by the FIB: decrements TTL / hop limit, writes the MACs and
/// redirects; without a neighbour entry lets the kernel resolve it. Anything
/// the FIB cannot forward goes to the stack (TC_ACT_OK), which also sends
/// "time exceeded" for an expiring TTL. With a `cache_epoch` (not 0) a
/// successful result is kept in this CPU's forward cache (see `cache`).
#[inline(always)]
fn forward_by_fib(ctx: &mut TcContext, f: &Flow, cache_epoch: u32) -> Result<i32, u32> {
    let mut p = core::mem::MaybeUninit::<FibParams>::uninit();
    // SAFETY: a zeroed parameter block is valid; it is made of 32-bit words.
    let p = unsafe { crate::mem::zeroed_in(&mut p) };
    fill_fib_params(ctx, f, p);
    // SAFETY: helper with a valid stack parameter block.
    let rc = unsafe {
        bpf_fib_lookup(
            ctx.skb.skb as *mut _,
            p,
            core::mem::size_of::<FibParams>() as i32,
            0,
        )
    };
    let rc = rc as u32;
    if rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH {
        return Ok(to_stack(ctx));
    }
    if !decrement_ttl(ctx, f)? {
        return Ok(to_stack(ctx));
    }
    if rc == BPF_FIB_LKUP_RET_NO_NEIGH {
        return Ok(redirect_to_next_hop(p));
    }
    if cache_epoch != 0 {
        remember_fib_result(f, p, cache_epoch);
    }
    out_by_mac(ctx, p.ifindex, p.smac, p.dmac)
}

/// The lookup's question: the packet's addresses, protocol and ports, as
/// it arrived on its interface.
#[inline(always)]
fn fill_fib_params(ctx: &TcContext, f: &Flow, p: &mut FibParams) {
    // SAFETY: skb pointer from the context.
    p.ifindex = unsafe { (*ctx.skb.skb).ifindex };
    p.l4_protocol = f.proto;
    p.sport = f.sport.to_be();
    p.dport = f.dport.to_be();
    // tot_len 0: the kernel checks the skb itself against the egress MTU,
    // which is right for GRO/GSO packets (larger than the MTU, segmented
    // later), and reports that MTU back in `mtu_result`.
    p.__bindgen_anon_1.tot_len = 0;
    if !f.v6 {
        p.family = AF_INET;
        p.__bindgen_anon_3.ipv4_src =
            u32::from_ne_bytes([f.src[12], f.src[13], f.src[14], f.src[15]]);
        p.__bindgen_anon_4.ipv4_dst =
            u32::from_ne_bytes([f.dst[12], f.dst[13], f.dst[14], f.dst[15]]);
        return;
    }
    p.family = AF_INET6;
    let mut s = [0u32; 4];
    let mut d = [0u32; 4];
    let mut i = 0;
    while i < 4 {
        s[i] = u32::from_ne_bytes([
            f.src[4 * i],
            f.src[4 * i + 1],
            f.src[4 * i + 2],
            f.src[4 * i + 3],
        ]);
        d[i] = u32::from_ne_bytes([
            f.dst[4 * i],
            f.dst[4 * i + 1],
            f.dst[4 * i + 2],
            f.dst[4 * i + 3],
        ]);
        i += 1;
    }
    p.__bindgen_anon_3.ipv6_src = s;
    p.__bindgen_anon_4.ipv6_dst = d;
}

/// A route without a neighbour entry: the lookup left the next hop in the
/// destination field; the kernel resolves the neighbour without routing
/// again.
#[inline(always)]
fn redirect_to_next_hop(p: &FibParams) -> i32 {
    let mut nh = core::mem::MaybeUninit::<bpf_redir_neigh>::uninit();
    // SAFETY: a zeroed block is valid, made of 32-bit words; the union
    // member matches the family.
    let nh = unsafe { crate::mem::zeroed_in(&mut nh) };
    if p.family == AF_INET6 {
        nh.nh_family = u32::from(AF_INET6);
        // SAFETY: the lookup wrote an IPv6 next hop when it set AF_INET6.
        nh.__bindgen_anon_1.ipv6_nh = unsafe { p.__bindgen_anon_4.ipv6_dst };
    } else {
        nh.nh_family = u32::from(AF_INET);
        // SAFETY: IPv4 family: the IPv4 member is the one written.
        nh.__bindgen_anon_1.ipv4_nh = unsafe { p.__bindgen_anon_4.ipv4_dst };
    }
    // SAFETY: helper with a valid stack parameter block.
    let rc = unsafe {
        bpf_redirect_neigh(
            p.ifindex,
            nh,
            core::mem::size_of::<bpf_redir_neigh>() as i32,
            0,
        )
    };
    rc as i32
}

/// Keeps a successful lookup in this CPU's forward cache under `epoch`.
/// The slow path: the config is read again rather than passed down.
#[inline(always)]
fn remember_fib_result(f: &Flow, p: &FibParams, epoch: u32) {
    let (Some(s), Some(cfg)) = (
        crate::cache::fwd_slot(&f.src, &f.dst),
        crate::maps::CONFIG.get(0),
    ) else {
        return;
    };
    // SAFETY: this CPU's slot; programs do not nest on one CPU.
    unsafe {
        (*s).src = f.src;
        (*s).dst = f.dst;
        (*s).expires_tick = crate::cache::expiry(cfg);
        (*s).epoch = epoch;
        (*s).ifindex = p.ifindex;
        (*s).mtu = u32::from(p.__bindgen_anon_1.mtu_result);
        crate::mem::copy_bytes(&mut (*s).smac, &p.smac);
        crate::mem::copy_bytes(&mut (*s).dmac, &p.dmac);
    }
}

/// Forwards by this CPU's cached FIB result for (source, destination), if
/// it is live, was cached under `epoch`, and the packet needs nothing the
/// full path would do differently (an MTU check, an expiring TTL).
/// `None`: take the full path.
#[inline(always)]
pub fn forward_from_cache(ctx: &mut TcContext, f: &Flow, epoch: u32) -> Option<i32> {
    let s = crate::cache::fwd_slot(&f.src, &f.dst)?;
    // SAFETY: this CPU's slot; programs do not nest on one CPU.
    let (ifindex, smac, dmac) = unsafe {
        if (*s).epoch != epoch || (*s).src != f.src || (*s).dst != f.dst {
            return None;
        }
        // The kernel's own bound (is_skb_forwardable): MTU + link header + VLAN tag.
        if ctx.len() > (*s).mtu + 18 || crate::clock::ticks() >= (*s).expires_tick {
            return None;
        }
        ((*s).ifindex, (*s).smac, (*s).dmac)
    };
    if decrement_ttl(ctx, f) != Ok(true) {
        return None;
    }
    out_by_mac(ctx, ifindex, smac, dmac).ok()
}

/// Decrements TTL / hop limit in place (the IPv4 header checksum in
/// software). `false`, packet untouched: it expires here.
#[inline(always)]
fn decrement_ttl(ctx: &mut TcContext, f: &Flow) -> Result<bool, u32> {
    if f.v6 {
        let ip: *mut Ipv6Hdr = ptr_at(ctx, ETH_LEN).map_err(|_| DROP_MALFORMED)?;
        // SAFETY: bounds checked by ptr_at.
        let (next, hops) = unsafe {
            let hops = (*ip).hop_limit;
            if hops <= 1 {
                return Ok(false);
            }
            (*ip).hop_limit = hops - 1;
            ((*ip).nexthdr, hops)
        };
        // No header checksum absorbs it (the kernel's forwarding gives up
        // CHECKSUM_COMPLETE instead; a redirect keeps it).
        crate::ctx::csum_carry(
            ctx,
            crate::ctx::word_delta(
                u16::from_ne_bytes([next, hops]),
                u16::from_ne_bytes([next, hops - 1]),
            ),
        );
    } else {
        let ip: *mut Ipv4Hdr = ptr_at(ctx, ETH_LEN).map_err(|_| DROP_MALFORMED)?;
        // SAFETY: bounds checked by ptr_at.
        unsafe {
            let ttl = (*ip).ttl;
            if ttl <= 1 {
                return Ok(false);
            }
            let proto = (*ip).proto;
            (*ip).ttl = ttl - 1;
            let c = csum_update16(
                u16::from_be_bytes((*ip).check),
                u16::from_be_bytes([ttl, proto]),
                u16::from_be_bytes([ttl - 1, proto]),
            );
            (*ip).check = c.to_be_bytes();
        }
    }
    Ok(true)
}

/// Writes the MACs and redirects out of `ifindex`.
#[inline(always)]
fn out_by_mac(ctx: &TcContext, ifindex: u32, smac: [u8; 6], dmac: [u8; 6]) -> Result<i32, u32> {
    let eth: *mut EthHdr = ptr_at(ctx, 0).map_err(|_| DROP_MALFORMED)?;
    // SAFETY: bounds checked by ptr_at.
    unsafe {
        (*eth).dst = dmac;
        (*eth).src = smac;
    }
    // SAFETY: plain helper call.
    Ok(unsafe { bpf_redirect(ifindex, 0) } as i32)
}

/// Out of line (see `verdict::Packed`).
#[inline(never)]
fn fib_forward_packed(ctx: &mut TcContext, f: &Flow, cache_epoch: u32) -> Packed {
    Packed::new(forward_by_fib(ctx, f, cache_epoch))
}

/// Forwards a pod's packet from an owned EIP out of the gateway by the FIB.
#[inline(always)]
pub fn fib_forward(ctx: &mut TcContext, f: &Flow, cache_epoch: u32) -> Result<i32, u32> {
    fib_forward_packed(ctx, f, cache_epoch)
        .get()
        .map(|v| v as i32)
}
