//! The controller's knobs (block size, the ports handed out, the per-node
//! cap) and the block arithmetic they imply.

/// Knobs of the allocation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControllerConfig {
    /// Ports per block; a power of two from 64 to 16384.
    pub port_block_size: u16,
    /// Ports below this are never handed out (block 0 with the default size).
    pub first_port: u16,
    /// The only ports (first, last) handed out of a gateway node's own
    /// address (useNodeIP): the node's own connections (its ephemeral
    /// ports, its listeners: kubelet, NodePorts, the VXLAN and probe ports)
    /// must never fall in a block, or their packets would be steered to a
    /// worker. Only whole blocks inside count. The default starts above
    /// Linux's default `ip_local_port_range` (32768-60999).
    pub node_ip_ports: (u16, u16),
    /// Most ports of one address one worker may hold (rounded up to whole
    /// blocks); policies may cap lower (`spec.maxPortsPerNode`).
    pub max_ports_per_node: u32,
    /// EIPs are announced by BGP (the controller runs the reflector): an
    /// ActiveActive gateway is allowed.
    pub bgp: bool,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        Self {
            port_block_size: DEFAULT_PORT_BLOCK_SIZE,
            first_port: 1024,
            node_ip_ports: DEFAULT_NODE_IP_PORTS,
            max_ports_per_node: DEFAULT_MAX_PORTS_PER_NODE,
            bgp: false,
        }
    }
}

/// Default ports per block: 1,008 blocks above port 1024, so a thousand
/// workers share one EIP.
pub const DEFAULT_PORT_BLOCK_SIZE: u16 = 64;

/// Default of [`ControllerConfig::max_ports_per_node`]: the whole EIP.
pub const DEFAULT_MAX_PORTS_PER_NODE: u32 = 65536;

/// Default of [`ControllerConfig::node_ip_ports`].
pub const DEFAULT_NODE_IP_PORTS: (u16, u16) = (61000, 65535);

/// The blocks of `size` ports lying wholly inside `first..=last`.
pub fn whole_blocks(first: u16, last: u16, size: u16) -> std::ops::Range<u16> {
    let size = u32::from(size.max(1));
    let start = u32::from(first).div_ceil(size);
    let end = (u32::from(last) + 1) / size;
    start.min(end) as u16..end as u16
}
