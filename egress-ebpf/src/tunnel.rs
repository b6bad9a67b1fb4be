//! `tunnel_ingress`, TC ingress on the VXLAN device: the packets the
//! tunnel delivers. On a gateway, a pod's packet from an owned EIP is
//! forwarded out by the FIB; on a worker, a reply to an EIP with a NAT
//! entry is reverse-translated and delivered to its pod.

use aya_ebpf::{bindings::TC_ACT_OK, macros::classifier, programs::TcContext};
use egress_common::{config::CFG_GATEWAY, drops::*};

use crate::{
    flow::{parse, Flow, FRAG_LATER},
    frag::KIND_REPLY,
    fwd::{fib_forward, forward_from_cache, to_pod},
    hdr::*,
    maps::{CONFIG, OWNED_EIPS},
    nat::reverse,
    verdict::drop_with,
};

#[classifier]
pub fn tunnel_ingress(mut ctx: TcContext) -> i32 {
    tunnel_ingress_verdict(&mut ctx)
}

#[inline(always)]
pub fn tunnel_ingress_verdict(ctx: &mut TcContext) -> i32 {
    match try_tunnel_ingress(ctx) {
        Ok(v) => v,
        Err(reason) => drop_with(ctx, reason),
    }
}

#[inline(always)]
fn try_tunnel_ingress(ctx: &mut TcContext) -> Result<i32, u32> {
    let f = match crate::maps::SCRATCH.get_ptr_mut(0) {
        // SAFETY: this CPU's scratch slot; programs do not nest on one CPU.
        Some(p) => unsafe { &mut *p },
        None => return Ok(TC_ACT_OK as i32),
    };
    if !parse(ctx, f) {
        return Ok(TC_ACT_OK as i32);
    }
    let cfg = match CONFIG.get(0) {
        Some(c) => c,
        None => return Err(DROP_NO_CONFIG),
    };
    if cfg.flags & CFG_GATEWAY != 0 {
        // A cached result was computed for an owned source under this epoch.
        if cfg.gateway_epoch != 0 {
            if let Some(v) = forward_from_cache(ctx, f, cfg.gateway_epoch) {
                return Ok(v);
            }
        }
        if OWNED_EIPS.get_ptr(&f.src).is_some() {
            return fib_forward(ctx, f, cfg.gateway_epoch);
        }
    }
    if f.frag == FRAG_LATER {
        return reply_fragment_to_pod(ctx, f);
    }
    let ifindex = reverse(ctx, f)?;
    // A SYN-ACK through the tunnel: clamp the MSS the pod will use, so its
    // segments fit the tunnel too.
    if f.proto == IPPROTO_TCP && f.tcp_flags & TCP_SYN != 0 && cfg.tunnel_mtu != 0 {
        let hdrs = if f.v6 { 60 } else { 40 };
        crate::tcp::clamp_mss(ctx, f, cfg.tunnel_mtu.saturating_sub(hdrs));
    }
    Ok(to_pod(ctx, f.v6, ifindex))
}

/// A later IPv4 fragment of a reply, to the pod its first fragment went to.
#[inline(never)]
pub fn reply_fragment_to_pod(ctx: &mut TcContext, f: &Flow) -> Result<i32, u32> {
    let e = crate::frag::recall(KIND_REPLY, f).ok_or(DROP_FRAGMENT)?;
    crate::frag::rewrite_addr(ctx, f, false, &e.addr).map_err(|_| DROP_MALFORMED)?;
    crate::policy_stats::reply(&e.stats_slot, ctx.len());
    Ok(to_pod(ctx, f.v6, e.ifindex))
}
