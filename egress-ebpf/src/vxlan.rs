//! VXLAN encapsulation written by the program itself: the outer Ethernet,
//! IPv4, UDP and VXLAN headers go in front of the frame with
//! `bpf_skb_adjust_room` (which also marks a GSO packet as UDP-tunnelled,
//! so the kernel segments it right), and the packet leaves by the uplink
//! directly. That skips the VXLAN device's transmit path, which routes
//! every packet again (a tunnel key set by a program is never cached).
//!
//! The outer next hop (interface and next-hop address) of each remote
//! tunnel endpoint comes from the FIB and is kept per CPU for
//! `DatapathConfig::cache_ticks` (200 ms); the packet leaves with `bpf_redirect_neigh`, so the
//! kernel's neighbour subsystem writes the link header and keeps the
//! neighbour entry fresh (it resolves or re-probes it as its own traffic
//! would). When the FIB has no route, or the packet is too large for the
//! egress interface, the caller falls back to the VXLAN device.

use aya_ebpf::{
    bindings::{
        bpf_adj_room_mode::BPF_ADJ_ROOM_MAC, bpf_fib_lookup as FibParams, bpf_redir_neigh,
        BPF_FIB_LKUP_RET_NO_NEIGH, BPF_FIB_LKUP_RET_SUCCESS, BPF_F_ADJ_ROOM_ENCAP_L2_ETH,
        BPF_F_ADJ_ROOM_ENCAP_L3_IPV4, BPF_F_ADJ_ROOM_ENCAP_L4_UDP, BPF_F_ADJ_ROOM_FIXED_GSO,
    },
    btf_maps::PerCpuArray,
    helpers::generated::{bpf_fib_lookup, bpf_redirect_neigh},
    macros::btf_map,
    programs::TcContext,
};
use egress_common::config::DatapathConfig;

use core::mem::{offset_of, size_of};

use crate::{ctx::fold, hdr::*, pkt, verdict::Packed};

/// Outer IPv4 + UDP + VXLAN, and the inner Ethernet header that follows.
pub const OUTER_LEN: usize = 20 + 8 + 8;
pub const GROW: usize = OUTER_LEN + ETH_LEN;
const AF_INET: u8 = 2;

/// A remote tunnel endpoint's next hop.
#[repr(C)]
pub struct Hop {
    /// `clock::ticks()` from which the slot is no longer used.
    pub expires_tick: u64,
    /// The endpoint (IPv4, network order bytes).
    pub remote: [u8; 4],
    pub ifindex: u32,
    /// The next-hop address (the endpoint itself when it is on-link).
    pub via: u32,
    pub _pad: u32,
}

#[btf_map]
static TUNNEL_HOPS: PerCpuArray<Hop, { crate::cache::SLOTS }> = PerCpuArray::new();

/// The outer headers, in wire order.
#[repr(C)]
pub struct Outer {
    pub eth: EthHdr,
    pub ip: Ipv4Hdr,
    pub udp: UdpHdr,
    pub vxlan_flags: [u8; 4],
    pub vni: [u8; 4],
    pub inner_eth: EthHdr,
}

/// The outer UDP source port's seed for a flow: the same for every packet
/// of it, different across flows (so the underlay's ECMP spreads them).
#[inline(always)]
pub fn entropy(src: u32, dst: u32, ports: u32) -> u32 {
    let h = (src ^ dst.rotate_left(16) ^ ports).wrapping_mul(0x9e37_79b1);
    h ^ (h >> 16)
}

#[inline(always)]
pub fn flow_entropy(f: &crate::flow::Flow) -> u32 {
    use crate::cache::fold;
    entropy(
        fold(&f.src),
        fold(&f.dst),
        u32::from(f.sport) << 16 | u32::from(f.dport),
    )
}

/// This CPU's live next hop for `remote` (interface, next-hop address as
/// the FIB writes it), asking the FIB on a miss.
#[inline(always)]
fn next_hop(ctx: &TcContext, cfg: &DatapathConfig, remote: [u8; 4]) -> Option<(u32, u32)> {
    let r = u32::from_ne_bytes(remote);
    let slot = TUNNEL_HOPS.get_ptr_mut(crate::cache::slot(r, 0))?;
    // SAFETY: this CPU's slot; programs do not nest on one CPU.
    unsafe {
        if (*slot).remote == remote && crate::clock::ticks() < (*slot).expires_tick {
            return Some(((*slot).ifindex, (*slot).via));
        }
    }
    if cfg.uplink_ifindex == 0 {
        return None;
    }
    let mut p = core::mem::MaybeUninit::<FibParams>::uninit();
    // SAFETY: a zeroed parameter block is valid; it is made of 32-bit words.
    let p = unsafe { crate::mem::zeroed_in(&mut p) };
    p.family = AF_INET;
    p.l4_protocol = IPPROTO_UDP;
    // As a packet arriving on the uplink would be routed (any egress
    // interface; nodes forward, so the lookup is allowed).
    p.ifindex = cfg.uplink_ifindex;
    p.__bindgen_anon_3.ipv4_src = u32::from_ne_bytes(cfg.node_tunnel_ip);
    p.__bindgen_anon_4.ipv4_dst = r;
    // SAFETY: helper with a valid stack parameter block.
    let rc = unsafe {
        bpf_fib_lookup(
            ctx.skb.skb as *mut _,
            p,
            core::mem::size_of::<FibParams>() as i32,
            0,
        )
    } as u32;
    // Without a neighbour entry the route is still known: the neighbour
    // subsystem resolves it when the packet leaves.
    if rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH {
        return None;
    }
    // SAFETY: the IPv4 member is the one the lookup wrote.
    let via = unsafe { p.__bindgen_anon_4.ipv4_dst };
    // SAFETY: as above.
    unsafe {
        (*slot).remote = remote;
        (*slot).ifindex = p.ifindex;
        (*slot).via = via;
        (*slot).expires_tick = crate::cache::expiry(cfg);
    }
    Some((p.ifindex, via))
}

/// Encapsulates the frame toward `remote` and redirects it out of the
/// uplink. `entropy` picks the outer UDP source port (flows spread over
/// the underlay's ECMP paths). `None`: nothing was changed, use the
/// device.
#[inline(always)]
pub fn encapsulate(
    ctx: &TcContext,
    cfg: &DatapathConfig,
    remote: [u8; 4],
    entropy: u32,
) -> Option<i32> {
    encapsulate_packed(ctx, cfg, u32::from_ne_bytes(remote), entropy)
        .get()
        .ok()
        .map(|v| v as i32)
}

/// Out of line (see `verdict::Packed`): its FIB parameter block would push
/// the callers past the 512-byte stack. The reason of an error is unused.
#[inline(never)]
fn encapsulate_packed(ctx: &TcContext, cfg: &DatapathConfig, remote: u32, entropy: u32) -> Packed {
    match encapsulate_in_place(ctx, cfg, remote.to_ne_bytes(), entropy) {
        Some(v) => Packed::ok(i64::from(v)),
        None => Packed::err(0),
    }
}

/// `cb[0]` of a benchmark run whose encapsulation grows plain room (see
/// `room_flags`).
#[cfg(feature = "bench")]
pub const PLAIN_ROOM: u32 = 0x6265_6e63;

/// The flags of the room for the outer headers: an encapsulation (the
/// kernel records the inner headers' offsets, so a GSO packet is segmented
/// as a tunnelled one) of an Ethernet frame in IPv4/UDP.
#[inline(always)]
pub fn room_flags(ctx: &TcContext, outer_l3: u32) -> u64 {
    // The benchmark's repeated runs (see `bench`) grow the room without
    // the encapsulation flags: the kernel refuses to encapsulate an skb
    // twice, and `repeat` runs one skb again and again.
    #[cfg(feature = "bench")]
    // SAFETY: skb pointer from the context.
    if unsafe { (*ctx.skb.skb).cb[0] } == PLAIN_ROOM {
        return 0;
    }
    #[cfg(not(feature = "bench"))]
    let _ = ctx;
    u64::from(
        outer_l3
            | BPF_F_ADJ_ROOM_ENCAP_L4_UDP
            | BPF_F_ADJ_ROOM_ENCAP_L2_ETH
            // The pod's segments already fit the tunnel (MSS clamp).
            | BPF_F_ADJ_ROOM_FIXED_GSO,
    ) | ((ETH_LEN as u64) << 56)
}

#[inline(always)]
fn encapsulate_in_place(
    ctx: &TcContext,
    cfg: &DatapathConfig,
    remote: [u8; 4],
    entropy: u32,
) -> Option<i32> {
    let frame_len = ctx.len();
    if !fits_tunnel(ctx, cfg, frame_len) {
        return None;
    }
    let (ifindex, via) = next_hop(ctx, cfg, remote)?;
    ctx.adjust_room(
        GROW as i32,
        BPF_ADJ_ROOM_MAC,
        room_flags(ctx, BPF_F_ADJ_ROOM_ENCAP_L3_IPV4),
    )
    .ok()?;
    // The room lies between the frame's Ethernet header, still in front,
    // and its IP header.
    let d = ctx.data();
    if d + size_of::<Outer>() > ctx.data_end() {
        // The room is there but the headers cannot be written: the
        // packet is no longer what the device path expects either.
        return Some(crate::verdict::drop_with(
            ctx,
            egress_common::drops::DROP_HELPER,
        ));
    }
    // For a GSO packet these lengths are placeholders (it may exceed 64 kB):
    // segmentation writes each segment's own.
    let ip_len = (OUTER_LEN as u32 + frame_len) as u16;
    let sport = 0xc000 | (entropy as u16 & 0x3fff);
    // SAFETY: `d .. d + size_of::<Outer>()` was bounds-checked above; no
    // helper call until the checksum update.
    let added = unsafe {
        move_inner_eth(d, offset_of!(Outer, inner_eth), ETH_P_IP);
        write_outer_ip(d, ip_len, cfg.node_tunnel_ip, remote);
        write_udp_vxlan(d + offset_of!(Outer, udp), ip_len - 20, sport, cfg);
        sum_of_new_bytes(d)
    };
    crate::ctx::csum_carry(ctx, added);
    Some(redirect_neigh_v4(ifindex, via))
}

/// Whether the frame may be encapsulated here. An IPv4 packet without DF
/// that does not fit the tunnel (the programs let it through, as a router
/// would) goes to the device, which fragments the outer packet as the
/// kernel's tunnels do; we send with DF.
#[inline(always)]
pub fn fits_tunnel(ctx: &TcContext, cfg: &DatapathConfig, frame_len: u32) -> bool {
    // SAFETY: skb pointer from the context.
    let gso = unsafe { (*ctx.skb.skb).gso_size } != 0;
    gso || cfg.tunnel_mtu == 0 || frame_len <= u32::from(cfg.tunnel_mtu) + ETH_LEN as u32
}

/// The inner Ethernet header is the frame's own, moved to `inner` (behind
/// the outer headers); the outer one keeps its addresses, which the
/// neighbour subsystem writes when the packet leaves
/// (`bpf_redirect_neigh`), and gets the underlay's type `outer_type`.
///
/// # Safety
/// `d .. d + inner + ETH_LEN` is inside the packet.
#[inline(always)]
pub unsafe fn move_inner_eth(d: usize, inner: usize, outer_type: u16) {
    let inner = d + inner;
    // SAFETY: see the function's contract.
    unsafe {
        pkt::store32(inner, pkt::load32(d));
        pkt::store32(inner + 4, pkt::load32(d + 4));
        pkt::store32(inner + 8, pkt::load32(d + 8));
        pkt::store16(inner + 12, pkt::load16(d + 12));
        pkt::store16(
            d + offset_of!(EthHdr, proto),
            u16::from_ne_bytes(outer_type.to_be_bytes()),
        );
    }
}

/// The outer IPv4 header checksum, over its 16-bit words.
#[inline(always)]
fn outer_ip_checksum(ip_len: u16, s: [u8; 4], r: [u8; 4]) -> u16 {
    let words = [
        0x4500u32,
        u32::from(ip_len),
        0x4000,
        0x4000 | u32::from(IPPROTO_UDP),
        u32::from(u16::from_be_bytes([s[0], s[1]])),
        u32::from(u16::from_be_bytes([s[2], s[3]])),
        u32::from(u16::from_be_bytes([r[0], r[1]])),
        u32::from(u16::from_be_bytes([r[2], r[3]])),
    ];
    let mut sum = 0u32;
    let mut i = 0;
    while i < words.len() {
        sum += words[i];
        i += 1;
    }
    fold(sum)
}

/// Version/IHL, TOS, length; no id, DF (the inner packets are sized to
/// fit); TTL, protocol, checksum; addresses.
///
/// # Safety
/// As `move_inner_eth`.
#[inline(always)]
pub unsafe fn write_outer_ip(d: usize, ip_len: u16, s: [u8; 4], r: [u8; 4]) {
    let w = u32::from_ne_bytes;
    let ip = d + offset_of!(Outer, ip);
    let len = ip_len.to_be_bytes();
    let check = outer_ip_checksum(ip_len, s, r).to_be_bytes();
    // SAFETY: see the function's contract.
    unsafe {
        pkt::store32(ip, w([0x45, 0, len[0], len[1]]));
        pkt::store32(ip + 4, w([0, 0, 0x40, 0]));
        pkt::store32(ip + 8, w([64, IPPROTO_UDP, check[0], check[1]]));
        pkt::store32(ip + 12, w(s));
        pkt::store32(ip + 16, w(r));
    }
}

/// UDP at `udp`: checksum zero (RFC 7348's advice for IPv4, as the kernel
/// device does; over IPv6 RFC 6935 allows it for tunnels, and the
/// receivers' VXLAN devices accept it: `udp6zerocsumrx`). VXLAN after it:
/// the I flag and the VNI.
///
/// # Safety
/// `udp .. udp + 16` is inside the packet.
#[inline(always)]
pub unsafe fn write_udp_vxlan(udp: usize, udp_len: u16, sport: u16, cfg: &DatapathConfig) {
    let w = u32::from_ne_bytes;
    let (len, sport) = (udp_len.to_be_bytes(), sport.to_be_bytes());
    let dport = cfg.vxlan_port.to_be_bytes();
    let v = cfg.vni.to_be_bytes();
    // SAFETY: see the function's contract.
    unsafe {
        pkt::store32(udp, w([sport[0], sport[1], dport[0], dport[1]]));
        pkt::store32(udp + 4, w([len[0], len[1], 0, 0]));
        pkt::store32(udp + 8, w([0x08, 0, 0, 0]));
        pkt::store32(udp + 12, w([v[1], v[2], v[3], 0]));
    }
}

/// What the new bytes add to skb->csum (CHECKSUM_COMPLETE sums from the
/// outer IPv4 header on): that header (its sum is zero: it carries its
/// checksum), the UDP and VXLAN headers and the inner Ethernet header,
/// summed from the packet as 32-bit words.
///
/// # Safety
/// As `move_inner_eth`.
#[inline(always)]
unsafe fn sum_of_new_bytes(d: usize) -> u32 {
    let mut added = 0u64;
    let mut off = offset_of!(Outer, udp);
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

/// Sends the packet out of `ifindex` toward the IPv4 next hop `via`; the
/// neighbour subsystem writes the link header.
#[inline(always)]
fn redirect_neigh_v4(ifindex: u32, via: u32) -> i32 {
    let mut nh = core::mem::MaybeUninit::<bpf_redir_neigh>::uninit();
    // SAFETY: a zeroed block is valid, made of 32-bit words; the IPv4
    // member matches the family.
    let nh = unsafe { crate::mem::zeroed_in(&mut nh) };
    nh.nh_family = u32::from(AF_INET);
    nh.__bindgen_anon_1.ipv4_nh = via;
    // SAFETY: helper with a valid stack parameter block.
    let rc = unsafe {
        bpf_redirect_neigh(
            ifindex,
            nh,
            core::mem::size_of::<bpf_redir_neigh>() as i32,
            0,
        )
    };
    rc as i32
}
