//! ICMP errors sent back to a pod in place of its packet:
//! - "fragmentation needed" (ICMP) / "packet too big" (ICMPv6) for a non-TCP
//!   packet that does not fit the tunnel, so path MTU discovery works for
//!   UDP and ICMP too;
//! - "administratively prohibited" for policy traffic the datapath cannot
//!   translate (fail closed), so the application fails at once instead of
//!   waiting for timeouts.
//!
//! The packet is rewritten in place into the error (quoting its start) and
//! sent back out of the interface it came in on.

use aya_ebpf::{
    btf_maps::PerCpuArray,
    helpers::generated::{bpf_redirect, bpf_skb_change_tail, bpf_skb_load_bytes},
    macros::btf_map,
    programs::TcContext,
};

use crate::{
    ctx::{fold, sum_words},
    hdr::*,
};

/// ICMP destination unreachable, code 13: communication administratively
/// prohibited (RFC 1812 5.2.7.1).
const ICMP_CODE_PROHIBITED: u8 = 13;
/// ICMPv6 destination unreachable, code 1: communication with destination
/// administratively prohibited (RFC 4443 3.1).
const ICMP6_CODE_PROHIBITED: u8 = 1;

/// Bytes of the offending packet quoted: its IP header and 8 bytes more
/// (IPv4), or its IPv6 header and 64 bytes more: the pod's kernel applies
/// the error only when it finds the socket, so the quote must reach the
/// ports past any extension headers (a Fragment header, options). The
/// packet is larger than the tunnel MTU, so it always has these bytes.
const QUOTE_V4: usize = IPV4_HDR + 8;
const QUOTE_V6: usize = IPV6_LEN + 64;
const MSG_V6: usize = IPV6_LEN + 8 + QUOTE_V6;

/// The IPv6 error is built here (per CPU), not on the stack, which the
/// worker's own frame leaves too little of.
#[btf_map]
static ERROR_V6: PerCpuArray<[u8; MSG_V6], 1> = PerCpuArray::new();
const IPV4_HDR: usize = 20;

/// Turns the packet into "fragmentation needed" / "packet too big" and
/// returns the redirect verdict, or -1 when the packet cannot be answered
/// (it is then dropped).
#[inline(never)]
pub fn too_big(ctx: &mut TcContext, v6: bool, mtu: u16) -> i64 {
    let (ty, code, word) = if v6 {
        (ICMP6_PKT_TOO_BIG, 0, u32::from(mtu))
    } else {
        (ICMP_DEST_UNREACH, 4, u32::from(mtu))
    };
    error_back(ctx, v6, ty, code, word).unwrap_or(-1)
}

/// Turns the packet into "administratively prohibited"; as `too_big`.
#[inline(never)]
pub fn prohibited(ctx: &mut TcContext, v6: bool) -> i64 {
    let (ty, code) = if v6 {
        (ICMP6_DEST_UNREACH, ICMP6_CODE_PROHIBITED)
    } else {
        (ICMP_DEST_UNREACH, ICMP_CODE_PROHIBITED)
    };
    error_back(ctx, v6, ty, code, 0).unwrap_or(-1)
}

/// Writes the error of type `ty` and `code` whose second word (MTU, or
/// unused) is `word`.
#[inline(always)]
fn error_back(ctx: &mut TcContext, v6: bool, ty: u8, code: u8, word: u32) -> Option<i64> {
    let quote = if v6 { QUOTE_V6 } else { QUOTE_V4 };
    if (ctx.len() as usize) < ETH_LEN + quote {
        // SAFETY: skb pointer from the context; grows with zeros.
        if unsafe { bpf_skb_change_tail(ctx.skb.skb, (ETH_LEN + quote) as u32, 0) } != 0 {
            return None;
        }
    }
    let macs: [u8; 12] = ctx.load(0).ok()?;
    let mut eth = [0u8; 12];
    eth[..6].copy_from_slice(&macs[6..12]);
    eth[6..].copy_from_slice(&macs[..6]);
    if v6 {
        // SAFETY: this CPU's slot; programs do not nest on one CPU.
        let m = unsafe { &mut *ERROR_V6.get_ptr_mut(0)? };
        let quote = IPV6_LEN + 8;
        // SAFETY: the helper writes QUOTE_V6 bytes into the slot's tail.
        let rc = unsafe {
            bpf_skb_load_bytes(
                ctx.skb.skb as *const _,
                ETH_LEN as u32,
                m.as_mut_ptr().add(quote) as *mut _,
                QUOTE_V6 as u32,
            )
        };
        if rc != 0 {
            return None;
        }
        let total = ETH_LEN + MSG_V6;
        // SAFETY: skb pointer from the context.
        if unsafe { bpf_skb_change_tail(ctx.skb.skb, total as u32, 0) } != 0 {
            return None;
        }
        let plen = (8 + QUOTE_V6) as u16;
        m[0] = 0x60;
        m[1] = 0;
        m[2] = 0;
        m[3] = 0;
        m[4..6].copy_from_slice(&plen.to_be_bytes());
        m[6] = IPPROTO_ICMPV6;
        m[7] = 255;
        let (head, q) = m.split_at_mut(quote);
        head[8..24].copy_from_slice(&q[24..40]); // from the original destination
        head[24..40].copy_from_slice(&q[8..24]); // to the pod
        head[40] = ty;
        head[41] = code;
        head[42] = 0;
        head[43] = 0;
        head[44..48].copy_from_slice(&word.to_be_bytes());
        let mut sum = sum_words(&head[8..40], 0);
        sum += u32::from(plen) + u32::from(IPPROTO_ICMPV6);
        sum = sum_words(&head[40..48], sum);
        sum = sum_words(q, sum);
        head[42..44].copy_from_slice(&fold(sum).to_be_bytes());
        ctx.store(0, &eth, 0).ok()?;
        ctx.store(ETH_LEN, m, 0).ok()?;
    } else {
        let q: [u8; QUOTE_V4] = ctx.load(ETH_LEN).ok()?;
        if q[0] != 0x45 {
            return None; // options: not answered
        }
        let total = ETH_LEN + IPV4_HDR + 8 + QUOTE_V4;
        // SAFETY: skb pointer from the context.
        if unsafe { bpf_skb_change_tail(ctx.skb.skb, total as u32, 0) } != 0 {
            return None;
        }
        let tot = (IPV4_HDR + 8 + QUOTE_V4) as u16;
        let mut ip = [0u8; IPV4_HDR];
        ip[0] = 0x45;
        ip[2..4].copy_from_slice(&tot.to_be_bytes());
        ip[8] = 64;
        ip[9] = IPPROTO_ICMP;
        ip[12..16].copy_from_slice(&q[16..20]); // from the original destination
        ip[16..20].copy_from_slice(&q[12..16]); // to the pod
        let c = fold(sum_words(&ip, 0));
        ip[10..12].copy_from_slice(&c.to_be_bytes());
        let mut icmp = [0u8; 8];
        icmp[0] = ty;
        icmp[1] = code;
        icmp[4..8].copy_from_slice(&word.to_be_bytes());
        let c = fold(sum_words(&q, sum_words(&icmp, 0)));
        icmp[2..4].copy_from_slice(&c.to_be_bytes());
        ctx.store(0, &eth, 0).ok()?;
        ctx.store(ETH_LEN, &ip, 0).ok()?;
        ctx.store(ETH_LEN + IPV4_HDR, &icmp, 0).ok()?;
        ctx.store(ETH_LEN + IPV4_HDR + 8, &q, 0).ok()?;
    }
    // SAFETY: skb pointer from the context; back out of the pod's veth.
    Some(unsafe { bpf_redirect((*ctx.skb.skb).ifindex, 0) })
}
