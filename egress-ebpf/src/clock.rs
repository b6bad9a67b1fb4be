//! Time, cheaply: the kernel's tick counter for cache lifetimes, and the
//! coarse clock read at most once per tick and CPU for NAT timestamps.

use aya_ebpf::{
    btf_maps::PerCpuArray,
    helpers::generated::{bpf_jiffies64, bpf_ktime_get_coarse_ns},
    macros::btf_map,
};

/// The kernel's tick counter (jiffies), the clock of every cache lifetime
/// (`cache::expiry`): the verifier turns this helper into one load, where
/// reading even the coarse clock is a call that cost ~13 ns per packet on
/// the reply path.
#[inline(always)]
pub fn ticks() -> u64 {
    // SAFETY: plain helper call.
    unsafe { bpf_jiffies64() }
}

/// This CPU's last coarse-clock reading and the tick it was taken in.
#[repr(C)]
pub struct ClockReading {
    tick: u64,
    ns: u64,
}

#[btf_map]
static CLOCK: PerCpuArray<ClockReading, 1> = PerCpuArray::new();

/// The coarse clock (`bpf_ktime_get_coarse_ns`), read at most once per
/// tick on each CPU: the clock itself only moves once per tick, and the
/// helper call cost ~13 ns per packet. The kernel advances the tick count
/// just before the clock, so a reading taken in between is one tick old
/// for the rest of that tick on this CPU: a timestamp may trail another
/// CPU's by one tick (callers compare them saturating).
#[inline(always)]
pub fn coarse_ns() -> u64 {
    let t = ticks();
    if let Some(c) = CLOCK.get_ptr_mut(0) {
        // SAFETY: this CPU's slot; programs do not nest on one CPU.
        unsafe {
            if (*c).tick != t {
                (*c).ns = bpf_ktime_get_coarse_ns();
                (*c).tick = t;
            }
            return (*c).ns;
        }
    }
    // SAFETY: plain helper call.
    unsafe { bpf_ktime_get_coarse_ns() }
}
