//! Packet and byte counters kept in per-CPU maps.

/// Packets and bytes seen; one slot per CPU, summed by userspace.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrafficCounter {
    pub packets: u64,
    pub bytes: u64,
}

impl TrafficCounter {
    /// Adds another CPU's slot to this one.
    pub fn merge(&mut self, other: &TrafficCounter) {
        self.packets = self.packets.wrapping_add(other.packets);
        self.bytes = self.bytes.wrapping_add(other.bytes);
    }
}

#[cfg(feature = "user")]
// SAFETY: repr(C), two u64 fields, no padding, every bit pattern valid.
unsafe impl aya::Pod for TrafficCounter {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_adds_both_fields() {
        let mut a = TrafficCounter {
            packets: 1,
            bytes: 100,
        };
        a.merge(&TrafficCounter {
            packets: 2,
            bytes: 50,
        });
        assert_eq!(
            a,
            TrafficCounter {
                packets: 3,
                bytes: 150
            }
        );
    }

    #[test]
    fn layout_has_no_hidden_padding() {
        assert_eq!(core::mem::size_of::<TrafficCounter>(), 16);
        assert_eq!(core::mem::offset_of!(TrafficCounter, bytes), 8);
    }
}
