//! `ROUTES`: EIP host routes the agent learned over BGP, as an LPM trie
//! keyed like the policy tries (IPv4 mapped into the 128-bit space). The
//! worker sends a new flow to the tunnel endpoint a route names instead of
//! the gateway in its policy's slot: BGP carries an EIP's move (LOCAL_PREF
//! 100 + epoch, best path = newest owner) to the agents without waiting for
//! their datastore watch. The agent writes a route only when its epoch is at
//! least the datastore's for that EIP.

/// Value of a `ROUTES` entry.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RouteNextHop {
    /// Tunnel endpoint (IPv4 underlay) of the node that announces the route.
    pub tunnel_ip: [u8; 4],
    /// The assignment epoch the route carries (LOCAL_PREF - 100).
    pub epoch: u32,
}

#[cfg(feature = "user")]
// SAFETY: repr(C), no padding (two 4-byte fields), every bit pattern valid.
unsafe impl aya::Pod for RouteNextHop {}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn layout() {
        assert_eq!(core::mem::size_of::<RouteNextHop>(), 8);
        assert_eq!(core::mem::offset_of!(RouteNextHop, epoch), 4);
    }
}
