//! What the agent is told at start, and its fixed waits.

use std::{
    collections::BTreeMap,
    net::{Ipv6Addr, SocketAddr},
    path::PathBuf,
    time::Duration,
};

use egress_failover::timers::FailoverTimers;
use ipnet::IpNet;

use crate::node::vxlan::VxlanSpec;

/// Everything the agent is told at start.
#[derive(Clone, Debug)]
pub struct AgentSettings {
    pub node: String,
    pub labels: BTreeMap<String, String>,
    pub uplink: String,
    /// The tunnel's outer family (`--underlay`).
    pub underlay: super::underlay::UnderlayChoice,
    /// Tunnel endpoint; the uplink's first address of the underlay's
    /// family when not given.
    pub tunnel_ip: Option<std::net::IpAddr>,
    /// The node's IPv6 address (useNodeIP); the uplink's first global one
    /// when not given.
    pub node_ipv6: Option<Ipv6Addr>,
    pub vxlan: VxlanSpec,
    pub vni: u32,
    pub pod_cidrs: Vec<IpNet>,
    pub service_cidrs: Vec<IpNet>,
    pub extra_cidrs: Vec<IpNet>,
    pub timers: FailoverTimers,
    /// Answer ARP/NDP and send gratuitous announcements for owned EIPs.
    pub l2_announce: bool,
    /// Whether the gateway's common replies may take the XDP program.
    pub uplink_xdp: crate::datapath::uplink_xdp::UplinkXdpMode,
    pub pin_dir: PathBuf,
    /// Sizes of the maps the agent creates (the NAT tables).
    pub map_sizes: crate::datapath::MapSizes,
    pub admin_addr: SocketAddr,
    /// A full reconcile at least this often, whatever the watches say.
    pub resync: Duration,
    /// How long a draining port block stays free of NAT entries before it
    /// is reported released (`port_use`).
    pub port_release_quarantine: Duration,
    /// Answer datapath probes on (tunnel address, port) with these settings.
    pub probe: Option<(egress_failover::probe::SessionConfig, u16)>,
    /// Peer with these reflectors and announce pod CIDRs and owned EIPs.
    pub bgp: Option<super::bgp::AgentBgpConfig>,
}

/// How soon a failed list of the datastore is tried again.
pub(super) const LIST_RETRY: Duration = Duration::from_secs(1);
