//! The per-policy counters (`POLICY_STATS`), by the policy's stats slot
//! (`EgressTarget::stats_slot`, which NAT and fragment entries carry).

use aya_ebpf::helpers::generated::bpf_map_lookup_elem;
use egress_common::policy::PolicyStats;

use crate::maps::POLICY_STATS;

/// This CPU's counters of `slot`. The slot is read where it lies (a map
/// value): a copy on the stack would push the deepest programs' frames
/// past the verifier's 512 bytes.
#[inline(always)]
fn counters(slot: &u32) -> Option<*mut PolicyStats> {
    // SAFETY: the map's definition and a readable 4-byte key; the verifier
    // inlines a per-CPU array's lookup (no call, no hash).
    let p = unsafe {
        bpf_map_lookup_elem(
            core::ptr::from_ref(&POLICY_STATS).cast_mut().cast(),
            core::ptr::from_ref(slot).cast(),
        )
    };
    (!p.is_null()).then_some(p.cast())
}

/// A packet of `len` bytes from a pod, translated under the policy of `slot`.
#[inline(always)]
pub fn egress(slot: &u32, len: u32) {
    if let Some(s) = counters(slot) {
        // SAFETY: this CPU's value; programs do not nest on one CPU.
        unsafe {
            (*s).egress_packets += 1;
            (*s).egress_bytes += u64::from(len);
        }
    }
}

/// A reply of `len` bytes delivered to a pod under the policy of `slot`.
#[inline(always)]
pub fn reply(slot: &u32, len: u32) {
    if let Some(s) = counters(slot) {
        // SAFETY: this CPU's value; programs do not nest on one CPU.
        unsafe {
            (*s).reply_packets += 1;
            (*s).reply_bytes += u64::from(len);
        }
    }
}
