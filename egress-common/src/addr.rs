//! One address layout for both families: every IP in a map key or value is
//! 16 bytes, IPv4 as an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`).
//!
//! That lets one map (and one code path) serve both families; an IPv4 prefix
//! of length `n` is stored as a 128-bit prefix of length `96 + n`.

/// A 16-byte address as it sits in the maps.
pub type Addr = [u8; 16];

/// The 12-byte prefix of an IPv4-mapped address.
pub const V4_MAPPED_PREFIX: [u8; 12] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff];

/// Maps an IPv4 address (network byte order bytes) into the 16-byte layout.
#[inline(always)]
pub const fn v4_mapped(v4: [u8; 4]) -> Addr {
    [
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, v4[0], v4[1], v4[2], v4[3],
    ]
}

/// The IPv4 address inside a mapped address, if it is one.
#[inline(always)]
pub fn as_v4(a: &Addr) -> Option<[u8; 4]> {
    if a[..12] == V4_MAPPED_PREFIX {
        Some([a[12], a[13], a[14], a[15]])
    } else {
        None
    }
}

/// Prefix length in the 128-bit space for an IPv4 prefix length.
#[inline(always)]
pub const fn v4_prefix_len(len: u8) -> u32 {
    96 + len as u32
}
