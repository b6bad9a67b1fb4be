//! Node-wide settings the programs read from a one-slot array.

/// The tunnel's UDP port unless the operator sets one: spidernet
/// egressgateway's, clear of the VXLAN ports CNIs use (4789: Calico and the
/// IANA port; 8472: Flannel and Cilium). The chart's default is the same.
pub const DEFAULT_VXLAN_PORT: u16 = 7789;

/// This node is a gateway: it answers ARP/NDP for owned EIPs and forwards
/// decapsulated traffic.
pub const CFG_GATEWAY: u32 = 1 << 0;
/// This node is a worker: it SNATs pod traffic.
pub const CFG_WORKER: u32 = 1 << 1;
/// The tunnel runs over IPv6: every 4-byte tunnel endpoint field is an
/// index into `TUNNEL_ENDPOINTS` (see `endpoints`), and the outer headers
/// are IPv6 (70 bytes with the inner Ethernet header instead of 50).
pub const CFG_UNDERLAY_V6: u32 = 1 << 2;

/// Slot 0 of the `CONFIG` array.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DatapathConfig {
    /// Interface index of this node's VXLAN device (external / collect_md mode).
    pub vxlan_ifindex: u32,
    /// VXLAN network identifier used for every tunnelled packet.
    pub vni: u32,
    /// Interface index of the gateway uplink (where ARP/NDP are answered).
    pub uplink_ifindex: u32,
    /// `CFG_*` bits.
    pub flags: u32,
    /// Largest inner IP packet that fits the tunnel (e.g. 1450 over a 1500 IPv4 underlay).
    pub tunnel_mtu: u16,
    /// Ports per block: EIP port `p` belongs to block `p / port_block_size`.
    pub port_block_size: u16,
    /// MAC address of the uplink, used as source of ARP replies and NAs.
    pub uplink_mac: [u8; 6],
    /// UDP port on which the datapath answers the controller's probes to
    /// `node_tunnel_ip` (0: not answered here; the agent's socket may).
    pub probe_port: u16,
    /// This node's tunnel endpoint: the IPv4 address (network byte order),
    /// or on an IPv6 underlay its index in `TUNNEL_ENDPOINTS`.
    pub node_tunnel_ip: [u8; 4],
    /// Seconds a NAT entry lives without traffic, per protocol/state.
    pub timeouts: NatTimeouts,
    /// Changes whenever the policy tables change (a digest of them); NAT
    /// entries validated under the current epoch skip the policy lookups.
    pub policy_epoch: u32,
    /// The same for the gateway's tables (owned EIPs, reply steering, block
    /// size): the per-CPU caches of the gateway paths hold results
    /// computed under one epoch and are ignored under any other. 0: no
    /// caching.
    pub gateway_epoch: u32,
    /// UDP port of the VXLAN tunnel (the destination of every outer header
    /// the programs write).
    pub vxlan_port: u16,
    /// How many kernel ticks (jiffies) a slot of the programs' per-CPU
    /// caches (a FIB result, a tunnel next hop) is used: 200 ms' worth,
    /// from the tick length the agent reads (`clock_getres` of the coarse
    /// clock). Reading the tick counter costs the programs nothing; a
    /// clock read cost ~13 ns per packet. 0: the caches are never used.
    pub cache_ticks: u16,
    pub _pad: [u8; 4],
}

/// Idle timeouts in seconds after which a NAT entry's port may be reused.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NatTimeouts {
    pub tcp_established: u32,
    /// SYN seen but no reply yet, or FIN/RST seen.
    pub tcp_transitory: u32,
    pub udp: u32,
    pub icmp: u32,
}

impl Default for NatTimeouts {
    fn default() -> Self {
        Self {
            tcp_established: 7440,
            tcp_transitory: 120,
            udp: 120,
            icmp: 30,
        }
    }
}

#[cfg(feature = "user")]
// SAFETY: repr(C), explicit padding, every bit pattern valid.
unsafe impl aya::Pod for DatapathConfig {}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn layout() {
        assert_eq!(core::mem::size_of::<NatTimeouts>(), 16);
        assert_eq!(core::mem::offset_of!(DatapathConfig, uplink_mac), 20);
        assert_eq!(core::mem::offset_of!(DatapathConfig, node_tunnel_ip), 28);
        assert_eq!(core::mem::size_of::<DatapathConfig>(), 64);
    }
}
