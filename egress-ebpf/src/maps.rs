//! The maps userspace pins and fills (names and sizes from
//! `egress_common::maps`). The programs' private state lives with the code
//! that owns it: the per-CPU caches (`cache`), the clock (`clock`), the
//! fragment table (`frag`), the ICMP error scratch (`icmp_err`), the tunnel
//! hops (`vxlan`), the interface counter (`count`) and the benchmark's
//! packet (`bench`).

use aya_ebpf::{
    bindings::BPF_F_NO_PREALLOC,
    btf_maps::{Array, HashMap, LpmTrie, LruHashMap, PerCpuArray},
    macros::btf_map,
};
use egress_common::{
    addr::Addr,
    config::DatapathConfig,
    drops::DROP_REASONS,
    maps::{
        NAT_TABLE_SIZE, OWNED_EIPS_SIZE, POD_LINKS_SIZE, POLICY_STATS_SIZE, POLICY_TRIE_SIZE,
        PORT_BLOCKS_SIZE, ROUTES_SIZE, STEERING_SIZE,
    },
    nat::{NatEntry, NatKey, NAT_EVENT_KINDS},
    pod_link::PodLink,
    policy::{DstMatch, EgressTarget, GatewaySpread, PolicyStats, SrcMatch, MAX_POLICY_SLOTS},
    ports::PortBlocks,
    route::RouteNextHop,
    steering::{OwnedEip, SteerKey, SteerTarget},
    TrafficCounter,
};

#[btf_map]
pub static POLICY_SRC: LpmTrie<Addr, SrcMatch, { POLICY_TRIE_SIZE as usize }> = LpmTrie::new();
#[btf_map]
pub static POLICY_DST: LpmTrie<Addr, DstMatch, { POLICY_TRIE_SIZE as usize }> = LpmTrie::new();
#[btf_map]
pub static POLICY_TARGETS: Array<EgressTarget, MAX_POLICY_SLOTS> = Array::new();
/// Not preallocated: only ActiveActive policies' slots have an entry.
#[btf_map]
pub static GATEWAY_SPREAD: HashMap<
    u32,
    GatewaySpread,
    MAX_POLICY_SLOTS,
    { BPF_F_NO_PREALLOC as usize },
> = HashMap::new();
#[btf_map]
pub static POLICY_STATS: PerCpuArray<PolicyStats, { POLICY_STATS_SIZE as usize }> =
    PerCpuArray::new();
#[btf_map]
pub static NAT_FWD: LruHashMap<NatKey, NatEntry, { NAT_TABLE_SIZE as usize }> = LruHashMap::new();
#[btf_map]
pub static NAT_REV: LruHashMap<NatKey, NatEntry, { NAT_TABLE_SIZE as usize }> = LruHashMap::new();
/// Not preallocated: a value holds up to 1,024 blocks (2 KiB), and a node
/// uses far fewer EIPs than the map's limit.
#[btf_map]
pub static PORT_BLOCKS: HashMap<
    Addr,
    PortBlocks,
    { PORT_BLOCKS_SIZE as usize },
    { BPF_F_NO_PREALLOC as usize },
> = HashMap::new();
#[btf_map]
pub static REPLY_STEERING: HashMap<SteerKey, SteerTarget, { STEERING_SIZE as usize }> =
    HashMap::new();
#[btf_map]
pub static OWNED_EIPS: HashMap<Addr, OwnedEip, { OWNED_EIPS_SIZE as usize }> = HashMap::new();
#[btf_map]
pub static CONFIG: Array<DatapathConfig, 1> = Array::new();
/// See `egress_common::maps::ANNOUNCE_UNTIL`: 0, or the instant (ns) after
/// which owned EIPs are no longer answered for.
#[btf_map]
pub static ANNOUNCE_UNTIL: Array<u64, 1> = Array::new();
/// See `egress_common::route`.
#[btf_map]
pub static ROUTES: LpmTrie<Addr, RouteNextHop, { ROUTES_SIZE as usize }> = LpmTrie::new();
/// See `egress_common::pod_link`.
#[btf_map]
pub static POD_LINKS: LruHashMap<Addr, PodLink, { POD_LINKS_SIZE as usize }> = LruHashMap::new();
/// See `egress_common::nat::NAT_EVENT_NEW`.
#[btf_map]
pub static NAT_EVENTS: PerCpuArray<TrafficCounter, NAT_EVENT_KINDS> = PerCpuArray::new();
#[btf_map]
pub static DROPS: PerCpuArray<TrafficCounter, DROP_REASONS> = PerCpuArray::new();

/// Per-CPU scratch for the parsed packet (keeps it off the 512-byte stack).
#[btf_map]
pub static SCRATCH: PerCpuArray<crate::flow::Flow, 1> = PerCpuArray::new();
