//! IP fragments of translated datagrams (IPv4, and IPv6 with a Fragment
//! header right after the fixed header).
//!
//! Only the first fragment of a datagram carries the ports, so only it can
//! be matched to a NAT entry or a port block. Each path that translates or
//! steers a first fragment remembers what it did under (source,
//! destination, IP id, protocol) as the packet arrived, and the later
//! fragments of the datagram get the same: the worker's egress the EIP
//! and gateway, the gateway's reply the worker, the worker's reply the pod.
//! A later fragment of such a datagram whose first fragment was not seen
//! (lost, or overtaken) is dropped and counted (`DROP_FRAGMENT`): it could
//! only leave with the wrong address. Fragments of other traffic pass.
//!
//! The table is an LRU, per node, not pinned: a datagram's fragments
//! arrive within milliseconds, and an entry older than the kernel's own
//! reassembly timeout is not used.

use aya_ebpf::{
    bindings::BPF_ANY,
    btf_maps::{LruHashMap, PerCpuArray},
    macros::btf_map,
    programs::TcContext,
};
use egress_common::addr::Addr;

use crate::{
    ctx::{csum_replace4, ptr_at},
    flow::Flow,
    hdr::{Ipv4Hdr, Ipv6Hdr, ETH_LEN},
};

/// Which path remembered a datagram (a node that is worker and gateway
/// sees the same reply as gateway and as worker).
pub const KIND_EGRESS: u8 = 1;
pub const KIND_STEER: u8 = 2;
pub const KIND_REPLY: u8 = 3;

/// As `net.ipv4.ipfrag_time`'s default: a datagram is not reassembled
/// after that.
const FRAG_TIMEOUT_NS: u64 = 30_000_000_000;

/// A datagram as its fragments arrive on one path.
#[repr(C)]
pub struct FragKey {
    pub src: Addr,
    pub dst: Addr,
    pub id: u32,
    pub kind: u8,
    pub proto: u8,
    pub _pad: u16,
}

/// What the first fragment got. `addr`: the new source (egress) or
/// destination (reply); `tunnel`: the gateway or worker endpoint.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct FragEntry {
    pub addr: Addr,
    pub tunnel: [u8; 4],
    /// The policy's counters (`EgressTarget::stats_slot`).
    pub stats_slot: u32,
    pub ifindex: u32,
    /// The flow entropy of the first fragment (the same outer UDP port, so
    /// that the underlay keeps the datagram on one path).
    pub entropy: u32,
    pub flags: u32,
    pub _pad: u32,
    pub seen_ns: u64,
}

#[btf_map]
static FRAGS: LruHashMap<FragKey, FragEntry, 16384> = LruHashMap::new();
/// The entry a path fills before `remember` (per CPU: off the stack).
#[btf_map]
static FRAG_NEXT: PerCpuArray<FragEntry, 1> = PerCpuArray::new();

/// This CPU's entry to fill for [`remember`].
#[inline(always)]
pub fn next_entry() -> Option<&'static mut FragEntry> {
    // SAFETY: this CPU's slot; programs do not nest on one CPU.
    FRAG_NEXT.get_ptr_mut(0).map(|p| unsafe { &mut *p })
}

#[inline(always)]
fn key(kind: u8, f: &Flow) -> FragKey {
    FragKey {
        src: f.src,
        dst: f.dst,
        id: f.ip_id,
        kind,
        proto: f.proto,
        _pad: 0,
    }
}

/// Remembers what the first fragment `f` got on the path `kind`: the
/// entry filled in [`next_entry`]. Non-inlined: the key stays off the
/// callers' frames.
#[inline(never)]
pub fn remember(kind: u8, f: &Flow) {
    let Some(e) = next_entry() else {
        return;
    };
    e.seen_ns = crate::clock::coarse_ns();
    let _ = FRAGS.insert(&key(kind, f), e, u64::from(BPF_ANY));
}

/// What the first fragment of `f`'s datagram got on the path `kind`.
#[inline(always)]
pub fn recall(kind: u8, f: &Flow) -> Option<FragEntry> {
    let e = FRAGS.get_ptr(&key(kind, f))?;
    // SAFETY: valid map value pointer; copied out.
    let e = unsafe { *e };
    let now = crate::clock::coarse_ns();
    if now.saturating_sub(e.seen_ns) > FRAG_TIMEOUT_NS {
        return None;
    }
    Some(e)
}

/// Rewrites the source (`src`) or destination of a later fragment `f`:
/// the IP header only (the transport header, and with it the transport
/// checksum, is in the first fragment). IPv4: the header checksum too
/// (address and checksum changes cancel in `skb->csum`); IPv6 has none, so
/// the change is carried into `skb->csum`.
#[inline(always)]
pub fn rewrite_addr(ctx: &TcContext, f: &Flow, src: bool, addr: &Addr) -> Result<(), ()> {
    if f.v6 {
        let ip: *mut Ipv6Hdr = ptr_at(ctx, ETH_LEN)?;
        let old = if src { &f.src } else { &f.dst };
        // SAFETY: bounds checked by ptr_at.
        unsafe {
            let a = if src {
                &mut (*ip).saddr
            } else {
                &mut (*ip).daddr
            };
            crate::mem::copy_addr(a, addr);
        }
        crate::ctx::csum_carry(ctx, crate::ctx::csum_diff16(old, addr));
        return Ok(());
    }
    let ip: *mut Ipv4Hdr = ptr_at(ctx, ETH_LEN)?;
    let new = [addr[12], addr[13], addr[14], addr[15]];
    // SAFETY: bounds checked by ptr_at.
    unsafe {
        let old = if src { (*ip).saddr } else { (*ip).daddr };
        if src {
            (*ip).saddr = new;
        } else {
            (*ip).daddr = new;
        }
        (*ip).check = csum_replace4((*ip).check, old, new);
    }
    Ok(())
}
