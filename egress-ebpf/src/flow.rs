//! Parsing a packet (IPv4 or IPv6 over Ethernet) into the fields the NAT
//! needs, and rewriting one side of it with correct checksums (an ICMP
//! error's quoted packet is rewritten in `icmp_quote`).

use aya_ebpf::programs::TcContext;
use egress_common::{
    addr::Addr,
    drops::{
        DROP_MALFORMED, DROP_UNTRANSLATED_ICMP, DROP_UNTRANSLATED_PROTO, DROP_UNTRANSLATED_V6_EXT,
    },
};

use crate::{
    ctx::{csum_carry, csum_diff16, csum_replace4, l4_flags, ptr_at, raw16, raw32, word_delta},
    hdr::*,
    mem::{copy_addr, put_v4_mapped, set_addr_words, v4_mapped_words},
    pkt,
};

/// What kind of ICMP message the packet is (0 when not ICMP).
pub const ICMP_NONE: u8 = 0;
pub const ICMP_KIND_ECHO_REQ: u8 = 1;
pub const ICMP_KIND_ECHO_REPLY: u8 = 2;
pub const ICMP_KIND_ERROR: u8 = 3;

/// Where an IPv4 packet sits in its datagram (see `frag`).
pub const FRAG_NONE: u8 = 0;
/// Offset 0, more fragments follow: carries the transport header.
pub const FRAG_FIRST: u8 = 1;
/// A later fragment: no transport header (ports 0, nothing parsed past IP).
pub const FRAG_LATER: u8 = 2;

/// `Flow::untranslated` when nothing was found that must fail closed (not
/// IP, an ICMP error, neighbour discovery): the packet passes untouched.
pub const UNTRANSLATED_NONE: u32 = u32::MAX;

/// The quoted packet inside an ICMP error (the packet we sent, as the far end saw it).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Quoted {
    /// Offset of the quoted IP header.
    pub l3_off: usize,
    /// Offset of the quoted transport header.
    pub l4_off: usize,
    pub proto: u8,
    pub src: Addr,
    pub dst: Addr,
    /// Quoted source port (or echo identifier) and destination port.
    pub sport: u16,
    pub dport: u16,
}

/// A 16-byte address in the packet, as four words (memory order).
///
/// # Safety
/// `p .. p + 16` lies in the packet, checked against `data_end`.
#[inline(always)]
unsafe fn packet_addr(p: usize) -> [u32; 4] {
    // SAFETY: the caller's bounds check.
    unsafe {
        [
            pkt::load32(p),
            pkt::load32(p + 4),
            pkt::load32(p + 8),
            pkt::load32(p + 12),
        ]
    }
}

/// Kept in a per-CPU scratch slot (`SCRATCH`), not on the 512-byte stack.
#[repr(C)]
pub struct Flow {
    pub v6: bool,
    pub proto: u8,
    pub l4_off: usize,
    pub src: Addr,
    pub dst: Addr,
    /// Ports in host order. ICMP echo request: `sport` = identifier;
    /// echo reply: `dport` = identifier.
    pub sport: u16,
    pub dport: u16,
    /// Offset of the transport checksum.
    pub csum_off: usize,
    pub tcp_flags: u8,
    /// Length of the IP packet (header included).
    pub l3_len: u32,
    /// IPv4 don't-fragment bit.
    pub df: bool,
    pub icmp_kind: u8,
    pub has_quoted: bool,
    pub quoted: Quoted,
    /// Set by the worker before a new translation: the tunnel endpoint the
    /// flow goes to (a BGP route's, or the policy slot's gateway).
    pub gw: [u8; 4],
    /// `FRAG_*`, and the identification of the datagram (IPv4 header or
    /// IPv6 Fragment header; fragments only).
    pub frag: u8,
    pub ip_id: u32,
    /// Set when `parse` fails after the addresses were read: the drop
    /// reason (`DROP_*`) for a policy's traffic that cannot be translated,
    /// or `UNTRANSLATED_NONE`.
    pub untranslated: u32,
}

// The addresses are read and written as words (`mem::addr_words`).
const _: () = assert!(
    core::mem::align_of::<Flow>() >= 4
        && core::mem::offset_of!(Flow, src) % 4 == 0
        && core::mem::offset_of!(Flow, dst) % 4 == 0
);

/// Parses the transport part at `l4_off`. Returns None for what we do not translate.
#[inline(always)]
fn parse_l4(ctx: &TcContext, f: &mut Flow) -> Option<()> {
    match f.proto {
        IPPROTO_TCP => {
            f.untranslated = DROP_MALFORMED;
            let t: *const TcpHdr = ptr_at(ctx, f.l4_off).ok()?;
            // SAFETY: bounds checked by ptr_at.
            unsafe {
                f.sport = u16::from_be_bytes((*t).source);
                f.dport = u16::from_be_bytes((*t).dest);
                f.tcp_flags = (*t).flags;
            }
            f.csum_off = f.l4_off + TCP_CHECK;
        }
        IPPROTO_UDP => {
            f.untranslated = DROP_MALFORMED;
            let u: *const UdpHdr = ptr_at(ctx, f.l4_off).ok()?;
            // SAFETY: bounds checked by ptr_at.
            unsafe {
                f.sport = u16::from_be_bytes((*u).source);
                f.dport = u16::from_be_bytes((*u).dest);
            }
            f.csum_off = f.l4_off + UDP_CHECK;
        }
        IPPROTO_ICMP | IPPROTO_ICMPV6 => {
            f.untranslated = DROP_MALFORMED;
            let i: *const IcmpHdr = ptr_at(ctx, f.l4_off).ok()?;
            // SAFETY: bounds checked by ptr_at.
            let (ty, id) = unsafe { ((*i).ty, u16::from_be_bytes((*i).id)) };
            f.untranslated = UNTRANSLATED_NONE;
            f.csum_off = f.l4_off + ICMP_CHECK;
            let (req, rep) = if f.v6 {
                (ICMP6_ECHO_REQUEST, ICMP6_ECHO_REPLY)
            } else {
                (ICMP_ECHO, ICMP_ECHO_REPLY)
            };
            if ty == req {
                f.icmp_kind = ICMP_KIND_ECHO_REQ;
                f.sport = id;
            } else if ty == rep {
                f.icmp_kind = ICMP_KIND_ECHO_REPLY;
                f.dport = id;
            } else if (!f.v6 && (ty == ICMP_DEST_UNREACH || ty == ICMP_TIME_EXCEEDED))
                || (f.v6
                    && (ty == ICMP6_DEST_UNREACH
                        || ty == ICMP6_PKT_TOO_BIG
                        || ty == ICMP6_TIME_EXCEEDED))
            {
                f.icmp_kind = ICMP_KIND_ERROR;
                if !parse_quoted(ctx, f.v6, f.l4_off + ICMP_LEN, &mut f.quoted) {
                    return None;
                }
                f.has_quoted = true;
            } else {
                if !(f.v6 && is_icmp6_link_control(ty)) {
                    f.untranslated = DROP_UNTRANSLATED_ICMP;
                }
                return None;
            }
        }
        _ => {
            f.untranslated = DROP_UNTRANSLATED_PROTO;
            return None;
        }
    }
    f.untranslated = UNTRANSLATED_NONE;
    Some(())
}

/// ICMPv6 that never leaves the link and carries no flow: router and
/// neighbour discovery, redirects, multicast listener messages (RFC 4861,
/// RFC 2710, RFC 3810). These pass whatever the policies say.
#[inline(always)]
fn is_icmp6_link_control(ty: u8) -> bool {
    (130..=137).contains(&ty) || ty == 143
}

#[inline(always)]
fn parse_quoted(ctx: &TcContext, v6: bool, l3_off: usize, q: &mut Quoted) -> bool {
    q.l3_off = l3_off;
    q.sport = 0;
    q.dport = 0;
    let ok = parse_quoted_inner(ctx, v6, l3_off, q).is_some();
    ok
}

#[inline(always)]
fn parse_quoted_inner(ctx: &TcContext, v6: bool, l3_off: usize, q: &mut Quoted) -> Option<()> {
    if v6 {
        let ip: *const Ipv6Hdr = ptr_at(ctx, l3_off).ok()?;
        // SAFETY: bounds checked by ptr_at.
        let nexthdr = unsafe {
            copy_addr(&mut q.src, &(*ip).saddr);
            copy_addr(&mut q.dst, &(*ip).daddr);
            (*ip).nexthdr
        };
        let t = v6_transport(ctx, l3_off + IPV6_LEN, nexthdr)?;
        // A quoted later fragment has no ports to find the flow by.
        if t.frag == FRAG_LATER {
            return None;
        }
        q.proto = t.proto;
        q.l4_off = t.off;
    } else {
        let ip: *const Ipv4Hdr = ptr_at(ctx, l3_off).ok()?;
        // SAFETY: bounds checked by ptr_at.
        let ihl = unsafe {
            q.proto = (*ip).proto;
            put_v4_mapped(&mut q.src, &(*ip).saddr);
            put_v4_mapped(&mut q.dst, &(*ip).daddr);
            ((*ip).version_ihl & 0x0f) as usize
        };
        if ihl < 5 {
            return None;
        }
        q.l4_off = l3_off + ihl * 4;
    }
    // The first 8 bytes of the quoted transport header are always there.
    let ports: *const UdpHdr = ptr_at(ctx, q.l4_off).ok()?;
    // SAFETY: bounds checked by ptr_at.
    unsafe {
        match q.proto {
            IPPROTO_TCP | IPPROTO_UDP => {
                q.sport = u16::from_be_bytes((*ports).source);
                q.dport = u16::from_be_bytes((*ports).dest);
            }
            IPPROTO_ICMP | IPPROTO_ICMPV6 => {
                let i = ports as *const IcmpHdr;
                q.sport = u16::from_be_bytes((*i).id);
            }
            _ => return None,
        }
    }
    Some(())
}

/// Where an IPv6 packet's transport header is, past its extension headers.
struct V6Transport {
    off: usize,
    proto: u8,
    /// `FRAG_*` and the identification, from a Fragment header.
    frag: u8,
    id: u32,
}

/// Extension headers stepped over at most: RFC 8200 4.1's order has
/// Hop-by-Hop, Destination Options, Routing, Fragment, Destination Options.
const MAX_V6_EXT: usize = 5;

/// Steps over the extension headers from `off` (the first one, of kind
/// `proto`) to the transport header. Hop-by-Hop and Destination Options
/// are skipped, as is a Routing header with no segments left (the fixed
/// header then holds the final destination, which the pseudo-header and
/// the policy use); the Fragment header (RFC 8200 4.5) gives offset, M
/// flag and identification. `None` for a Routing header with segments
/// left (the destination is not the final one), for headers that lie past
/// the first 256 bytes, and for more than `MAX_V6_EXT`; other kinds (AH,
/// ESP, ...) end the walk as the transport, which is then not translated.
#[inline(always)]
fn v6_transport(ctx: &TcContext, off: usize, proto: u8) -> Option<V6Transport> {
    let mut t = V6Transport {
        off,
        proto,
        frag: FRAG_NONE,
        id: 0,
    };
    let mut i = 0;
    while i < MAX_V6_EXT {
        // Next header, length or reserved, and (Routing) type, segments left.
        let h: *const [u8; 8] = ptr_at(ctx, t.off).ok()?;
        // SAFETY: bounds checked by ptr_at.
        let h = unsafe { *h };
        match t.proto {
            IPPROTO_FRAGMENT => {
                let offset_flags = u16::from_be_bytes([h[2], h[3]]);
                if offset_flags >> 3 != 0 {
                    t.frag = FRAG_LATER;
                } else if offset_flags & 1 != 0 {
                    t.frag = FRAG_FIRST;
                }
                t.id = u32::from_be_bytes([h[4], h[5], h[6], h[7]]);
                t.off += 8;
            }
            IPPROTO_ROUTING if h[3] != 0 => return None,
            IPPROTO_HOPOPTS | IPPROTO_DSTOPTS | IPPROTO_ROUTING => {
                t.off += (usize::from(h[1]) + 1) * 8;
            }
            _ => return Some(t),
        }
        t.proto = h[0];
        i += 1;
    }
    match t.proto {
        IPPROTO_HOPOPTS | IPPROTO_DSTOPTS | IPPROTO_ROUTING | IPPROTO_FRAGMENT => None,
        _ => Some(t),
    }
}

/// Parses Ethernet + IP + transport. `None`: not something we translate
/// (other ethertypes, other protocols, IPv6 extension headers that
/// `v6_transport` does not step over).
#[inline(always)]
pub fn parse(ctx: &TcContext, f: &mut Flow) -> bool {
    parse_inner(ctx, f).is_some()
}

#[inline(always)]
fn parse_inner(ctx: &TcContext, f: &mut Flow) -> Option<()> {
    let eth: *const EthHdr = ptr_at(ctx, 0).ok()?;
    // SAFETY: bounds checked by ptr_at.
    let proto = u16::from_be_bytes(unsafe { (*eth).proto });
    f.v6 = false;
    f.sport = 0;
    f.dport = 0;
    f.tcp_flags = 0;
    f.df = false;
    f.icmp_kind = ICMP_NONE;
    f.has_quoted = false;
    f.frag = FRAG_NONE;
    f.untranslated = UNTRANSLATED_NONE;
    if proto == ETH_P_IP {
        let ip: *const Ipv4Hdr = ptr_at(ctx, ETH_LEN).ok()?;
        // SAFETY: bounds checked by ptr_at.
        unsafe {
            let frag = u16::from_be_bytes((*ip).frag_off);
            if frag & 0x1fff != 0 {
                f.frag = FRAG_LATER;
            } else if frag & 0x2000 != 0 {
                f.frag = FRAG_FIRST;
            }
            f.ip_id = u32::from(u16::from_be_bytes((*ip).id));
            f.df = frag & 0x4000 != 0;
            let ihl = ((*ip).version_ihl & 0x0f) as usize;
            f.proto = (*ip).proto;
            f.l3_len = u32::from(u16::from_be_bytes((*ip).tot_len));
            let ipa = ip as usize;
            set_addr_words(&mut f.src, v4_mapped_words(pkt::load32(ipa + IPV4_SADDR)));
            set_addr_words(&mut f.dst, v4_mapped_words(pkt::load32(ipa + IPV4_DADDR)));
            if ihl < 5 {
                f.untranslated = DROP_MALFORMED;
                return None;
            }
            f.l4_off = ETH_LEN + ihl * 4;
        }
        if f.proto == IPPROTO_ICMPV6 {
            f.untranslated = DROP_UNTRANSLATED_PROTO;
            return None;
        }
    } else if proto == ETH_P_IPV6 {
        let ip: *const Ipv6Hdr = ptr_at(ctx, ETH_LEN).ok()?;
        f.v6 = true;
        // SAFETY: bounds checked by ptr_at.
        let nexthdr = unsafe {
            set_addr_words(&mut f.src, packet_addr(ip as usize + IPV6_SADDR));
            set_addr_words(&mut f.dst, packet_addr(ip as usize + IPV6_DADDR));
            f.l3_len = u32::from(u16::from_be_bytes((*ip).payload_len)) + IPV6_LEN as u32;
            (*ip).nexthdr
        };
        f.untranslated = DROP_UNTRANSLATED_V6_EXT;
        let t = v6_transport(ctx, ETH_LEN + IPV6_LEN, nexthdr)?;
        f.untranslated = UNTRANSLATED_NONE;
        f.proto = t.proto;
        f.l4_off = t.off;
        f.frag = t.frag;
        f.ip_id = t.id;
        if f.proto == IPPROTO_ICMP {
            f.untranslated = DROP_UNTRANSLATED_PROTO;
            return None;
        }
    } else {
        return None;
    }
    // A later fragment has no transport header: the callers look its
    // datagram up (see `frag`).
    if f.frag == FRAG_LATER {
        return match f.proto {
            IPPROTO_TCP | IPPROTO_UDP | IPPROTO_ICMP | IPPROTO_ICMPV6 => Some(()),
            _ => {
                f.untranslated = DROP_UNTRANSLATED_PROTO;
                None
            }
        };
    }
    parse_l4(ctx, f)?;
    Some(())
}

/// Which end of the flow to rewrite.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Src,
    Dst,
}

/// Rewrites address and port (or echo identifier) of one side, fixing the
/// IPv4 header checksum and the transport checksum (pseudo-header included).
///
/// Address and port are written in place and the IPv4 header checksum is
/// updated in software (it never depends on the skb's checksum state). The
/// transport checksum goes through `bpf_l4_csum_replace`, which alone knows
/// `skb->ip_summed`: with CHECKSUM_PARTIAL only the pseudo-header part may
/// change the field. Two helper calls at most (address, port).
#[inline(never)]
pub fn rewrite(
    ctx: &mut TcContext,
    f: &Flow,
    side: Side,
    addr: &Addr,
    port: u16,
) -> Result<(), ()> {
    let (old_addr, old_port) = match side {
        Side::Src => (&f.src, f.sport),
        Side::Dst => (&f.dst, f.dport),
    };
    let l4f = l4_flags(f.proto);
    let port_off = if f.proto == IPPROTO_ICMP || f.proto == IPPROTO_ICMPV6 {
        f.l4_off + ICMP_ID
    } else if side == Side::Src {
        f.l4_off
    } else {
        f.l4_off + 2
    };
    let nb = port.to_be_bytes();
    // Changes no checksum field absorbs, for skb->csum (see `csum_carry`).
    let mut uncovered = 0u32;
    // Everything written in place first; helper calls (which invalidate
    // packet pointers) come last.
    let (from, to, size) = if f.v6 {
        let ip: *mut Ipv6Hdr = ptr_at(ctx, ETH_LEN)?;
        // SAFETY: bounds checked by ptr_at.
        unsafe {
            if side == Side::Src {
                (*ip).saddr = *addr;
            } else {
                (*ip).daddr = *addr;
            }
        }
        let diff = csum_diff16(old_addr, addr);
        // The pseudo-header update below takes `diff` out of skb->csum as
        // for IPv4, where the header checksum absorbs the address; IPv6
        // has no header checksum, so the address and the L4 checksum
        // changes cancel and skb->csum must end where it started.
        uncovered = diff;
        (0, u64::from(diff), 0)
    } else {
        let ip: *mut Ipv4Hdr = ptr_at(ctx, ETH_LEN)?;
        let old4 = [old_addr[12], old_addr[13], old_addr[14], old_addr[15]];
        let new4 = [addr[12], addr[13], addr[14], addr[15]];
        // SAFETY: bounds checked by ptr_at.
        unsafe {
            if side == Side::Src {
                (*ip).saddr = new4;
            } else {
                (*ip).daddr = new4;
            }
            (*ip).check = csum_replace4((*ip).check, old4, new4);
        }
        (raw32(old4), raw32(new4), 4)
    };
    if old_port != port {
        let p: *mut [u8; 2] = ptr_at(ctx, port_off)?;
        // A UDP datagram over IPv4 without a checksum: nothing absorbs the
        // port change.
        if f.proto == IPPROTO_UDP && !f.v6 {
            let c: *const [u8; 2] = ptr_at(ctx, f.csum_off)?;
            // SAFETY: bounds checked by ptr_at.
            if unsafe { *c } == [0, 0] {
                uncovered = word_delta(raw16(old_port.to_be_bytes()) as u16, raw16(nb) as u16);
            }
        }
        // SAFETY: bounds checked by ptr_at.
        unsafe { *p = nb };
    }
    // ICMPv4 has no pseudo-header; TCP, UDP and ICMPv6 do.
    if f.proto != IPPROTO_ICMP {
        ctx.l4_csum_replace(
            f.csum_off,
            from,
            to,
            size | l4f | u64::from(aya_ebpf::bindings::BPF_F_PSEUDO_HDR),
        )
        .map_err(|_| ())?;
    }
    if old_port != port {
        ctx.l4_csum_replace(
            f.csum_off,
            raw16(old_port.to_be_bytes()),
            raw16(nb),
            2 | l4f,
        )
        .map_err(|_| ())?;
    }
    csum_carry(ctx, uncovered);
    Ok(())
}
