//! Names of the maps in the eBPF object.
//!
//! Userspace pins every map under one bpffs folder, by these names, so that
//! an agent restart reuses the maps (and the traffic they steer) instead of
//! creating empty ones.

/// Default bpffs folder for the pinned maps and links of one node.
pub const DEFAULT_PIN_DIR: &str = "/sys/fs/bpf/egress";

/// Per-CPU packet/byte counter of the `tc_count` probe program.
pub const IFACE_STATS: &str = "IFACE_STATS";
/// LPM trie: pod prefix -> `SrcMatch`.
pub const POLICY_SRC: &str = "POLICY_SRC";
/// LPM trie: destination prefix -> `DstMatch`.
pub const POLICY_DST: &str = "POLICY_DST";
/// Array: policy slot -> `EgressTarget`.
pub const POLICY_TARGETS: &str = "POLICY_TARGETS";
/// Hash: policy slot -> `GatewaySpread` (ActiveActive gateways' slots).
pub const GATEWAY_SPREAD: &str = "GATEWAY_SPREAD";
/// Per-CPU hash: policy id -> `PolicyStats`.
pub const POLICY_STATS: &str = "POLICY_STATS";
/// LRU hash: forward `NatKey` -> `NatEntry`.
pub const NAT_FWD: &str = "NAT_FWD";
/// LRU hash: reverse `NatKey` -> `NatEntry`.
pub const NAT_REV: &str = "NAT_REV";
/// Hash: EIP -> `PortBlocks`.
pub const PORT_BLOCKS: &str = "PORT_BLOCKS";
/// Hash: `SteerKey` -> `SteerTarget`.
pub const REPLY_STEERING: &str = "REPLY_STEERING";
/// Hash: EIP -> `OwnedEip`.
pub const OWNED_EIPS: &str = "OWNED_EIPS";
/// Array (one slot): `DatapathConfig`.
pub const CONFIG: &str = "CONFIG";
/// Per-CPU array: drop reason -> `TrafficCounter`.
pub const DROPS: &str = "DROPS";
/// Array (one slot): `u64` monotonic instant (ns, the clock of
/// `bpf_ktime_get_ns`) until which this node may answer ARP/NDP for its
/// EIPs; 0 means no limit. The agent extends it on every heartbeat renewal,
/// so a node whose agent died falls silent by itself (self-fencing that does
/// not need the agent to be alive).
pub const ANNOUNCE_UNTIL: &str = "ANNOUNCE_UNTIL";
/// LPM trie: EIP host route learned over BGP -> `RouteNextHop`.
pub const ROUTES: &str = "ROUTES";
/// LRU hash: pod address -> `pod_link::PodLink`, learned by the worker
/// program from the pod's frames; how replies are delivered.
pub const POD_LINKS: &str = "POD_LINKS";
/// Per-CPU array: `nat::NAT_EVENT_*` -> `TrafficCounter`.
pub const NAT_EVENTS: &str = "NAT_EVENTS";
/// Per-CPU array: `TrafficCounter` of what the gateway's XDP program sent
/// back out with `XDP_TX`, by path (`XDP_TX_PATHS`; the TC paths' are
/// not counted).
pub const XDP_TX_COUNT: &str = "XDP_TX_COUNT";
/// Array: endpoint index -> `endpoints::TunnelEndpoint` (IPv6 underlay).
pub const TUNNEL_ENDPOINTS: &str = "TUNNEL_ENDPOINTS";
/// The slots of `XDP_TX_COUNT`: steered replies, decapsulated forwards.
pub const XDP_TX_PATHS: [&str; 2] = ["reply", "forward"];

/// Every map userspace pins, in the order it creates them.
pub const PINNED_MAPS: &[&str] = &[
    IFACE_STATS,
    POLICY_SRC,
    POLICY_DST,
    POLICY_TARGETS,
    GATEWAY_SPREAD,
    POLICY_STATS,
    NAT_FWD,
    NAT_REV,
    PORT_BLOCKS,
    REPLY_STEERING,
    OWNED_EIPS,
    CONFIG,
    DROPS,
    ANNOUNCE_UNTIL,
    ROUTES,
    POD_LINKS,
    NAT_EVENTS,
    XDP_TX_COUNT,
    TUNNEL_ENDPOINTS,
];

/// Programs in the object.
pub const PROG_WORKER_EGRESS: &str = "worker_egress";
pub const PROG_TUNNEL_INGRESS: &str = "tunnel_ingress";
pub const PROG_UPLINK_INGRESS: &str = "uplink_ingress";
pub const PROG_UPLINK_XDP: &str = "uplink_xdp";

/// Map capacities: the eBPF object declares its maps with these, and
/// userspace sizes its diffs by them (the agent may resize `NAT_*` at load).
pub const POLICY_TRIE_SIZE: u32 = 16384;
pub const NAT_TABLE_SIZE: u32 = 262144;
pub const PORT_BLOCKS_SIZE: u32 = 4096;
pub const STEERING_SIZE: u32 = 65536;
pub const OWNED_EIPS_SIZE: u32 = 4096;
/// EIP host routes learned over BGP.
pub const ROUTES_SIZE: u32 = 4096;
/// Counter slots: one per policy a node can hold, its fail-closed
/// stand-ins and the shared overflow entry, with room to spare so that a
/// freed slot is not handed out again at once.
pub const POLICY_STATS_SIZE: u32 = 2 * crate::policy::MAX_POLICY_SLOTS as u32;
pub const POD_LINKS_SIZE: u32 = 65536;
