//! What the programs return: the TC verdict, drops counted by reason, and
//! the one-word form a result takes across a call kept out of line.

use aya_ebpf::programs::TcContext;
use egress_common::TrafficCounter;

use crate::maps::DROPS;

/// Counts a dropped packet under `reason` and returns the drop verdict.
#[inline(always)]
pub fn drop_with(ctx: &TcContext, reason: u32) -> i32 {
    count(ctx, reason);
    aya_ebpf::bindings::TC_ACT_SHOT as i32
}

/// Counts a packet under `reason` (`egress_common::drops`), whatever
/// becomes of it.
#[inline(always)]
pub fn count(ctx: &TcContext, reason: u32) {
    if let Some(slot) = DROPS.get_ptr_mut(reason) {
        let slot: *mut TrafficCounter = slot;
        // SAFETY: per-CPU slot owned by this CPU for the program's run.
        unsafe {
            (*slot).packets += 1;
            (*slot).bytes += u64::from(ctx.len());
        }
    }
}

/// A result, a value (>= 0) or a drop reason, as one i64: the form it
/// takes across a function the compiler keeps out of line (`#[inline(never)]`
/// keeps the callers' 512-byte stacks small). Such a call returns one
/// register, and a `Result` would leave some of its bits undefined on some
/// paths, which the verifier refuses. A reason `r` travels as `-(r + 1)`.
#[repr(transparent)]
#[derive(Clone, Copy)]
pub struct Packed(i64);

impl Packed {
    #[inline(always)]
    pub fn ok(v: i64) -> Self {
        Self(v)
    }

    #[inline(always)]
    pub fn err(reason: u32) -> Self {
        Self(-i64::from(reason) - 1)
    }

    #[inline(always)]
    pub fn new<T: Into<i64>>(r: Result<T, u32>) -> Self {
        match r {
            Ok(v) => Self::ok(v.into()),
            Err(reason) => Self::err(reason),
        }
    }

    #[inline(always)]
    pub fn get(self) -> Result<i64, u32> {
        if self.0 < 0 {
            Err((-(self.0 + 1)) as u32)
        } else {
            Ok(self.0)
        }
    }
}
