//! `worker_egress`: TC ingress on a pod's host-side veth (packets from the pod).

use aya_ebpf::maps::lpm_trie::Key;
use aya_ebpf::{bindings::TC_ACT_OK, macros::classifier, programs::TcContext};
use egress_common::{
    addr::Addr, config::DatapathConfig, drops::*, nat::NAT_LOCAL_GATEWAY, policy::*,
};

use crate::{
    flow::{
        parse, rewrite, Flow, Side, FRAG_FIRST, FRAG_LATER, ICMP_KIND_ECHO_REPLY, ICMP_KIND_ERROR,
        UNTRANSLATED_NONE,
    },
    frag::KIND_EGRESS,
    fwd::{encap, fib_forward, learn_pod_link},
    hdr::*,
    maps::{CONFIG, GATEWAY_SPREAD, NAT_FWD, POLICY_DST, POLICY_SRC, POLICY_TARGETS, ROUTES},
    nat::forward_port,
    tcp::clamp_mss,
    verdict::drop_with,
};

#[classifier]
pub fn worker_egress(mut ctx: TcContext) -> i32 {
    worker_egress_verdict(&mut ctx)
}

/// The program's verdict (also run by the benchmark's `bench_worker_*`).
#[inline(always)]
pub fn worker_egress_verdict(ctx: &mut TcContext) -> i32 {
    match try_worker_egress(ctx) {
        Ok(v) => v,
        Err(reason) => drop_with(ctx, reason),
    }
}

#[inline(always)]
fn try_worker_egress(ctx: &mut TcContext) -> Result<i32, u32> {
    let f = match crate::maps::SCRATCH.get_ptr_mut(0) {
        // SAFETY: this CPU's scratch slot; programs do not nest on one CPU.
        Some(p) => unsafe { &mut *p },
        None => return Ok(TC_ACT_OK as i32),
    };
    if !parse(ctx, f) {
        return fail_closed(ctx, f);
    }
    // Replies and errors a pod sends towards the outside are not flows it opens.
    if f.icmp_kind == ICMP_KIND_ECHO_REPLY || f.icmp_kind == ICMP_KIND_ERROR {
        return Ok(TC_ACT_OK as i32);
    }
    let cfg = match CONFIG.get(0) {
        Some(c) => c,
        None => return Err(DROP_NO_CONFIG),
    };
    if f.frag == FRAG_LATER {
        return later_fragment(ctx, cfg, f);
    }
    // Established flow validated under the current policy tables: no lookups.
    let v = fast_path(ctx, cfg, f);
    if v >= 0 {
        return Ok(v as i32);
    }
    if v < FAST_REVALIDATE {
        return Err((-(v - FAST_REVALIDATE + 1)) as u32);
    }
    let absent = v == FAST_NO_ENTRY;
    let (slot, target) = match policy_target(f) {
        Some(t) => t,
        None => return Ok(TC_ACT_OK as i32),
    };
    // Fail closed: the policy selects this traffic but has no EIP or
    // gateway yet; the packet must not leave with the pod's own address.
    if target.flags & TARGET_NO_GATEWAY != 0 {
        return Err(DROP_NO_GATEWAY);
    }
    let Some(eip) = eip_for_family(target, f.v6) else {
        return Ok(TC_ACT_OK as i32);
    };
    let local = target.flags & TARGET_LOCAL_GATEWAY != 0;
    if !local && too_big_for_tunnel(cfg, f) {
        // Counted under too_big; the pod gets the ICMP error instead of the packet.
        crate::verdict::count(ctx, DROP_TOO_BIG);
        let v = crate::icmp_err::too_big(ctx, f.v6, cfg.tunnel_mtu);
        if v < 0 {
            return Ok(aya_ebpf::bindings::TC_ACT_SHOT as i32);
        }
        return Ok(v as i32);
    }
    let gw = if local {
        target.gateway_tunnel_ip
    } else {
        gateway_of(cfg, slot, target, f, eip)
    };
    f.gw = gw;
    if absent {
        learn_pod_link(ctx, &f.src);
    }
    let port = match forward_port(ctx, cfg, f, target, absent) {
        Ok(p) => p,
        Err(DROP_PORTS_EXHAUSTED) => return refuse_exhausted(ctx, f.v6),
        Err(r) => return Err(r),
    };
    if f.frag == FRAG_FIRST {
        remember_egress(f, eip, gw, target.stats_slot, local);
    }
    send_translated(ctx, cfg, f, target, eip, port)
}

/// The policy's EIP for the packet's family; `None` when the policy has
/// none of that family (the packet is not its business).
#[inline(always)]
fn eip_for_family(target: &EgressTarget, v6: bool) -> Option<&Addr> {
    let (flag, eip) = if v6 {
        (TARGET_HAS_V6, &target.eip_v6)
    } else {
        (TARGET_HAS_V4, &target.eip_v4)
    };
    (target.flags & flag != 0).then_some(eip)
}

/// A packet that may not be fragmented (IPv6, or IPv4 with DF) and does
/// not fit the tunnel. TCP is left out: its segments are sized by the MSS
/// clamp.
#[inline(always)]
fn too_big_for_tunnel(cfg: &DatapathConfig, f: &Flow) -> bool {
    f.proto != IPPROTO_TCP
        && (f.v6 || f.df)
        && cfg.tunnel_mtu != 0
        && f.l3_len > u32::from(cfg.tunnel_mtu)
}

/// Rewrites the source to (`eip`, `port`), clamps a SYN's MSS to the
/// tunnel, counts the packet for its policy and sends it: to the local
/// gateway path by the FIB, or through the tunnel to `f.gw`.
#[inline(always)]
fn send_translated(
    ctx: &mut TcContext,
    cfg: &DatapathConfig,
    f: &mut Flow,
    target: &EgressTarget,
    eip: &Addr,
    port: u16,
) -> Result<i32, u32> {
    let local = target.flags & TARGET_LOCAL_GATEWAY != 0;
    rewrite(ctx, f, Side::Src, eip, port).map_err(|_| DROP_HELPER)?;
    if f.proto == IPPROTO_TCP && f.tcp_flags & TCP_SYN != 0 && !local && cfg.tunnel_mtu != 0 {
        let hdrs = if f.v6 { 60 } else { 40 };
        clamp_mss(ctx, f, cfg.tunnel_mtu.saturating_sub(hdrs));
    }
    crate::policy_stats::egress(&target.stats_slot, ctx.len());
    if local {
        crate::mem::copy_addr(&mut f.src, eip);
        f.sport = port;
        return fib_forward(ctx, f, 0);
    }
    encap(ctx, cfg, f.gw, crate::vxlan::flow_entropy(f))
}

/// A packet `parse` could not take: when it is a selected pod's, to a
/// destination of its policy, in a family the policy translates (or the
/// policy is waiting for a gateway), it must not leave with the pod's
/// address. It is dropped under its reason and the pod is told
/// "administratively prohibited". Everything else passes untouched: not
/// IP, ICMP errors, neighbour discovery, link-local and multicast
/// destinations (they never leave the link), traffic outside the policies.
#[inline(never)]
fn fail_closed(ctx: &mut TcContext, f: &Flow) -> Result<i32, u32> {
    if f.untranslated == UNTRANSLATED_NONE || stays_on_link(&f.dst) {
        return Ok(TC_ACT_OK as i32);
    }
    let target = match policy_target(f) {
        Some((_, t)) => t,
        None => return Ok(TC_ACT_OK as i32),
    };
    let family = if f.v6 { TARGET_HAS_V6 } else { TARGET_HAS_V4 };
    if target.flags & (family | TARGET_NO_GATEWAY) == 0 {
        return Ok(TC_ACT_OK as i32);
    }
    crate::verdict::count(ctx, f.untranslated);
    let v = crate::icmp_err::prohibited(ctx, f.v6);
    if v < 0 {
        return Ok(aya_ebpf::bindings::TC_ACT_SHOT as i32);
    }
    Ok(v as i32)
}

/// A new flow for which no port is free (the worker's blocks are full, or
/// the EIP has none left for it): counted under `ports_exhausted`, and the
/// pod is told "administratively prohibited" at once (a TCP connect fails
/// with EHOSTUNREACH instead of retransmitting its SYN into a drop).
#[inline(never)]
fn refuse_exhausted(ctx: &mut TcContext, v6: bool) -> Result<i32, u32> {
    crate::verdict::count(ctx, DROP_PORTS_EXHAUSTED);
    let v = crate::icmp_err::prohibited(ctx, v6);
    if v < 0 {
        return Ok(aya_ebpf::bindings::TC_ACT_SHOT as i32);
    }
    Ok(v as i32)
}

/// Link-local and multicast destinations (IPv4 169.254/16, 224/4 and the
/// broadcast address; IPv6 fe80::/10 and ff00::/8).
#[inline(always)]
fn stays_on_link(dst: &Addr) -> bool {
    match egress_common::addr::as_v4(dst) {
        Some(v4) => (v4[0] == 169 && v4[1] == 254) || v4[0] & 0xf0 == 224 || v4 == [255; 4],
        None => dst[0] == 0xff || (dst[0] == 0xfe && dst[1] & 0xc0 == 0x80),
    }
}

/// The policy slot that selects `f` (source pod, destination), if any,
/// and its target.
#[inline(always)]
fn policy_target(f: &Flow) -> Option<(u32, &'static EgressTarget)> {
    // Read in place: a `DstMatch` is too big to copy onto the BPF stack.
    let src = POLICY_SRC.get(&Key::new(128, f.src))?;
    let dst = POLICY_DST.get(&Key::new(128, f.dst))?;
    let slot = pick_slot(src, dst)?;
    Some((slot, POLICY_TARGETS.get(slot)?))
}

/// The remote gateway of a new flow: with several gateways holding the
/// EIP (ActiveActive), the one of the flow's bucket; else the EIP's BGP
/// route, else the policy's gateway. Not inlined: its locals would add to
/// the caller's frame, which the chain of calls below it cannot afford.
#[inline(never)]
fn gateway_of(
    cfg: &DatapathConfig,
    slot: u32,
    target: &EgressTarget,
    f: &Flow,
    eip: &Addr,
) -> [u8; 4] {
    if target.flags & TARGET_SPREAD != 0 {
        let bucket = spread_bucket(crate::vxlan::flow_entropy(f));
        if let Some(s) = GATEWAY_SPREAD.get_ptr(&slot) {
            // SAFETY: a valid map value; the 4 bytes are copied out at once.
            if let Some(gw) = unsafe { (*s).tunnel_ips.get(bucket).copied() } {
                if gw != [0; 4] {
                    return gw;
                }
            }
        }
        return target.gateway_tunnel_ip;
    }
    gateway_by_route(cfg, eip).unwrap_or(target.gateway_tunnel_ip)
}

/// Remembers the translation of a first fragment for the later ones (`frag`).
#[inline(always)]
fn remember_egress(f: &Flow, eip: &Addr, gw: [u8; 4], stats_slot: u32, local: bool) {
    if let Some(e) = crate::frag::next_entry() {
        crate::mem::copy_addr(&mut e.addr, eip);
        e.tunnel = gw;
        e.stats_slot = stats_slot;
        e.entropy = crate::vxlan::flow_entropy(f);
        e.flags = if local {
            u32::from(NAT_LOCAL_GATEWAY)
        } else {
            0
        };
        crate::frag::remember(KIND_EGRESS, f);
    }
}

/// A later IPv4 fragment from the pod leaves as its first fragment did
/// (see `frag`). One of a datagram a policy selects whose first fragment
/// was not seen is dropped; other traffic's passes.
#[inline(never)]
fn later_fragment(ctx: &mut TcContext, cfg: &DatapathConfig, f: &mut Flow) -> Result<i32, u32> {
    let e = match crate::frag::recall(KIND_EGRESS, f) {
        Some(e) => e,
        None if policy_target(f).is_some() => return Err(DROP_FRAGMENT),
        None => return Ok(TC_ACT_OK as i32),
    };
    crate::frag::rewrite_addr(ctx, f, true, &e.addr).map_err(|_| DROP_MALFORMED)?;
    crate::policy_stats::egress(&e.stats_slot, ctx.len());
    if e.flags & u32::from(NAT_LOCAL_GATEWAY) != 0 {
        crate::mem::copy_addr(&mut f.src, &e.addr);
        return fib_forward(ctx, f, 0);
    }
    encap(ctx, cfg, e.tunnel, e.entropy)
}

/// The tunnel endpoint a BGP-learned host route names for `eip` (see
/// `egress_common::route`), unless it is this node or absent.
#[inline(always)]
fn gateway_by_route(cfg: &DatapathConfig, eip: &Addr) -> Option<[u8; 4]> {
    let r = ROUTES.get(&Key::new(128, *eip))?;
    if r.tunnel_ip == [0; 4] || r.tunnel_ip == cfg.node_tunnel_ip {
        return None;
    }
    Some(r.tunnel_ip)
}

/// `fast_path`: no forward NAT entry (the full path need not look again).
const FAST_NO_ENTRY: i64 = -1;
/// `fast_path`: the full path must decide (no epoch yet, stale epoch, or an
/// oversized packet that needs the ICMP answer).
const FAST_REVALIDATE: i64 = -2;

/// The established-flow path: a forward NAT entry validated under the
/// current `policy_epoch` carries everything (EIP, port, gateway, policy).
/// Returns a verdict (>= 0), `FAST_NO_ENTRY`, `FAST_REVALIDATE`, or
/// `FAST_REVALIDATE - 1 - reason` for a drop.
#[inline(never)]
fn fast_path(ctx: &mut TcContext, cfg: &DatapathConfig, f: &mut Flow) -> i64 {
    if cfg.policy_epoch == 0 {
        return FAST_REVALIDATE;
    }
    let key = crate::nat::fwd_key(f);
    let e = match NAT_FWD.get_ptr_mut(&key) {
        Some(e) => e,
        None => return FAST_NO_ENTRY,
    };
    // SAFETY: valid map value pointer; fields copied before the packet changes.
    let (eip, port, gw, local, stats_slot) = unsafe {
        if (*e).epoch != cfg.policy_epoch {
            return FAST_REVALIDATE;
        }
        let local = (*e).flags & NAT_LOCAL_GATEWAY != 0;
        if !local
            && f.proto != IPPROTO_TCP
            && (f.v6 || f.df)
            && cfg.tunnel_mtu != 0
            && f.l3_len > u32::from(cfg.tunnel_mtu)
        {
            return FAST_REVALIDATE;
        }
        let now = crate::clock::coarse_ns();
        (*e).last_seen_ns = now;
        if f.proto == IPPROTO_TCP {
            (*e).state = crate::nat::next_tcp_state((*e).state, f.tcp_flags);
        }
        (
            (*e).addr,
            (*e).port,
            (*e).ifindex.to_ne_bytes(),
            local,
            (*e).stats_slot,
        )
    };
    if f.frag == FRAG_FIRST {
        remember_egress(f, &eip, gw, stats_slot, local);
    }
    if rewrite(ctx, f, Side::Src, &eip, port).is_err() {
        return FAST_REVALIDATE - 1 - i64::from(DROP_HELPER);
    }
    if f.proto == IPPROTO_TCP && f.tcp_flags & TCP_SYN != 0 && !local && cfg.tunnel_mtu != 0 {
        let hdrs = if f.v6 { 60 } else { 40 };
        clamp_mss(ctx, f, cfg.tunnel_mtu.saturating_sub(hdrs));
    }
    // SAFETY: `e` is still the valid map value pointer.
    crate::policy_stats::egress(unsafe { &(*e).stats_slot }, ctx.len());
    let r = if local {
        crate::mem::copy_addr(&mut f.src, &eip);
        f.sport = port;
        fib_forward(ctx, f, 0)
    } else {
        encap(ctx, cfg, gw, crate::vxlan::flow_entropy(f))
    };
    match r {
        Ok(v) => i64::from(v),
        Err(reason) => FAST_REVALIDATE - 1 - i64::from(reason),
    }
}
