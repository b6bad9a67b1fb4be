//! Copies and zeroing written out as single stores.
//!
//! The BPF backend lowers no `memset` or `memmove` inline: a zeroed array,
//! a struct's padding, or an address copied between two pointers LLVM
//! cannot tell apart (the packet and a map value) becomes a call to a
//! subprogram that loops one byte at a time: 10-16 iterations for an
//! address, 64 for a FIB parameter block, on every packet. The stores here
//! are volatile so that LLVM cannot merge them back into such a call.

use core::ptr::{read_volatile, write_volatile};
use egress_common::addr::Addr;

/// `*dst = *src` for a 16-byte address, one byte at a time, unrolled.
#[inline(always)]
pub fn copy_addr(dst: &mut Addr, src: &Addr) {
    copy_bytes(dst, src)
}

/// `*dst = *src`, one byte at a time, unrolled.
#[inline(always)]
pub fn copy_bytes<const N: usize>(dst: &mut [u8; N], src: &[u8; N]) {
    let (d, s) = (dst.as_mut_ptr(), src.as_ptr());
    let mut i = 0;
    while i < N {
        // SAFETY: inside both N-byte arrays.
        unsafe { write_volatile(d.add(i), read_volatile(s.add(i))) };
        i += 1;
    }
}

/// `*dst = ::ffff:a.b.c.d`, the IPv4-mapped form of `v4`, one byte at a
/// time (volatile: into map memory, where LLVM would merge the zeros into
/// a `memset` call).
#[inline(always)]
pub fn put_v4_mapped(dst: &mut Addr, v4: &[u8; 4]) {
    let d = dst.as_mut_ptr();
    let mut i = 0;
    while i < 16 {
        let b = if i < 10 {
            0
        } else if i < 12 {
            0xff
        } else {
            v4[i - 12]
        };
        // SAFETY: inside the 16-byte block.
        unsafe { write_volatile(d.add(i), b) };
        i += 1;
    }
}

/// The IPv4-mapped form of `v4` as a value, for a local (`egress_common`'s
/// `v4_mapped` starts from a zeroed array: a `memset` call here). Plain
/// word stores, so that the value can stay in registers.
#[inline(always)]
pub fn v4_mapped(v4: &[u8; 4]) -> Addr {
    let mut a = core::mem::MaybeUninit::<Addr>::uninit();
    let p = a.as_mut_ptr() as *mut u8;
    // SAFETY: the three writes cover the 16 bytes before assume_init.
    unsafe {
        core::ptr::write_unaligned(p as *mut u64, 0);
        core::ptr::write_unaligned(p.add(8) as *mut [u8; 4], [0, 0, 0xff, 0xff]);
        core::ptr::write_unaligned(p.add(12) as *mut [u8; 4], *v4);
        a.assume_init()
    }
}

/// The four words of an address (memory order) stored where it is 4-byte
/// aligned: a byte array's accesses are otherwise split into single bytes.
///
/// # Safety
/// `a` must be 4-byte aligned: a field at a multiple of 4 in a struct
/// aligned to 4 or more (the callers assert their layouts).
#[inline(always)]
pub unsafe fn addr_words(a: *const Addr) -> [u32; 4] {
    let w = a as *const u32;
    // SAFETY: aligned and inside the address, as the caller promised.
    unsafe { [*w, *w.add(1), *w.add(2), *w.add(3)] }
}

/// Stores an address given as four words (memory order) where it is
/// 4-byte aligned, one store per word.
///
/// # Safety
/// As for [`addr_words`].
#[inline(always)]
pub unsafe fn set_addr_words(a: *mut Addr, w: [u32; 4]) {
    let p = a as *mut u32;
    let mut i = 0;
    while i < 4 {
        // SAFETY: aligned and inside the address, as the caller promised.
        unsafe { write_volatile(p.add(i), w[i]) };
        i += 1;
    }
}

/// The first three words of every IPv4-mapped address (`::ffff:0:0/96`),
/// in memory order.
pub const V4_MAPPED_PREFIX: [u32; 3] = [0, 0, u32::from_ne_bytes([0, 0, 0xff, 0xff])];

/// The words of `::ffff:a.b.c.d` for the IPv4 word `v4` (memory order).
#[inline(always)]
pub fn v4_mapped_words(v4: u32) -> [u32; 4] {
    let [a, b, c] = V4_MAPPED_PREFIX;
    [a, b, c, v4]
}

/// Zeroes a `T` made of 32-bit words (a helper's parameter block), one
/// word per store.
///
/// # Safety
/// `p` must be valid for writes of a `T`, 4-byte aligned, and all-zero
/// bytes must be a valid `T`.
#[inline(always)]
pub unsafe fn zero_words<T>(p: *mut T) {
    let w = p as *mut u32;
    let mut i = 0;
    while i < core::mem::size_of::<T>() / 4 {
        // SAFETY: inside the caller's T, aligned as the caller promised.
        unsafe { write_volatile(w.add(i), 0) };
        i += 1;
    }
}

/// Zeroes the caller's `slot` in place with [`zero_words`] and returns it.
/// In place: moving a zeroed value out (`assume_init`) is a copy from
/// known zeros, which LLVM turns back into a `memset` call.
///
/// # Safety
/// `T` must be 4-byte aligned and all-zero bytes a valid `T`.
#[inline(always)]
pub unsafe fn zeroed_in<T>(slot: &mut core::mem::MaybeUninit<T>) -> &mut T {
    // SAFETY: the caller's promises; every byte is written before the
    // reference is made.
    unsafe {
        zero_words(slot.as_mut_ptr());
        &mut *slot.as_mut_ptr()
    }
}
