//! Gateway tables: reply steering and owned EIPs.

use crate::addr::Addr;

/// Key of `REPLY_STEERING`: (EIP, block index).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SteerKey {
    pub eip: Addr,
    pub block: u16,
    pub _pad: [u8; 2],
}

/// The block belongs to this node itself (worker and gateway in one): no tunnel.
pub const STEER_LOCAL: u32 = 1 << 0;

/// Value of `REPLY_STEERING`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SteerTarget {
    /// Tunnel endpoint of the worker holding the block (IPv4 underlay).
    pub worker_tunnel_ip: [u8; 4],
    pub flags: u32,
}

/// Answer ARP (IPv4) / NDP neighbour solicitations (IPv6) for this EIP.
pub const OWNED_ANSWER_NEIGH: u32 = 1 << 0;

/// The EIP is this node's own address (`useNodeIP`): ports outside every
/// block belong to the node's own connections and go to the stack.
pub const OWNED_NODE_IP: u32 = 1 << 1;

/// Value of `OWNED_EIPS` (key: EIP, mapped).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OwnedEip {
    pub flags: u32,
    /// Fencing token of the assignment.
    pub epoch: u32,
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: repr(C), explicit padding, every bit pattern valid.
    unsafe impl aya::Pod for super::SteerKey {}
    unsafe impl aya::Pod for super::SteerTarget {}
    unsafe impl aya::Pod for super::OwnedEip {}
}
