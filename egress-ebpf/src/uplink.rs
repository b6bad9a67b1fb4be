//! `uplink_ingress`, TC ingress on a gateway's uplink: ARP and NDP for the
//! EIPs it owns (see `neigh`), the datapath probes' answers (see `probe`),
//! and replies to owned EIPs, steered to the worker that holds the port's
//! block.

use aya_ebpf::{bindings::TC_ACT_OK, macros::classifier, programs::TcContext};
use egress_common::{
    addr::Addr,
    config::{DatapathConfig, CFG_GATEWAY},
    drops::*,
    steering::*,
};

use crate::{
    cache::{cached_steering, cached_steering_v4, remember_steering},
    ctx::ptr_at,
    flow::{parse, Flow, FRAG_FIRST, FRAG_LATER, ICMP_KIND_ECHO_REPLY, ICMP_KIND_ERROR},
    frag::KIND_STEER,
    fwd::{encap, to_pod},
    hdr::*,
    maps::{CONFIG, OWNED_EIPS, REPLY_STEERING},
    nat::reverse,
    neigh::{arp_reply, ndp_reply},
    pkt,
    tunnel::reply_fragment_to_pod,
    verdict::drop_with,
};

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
pub fn steer_key(eip: &Addr, block: u16) -> SteerKey {
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
    let r = PlainReplyV4::read(ctx.data(), ctx.data_end())?;
    let (flags, worker) = cached_steering_v4(r.daddr, r.dport / bs, cfg.gateway_epoch)?;
    if flags & STEER_LOCAL != 0 {
        return None;
    }
    encap(ctx, cfg, worker, r.entropy()).ok()
}

/// The headers of an IPv4 TCP or UDP packet without IP options that is
/// not a fragment: the replies both the TC and the XDP fast paths steer
/// from their headers alone. Addresses are words in memory order.
pub struct PlainReplyV4 {
    pub saddr: u32,
    pub daddr: u32,
    pub sport: u16,
    pub dport: u16,
}

impl PlainReplyV4 {
    /// Reads the frame `d .. end` (an Ethernet frame), read as packet
    /// words; `None` for anything else.
    #[inline(always)]
    pub fn read(d: usize, end: usize) -> Option<Self> {
        let l4 = ETH_LEN + core::mem::size_of::<Ipv4Hdr>();
        // The full parse wants the whole transport header (TCP's 20 bytes,
        // UDP's 8); so does this. The smaller bound is checked here.
        if d + l4 + core::mem::size_of::<UdpHdr>() > end {
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
            IPPROTO_TCP if d + l4 + TCP_LEN > end => return None,
            IPPROTO_TCP | IPPROTO_UDP => {}
            _ => return None,
        }
        Some(Self {
            saddr,
            daddr,
            sport: u16::from_be_bytes([ports[0], ports[1]]),
            dport: u16::from_be_bytes([ports[2], ports[3]]),
        })
    }

    /// As `vxlan::flow_entropy` computes it from the parsed flow, so a flow
    /// keeps its outer source port whichever path its packets take.
    #[inline(always)]
    pub fn entropy(&self) -> u32 {
        let prefix = crate::mem::V4_MAPPED_PREFIX[2];
        crate::vxlan::entropy(
            prefix ^ self.saddr,
            prefix ^ self.daddr,
            u32::from(self.sport) << 16 | u32::from(self.dport),
        )
    }
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
