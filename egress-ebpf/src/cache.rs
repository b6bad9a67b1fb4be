//! Per-CPU caches of the gateway paths, so that a packet of a known
//! destination skips the hash lookups and the FIB lookup.
//!
//! Each is a direct-mapped per-CPU array: a slot holds one result with the
//! key it was computed for and the `gateway_epoch` it was computed under.
//! A slot is used only when key and epoch match (a change of the owned
//! EIPs or the steering changes the epoch, see `DatapathConfig`); the
//! forward slots also expire, so that a route or neighbour change is seen
//! within `DatapathConfig::cache_ticks` (200 ms). Only successful results
//! are cached: anything the full path would drop, pass or hand to the
//! kernel is decided by it again.

use aya_ebpf::{btf_maps::PerCpuArray, macros::btf_map};
use egress_common::{addr::Addr, config::DatapathConfig};

/// The tick until which a slot filled now is used (not included).
#[inline(always)]
pub fn expiry(cfg: &DatapathConfig) -> u64 {
    crate::clock::ticks() + u64::from(cfg.cache_ticks)
}

/// Slots of each per-CPU cache (direct-mapped).
pub const SLOTS: usize = 1024;

/// A decapsulated packet's (source EIP, destination) and how it leaves.
#[repr(C)]
pub struct FwdSlot {
    pub src: Addr,
    pub dst: Addr,
    /// `ticks()` from which the slot is no longer used.
    pub expires_tick: u64,
    pub epoch: u32,
    pub ifindex: u32,
    /// The egress device's MTU (larger packets take the full path, which
    /// lets the kernel check them).
    pub mtu: u32,
    pub smac: [u8; 6],
    pub dmac: [u8; 6],
}

/// A reply's (EIP, port block) and where it is steered.
#[repr(C)]
pub struct SteerSlot {
    pub eip: Addr,
    pub block: u16,
    pub _pad: u16,
    /// `STEER_*` flags of the steering entry.
    pub flags: u32,
    pub epoch: u32,
    pub worker_tunnel_ip: [u8; 4],
}

#[btf_map]
pub static FWD_CACHE: PerCpuArray<FwdSlot, SLOTS> = PerCpuArray::new();
#[btf_map]
pub static STEER_CACHE: PerCpuArray<SteerSlot, SLOTS> = PerCpuArray::new();

/// Folds an address into one word (all four for IPv6; IPv4-mapped
/// addresses differ only in the last).
#[inline(always)]
pub fn fold(a: &Addr) -> u32 {
    let w = |i: usize| u32::from_ne_bytes([a[i], a[i + 1], a[i + 2], a[i + 3]]);
    w(0) ^ w(4) ^ w(8) ^ w(12)
}

/// The slot of a key made of two words (multiplicative hashing).
#[inline(always)]
pub fn slot(a: u32, b: u32) -> u32 {
    let h = (a ^ b.rotate_left(16)).wrapping_mul(0x9e37_79b1);
    h >> (32 - (SLOTS as u32).trailing_zeros())
}

#[inline(always)]
pub fn fwd_slot(src: &Addr, dst: &Addr) -> Option<*mut FwdSlot> {
    FWD_CACHE.get_ptr_mut(slot(fold(src), fold(dst)))
}

#[inline(always)]
fn steer_slot(eip: &Addr, block: u16) -> Option<*mut SteerSlot> {
    STEER_CACHE.get_ptr_mut(slot(fold(eip), u32::from(block)))
}

/// The steering (`STEER_*` flags, worker tunnel endpoint) this CPU cached
/// for (EIP, block) under `epoch` (not 0).
#[inline(always)]
pub fn cached_steering(eip: &Addr, block: u16, epoch: u32) -> Option<(u32, [u8; 4])> {
    let s = steer_slot(eip, block)?;
    // SAFETY: this CPU's slot; programs do not nest on one CPU.
    unsafe {
        if (*s).epoch != epoch || (*s).block != block || (*s).eip != *eip {
            return None;
        }
        Some(((*s).flags, (*s).worker_tunnel_ip))
    }
}

/// `cached_steering` for the IPv4 EIP `v4` (a word in memory order),
/// compared a word at a time without building the mapped address (whose
/// `fold` is the prefix's third word ^ `v4`).
#[inline(always)]
pub fn cached_steering_v4(v4: u32, block: u16, epoch: u32) -> Option<(u32, [u8; 4])> {
    let s =
        STEER_CACHE.get_ptr_mut(slot(crate::mem::V4_MAPPED_PREFIX[2] ^ v4, u32::from(block)))?;
    // SAFETY: this CPU's slot; programs do not nest on one CPU. `eip` is
    // the first field of a 4-byte aligned struct, so its words are aligned.
    unsafe {
        let w = core::ptr::addr_of!((*s).eip) as *const u32;
        if (*s).epoch != epoch
            || (*s).block != block
            || *w.add(3) != v4
            || *w.add(2) != crate::mem::V4_MAPPED_PREFIX[2]
            || *w.add(1) != 0
            || *w != 0
        {
            return None;
        }
        Some(((*s).flags, (*s).worker_tunnel_ip))
    }
}

const _: () =
    assert!(core::mem::offset_of!(SteerSlot, eip) == 0 && core::mem::align_of::<SteerSlot>() >= 4);

/// Caches the steering of (EIP, block), found in the tables under `epoch`.
#[inline(always)]
pub fn remember_steering(eip: &Addr, block: u16, epoch: u32, flags: u32, worker: [u8; 4]) {
    if let Some(s) = steer_slot(eip, block) {
        // SAFETY: this CPU's slot; programs do not nest on one CPU.
        unsafe {
            crate::mem::copy_addr(&mut (*s).eip, eip);
            (*s).block = block;
            (*s).flags = flags;
            (*s).epoch = epoch;
            (*s).worker_tunnel_ip = worker;
        }
    }
}
