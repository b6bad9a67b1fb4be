//! The gateway's forward in XDP (part of `uplink_xdp`): a VXLAN packet to
//! this node whose inner IPv4 TCP or UDP packet leaves from an owned EIP
//! is decapsulated and sent back out of the uplink with `XDP_TX`, when
//! its next hop lies behind the uplink. It decides as `tunnel_ingress`
//! does on a gateway (an owned source, the FIB, the TTL) and shares that
//! program's per-CPU forward cache; whatever it does not take (another
//! VNI, a fragment, IP options, an expiring TTL, a next hop behind another
//! device or not resolved, a packet the route's MTU does not carry) goes
//! on to the kernel's VXLAN device and `tunnel_ingress` untouched.
//!
//! The outer headers are not checked beyond what identifies the tunnel
//! (as the kernel's VXLAN device, which accepts any source): the inner
//! packet carries its own checksums to the server. They are IPv4 ones
//! (`STRIP_V4`) or, on an IPv6 underlay, IPv6 ones without extension
//! headers (`STRIP_V6`); the inner packet is IPv4 either way.

use aya_ebpf::{
    bindings::{bpf_fib_lookup as FibParams, xdp_action::XDP_TX, BPF_FIB_LKUP_RET_SUCCESS},
    helpers::generated::{bpf_fib_lookup, bpf_xdp_adjust_head},
    programs::XdpContext,
};
use egress_common::{addr::Addr, config::DatapathConfig};

use core::mem::{offset_of, size_of};

use crate::{ctx::csum_update16, hdr::*, maps::OWNED_EIPS, pkt, vxlan::Outer, vxlan6};

const AF_INET: u8 = 2;
/// The outer headers taken off: Ethernet, IPv4, UDP, VXLAN.
pub const STRIP_V4: usize = offset_of!(Outer, inner_eth);
/// The same over an IPv6 underlay: Ethernet, IPv6, UDP, VXLAN.
pub const STRIP_V6: usize = offset_of!(vxlan6::Outer, inner_eth);

/// True when the frame is VXLAN to this node's tunnel endpoint on the
/// cluster's port (a cheap test, before anything is looked up).
#[inline(always)]
pub fn is_tunnel_packet(ctx: &XdpContext, cfg: &DatapathConfig) -> bool {
    let d = ctx.data();
    if d + offset_of!(Outer, vxlan_flags) > ctx.data_end() {
        return false;
    }
    let ip = d + offset_of!(Outer, ip);
    // SAFETY: every access lies in the outer Ethernet, IPv4 and UDP
    // headers, checked above.
    unsafe {
        pkt::load16(d + offset_of!(EthHdr, proto)) == u16::from_ne_bytes(ETH_P_IP.to_be_bytes())
            && pkt::load32(ip + IPV4_DADDR) == u32::from_ne_bytes(cfg.node_tunnel_ip)
            && pkt::load16(d + offset_of!(Outer, udp) + 2)
                == u16::from_ne_bytes(cfg.vxlan_port.to_be_bytes())
    }
}

/// True when the frame is VXLAN over IPv6 (no extension headers) to
/// this node's tunnel endpoint on the cluster's port.
#[inline(always)]
pub fn is_tunnel_packet_v6(ctx: &XdpContext, cfg: &DatapathConfig) -> bool {
    let d = ctx.data();
    if d + offset_of!(vxlan6::Outer, vxlan_flags) > ctx.data_end() {
        return false;
    }
    let Some(me) = vxlan6::endpoint(egress_common::endpoints::index_of(cfg.node_tunnel_ip)) else {
        return false;
    };
    // SAFETY: a map value's field at offset 0, 8-byte aligned.
    let me = unsafe { crate::mem::addr_words(me) };
    let ip = d + offset_of!(vxlan6::Outer, ip);
    let dst = ip + IPV6_DADDR;
    // SAFETY: every access lies in the outer Ethernet, IPv6 and UDP
    // headers, checked above.
    unsafe {
        pkt::load16(d + offset_of!(EthHdr, proto)) == u16::from_ne_bytes(ETH_P_IPV6.to_be_bytes())
            && pkt::load16(ip + 6).to_ne_bytes()[0] == IPPROTO_UDP
            && pkt::load32(dst) == me[0]
            && pkt::load32(dst + 4) == me[1]
            && pkt::load32(dst + 8) == me[2]
            && pkt::load32(dst + 12) == me[3]
            && pkt::load16(d + offset_of!(vxlan6::Outer, udp) + 2)
                == u16::from_ne_bytes(cfg.vxlan_port.to_be_bytes())
    }
}

/// The inner packet's fields the forward needs.
struct Inner {
    saddr: u32,
    daddr: u32,
    proto: u8,
    ttl: u8,
    tot_len: u16,
    ports: u32,
}

/// Decapsulates and sends out a tunnel packet (`is_tunnel_packet`, or
/// `is_tunnel_packet_v6` with `STRIP_V6`) it can forward; `None`: leave
/// it to the kernel.
#[inline(always)]
pub fn forward<const STRIP: usize>(ctx: &XdpContext, cfg: &DatapathConfig) -> Option<u32> {
    let inner = read_inner::<STRIP>(ctx.data(), ctx.data_end(), cfg)?;
    let src = crate::mem::v4_mapped(&inner.saddr.to_ne_bytes());
    let dst = crate::mem::v4_mapped(&inner.daddr.to_ne_bytes());
    let ingress = ctx.ingress_ifindex() as u32;
    let (smac, dmac) = match from_cache(cfg, &src, &dst, ingress, inner.tot_len) {
        Some(m) => m,
        None => {
            OWNED_EIPS.get_ptr(&src)?;
            by_fib(ctx, cfg, &inner, &src, &dst)?
        }
    };
    decapsulate::<STRIP>(ctx, &inner, smac, dmac)
}

/// The outer VXLAN header of this cluster and an inner IPv4 TCP or UDP
/// packet without options, unfragmented, whose TTL lets it be forwarded.
#[inline(always)]
fn read_inner<const STRIP: usize>(d: usize, end: usize, cfg: &DatapathConfig) -> Option<Inner> {
    // The VXLAN header ends the outer headers; the inner Ethernet header,
    // IPv4 header and the first word of the transport header follow.
    let vxlan = STRIP - 8;
    let inner_ip = STRIP + ETH_LEN;
    let inner_l4 = inner_ip + size_of::<Ipv4Hdr>();
    if d + inner_l4 + size_of::<UdpHdr>() > end {
        return None;
    }
    let ip = d + inner_ip;
    let outer = d + offset_of!(Outer, ip);
    let v = cfg.vni.to_be_bytes();
    // SAFETY: every access lies in `d .. d + inner_l4 + 8`, checked above.
    let (w0, w1, w2, saddr, daddr, ports) = unsafe {
        // An outer IPv4 header as `Outer` lays it out (no options), UDP,
        // and not a fragment: a first fragment holds only part of the
        // frame. (`is_tunnel_packet_v6` checked the IPv6 one.)
        if STRIP == STRIP_V4 {
            let o0 = pkt::load32(outer).to_ne_bytes();
            let o1 = pkt::load32(outer + 4).to_ne_bytes();
            let o2 = pkt::load32(outer + 8).to_ne_bytes();
            if o0[0] != 0x45
                || u16::from_be_bytes([o1[2], o1[3]]) & 0x3fff != 0
                || o2[1] != IPPROTO_UDP
            {
                return None;
            }
        }
        if pkt::load32(d + vxlan) != u32::from_ne_bytes([0x08, 0, 0, 0])
            || pkt::load32(d + vxlan + 4) != u32::from_ne_bytes([v[1], v[2], v[3], 0])
            || pkt::load16(d + STRIP + offset_of!(EthHdr, proto))
                != u16::from_ne_bytes(ETH_P_IP.to_be_bytes())
        {
            return None;
        }
        (
            pkt::load32(ip).to_ne_bytes(),
            pkt::load32(ip + 4).to_ne_bytes(),
            pkt::load32(ip + 8).to_ne_bytes(),
            pkt::load32(ip + IPV4_SADDR),
            pkt::load32(ip + IPV4_DADDR),
            pkt::load32(d + inner_l4),
        )
    };
    let (ttl, proto) = (w2[0], w2[1]);
    if w0[0] != 0x45 || u16::from_be_bytes([w1[2], w1[3]]) & 0x3fff != 0 || ttl <= 1 {
        return None;
    }
    if proto != IPPROTO_TCP && proto != IPPROTO_UDP {
        return None;
    }
    let tot_len = u16::from_be_bytes([w0[2], w0[3]]);
    if usize::from(tot_len) + d + inner_ip > end {
        return None;
    }
    Some(Inner {
        saddr,
        daddr,
        proto,
        ttl,
        tot_len,
        ports,
    })
}

/// This CPU's forward cache slot for (src, dst), if live under this epoch,
/// leaving by the uplink and large enough: its (source, next hop) MACs.
#[inline(always)]
fn from_cache(
    cfg: &DatapathConfig,
    src: &Addr,
    dst: &Addr,
    ingress: u32,
    tot_len: u16,
) -> Option<([u8; 6], [u8; 6])> {
    if cfg.gateway_epoch == 0 {
        return None;
    }
    let s = crate::cache::fwd_slot(src, dst)?;
    // SAFETY: this CPU's slot; programs do not nest on one CPU.
    unsafe {
        if (*s).epoch != cfg.gateway_epoch
            || (*s).src != *src
            || (*s).dst != *dst
            || (*s).ifindex != ingress
            || u32::from(tot_len) > (*s).mtu
            || crate::clock::ticks() >= (*s).expires_tick
        {
            return None;
        }
        Some(((*s).smac, (*s).dmac))
    }
}

/// Asks the FIB, for a packet as large as the tunnel carries (so that the
/// answer holds for every packet of the pair); a next hop with a resolved
/// neighbour behind the uplink is cached and returned.
#[inline(always)]
fn by_fib(
    ctx: &XdpContext,
    cfg: &DatapathConfig,
    inner: &Inner,
    src: &Addr,
    dst: &Addr,
) -> Option<([u8; 6], [u8; 6])> {
    let size = cfg.tunnel_mtu.max(inner.tot_len);
    let mut p = core::mem::MaybeUninit::<FibParams>::uninit();
    // SAFETY: a zeroed parameter block is valid; it is made of 32-bit words.
    let p = unsafe { crate::mem::zeroed_in(&mut p) };
    p.family = AF_INET;
    p.l4_protocol = inner.proto;
    let ports = inner.ports.to_ne_bytes();
    p.sport = u16::from_ne_bytes([ports[0], ports[1]]);
    p.dport = u16::from_ne_bytes([ports[2], ports[3]]);
    p.__bindgen_anon_1.tot_len = size;
    p.ifindex = ctx.ingress_ifindex() as u32;
    p.__bindgen_anon_3.ipv4_src = inner.saddr;
    p.__bindgen_anon_4.ipv4_dst = inner.daddr;
    // SAFETY: helper with the program's context and a valid stack block.
    let rc = unsafe { bpf_fib_lookup(ctx.ctx as *mut _, p, size_of::<FibParams>() as i32, 0) };
    if rc as u32 != BPF_FIB_LKUP_RET_SUCCESS || p.ifindex != ctx.ingress_ifindex() as u32 {
        return None;
    }
    if cfg.gateway_epoch != 0 {
        if let Some(s) = crate::cache::fwd_slot(src, dst) {
            // SAFETY: this CPU's slot; programs do not nest on one CPU.
            unsafe {
                (*s).src = *src;
                (*s).dst = *dst;
                (*s).expires_tick = crate::cache::expiry(cfg);
                (*s).epoch = cfg.gateway_epoch;
                (*s).ifindex = p.ifindex;
                // XDP's lookup reports no MTU on success: what it was
                // asked about is known to fit.
                (*s).mtu = u32::from(size);
                (*s).smac = p.smac;
                (*s).dmac = p.dmac;
            }
        }
    }
    Some((p.smac, p.dmac))
}

/// Takes the outer headers off, writes the inner Ethernet header toward
/// the next hop, decrements the TTL and sends the packet back out.
#[inline(always)]
fn decapsulate<const STRIP: usize>(
    ctx: &XdpContext,
    inner: &Inner,
    smac: [u8; 6],
    dmac: [u8; 6],
) -> Option<u32> {
    // SAFETY: helper with the program's context; the frame holds more
    // than `STRIP` bytes (checked by `read_inner`).
    if unsafe { bpf_xdp_adjust_head(ctx.ctx, STRIP as i32) } != 0 {
        return None;
    }
    let d = ctx.data();
    let ip = d + ETH_LEN;
    if ip + size_of::<Ipv4Hdr>() > ctx.data_end() {
        return None;
    }
    let w = u32::from_ne_bytes;
    let ttl_word = u16::from_be_bytes([inner.ttl, inner.proto]);
    let new_word = u16::from_be_bytes([inner.ttl - 1, inner.proto]);
    // SAFETY: the Ethernet and IPv4 headers were bounds-checked above.
    unsafe {
        pkt::store32(d, w([dmac[0], dmac[1], dmac[2], dmac[3]]));
        pkt::store32(d + 4, w([dmac[4], dmac[5], smac[0], smac[1]]));
        pkt::store32(d + 8, w([smac[2], smac[3], smac[4], smac[5]]));
        let check = u16::from_be(pkt::load16(ip + IPV4_CHECK));
        pkt::store16(ip + 8, new_word.to_be());
        pkt::store16(
            ip + IPV4_CHECK,
            csum_update16(check, ttl_word, new_word).to_be(),
        );
    }
    crate::uplink_xdp::count_tx(crate::uplink_xdp::TX_FORWARD, ctx);
    Some(XDP_TX)
}
