//! Translating an ICMP error back to the pod: the error's destination
//! (EIP -> pod) and, inside the packet it quotes (the pod's packet as the
//! far end saw it), that packet's source address and port. The ICMP
//! checksum covers the quoted bytes and follows each change; the quoted
//! IPv4 header checksum and the quoted UDP checksum follow too.

use aya_ebpf::programs::TcContext;
use egress_common::addr::Addr;

use crate::{
    ctx::{csum_update16, ptr_at, raw16, raw32, replace_addr16},
    flow::Flow,
    hdr::*,
};

/// Rewrites the ICMP error `f` for the pod at `addr`, `port`.
#[inline(never)]
pub fn rewrite_icmp_error(ctx: &mut TcContext, f: &Flow, addr: &Addr, port: u16) -> Result<(), ()> {
    rewrite_outer_dst(ctx, f, addr)?;
    let udp_check = quoted_udp_check(ctx, f);
    let mut new_udp_check = udp_check;
    if f.v6 {
        rewrite_quoted_src_v6(ctx, f, addr, &mut new_udp_check)?;
    } else {
        rewrite_quoted_src_v4(ctx, f, addr, &mut new_udp_check)?;
    }
    rewrite_quoted_port(ctx, f, port, &mut new_udp_check)?;
    if let (Some(old), Some(new)) = (udp_check, new_udp_check) {
        store_quoted_udp_check(ctx, f, old, new)?;
    }
    Ok(())
}

/// The error's own destination (the pseudo-header counts for ICMPv6 only).
#[inline(always)]
fn rewrite_outer_dst(ctx: &mut TcContext, f: &Flow, addr: &Addr) -> Result<(), ()> {
    if f.v6 {
        return replace_addr16(ctx, ETH_LEN + IPV6_DADDR, &f.dst, addr, f.csum_off, true, 0);
    }
    let (old4, new4) = (v4_of(&f.dst), v4_of(addr));
    ctx.store(ETH_LEN + IPV4_DADDR, &new4, 0).map_err(|_| ())?;
    ctx.l3_csum_replace(ETH_LEN + IPV4_CHECK, raw32(old4), raw32(new4), 4)
        .map_err(|_| ())
}

/// The quoted UDP checksum when there is one to keep right: always over
/// IPv6; over IPv4 only when the sender used one (not zero).
#[inline(always)]
fn quoted_udp_check(ctx: &TcContext, f: &Flow) -> Option<u16> {
    let q = &f.quoted;
    if q.proto != IPPROTO_UDP {
        return None;
    }
    let p = ptr_at::<UdpHdr>(ctx, q.l4_off).ok()?;
    // SAFETY: bounds checked by ptr_at.
    let c = u16::from_be_bytes(unsafe { (*p).check });
    (c != 0 || f.v6).then_some(c)
}

#[inline(always)]
fn rewrite_quoted_src_v6(
    ctx: &mut TcContext,
    f: &Flow,
    addr: &Addr,
    udp_check: &mut Option<u16>,
) -> Result<(), ()> {
    let q = &f.quoted;
    replace_addr16(
        ctx,
        q.l3_off + IPV6_SADDR,
        &q.src,
        addr,
        f.csum_off,
        false,
        0,
    )?;
    if let Some(c) = udp_check.as_mut() {
        let mut i = 0;
        while i < 16 {
            *c = csum_update16(
                *c,
                u16::from_be_bytes([q.src[i], q.src[i + 1]]),
                u16::from_be_bytes([addr[i], addr[i + 1]]),
            );
            i += 2;
        }
    }
    Ok(())
}

/// The quoted source address, then the quoted IPv4 header checksum, and
/// the ICMP checksum for each of those changes.
#[inline(always)]
fn rewrite_quoted_src_v4(
    ctx: &mut TcContext,
    f: &Flow,
    addr: &Addr,
    udp_check: &mut Option<u16>,
) -> Result<(), ()> {
    let q = &f.quoted;
    let (old4, new4) = (v4_of(&q.src), v4_of(addr));
    ctx.store(q.l3_off + IPV4_SADDR, &new4, 0).map_err(|_| ())?;
    ctx.l4_csum_replace(f.csum_off, raw32(old4), raw32(new4), 4)
        .map_err(|_| ())?;
    let qc: *const [u8; 2] = ptr_at(ctx, q.l3_off + IPV4_CHECK).map_err(|_| ())?;
    // SAFETY: bounds checked by ptr_at.
    let old_qc = u16::from_be_bytes(unsafe { *qc });
    let new_qc = update_for_v4(old_qc, old4, new4);
    ctx.store(q.l3_off + IPV4_CHECK, &new_qc.to_be_bytes(), 0)
        .map_err(|_| ())?;
    ctx.l4_csum_replace(
        f.csum_off,
        raw16(old_qc.to_be_bytes()),
        raw16(new_qc.to_be_bytes()),
        2,
    )
    .map_err(|_| ())?;
    if let Some(c) = udp_check.as_mut() {
        *c = update_for_v4(*c, old4, new4);
    }
    Ok(())
}

/// The quoted source port, or the echo identifier of a quoted echo.
#[inline(always)]
fn rewrite_quoted_port(
    ctx: &mut TcContext,
    f: &Flow,
    port: u16,
    udp_check: &mut Option<u16>,
) -> Result<(), ()> {
    let q = &f.quoted;
    if q.sport == port {
        return Ok(());
    }
    let off = if q.proto == IPPROTO_TCP || q.proto == IPPROTO_UDP {
        q.l4_off
    } else {
        q.l4_off + ICMP_ID
    };
    let nb = port.to_be_bytes();
    ctx.store(off, &nb, 0).map_err(|_| ())?;
    ctx.l4_csum_replace(f.csum_off, raw16(q.sport.to_be_bytes()), raw16(nb), 2)
        .map_err(|_| ())?;
    if let Some(c) = udp_check.as_mut() {
        *c = csum_update16(*c, q.sport, port);
    }
    Ok(())
}

/// Writes the quoted UDP checksum (zero means "none" on the wire, so a
/// computed zero is sent as all ones) and updates the ICMP checksum for it.
#[inline(always)]
fn store_quoted_udp_check(ctx: &mut TcContext, f: &Flow, old: u16, new: u16) -> Result<(), ()> {
    let new = if new == 0 { 0xffff } else { new };
    ctx.store(f.quoted.l4_off + UDP_CHECK, &new.to_be_bytes(), 0)
        .map_err(|_| ())?;
    ctx.l4_csum_replace(
        f.csum_off,
        raw16(old.to_be_bytes()),
        raw16(new.to_be_bytes()),
        2,
    )
    .map_err(|_| ())
}

/// A checksum updated for an IPv4 address change, word by word.
#[inline(always)]
fn update_for_v4(check: u16, old4: [u8; 4], new4: [u8; 4]) -> u16 {
    let c = csum_update16(
        check,
        u16::from_be_bytes([old4[0], old4[1]]),
        u16::from_be_bytes([new4[0], new4[1]]),
    );
    csum_update16(
        c,
        u16::from_be_bytes([old4[2], old4[3]]),
        u16::from_be_bytes([new4[2], new4[3]]),
    )
}

/// The IPv4 address in an IPv4-mapped `Addr`.
#[inline(always)]
fn v4_of(a: &Addr) -> [u8; 4] {
    [a[12], a[13], a[14], a[15]]
}
