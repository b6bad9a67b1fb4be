//! `TUNNEL_ENDPOINTS`: the addresses of the tunnel endpoints on an IPv6
//! underlay (`config::CFG_UNDERLAY_V6`).
//!
//! Every tunnel endpoint field of the other maps is 4 bytes (a policy's
//! gateway, a spread bucket, a route's next hop, a steering target, a NAT
//! or fragment entry's gateway, `DatapathConfig::node_tunnel_ip`). On an
//! IPv4 underlay it holds the address itself. On an IPv6 underlay it holds
//! an index into this array, which holds the address, as a load
//! balancer's connection table holds a backend's index rather than its
//! address: the layouts of the pinned maps stay as they are, so an agent
//! upgrade on an IPv4 underlay reuses every pinned entry unchanged.
//!
//! Index 0 is never given out: a zero field means "no endpoint" on both
//! underlays. The agent keeps each address's index for as long as the
//! address is in use and reads them back from the pinned array after a
//! restart (NAT entries outlive the agent and carry indexes).

/// Endpoints a node can name at once: every other node of a large cluster
/// (a gateway steers replies to every worker) with room to spare, so that
/// a freed index is not handed out again soon.
pub const TUNNEL_ENDPOINTS_SIZE: u32 = 8192;

/// Value of `TUNNEL_ENDPOINTS` (an array indexed by endpoint index).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TunnelEndpoint {
    /// The endpoint's IPv6 address; all zero: the index is unused.
    pub addr: [u8; 16],
}

/// The index a 4-byte endpoint field holds on an IPv6 underlay.
#[inline(always)]
pub fn index_of(field: [u8; 4]) -> u32 {
    u32::from_ne_bytes(field)
}

/// The 4-byte endpoint field that names index `i`.
#[inline(always)]
pub fn field_of(i: u32) -> [u8; 4] {
    i.to_ne_bytes()
}

#[cfg(feature = "user")]
// SAFETY: repr(C), one byte array, every bit pattern valid.
unsafe impl aya::Pod for TunnelEndpoint {}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn an_index_survives_the_field() {
        for i in [0, 1, 255, 256, TUNNEL_ENDPOINTS_SIZE - 1] {
            assert_eq!(index_of(field_of(i)), i);
        }
        assert_eq!(core::mem::size_of::<TunnelEndpoint>(), 16);
    }
}
