//! The worker's NAT table: two LRU hashes, forward and reverse.
//!
//! Forward key: (pod ip, dst ip, pod port, dst port, proto) as the pod sends.
//! Reverse key: (remote ip, EIP, remote port, EIP port, proto) as the reply
//! arrives. For ICMP echo the identifier is the port: forward
//! `sport = id, dport = 0`, reverse `sport = 0, dport = id`.

use crate::addr::Addr;

/// Key of both NAT maps (addresses mapped, ports in host byte order).
/// Aligned to 4 so that the programs build keys a word at a time (the
/// layout, 40 bytes, is the same).
#[repr(C, align(4))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NatKey {
    pub src: Addr,
    pub dst: Addr,
    pub sport: u16,
    pub dport: u16,
    pub proto: u8,
    pub _pad: [u8; 3],
}

/// TCP state kept per entry (decides the idle timeout).
pub const TCP_SYN_SENT: u8 = 1;
pub const TCP_ESTABLISHED: u8 = 2;
pub const TCP_CLOSING: u8 = 3;

/// Forward entry flag: the gateway is this node (no tunnel).
pub const NAT_LOCAL_GATEWAY: u8 = 1;

/// `NAT_EVENTS` slots (per-CPU counters): translations made, and TCP
/// segments other than a SYN that found none (their entry was evicted from
/// a full table, or the connection began before its policy applied): the
/// server does not know the new port and resets the connection.
pub const NAT_EVENT_NEW: u32 = 0;
pub const NAT_EVENT_TCP_MIDSTREAM: u32 = 1;
pub const NAT_EVENT_KINDS: usize = 2;
/// Names in slot order, for tools.
pub const NAT_EVENT_NAMES: [&str; NAT_EVENT_KINDS] = ["new", "tcp_midstream"];

/// Value of both NAT maps: the other side of the translation.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NatEntry {
    /// Forward map: the EIP. Reverse map: the pod address.
    pub addr: Addr,
    /// Forward map: the EIP port. Reverse map: the pod port.
    pub port: u16,
    /// `TCP_*` state (TCP only).
    pub state: u8,
    /// Forward map: `NAT_LOCAL_GATEWAY` when the EIP lives on this node.
    pub flags: u8,
    /// Reverse map: the pod's host-side veth, where replies are delivered.
    /// Forward map: the gateway's tunnel endpoint (IPv4, network order bytes
    /// read as a native u32).
    pub ifindex: u32,
    /// The policy's `EgressTarget::stats_slot` (its counters). An entry
    /// written before slots existed holds the policy's id here, past the
    /// array's end: its packets are not counted.
    pub stats_slot: u32,
    /// Forward map: the `policy_epoch` the entry was validated under; while
    /// it equals the config's, packets skip the policy lookups.
    pub epoch: u32,
    /// bpf_ktime_get_ns() of the last packet either way.
    pub last_seen_ns: u64,
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: repr(C), explicit padding, every bit pattern valid.
    unsafe impl aya::Pod for super::NatKey {}
    unsafe impl aya::Pod for super::NatEntry {}
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn layout() {
        assert_eq!(core::mem::size_of::<NatKey>(), 40);
        assert_eq!(core::mem::size_of::<NatEntry>(), 40);
        assert_eq!(core::mem::offset_of!(NatEntry, last_seen_ns), 32);
    }
}
