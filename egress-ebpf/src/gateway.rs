//! The gateway side and the tunnel's receive side.
//!
//! - `tunnel_ingress` (TC ingress on the VXLAN device): decapsulated
//!   packets. From an owned EIP: forward out by the FIB (gateway). To an EIP
//!   with a NAT entry: reverse-translate and deliver to the pod (worker).
//! - `uplink_ingress` (TC ingress on the gateway's uplink): ARP / NDP for
//!   owned EIPs, and packets to owned EIPs steered to the worker holding the
//!   port's block.

use aya_ebpf::{
    bindings::TC_ACT_OK,
    helpers::generated::{bpf_ktime_get_ns, bpf_redirect},
    macros::classifier,
    programs::TcContext,
};
use egress_common::{
    addr::Addr,
    config::{DatapathConfig, CFG_GATEWAY},
    drops::*,
    steering::*,
};

use crate::{
    cache::{cached_steering, cached_steering_v4, remember_steering},
    ctx::{drop_with, ptr_at},
    flow::Flow,
    flow::{parse, FRAG_FIRST, FRAG_LATER, ICMP_KIND_ECHO_REPLY, ICMP_KIND_ERROR},
    frag::{KIND_REPLY, KIND_STEER},
    fwd::{encap, fib_forward, forward_from_cache, to_pod},
    hdr::*,
    maps::{ANNOUNCE_UNTIL, CONFIG, OWNED_EIPS, REPLY_STEERING},
    nat::reverse,
    pkt,
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
        crate::worker::clamp_mss(ctx, f, cfg.tunnel_mtu.saturating_sub(hdrs));
    }
    Ok(to_pod(ctx, f.v6, ifindex))
}

#[classifier]
pub fn uplink_ingress(mut ctx: TcContext) -> i32 {
    uplink_ingress_verdict(&mut ctx)
}

/// The program's verdict (also run by the benchmark's `bench_gateway_reply`).
#[inline(always)]
pub fn uplink_ingress_verdict(ctx: &mut TcContext) -> i32 {
    match try_uplink_ingress(ctx) {
        Ok(v) => v,
        Err(reason) => drop_with(ctx, reason),
    }
}

/// The agent's announce lease has not run out (or there is none). It is
/// extended on every heartbeat renewal; when the agent dies the node stops
/// answering for its EIPs when the agent itself would have fenced.
#[inline(always)]
fn announce_lease_valid() -> bool {
    match ANNOUNCE_UNTIL.get(0) {
        // SAFETY: plain helper call.
        Some(&until) => until == 0 || unsafe { bpf_ktime_get_ns() } < until,
        None => true,
    }
}

#[inline(always)]
fn owned_answering(addr: &Addr) -> bool {
    if !announce_lease_valid() {
        return false;
    }
    match OWNED_EIPS.get_ptr(addr) {
        // SAFETY: valid map value pointer.
        Some(o) => unsafe { (*o).flags & OWNED_ANSWER_NEIGH != 0 },
        None => false,
    }
}

/// Turns an ARP request for an owned EIP into the reply, sent back out of
/// the interface it came in on.
#[inline(always)]
fn arp_reply_inner(ctx: &TcContext, mac: [u8; 6]) -> Result<i32, u32> {
    let eth: *mut EthHdr = ptr_at(ctx, 0).map_err(|_| DROP_MALFORMED)?;
    let arp: *mut ArpHdr = match ptr_at(ctx, ETH_LEN) {
        Ok(p) => p,
        Err(_) => return Ok(TC_ACT_OK as i32),
    };
    // SAFETY: both pointers bounds-checked by ptr_at; no helper call in between.
    unsafe {
        if (*arp).htype != [0, 1]
            || (*arp).ptype != [0x08, 0x00]
            || (*arp).hlen != 6
            || (*arp).plen != 4
            || (*arp).op != [0, 1]
        {
            return Ok(TC_ACT_OK as i32);
        }
        let tpa = (*arp).tpa;
        let spa = (*arp).spa;
        if tpa == spa || !owned_answering(&crate::mem::v4_mapped(&tpa)) {
            return Ok(TC_ACT_OK as i32);
        }
        let sha = (*arp).sha;
        (*arp).op = [0, 2];
        (*arp).tha = sha;
        (*arp).tpa = spa;
        (*arp).sha = mac;
        (*arp).spa = tpa;
        (*eth).dst = sha;
        (*eth).src = mac;
        Ok(bpf_redirect((*ctx.skb.skb).ifindex, 0) as i32)
    }
}

/// Answers a neighbour solicitation for an owned IPv6 EIP with a solicited
/// advertisement (rewritten in place; both carry one link-layer option).
#[inline(always)]
fn ndp_reply_inner(ctx: &TcContext, mac: [u8; 6]) -> Result<i32, u32> {
    let eth: *mut EthHdr = ptr_at(ctx, 0).map_err(|_| DROP_MALFORMED)?;
    let ip: *mut Ipv6Hdr = ptr_at(ctx, ETH_LEN).map_err(|_| DROP_MALFORMED)?;
    let nd: *mut NdMsg = match ptr_at(ctx, ETH_LEN + IPV6_LEN) {
        Ok(p) => p,
        Err(_) => return Ok(TC_ACT_OK as i32),
    };
    // SAFETY: pointers bounds-checked by ptr_at; no helper call in between
    // except the map lookup, which does not touch the packet.
    unsafe {
        if (*ip).nexthdr != IPPROTO_ICMPV6
            || (*ip).hop_limit != 255
            || u16::from_be_bytes((*ip).payload_len) as usize != ND_LEN
            || (*nd).ty != ICMP6_NEIGH_SOLICIT
            || (*nd).code != 0
            || (*nd).opt_type != 1
            || (*nd).opt_len != 1
        {
            return Ok(TC_ACT_OK as i32);
        }
        let target = (*nd).target;
        let src = (*ip).saddr;
        // Duplicate address detection (unspecified source) is not answered here.
        if src == [0u8; 16] || !owned_answering(&target) {
            return Ok(TC_ACT_OK as i32);
        }
        let peer_mac = (*eth).src;
        (*eth).dst = peer_mac;
        (*eth).src = mac;
        (*ip).daddr = src;
        (*ip).saddr = target;
        (*nd).ty = ICMP6_NEIGH_ADVERT;
        (*nd).flags = [0x60, 0, 0, 0]; // solicited + override
        (*nd).opt_type = 2;
        (*nd).opt_mac = mac;
        (*nd).check = [0, 0];
        // Full checksum: pseudo-header (src, dst, length, next header) + message.
        let mut sum: u32 = 0;
        let mut i = 0;
        while i < 16 {
            sum += u32::from(u16::from_be_bytes([target[i], target[i + 1]]));
            sum += u32::from(u16::from_be_bytes([src[i], src[i + 1]]));
            i += 2;
        }
        sum += ND_LEN as u32 + u32::from(IPPROTO_ICMPV6);
        let words = nd as *const [u8; 2];
        let mut j = 0;
        while j < ND_LEN / 2 {
            let w = *words.add(j);
            sum += u32::from(u16::from_be_bytes(w));
            j += 1;
        }
        sum = (sum & 0xffff) + (sum >> 16);
        sum = (sum & 0xffff) + (sum >> 16);
        let mut c = !(sum as u16);
        if c == 0 {
            c = 0xffff;
        }
        (*nd).check = c.to_be_bytes();
        Ok(bpf_redirect((*ctx.skb.skb).ifindex, 0) as i32)
    }
}

#[inline(always)]
fn try_uplink_ingress(ctx: &mut TcContext) -> Result<i32, u32> {
    let cfg = match CONFIG.get(0) {
        Some(c) => c,
        None => return Ok(TC_ACT_OK as i32),
    };
    if cfg.flags & CFG_GATEWAY == 0 {
        return Ok(TC_ACT_OK as i32);
    }
    // The common reply first. It cannot be a probe (the probe port lies in
    // no port block: node-IP blocks come from a range the controller keeps
    // clear of it), nor ARP or NDP (IPv4 TCP/UDP only).
    if let Some(v) = steer_v4_from_cache(ctx, cfg) {
        return Ok(v);
    }
    if let Some(v) = crate::probe::answer(ctx, cfg) {
        return Ok(v);
    }
    let eth: *const EthHdr = ptr_at(ctx, 0).map_err(|_| DROP_MALFORMED)?;
    // SAFETY: bounds checked by ptr_at.
    let proto = u16::from_be_bytes(unsafe { (*eth).proto });
    if proto == ETH_P_ARP {
        return arp_reply(ctx, cfg.uplink_mac);
    }
    if proto == ETH_P_IPV6 {
        if let Ok(nd) = ptr_at::<NdMsg>(ctx, ETH_LEN + IPV6_LEN) {
            // SAFETY: bounds checked by ptr_at.
            let (nh, ty) = unsafe {
                let ip = (ctx.data() + ETH_LEN) as *const Ipv6Hdr;
                ((*ip).nexthdr, (*nd).ty)
            };
            if nh == IPPROTO_ICMPV6 && ty == ICMP6_NEIGH_SOLICIT {
                return ndp_reply(ctx, cfg.uplink_mac);
            }
        }
    }
    let f = match crate::maps::SCRATCH.get_ptr_mut(0) {
        // SAFETY: this CPU's scratch slot; programs do not nest on one CPU.
        Some(p) => unsafe { &mut *p },
        None => return Ok(TC_ACT_OK as i32),
    };
    if !parse(ctx, f) {
        return Ok(TC_ACT_OK as i32);
    }
    if f.frag == FRAG_LATER {
        return steer_later_fragment(ctx, cfg, f);
    }
    let port = if f.icmp_kind == ICMP_KIND_ERROR {
        f.quoted.sport
    } else if f.icmp_kind == ICMP_KIND_ECHO_REPLY
        || f.proto == IPPROTO_TCP
        || f.proto == IPPROTO_UDP
    {
        f.dport
    } else {
        // Echo requests to the EIP and the like: for the stack.
        return Ok(TC_ACT_OK as i32);
    };
    let bs = cfg.port_block_size;
    if bs != 0 && cfg.gateway_epoch != 0 {
        // A cached steering was found for an owned EIP under this epoch.
        if let Some((flags, worker)) = cached_steering(&f.dst, port / bs, cfg.gateway_epoch) {
            return steer(ctx, cfg, f, flags, worker);
        }
    }
    let owned = match OWNED_EIPS.get_ptr(&f.dst) {
        // SAFETY: valid map value pointer.
        Some(o) => unsafe { *o },
        None => return Ok(TC_ACT_OK as i32),
    };
    if bs == 0 {
        return Err(DROP_NO_CONFIG);
    }
    let key = steer_key(&f.dst, port / bs);
    let target = match REPLY_STEERING.get_ptr(&key) {
        // SAFETY: valid map value pointer.
        Some(s) => unsafe { *s },
        None => {
            // useNodeIP: the node's own connections use ports outside the blocks.
            if owned.flags & OWNED_NODE_IP != 0 {
                return Ok(TC_ACT_OK as i32);
            }
            return Err(DROP_NO_STEERING);
        }
    };
    if cfg.gateway_epoch != 0 {
        remember_steering(
            &f.dst,
            key.block,
            cfg.gateway_epoch,
            target.flags,
            target.worker_tunnel_ip,
        );
    }
    steer(ctx, cfg, f, target.flags, target.worker_tunnel_ip)
}

/// A steering key. The block and the zero padding after it are written as
/// one 32-bit word (a `[0; 2]` literal is a `memset` call in BPF; see `mem`).
#[inline(always)]
fn steer_key(eip: &Addr, block: u16) -> SteerKey {
    let mut k = core::mem::MaybeUninit::<SteerKey>::uninit();
    let p = k.as_mut_ptr();
    // SAFETY: every byte is written before assume_init; `block` and `_pad`
    // are the key's last 4 bytes (little-endian: block first).
    unsafe {
        core::ptr::addr_of_mut!((*p).eip).write(*eip);
        core::ptr::write_unaligned(
            core::ptr::addr_of_mut!((*p).block) as *mut u32,
            u32::from(block).to_le(),
        );
        k.assume_init()
    }
}

const _: () = assert!(
    core::mem::offset_of!(SteerKey, _pad) == core::mem::offset_of!(SteerKey, block) + 2
        && core::mem::size_of::<SteerKey>() == core::mem::offset_of!(SteerKey, block) + 4
);

/// The common reply, an IPv4 TCP or UDP packet (no options, not a
/// fragment) whose (EIP, block) this CPU has steered to another node
/// before: into the tunnel from the headers alone, read as packet words,
/// without the full parse (a third of the path's cost). Anything else:
/// `None`, the full path.
#[inline(always)]
fn steer_v4_from_cache(ctx: &TcContext, cfg: &DatapathConfig) -> Option<i32> {
    let bs = cfg.port_block_size;
    if bs == 0 || cfg.gateway_epoch == 0 {
        return None;
    }
    let l4 = ETH_LEN + core::mem::size_of::<Ipv4Hdr>();
    // The full parse wants the whole transport header (TCP's 20 bytes,
    // UDP's 8); so does this. The smaller bound is checked here.
    let d = ctx.data();
    if d + l4 + core::mem::size_of::<UdpHdr>() > ctx.data_end() {
        return None;
    }
    let ip = d + ETH_LEN;
    // SAFETY: every access below lies in `d .. d + l4 + 8`, checked above.
    let (proto, saddr, daddr, ports) = unsafe {
        if pkt::load16(d + core::mem::offset_of!(EthHdr, proto))
            != u16::from_ne_bytes(ETH_P_IP.to_be_bytes())
        {
            return None;
        }
        // Version/IHL, TOS | ..., flags and fragment offset | TTL, protocol.
        let w0 = pkt::load32(ip).to_ne_bytes();
        let w1 = pkt::load32(ip + 4).to_ne_bytes();
        let w2 = pkt::load32(ip + 8).to_ne_bytes();
        if w0[0] != 0x45 || u16::from_be_bytes([w1[2], w1[3]]) & 0x3fff != 0 {
            return None;
        }
        (
            w2[1],
            pkt::load32(ip + IPV4_SADDR),
            pkt::load32(ip + IPV4_DADDR),
            pkt::load32(d + l4).to_ne_bytes(),
        )
    };
    match proto {
        IPPROTO_TCP if d + l4 + TCP_LEN > ctx.data_end() => return None,
        IPPROTO_TCP | IPPROTO_UDP => {}
        _ => return None,
    }
    let sport = u16::from_be_bytes([ports[0], ports[1]]);
    let dport = u16::from_be_bytes([ports[2], ports[3]]);
    let (flags, worker) = cached_steering_v4(daddr, dport / bs, cfg.gateway_epoch)?;
    if flags & STEER_LOCAL != 0 {
        return None;
    }
    // As `vxlan::flow_entropy` computes it from the parsed flow, so a flow
    // keeps its outer source port whichever path its packets take.
    let prefix = crate::mem::V4_MAPPED_PREFIX[2];
    let entropy = crate::vxlan::entropy(
        prefix ^ saddr,
        prefix ^ daddr,
        u32::from(sport) << 16 | u32::from(dport),
    );
    encap(ctx, cfg, worker, entropy).ok()
}

/// A reply to an owned EIP, to the worker that holds its port's block:
/// through the tunnel, or to the pod when that worker is this node.
#[inline(always)]
fn steer(
    ctx: &mut TcContext,
    cfg: &DatapathConfig,
    f: &Flow,
    flags: u32,
    worker: [u8; 4],
) -> Result<i32, u32> {
    if f.frag == FRAG_FIRST {
        if let Some(e) = crate::frag::next_entry() {
            e.tunnel = worker;
            e.entropy = crate::vxlan::flow_entropy(f);
            e.flags = flags;
            crate::frag::remember(KIND_STEER, f);
        }
    }
    if flags & STEER_LOCAL != 0 {
        let ifindex = reverse(ctx, f)?;
        return Ok(to_pod(ctx, f.v6, ifindex));
    }
    encap(ctx, cfg, worker, crate::vxlan::flow_entropy(f))
}

/// A later IPv4 fragment to an owned EIP goes where its first fragment was
/// steered (see `frag`); without one it is dropped, unless the EIP is the
/// node's own address (then it may be the node's own traffic).
#[inline(never)]
fn steer_later_fragment(ctx: &mut TcContext, cfg: &DatapathConfig, f: &Flow) -> Result<i32, u32> {
    let owned = match OWNED_EIPS.get_ptr(&f.dst) {
        // SAFETY: valid map value pointer.
        Some(o) => unsafe { *o },
        None => return Ok(TC_ACT_OK as i32),
    };
    let e = match crate::frag::recall(KIND_STEER, f) {
        Some(e) => e,
        None if owned.flags & OWNED_NODE_IP != 0 => return Ok(TC_ACT_OK as i32),
        None => return Err(DROP_FRAGMENT),
    };
    if e.flags & STEER_LOCAL != 0 {
        return reply_fragment_to_pod(ctx, f);
    }
    encap(ctx, cfg, e.tunnel, e.entropy)
}

/// A later IPv4 fragment of a reply, to the pod its first fragment went to.
#[inline(never)]
fn reply_fragment_to_pod(ctx: &mut TcContext, f: &Flow) -> Result<i32, u32> {
    let e = crate::frag::recall(KIND_REPLY, f).ok_or(DROP_FRAGMENT)?;
    crate::frag::rewrite_addr(ctx, f, false, &e.addr).map_err(|_| DROP_MALFORMED)?;
    if let Some(s) = crate::maps::POLICY_STATS.get_ptr_mut(&e.policy_id) {
        // SAFETY: per-CPU value of this CPU.
        unsafe {
            (*s).reply_packets += 1;
            (*s).reply_bytes += u64::from(ctx.len());
        }
    }
    Ok(to_pod(ctx, f.v6, e.ifindex))
}

/// Non-inlined (keeps the caller's stack small); the result travels as one
/// i64 so that no path returns undefined register bits.
#[inline(never)]
pub fn arp_reply_raw(ctx: &TcContext, mac: [u8; 6]) -> i64 {
    match arp_reply_inner(ctx, mac) {
        Ok(v) => i64::from(v),
        Err(r) => -(i64::from(r)) - 1,
    }
}

#[inline(always)]
pub fn arp_reply(ctx: &TcContext, mac: [u8; 6]) -> Result<i32, u32> {
    let v = arp_reply_raw(ctx, mac);
    if v < 0 {
        Err((-(v + 1)) as u32)
    } else {
        Ok(v as i32)
    }
}

/// Non-inlined (keeps the caller's stack small); the result travels as one
/// i64 so that no path returns undefined register bits.
#[inline(never)]
pub fn ndp_reply_raw(ctx: &TcContext, mac: [u8; 6]) -> i64 {
    match ndp_reply_inner(ctx, mac) {
        Ok(v) => i64::from(v),
        Err(r) => -(i64::from(r)) - 1,
    }
}

#[inline(always)]
pub fn ndp_reply(ctx: &TcContext, mac: [u8; 6]) -> Result<i32, u32> {
    let v = ndp_reply_raw(ctx, mac);
    if v < 0 {
        Err((-(v + 1)) as u32)
    } else {
        Ok(v as i32)
    }
}
