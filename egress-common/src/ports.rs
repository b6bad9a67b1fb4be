//! Port blocks of this worker (key: EIP, mapped).

/// Most blocks one worker can hold for one EIP.
pub const MAX_BLOCKS_PER_EIP: usize = 16;

/// Value of `PORT_BLOCKS`: the block indexes (port / block size) this node may use.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortBlocks {
    pub count: u32,
    pub _pad: u32,
    pub blocks: [u16; MAX_BLOCKS_PER_EIP],
}

#[cfg(feature = "user")]
// SAFETY: repr(C), explicit padding, every bit pattern valid.
unsafe impl aya::Pod for PortBlocks {}

/// A cheap 32-bit mix of the flow, used to spread flows over ports.
#[inline(always)]
pub fn flow_hash(words: &[u32; 4]) -> u32 {
    let mut h: u32 = 0x9e37_79b9;
    let mut i = 0;
    while i < 4 {
        h ^= words[i];
        h = h.wrapping_mul(0x85eb_ca6b);
        h ^= h >> 13;
        i += 1;
    }
    h
}
