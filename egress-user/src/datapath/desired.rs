//! The plain-data description of what this node's maps should hold.
//!
//! The control plane (`egress-control`) computes a [`DesiredMaps`] and hands
//! it to [`super::apply`]; nothing here knows about BPF layouts.

use std::{
    fmt,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    str::FromStr,
};

use egress_common::config::NatTimeouts;

/// An IPv4 or IPv6 prefix, e.g. `10.244.0.0/16` or `fd00::/64`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Cidr {
    pub addr: IpAddr,
    pub len: u8,
}

impl Cidr {
    pub fn new(addr: IpAddr, len: u8) -> Result<Self, CidrError> {
        let max = if addr.is_ipv4() { 32 } else { 128 };
        if len > max {
            return Err(CidrError(format!("{addr}/{len}: prefix longer than {max}")));
        }
        Ok(Self { addr, len }.normalized())
    }

    /// A host route: /32 or /128.
    pub fn host(addr: IpAddr) -> Self {
        Self {
            addr,
            len: if addr.is_ipv4() { 32 } else { 128 },
        }
    }

    /// The prefix with the host bits cleared.
    pub fn normalized(self) -> Self {
        let addr = match self.addr {
            IpAddr::V4(a) => {
                let mask = if self.len == 0 {
                    0
                } else {
                    u32::MAX << (32 - u32::from(self.len))
                };
                IpAddr::V4(Ipv4Addr::from(u32::from(a) & mask))
            }
            IpAddr::V6(a) => {
                let mask = if self.len == 0 {
                    0
                } else {
                    u128::MAX << (128 - u32::from(self.len))
                };
                IpAddr::V6(Ipv6Addr::from(u128::from(a) & mask))
            }
        };
        Self {
            addr,
            len: self.len,
        }
    }

    /// True when `other` lies inside this prefix (same family only).
    pub fn contains(&self, other: &Cidr) -> bool {
        if self.addr.is_ipv4() != other.addr.is_ipv4() || other.len < self.len {
            return false;
        }
        Cidr {
            addr: other.addr,
            len: self.len,
        }
        .normalized()
        .addr
            == self.addr
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad CIDR {0}")]
pub struct CidrError(pub String);

impl FromStr for Cidr {
    type Err = CidrError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (a, l) = match s.split_once('/') {
            Some((a, l)) => (a, Some(l)),
            None => (s, None),
        };
        let addr: IpAddr = a.parse().map_err(|_| CidrError(s.to_owned()))?;
        let len = match l {
            Some(l) => l.parse().map_err(|_| CidrError(s.to_owned()))?,
            None => Cidr::host(addr).len,
        };
        Cidr::new(addr, len)
    }
}

/// One egress policy as it applies on this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyRule {
    /// Stable identifier; keys the per-policy counters.
    pub id: u32,
    /// `spec.priority`: lower wins where policies overlap (ties: lower id).
    pub priority: i32,
    /// Pod addresses (host prefixes) or `podSubnet` prefixes.
    pub sources: Vec<Cidr>,
    /// `destSubnet`; empty means every destination.
    pub destinations: Vec<Cidr>,
    /// `excludedSubnet`: these destinations take the normal path.
    pub excluded: Vec<Cidr>,
    pub eip_v4: Option<Ipv4Addr>,
    pub eip_v6: Option<Ipv6Addr>,
    /// Tunnel endpoint of the gateway that owns the EIPs (of the
    /// underlay's family, see `NodeConfig::node_tunnel_ip`).
    pub gateway_tunnel_ip: IpAddr,
    /// ActiveActive: the tunnel endpoints of every gateway holding the
    /// EIPs; new flows spread over them by hash. Empty: `gateway_tunnel_ip`.
    pub spread: Vec<IpAddr>,
    /// The gateway is this node: SNAT and forward without the tunnel.
    pub local_gateway: bool,
    /// `useNodeIP`: the EIP is the gateway node's own address.
    pub use_node_ip: bool,
    /// Fail closed: the policy selects these pods but cannot be applied on
    /// this node yet (no EIP assigned, or its gateway has no tunnel
    /// endpoint). Matching packets are dropped and counted under
    /// `no_gateway` instead of leaving with the pod's own address; the EIPs
    /// and the gateway endpoint are then not needed.
    pub no_gateway: bool,
}

/// Port blocks of one EIP granted to this worker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortBlockGrant {
    pub eip: IpAddr,
    /// Block indexes: block `b` holds ports `b * size .. (b + 1) * size`.
    pub blocks: Vec<u16>,
}

/// Gateway: replies to (EIP, block) go to this worker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplySteering {
    pub eip: IpAddr,
    pub block: u16,
    pub worker_tunnel_ip: IpAddr,
    /// The worker is this node: no tunnel.
    pub local: bool,
}

/// Gateway: an EIP this node owns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnedEip {
    pub eip: IpAddr,
    /// Answer ARP / NDP for it (L2 mode).
    pub answer_neigh: bool,
    /// It is the node's own address (`useNodeIP`): unsteered ports go to the stack.
    pub node_ip: bool,
    pub epoch: u32,
}

/// Worker: an EIP host route learned over BGP, which sends new flows to
/// that EIP's announcing node (see `egress_common::route`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EipRoute {
    pub eip: IpAddr,
    pub tunnel_ip: IpAddr,
    pub epoch: u32,
}

/// Node-wide settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeConfig {
    pub is_worker: bool,
    pub is_gateway: bool,
    pub vxlan_ifindex: u32,
    pub vni: u32,
    pub uplink_ifindex: u32,
    pub uplink_mac: [u8; 6],
    /// Largest inner IP packet the tunnel carries (1450 over a 1500 IPv4 underlay).
    pub tunnel_mtu: u16,
    pub port_block_size: u16,
    /// This node's tunnel endpoint. Its family is the underlay's: on an
    /// IPv6 one every endpoint is IPv6 and the maps name them by index
    /// (see `egress_common::endpoints`); endpoints of the other family
    /// are taken as absent.
    pub node_tunnel_ip: IpAddr,
    pub timeouts: NatTimeouts,
    /// UDP port of the controller's probes the datapath answers (0: none).
    pub probe_port: u16,
    /// UDP port of the VXLAN tunnel.
    pub vxlan_port: u16,
    /// Kernel ticks a slot of the programs' per-CPU caches is used
    /// (`DatapathConfig::cache_ticks`); the default is 200 ms on this kernel.
    pub cache_ticks: u16,
}

/// How long a slot of the programs' per-CPU caches (a FIB result, a tunnel
/// next hop) is used before the FIB is asked again: a route or neighbour
/// change is seen within it.
pub const CACHE_LIFETIME: std::time::Duration = std::time::Duration::from_millis(200);

/// `CACHE_LIFETIME` in kernel ticks of length `tick`, rounded down (never
/// longer), at least one. An unknown tick (zero) is taken as 10 ms, the
/// longest Linux has (HZ=100), so the lifetime is never longer either.
pub fn cache_ticks(tick: std::time::Duration) -> u16 {
    let tick = if tick.is_zero() {
        std::time::Duration::from_millis(10)
    } else {
        tick
    };
    let n = CACHE_LIFETIME.as_nanos() / tick.as_nanos();
    n.clamp(1, u128::from(u16::MAX)) as u16
}

/// The kernel's tick length (1/HZ): the resolution of the coarse clocks,
/// which advance once per tick. Zero when it cannot be read.
pub fn kernel_tick() -> std::time::Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer; the call only writes it.
    if unsafe { libc::clock_getres(libc::CLOCK_MONOTONIC_COARSE, &mut ts) } != 0 {
        return std::time::Duration::ZERO;
    }
    std::time::Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

impl Default for NodeConfig {
    fn default() -> Self {
        Self {
            is_worker: true,
            is_gateway: false,
            vxlan_ifindex: 0,
            vni: 1,
            uplink_ifindex: 0,
            uplink_mac: [0; 6],
            tunnel_mtu: 1450,
            port_block_size: 1024,
            node_tunnel_ip: Ipv4Addr::UNSPECIFIED.into(),
            timeouts: NatTimeouts::default(),
            probe_port: 0,
            vxlan_port: 4789,
            cache_ticks: cache_ticks(kernel_tick()),
        }
    }
}

/// Everything the maps of one node should hold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DesiredMaps {
    pub config: NodeConfig,
    pub policies: Vec<PolicyRule>,
    /// Pod, service, node and extra CIDRs: never SNATed.
    pub cluster_cidrs: Vec<Cidr>,
    pub port_blocks: Vec<PortBlockGrant>,
    pub reply_steering: Vec<ReplySteering>,
    pub owned_eips: Vec<OwnedEip>,
    /// BGP-learned EIP routes, newer than (or as new as) the datastore's.
    pub routes: Vec<EipRoute>,
}

impl PolicyRule {
    /// The fail-closed form of a policy: it matches as usual and drops what
    /// it matches (`no_gateway`), with no EIP and no gateway.
    pub fn fail_closed(
        id: u32,
        priority: i32,
        sources: Vec<Cidr>,
        destinations: Vec<Cidr>,
        excluded: Vec<Cidr>,
    ) -> Self {
        PolicyRule {
            id,
            priority,
            sources,
            destinations,
            excluded,
            eip_v4: None,
            eip_v6: None,
            gateway_tunnel_ip: Ipv4Addr::UNSPECIFIED.into(),
            spread: Vec::new(),
            local_gateway: false,
            use_node_ip: false,
            no_gateway: true,
        }
    }
}

#[cfg(test)]
impl PolicyRule {
    /// A rule for tests: EIP 198.51.100.1 (IPv4 only) on the gateway at
    /// tunnel 10.0.0.1, nothing excluded, no special path.
    pub(crate) fn for_test(
        id: u32,
        priority: i32,
        sources: Vec<Cidr>,
        destinations: Vec<Cidr>,
    ) -> Self {
        PolicyRule {
            eip_v4: Some(Ipv4Addr::new(198, 51, 100, 1)),
            gateway_tunnel_ip: Ipv4Addr::new(10, 0, 0, 1).into(),
            no_gateway: false,
            ..Self::fail_closed(id, priority, sources, destinations, Vec::new())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidr_parse_normalize_contains() {
        let a: Cidr = "10.1.2.3/16".parse().unwrap();
        assert_eq!(a.to_string(), "10.1.0.0/16");
        assert!(a.contains(&"10.1.9.9".parse().unwrap()));
        assert!(!a.contains(&"10.2.0.0/24".parse().unwrap()));
        assert!(!a.contains(&"10.0.0.0/8".parse().unwrap()));
        let v6: Cidr = "::/0".parse().unwrap();
        assert!(
            !v6.contains(&"10.1.0.0/16".parse().unwrap()),
            "families never contain each other"
        );
        assert!("10.0.0.0/33".parse::<Cidr>().is_err());
        assert!("nonsense".parse::<Cidr>().is_err());
    }

    #[test]
    fn cache_lifetime_in_ticks_is_never_longer_than_200_ms() {
        let ms = std::time::Duration::from_millis;
        assert_eq!(cache_ticks(ms(10)), 20, "HZ=100");
        assert_eq!(cache_ticks(ms(4)), 50, "HZ=250");
        assert_eq!(cache_ticks(ms(1)), 200, "HZ=1000");
        assert_eq!(
            cache_ticks(std::time::Duration::from_nanos(3_333_333)),
            60,
            "HZ=300"
        );
        assert_eq!(
            cache_ticks(std::time::Duration::ZERO),
            20,
            "unknown: as HZ=100"
        );
        assert_eq!(
            cache_ticks(std::time::Duration::from_secs(1)),
            1,
            "at least one"
        );
        // This kernel's tick is one of Linux's (HZ 100..=1000).
        let t = kernel_tick();
        assert!(t >= ms(1) && t <= ms(10), "tick {t:?}");
    }
}
