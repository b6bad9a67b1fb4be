//! Packet access, checksum and counter helpers shared by the programs.

use aya_ebpf::{
    bindings::{BPF_F_MARK_MANGLED_0, BPF_F_PSEUDO_HDR},
    helpers::generated::{bpf_csum_diff, bpf_csum_update},
    programs::TcContext,
};
use egress_common::addr::Addr;

/// A pointer to a `T` at `off` bytes into the packet, if it is in bounds.
#[inline(always)]
pub fn ptr_at<T>(ctx: &TcContext, off: usize) -> Result<*mut T, ()> {
    // Headers we read all lie in the first 256 bytes; the bound also lets
    // the verifier accept offsets that were computed from packet data.
    if off > 255 {
        return Err(());
    }
    let start = ctx.data();
    let end = ctx.data_end();
    if start + off + core::mem::size_of::<T>() > end {
        return Err(());
    }
    Ok((start + off) as *mut T)
}

/// Carries a change of the packet's bytes that no checksum field absorbs
/// into `skb->csum`: `delta` is a ones'-complement sum of raw (memory
/// order) 16-bit words, new minus old, as `bpf_csum_diff` returns.
///
/// Only a `CHECKSUM_COMPLETE` skb (from a NIC that sums every packet:
/// mlx5, ice, ...) holds a running sum; the helper leaves other skbs
/// alone. Without this, the receiving stack finds the sum wrong, logs
/// "hw csum failure" and verifies every such packet again in software.
#[inline(always)]
pub fn csum_carry(ctx: &TcContext, delta: u32) {
    if delta != 0 {
        // SAFETY: skb pointer from the context; the helper only adds.
        unsafe { bpf_csum_update(ctx.skb.skb, delta) };
    }
}

/// `new - old` of one raw 16-bit word, as a partial sum for [`csum_carry`].
#[inline(always)]
pub fn word_delta(old: u16, new: u16) -> u32 {
    u32::from(!old) + u32::from(new)
}

/// Raw (memory order) value of 2 bytes, as the checksum helpers take them.
#[inline(always)]
pub fn raw16(b: [u8; 2]) -> u64 {
    u64::from(u16::from_ne_bytes(b))
}

#[inline(always)]
pub fn raw32(b: [u8; 4]) -> u64 {
    u64::from(u32::from_ne_bytes(b))
}

/// Checksum flags for the L4 checksum of `proto`, beyond the size bits.
/// UDP gets MARK_MANGLED_0: a zero (absent) IPv4 UDP checksum stays zero,
/// and a result of zero is written as 0xffff.
#[inline(always)]
pub fn l4_flags(proto: u8) -> u64 {
    if proto == crate::hdr::IPPROTO_UDP {
        u64::from(BPF_F_MARK_MANGLED_0)
    } else {
        0
    }
}

/// Replaces a 16-byte address at `addr_off` and folds the change into the
/// checksum at `csum_off` (when `csum_off != 0`), as pseudo-header data if `pseudo`.
#[inline(always)]
pub fn replace_addr16(
    ctx: &mut TcContext,
    addr_off: usize,
    old: &Addr,
    new: &Addr,
    csum_off: usize,
    pseudo: bool,
    extra_flags: u64,
) -> Result<(), ()> {
    ctx.store(addr_off, new, 0).map_err(|_| ())?;
    if csum_off != 0 {
        let mut a = [0u32; 4];
        let mut b = [0u32; 4];
        let mut i = 0;
        while i < 4 {
            a[i] = u32::from_ne_bytes([old[4 * i], old[4 * i + 1], old[4 * i + 2], old[4 * i + 3]]);
            b[i] = u32::from_ne_bytes([new[4 * i], new[4 * i + 1], new[4 * i + 2], new[4 * i + 3]]);
            i += 1;
        }
        // SAFETY: both buffers are 16 bytes on the stack.
        let diff = unsafe { bpf_csum_diff(a.as_mut_ptr(), 16, b.as_mut_ptr(), 16, 0) };
        if diff < 0 {
            return Err(());
        }
        let flags = extra_flags
            | if pseudo {
                u64::from(BPF_F_PSEUDO_HDR)
            } else {
                0
            };
        ctx.l4_csum_replace(csum_off, 0, diff as u64, flags)
            .map_err(|_| ())?;
        if pseudo {
            // The helper takes the address change out of skb->csum as if
            // an IPv4 header checksum had absorbed it; IPv6 has none, and
            // the address and the L4 checksum changes already cancel.
            csum_carry(ctx, diff as u32);
        }
    }
    Ok(())
}

/// The one's-complement difference `new - old` of two 16-byte addresses as
/// a 32-bit partial sum (what `bpf_csum_diff(old, 16, new, 16, 0)` returns),
/// computed without a helper call.
#[inline(always)]
pub fn csum_diff16(old: &Addr, new: &Addr) -> u32 {
    let mut sum: u64 = 0;
    let mut i = 0;
    while i < 16 {
        let o = u32::from_ne_bytes([old[i], old[i + 1], old[i + 2], old[i + 3]]);
        let n = u32::from_ne_bytes([new[i], new[i + 1], new[i + 2], new[i + 3]]);
        sum += u64::from(!o) + u64::from(n);
        i += 4;
    }
    sum = (sum & 0xffff_ffff) + (sum >> 32);
    sum = (sum & 0xffff_ffff) + (sum >> 32);
    sum as u32
}

/// An IPv4 header checksum (network order bytes) updated for a 4-byte
/// change (RFC 1624), in software: the header checksum never depends on
/// the skb's checksum state.
#[inline(always)]
pub fn csum_replace4(check: [u8; 2], old: [u8; 4], new: [u8; 4]) -> [u8; 2] {
    let c = u16::from_be_bytes(check);
    let c = csum_update16(
        c,
        u16::from_be_bytes([old[0], old[1]]),
        u16::from_be_bytes([new[0], new[1]]),
    );
    csum_update16(
        c,
        u16::from_be_bytes([old[2], old[3]]),
        u16::from_be_bytes([new[2], new[3]]),
    )
    .to_be_bytes()
}

/// RFC 1624 incremental update of a checksum held in software.
#[inline(always)]
pub fn csum_update16(check: u16, old: u16, new: u16) -> u16 {
    let mut sum = u32::from(!check) + u32::from(!old) + u32::from(new);
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    !(sum as u16)
}

/// Ones' complement sum of `buf` as big-endian 16-bit words, added to `sum`.
#[inline(always)]
pub fn sum_words(buf: &[u8], mut sum: u32) -> u32 {
    let mut i = 0;
    while i + 1 < buf.len() {
        sum += u32::from(u16::from_be_bytes([buf[i], buf[i + 1]]));
        i += 2;
    }
    sum
}

/// The Internet checksum of a 32-bit partial sum (folded, complemented).
#[inline(always)]
pub fn fold(mut sum: u32) -> u16 {
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    !(sum as u16)
}
