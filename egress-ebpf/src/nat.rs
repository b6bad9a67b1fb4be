//! The worker's NAT: forward translation with port allocation from this
//! node's blocks, and reverse translation of replies and ICMP errors.

use aya_ebpf::{
    bindings::{BPF_ANY, BPF_NOEXIST},
    programs::TcContext,
};
use egress_common::{
    addr::Addr,
    config::DatapathConfig,
    drops::*,
    nat::*,
    policy::{EgressTarget, TARGET_LOCAL_GATEWAY},
    ports::{block_slot, flow_hash, PortBlocks, MAX_BLOCKS_PER_EIP},
};

use crate::{
    flow::{rewrite, Flow, Side, ICMP_KIND_ERROR},
    hdr::*,
    icmp_quote::rewrite_icmp_error,
    maps::{NAT_FWD, NAT_REV, PORT_BLOCKS},
    mem::{addr_words, set_addr_words},
    verdict::Packed,
};

/// How many ports a new flow tries before giving up. The controller keeps
/// a worker's blocks at most half full (see the grant rule in
/// `egress_control::controller::grants`), so 16 random probes all miss with a
/// chance below 2^-16; only a worker at its limit gets here.
const PORT_PROBES: u32 = 16;

#[inline(always)]
fn idle_timeout_ns(cfg: &DatapathConfig, proto: u8, fwd_state: u8, rev_state: u8) -> u64 {
    let t = &cfg.timeouts;
    let secs = match proto {
        IPPROTO_TCP => {
            if fwd_state == TCP_ESTABLISHED && rev_state == TCP_ESTABLISHED {
                t.tcp_established
            } else {
                t.tcp_transitory
            }
        }
        IPPROTO_UDP => t.udp,
        _ => t.icmp,
    };
    u64::from(secs) * 1_000_000_000
}

#[inline(always)]
pub fn next_tcp_state(old: u8, flags: u8) -> u8 {
    if flags & (TCP_FIN | TCP_RST) != 0 {
        TCP_CLOSING
    } else if flags & TCP_SYN != 0 && old == 0 {
        TCP_SYN_SENT
    } else if old == TCP_CLOSING {
        TCP_CLOSING
    } else {
        TCP_ESTABLISHED
    }
}

/// The key of the flow as parsed: the forward key of a pod's packet, the
/// reverse key of a reply. Built a word at a time from the aligned
/// addresses of `Flow` (see `flow`).
#[inline(always)]
pub fn fwd_key(f: &Flow) -> NatKey {
    let mut k = core::mem::MaybeUninit::<NatKey>::uninit();
    let p = k.as_mut_ptr();
    // SAFETY: every byte is written before assume_init; NatKey is 4-byte
    // aligned with its addresses first, and so are Flow's (asserted there).
    unsafe {
        set_addr_words(core::ptr::addr_of_mut!((*p).src), addr_words(&f.src));
        set_addr_words(core::ptr::addr_of_mut!((*p).dst), addr_words(&f.dst));
        core::ptr::addr_of_mut!((*p).sport).write(f.sport);
        core::ptr::addr_of_mut!((*p).dport).write(f.dport);
        core::ptr::write_unaligned(
            core::ptr::addr_of_mut!((*p).proto) as *mut u32,
            u32::from(f.proto).to_le(),
        );
        k.assume_init()
    }
}

const _: () = assert!(
    core::mem::align_of::<NatKey>() >= 4
        && core::mem::offset_of!(NatKey, src) == 0
        && core::mem::offset_of!(NatKey, dst) == 16
);

/// A NAT key. The protocol and the zero padding after it are written as
/// one 32-bit word: a `[0; 3]` literal is a `memset` call in BPF (see `mem`).
#[inline(always)]
pub fn nat_key(src: &Addr, dst: &Addr, sport: u16, dport: u16, proto: u8) -> NatKey {
    let mut k = core::mem::MaybeUninit::<NatKey>::uninit();
    let p = k.as_mut_ptr();
    // SAFETY: every byte is written before assume_init; `proto` and `_pad`
    // are the key's last 4 bytes (little-endian: proto first).
    unsafe {
        core::ptr::addr_of_mut!((*p).src).write(*src);
        core::ptr::addr_of_mut!((*p).dst).write(*dst);
        core::ptr::addr_of_mut!((*p).sport).write(sport);
        core::ptr::addr_of_mut!((*p).dport).write(dport);
        core::ptr::write_unaligned(
            core::ptr::addr_of_mut!((*p).proto) as *mut u32,
            u32::from(proto).to_le(),
        );
        k.assume_init()
    }
}

const _: () = assert!(
    core::mem::offset_of!(NatKey, _pad) == core::mem::offset_of!(NatKey, proto) + 1
        && core::mem::size_of::<NatKey>() == core::mem::offset_of!(NatKey, proto) + 4
);

/// An existing translation of the flow to the same EIP: refreshed with the
/// current policy tables' values in `fresh` (all but the port and state);
/// its port. `None` when it is of another EIP.
#[inline(always)]
fn reuse(e: &mut NatEntry, fresh: &NatEntry, f: &Flow) -> Option<u16> {
    if e.addr != fresh.addr {
        return None;
    }
    e.last_seen_ns = fresh.last_seen_ns;
    if f.proto == IPPROTO_TCP {
        e.state = next_tcp_state(e.state, f.tcp_flags);
    }
    // Still right under the current policy tables.
    e.epoch = fresh.epoch;
    e.ifindex = fresh.ifindex;
    e.flags = fresh.flags;
    e.stats_slot = fresh.stats_slot;
    Some(e.port)
}

/// Where a new flow's port search starts: a hash of its addresses
/// (their last words), ports and protocol.
#[inline(always)]
fn port_hash(f: &Flow) -> u32 {
    flow_hash(&[
        u32::from_ne_bytes([f.src[12], f.src[13], f.src[14], f.src[15]]),
        u32::from_ne_bytes([f.dst[12], f.dst[13], f.dst[14], f.dst[15]]),
        u32::from(f.sport) << 16 | u32::from(f.dport),
        u32::from(f.proto) ^ u32::from_ne_bytes([f.src[8], f.src[9], f.src[10], f.src[11]]),
    ])
}

/// The port of reverse key `rev` is taken: takes it over when its flow has
/// been idle for its timeout (the forward entry removed, the reverse one
/// overwritten). True when the port is this flow's now.
#[inline(always)]
fn reclaim_idle(
    cfg: &DatapathConfig,
    f: &Flow,
    rev: &NatKey,
    rev_val: &NatEntry,
    now: u64,
) -> bool {
    let Some(old) = NAT_REV.get_ptr(rev) else {
        return false;
    };
    // SAFETY: valid map value pointer.
    let old = unsafe { &*old };
    let old_fwd = nat_key(&old.addr, &f.dst, old.port, f.dport, f.proto);
    let (fwd_seen, fwd_state) = match NAT_FWD.get_ptr(&old_fwd) {
        // SAFETY: valid map value pointer.
        Some(e) => unsafe { ((*e).last_seen_ns, (*e).state) },
        None => (0, 0),
    };
    let seen = if fwd_seen > old.last_seen_ns {
        fwd_seen
    } else {
        old.last_seen_ns
    };
    if now.saturating_sub(seen) < idle_timeout_ns(cfg, f.proto, fwd_state, old.state) {
        return false;
    }
    let _ = NAT_FWD.remove(&old_fwd);
    NAT_REV.insert(rev, rev_val, u64::from(BPF_ANY)).is_ok()
}

/// The EIP's port blocks on this worker and how many of them new flows
/// choose from.
#[inline(always)]
fn granted_blocks(eip: &Addr, cfg: &DatapathConfig) -> Result<(&'static PortBlocks, u32), u32> {
    let blocks = PORT_BLOCKS.get_ptr(eip).ok_or(DROP_NO_PORT_BLOCK)?;
    // SAFETY: valid map value pointer.
    let blocks = unsafe { &*blocks };
    if cfg.port_block_size == 0 {
        return Err(DROP_NO_PORT_BLOCK);
    }
    let n = blocks.count;
    // Written by the agent for an EIP the controller could grant no block
    // of: the EIP is exhausted, and the pod is told so at once.
    if n == 0 {
        return Err(DROP_PORTS_EXHAUSTED);
    }
    let max = MAX_BLOCKS_PER_EIP as u32;
    Ok((blocks, if n > max { max } else { n }))
}

/// Finds or creates the translation of `f` to its EIP and returns the EIP
/// port. `absent`: the caller just looked the forward key up and found
/// nothing, so the lookup is not repeated.
#[inline(always)]
fn translate_forward(
    ctx: &TcContext,
    cfg: &DatapathConfig,
    f: &Flow,
    target: &EgressTarget,
    absent: bool,
) -> Packed {
    // The coarse clock (one tick of resolution) is enough for timeouts in
    // seconds and cheaper to read; every NAT timestamp uses it. Idle means
    // `now - seen >= timeout`, so a zero timeout expires within one tick too;
    // saturating, since a CPU's reading may trail another's by one tick
    // (`clock::coarse_ns`).
    let now = crate::clock::coarse_ns();
    let key = fwd_key(f);
    let mut fresh = forward_template(cfg, f, target, now);
    if !absent {
        if let Some(e) = NAT_FWD.get_ptr_mut(&key) {
            // SAFETY: valid map value pointer, for this run.
            if let Some(port) = unsafe { reuse(&mut *e, &fresh, f) } {
                return Packed::ok(i64::from(port));
            }
            // The policy now maps this flow to another EIP: allocate anew.
        }
    }
    new_translation(ctx, cfg, f, &key, &mut fresh)
}

/// The forward entry of `f` under the current policy tables, but for its
/// port and TCP state.
#[inline(always)]
fn forward_template(cfg: &DatapathConfig, f: &Flow, target: &EgressTarget, now: u64) -> NatEntry {
    let flags = if target.flags & TARGET_LOCAL_GATEWAY != 0 {
        NAT_LOCAL_GATEWAY
    } else {
        0
    };
    NatEntry {
        addr: if f.v6 { target.eip_v6 } else { target.eip_v4 },
        port: 0,
        state: 0,
        flags,
        ifindex: u32::from_ne_bytes(f.gw),
        stats_slot: target.stats_slot,
        epoch: cfg.policy_epoch,
        last_seen_ns: now,
    }
}

/// A new flow: claims a port of the EIP's blocks, then writes the forward
/// entry (the reverse one was written by the claim). `fwd` is the forward
/// entry but for its port and state, which are filled in here (in place:
/// the program's stack is small).
#[inline(always)]
fn new_translation(
    ctx: &TcContext,
    cfg: &DatapathConfig,
    f: &Flow,
    key: &NatKey,
    fwd: &mut NatEntry,
) -> Packed {
    let (blocks, n) = match granted_blocks(&fwd.addr, cfg) {
        Ok(b) => b,
        Err(reason) => return Packed::err(reason),
    };
    let rev_val = NatEntry {
        addr: f.src,
        port: f.sport,
        state: 0,
        flags: 0,
        // SAFETY: skb pointer from the context.
        ifindex: unsafe { (*ctx.skb.skb).ifindex },
        stats_slot: fwd.stats_slot,
        epoch: 0,
        last_seen_ns: fwd.last_seen_ns,
    };
    let Some((port, rev)) = claim_port(cfg, f, &fwd.addr, blocks, n, &rev_val) else {
        return Packed::err(DROP_PORTS_EXHAUSTED);
    };
    fwd.port = port;
    if f.proto == IPPROTO_TCP {
        fwd.state = next_tcp_state(0, f.tcp_flags);
    }
    if NAT_FWD.insert(key, fwd, u64::from(BPF_ANY)).is_err() {
        let _ = NAT_REV.remove(&rev);
        return Packed::err(DROP_NAT_INSERT);
    }
    count_event(ctx, NAT_EVENT_NEW);
    if f.proto == IPPROTO_TCP && f.tcp_flags & TCP_SYN == 0 {
        count_event(ctx, NAT_EVENT_TCP_MIDSTREAM);
    }
    Packed::ok(i64::from(port))
}

/// Tries up to `PORT_PROBES` ports of the first `n` blocks, from the
/// flow's hash on, and takes the first free (or idle) one by writing its
/// reverse entry `rev_val`. The port and that reverse key.
#[inline(always)]
fn claim_port(
    cfg: &DatapathConfig,
    f: &Flow,
    eip: &Addr,
    blocks: &PortBlocks,
    n: u32,
    rev_val: &NatEntry,
) -> Option<(u16, NatKey)> {
    let bs = u32::from(cfg.port_block_size);
    let h = port_hash(f);
    let mut i: u32 = 0;
    while i < PORT_PROBES {
        let hh = h.wrapping_add(i.wrapping_mul(0x9e37_79b1));
        i += 1;
        let idx = block_slot(hh, n) as usize;
        if idx >= MAX_BLOCKS_PER_EIP {
            continue;
        }
        let port = u32::from(blocks.blocks[idx]) * bs + (hh & 0xffff) % bs;
        if port == 0 || port > 65535 {
            continue;
        }
        let port = port as u16;
        let rev = nat_key(&f.dst, eip, f.dport, port, f.proto);
        let taken = NAT_REV
            .insert(&rev, rev_val, u64::from(BPF_NOEXIST))
            .is_ok()
            // The reverse entry carries this packet's time.
            || reclaim_idle(cfg, f, &rev, rev_val, rev_val.last_seen_ns);
        if taken {
            return Some((port, rev));
        }
    }
    None
}

/// Counts a NAT event (`egress_common::nat::NAT_EVENT_*`) on this CPU.
#[inline(always)]
fn count_event(ctx: &TcContext, event: u32) {
    if let Some(c) = crate::maps::NAT_EVENTS.get_ptr_mut(event) {
        // SAFETY: per-CPU slot owned by this CPU for the program's run.
        unsafe {
            (*c).packets += 1;
            (*c).bytes += u64::from(ctx.len());
        }
    }
}

/// Reverse key of a reply (or of the flow an ICMP error quotes).
#[inline(always)]
fn rev_key(f: &Flow) -> NatKey {
    if f.icmp_kind == ICMP_KIND_ERROR && f.has_quoted {
        let q = &f.quoted;
        // The quoted packet is ours as sent: src = EIP:port, dst = remote.
        let proto = q.proto;
        let is_icmp = proto == IPPROTO_ICMP || proto == IPPROTO_ICMPV6;
        nat_key(
            &q.dst,
            &q.src,
            if is_icmp { 0 } else { q.dport },
            q.sport,
            proto,
        )
    } else {
        fwd_key(f)
    }
}

/// Reverse-translates a reply to an EIP and returns the pod's veth ifindex.
#[inline(always)]
fn translate_reverse(ctx: &mut TcContext, f: &Flow) -> Result<u32, u32> {
    let key = rev_key(f);
    let e = NAT_REV.get_ptr_mut(&key).ok_or(DROP_NO_NAT_ENTRY)?;
    // SAFETY: valid map value pointer; copied before the packet is touched.
    let entry = unsafe {
        (*e).last_seen_ns = crate::clock::coarse_ns();
        if f.proto == IPPROTO_TCP {
            (*e).state = next_tcp_state(
                if (*e).state == 0 {
                    TCP_SYN_SENT
                } else {
                    (*e).state
                },
                f.tcp_flags & !TCP_SYN,
            );
        }
        *e
    };
    if f.icmp_kind == ICMP_KIND_ERROR && f.has_quoted {
        rewrite_icmp_error(ctx, f, &entry.addr, entry.port)
    } else {
        rewrite(ctx, f, Side::Dst, &entry.addr, entry.port)
    }
    .map_err(|_| DROP_HELPER)?;
    if f.frag == crate::flow::FRAG_FIRST {
        if let Some(e) = crate::frag::next_entry() {
            crate::mem::copy_addr(&mut e.addr, &entry.addr);
            e.stats_slot = entry.stats_slot;
            e.ifindex = entry.ifindex;
            crate::frag::remember(crate::frag::KIND_REPLY, f);
        }
    }
    // SAFETY: `e` is still the valid map value pointer.
    crate::policy_stats::reply(unsafe { &(*e).stats_slot }, ctx.len());
    Ok(entry.ifindex)
}

/// Out of line (see `verdict::Packed`).
#[inline(never)]
fn forward_port_packed(
    ctx: &TcContext,
    cfg: &DatapathConfig,
    f: &Flow,
    target: &EgressTarget,
    absent: bool,
) -> Packed {
    translate_forward(ctx, cfg, f, target, absent)
}

#[inline(always)]
pub fn forward_port(
    ctx: &TcContext,
    cfg: &DatapathConfig,
    f: &Flow,
    target: &EgressTarget,
    absent: bool,
) -> Result<u16, u32> {
    forward_port_packed(ctx, cfg, f, target, absent)
        .get()
        .map(|v| v as u16)
}

/// Out of line (see `verdict::Packed`).
#[inline(never)]
fn reverse_packed(ctx: &mut TcContext, f: &Flow) -> Packed {
    Packed::new(translate_reverse(ctx, f))
}

/// Reverse-translates a reply to its pod; the pod's link index.
#[inline(always)]
pub fn reverse(ctx: &mut TcContext, f: &Flow) -> Result<u32, u32> {
    reverse_packed(ctx, f).get().map(|v| v as u32)
}
