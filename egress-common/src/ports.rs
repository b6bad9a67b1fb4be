//! Port blocks of this worker (key: EIP, mapped), and the pure helpers the
//! program uses to pick a port in them.

/// Most blocks one worker can hold for one EIP: with the smallest block
/// size (64 ports) every block of an EIP (65,536 / 64 = 1,024), so one
/// worker can grow to the whole EIP.
pub const MAX_BLOCKS_PER_EIP: usize = 1024;

/// Value of `PORT_BLOCKS`: the block indexes (port / block size) this node
/// may choose for new flows. Blocks the controller marked draining are not
/// here (the worker stops choosing them) although the worker still holds
/// them for its existing flows. An entry with `count == 0` says the worker
/// needs the EIP but holds no block of it (the EIP is exhausted): new flows
/// are refused at once.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortBlocks {
    pub count: u32,
    pub _pad: u32,
    pub blocks: [u16; MAX_BLOCKS_PER_EIP],
}

impl Default for PortBlocks {
    fn default() -> Self {
        Self {
            count: 0,
            _pad: 0,
            blocks: [0; MAX_BLOCKS_PER_EIP],
        }
    }
}

#[cfg(feature = "user")]
// SAFETY: repr(C), explicit padding, every bit pattern valid.
unsafe impl aya::Pod for PortBlocks {}

/// Which of `n` blocks (1 ..= MAX_BLOCKS_PER_EIP) a flow hash picks: the
/// top 16 bits scaled to `0..n` by a multiply (no division in the program).
#[inline(always)]
pub fn block_slot(hash: u32, n: u32) -> u32 {
    ((hash >> 16) * n) >> 16
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout() {
        assert_eq!(
            core::mem::size_of::<PortBlocks>(),
            8 + 2 * MAX_BLOCKS_PER_EIP
        );
        assert_eq!(core::mem::offset_of!(PortBlocks, blocks), 8);
    }

    #[test]
    fn the_slot_stays_below_the_count_and_reaches_every_block() {
        for n in [1u32, 2, 7, 16, 469, 1008, 1024] {
            let mut seen = [false; MAX_BLOCKS_PER_EIP];
            for h in (0..=u16::MAX as u32).map(|x| x << 16 | 0xabcd) {
                let s = block_slot(h, n);
                assert!(s < n, "n {n} hash {h:#x}: slot {s}");
                seen[s as usize] = true;
            }
            assert!(
                seen[..n as usize].iter().all(|s| *s),
                "n {n}: a block is never picked"
            );
        }
    }
}
