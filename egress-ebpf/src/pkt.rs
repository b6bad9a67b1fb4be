//! 16- and 32-bit packet loads and stores at any alignment.
//!
//! Header fields are byte arrays (packet headers are not aligned), and the
//! BPF backend splits every access LLVM cannot prove aligned into single
//! bytes: a 4-byte address became 4 loads, 3 shifts and 3 ors. The kernel
//! accepts unaligned packet accesses where the CPU handles them (x86-64,
//! arm64: `HAVE_EFFICIENT_UNALIGNED_ACCESS`; the verifier checks alignment
//! only for the stack, map values and context), so these emit the one
//! instruction themselves. Values are in memory order: the bytes of the
//! packet as a native-endian word (`u32::from_ne_bytes`).
//!
//! The caller bounds-checks `p .. p + size` against `data_end` first, as
//! for any packet access.

/// The 32-bit word at `p`.
///
/// # Safety
/// `p .. p + 4` lies in the packet, checked against `data_end`.
#[inline(always)]
pub unsafe fn load32(p: usize) -> u32 {
    let v: u64;
    // SAFETY: see the function's contract; a plain load.
    unsafe {
        core::arch::asm!(
            "{v} = *(u32 *)({p} + 0)",
            p = in(reg) p,
            v = lateout(reg) v,
            options(nostack, readonly, preserves_flags),
        )
    };
    v as u32
}

/// Stores the 32-bit word `v` at `p`.
///
/// # Safety
/// `p .. p + 4` lies in the packet, checked against `data_end`.
#[inline(always)]
pub unsafe fn store32(p: usize, v: u32) {
    // SAFETY: see the function's contract; a plain store.
    unsafe {
        core::arch::asm!(
            "*(u32 *)({p} + 0) = {v}",
            p = in(reg) p,
            v = in(reg) u64::from(v),
            options(nostack, preserves_flags),
        )
    };
}

/// The 16-bit word at `p`.
///
/// # Safety
/// `p .. p + 2` lies in the packet, checked against `data_end`.
#[inline(always)]
pub unsafe fn load16(p: usize) -> u16 {
    let v: u64;
    // SAFETY: see the function's contract; a plain load.
    unsafe {
        core::arch::asm!(
            "{v} = *(u16 *)({p} + 0)",
            p = in(reg) p,
            v = lateout(reg) v,
            options(nostack, readonly, preserves_flags),
        )
    };
    v as u16
}

/// Stores the 16-bit word `v` at `p`.
///
/// # Safety
/// `p .. p + 2` lies in the packet, checked against `data_end`.
#[inline(always)]
pub unsafe fn store16(p: usize, v: u16) {
    // SAFETY: see the function's contract; a plain store.
    unsafe {
        core::arch::asm!(
            "*(u16 *)({p} + 0) = {v}",
            p = in(reg) p,
            v = in(reg) u64::from(v),
            options(nostack, preserves_flags),
        )
    };
}
