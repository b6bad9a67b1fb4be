//! How a reply reaches a pod whatever its wiring: the pod's own MAC, the
//! MAC it sends to (its gateway: the host veth, or the bridge), and the
//! host-side device its frames come in on.
//!
//! The worker program learns this from the pod's own frames (as a bridge
//! learns its forwarding table) and delivers replies by writing these MACs
//! and redirecting out of that device. No neighbour lookup is involved, so
//! a routed veth (Calico), a veth enslaved to a bridge (flannel, CNI
//! `bridge`) and a point-to-point veth (CNI `ptp`) all work the same.

/// Value of `POD_LINKS` (key: the pod's address, `addr::Addr`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PodLink {
    /// The host-side device the pod's frames arrive on.
    pub ifindex: u32,
    /// Source MAC of the pod's frames (the pod's interface).
    pub pod_mac: [u8; 6],
    /// Destination MAC of the pod's frames (the next hop the pod uses).
    pub gateway_mac: [u8; 6],
}

#[cfg(feature = "user")]
// SAFETY: repr(C), no padding (4 + 6 + 6), every bit pattern valid.
unsafe impl aya::Pod for PodLink {}

#[cfg(test)]
mod tests {
    #[test]
    fn layout() {
        assert_eq!(core::mem::size_of::<super::PodLink>(), 16);
        assert_eq!(core::mem::offset_of!(super::PodLink, gateway_mac), 10);
    }
}
