//! Why a packet was dropped (index of the per-CPU `DROPS` array).

pub const DROP_MALFORMED: u32 = 0;
/// Policy traffic to an EIP this worker holds no port block of.
pub const DROP_NO_PORT_BLOCK: u32 = 1;
/// Every port probed for a new flow was in use.
pub const DROP_PORTS_EXHAUSTED: u32 = 2;
/// Gateway: a packet to an owned EIP on a port that belongs to no block.
pub const DROP_NO_STEERING: u32 = 3;
/// Worker: a reply through the tunnel with no NAT entry.
pub const DROP_NO_NAT_ENTRY: u32 = 4;
/// Oversized non-TCP packet with DF (answered with ICMP when possible).
pub const DROP_TOO_BIG: u32 = 5;
/// Node configuration missing (agent not done setting up).
pub const DROP_NO_CONFIG: u32 = 6;
/// The NAT map refused an insert.
pub const DROP_NAT_INSERT: u32 = 7;
/// A helper (tunnel key, checksum, store) failed.
pub const DROP_HELPER: u32 = 8;
/// Worker: the packet matches a policy that cannot be applied on this node
/// yet (no EIP assigned, or its gateway has no tunnel endpoint). Fail
/// closed: it is dropped rather than sent out with the pod's own address.
pub const DROP_NO_GATEWAY: u32 = 9;
/// An IPv4 fragment after the first (no ports) of a datagram that needs
/// translation, whose first fragment this node has not seen (lost, or
/// overtaken): there is nothing to translate it with.
pub const DROP_FRAGMENT: u32 = 10;
/// Fail closed: a selected pod's packet to a policy destination in an IP
/// protocol the datapath does not translate (SCTP, GRE, ESP, ...). The
/// pod gets ICMP "administratively prohibited" back.
pub const DROP_UNTRANSLATED_PROTO: u32 = 11;
/// Fail closed: an ICMP or ICMPv6 query other than echo (timestamp,
/// address mask, node information, ...) to a policy destination.
pub const DROP_UNTRANSLATED_ICMP: u32 = 12;
/// Fail closed: IPv6 whose extension headers the parser does not step
/// over (a Routing header with segments left, a chain longer than it
/// follows, headers past the first 256 bytes) to a policy destination.
pub const DROP_UNTRANSLATED_V6_EXT: u32 = 13;

/// IPv6 underlay: the tunnel endpoint a packet is sent to (a gateway, or
/// the worker of a reply) has no address in `TUNNEL_ENDPOINTS` (the agent
/// has not written it yet, or the index is stale).
pub const DROP_NO_TUNNEL_ENDPOINT: u32 = 14;

pub const DROP_REASONS: usize = 15;

/// Names in index order, for tools.
pub const DROP_NAMES: [&str; DROP_REASONS] = [
    "malformed",
    "no_port_block",
    "ports_exhausted",
    "no_steering",
    "no_nat_entry",
    "too_big",
    "no_config",
    "nat_insert",
    "helper",
    "no_gateway",
    "fragment",
    "untranslated_proto",
    "untranslated_icmp",
    "untranslated_v6_ext",
    "no_tunnel_endpoint",
];
