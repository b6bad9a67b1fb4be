//! Every map of the object. Names match `egress_common::maps`; userspace pins them.

use aya_ebpf::{
    bindings::BPF_F_NO_PREALLOC,
    btf_maps::{Array, HashMap, LpmTrie, LruHashMap, PerCpuArray, PerCpuHashMap},
    macros::btf_map,
};
use egress_common::{
    addr::Addr,
    config::DatapathConfig,
    drops::DROP_REASONS,
    maps::{POD_LINKS_SIZE, POLICY_STATS_SIZE, POLICY_TRIE_SIZE},
    nat::{NatEntry, NatKey, NAT_EVENT_KINDS},
    pod_link::PodLink,
    policy::{DstMatch, EgressTarget, PolicyStats, SrcMatch, MAX_POLICY_SLOTS},
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
#[btf_map]
pub static POLICY_STATS: PerCpuHashMap<u32, PolicyStats, { POLICY_STATS_SIZE as usize }> =
    PerCpuHashMap::new();
#[btf_map]
pub static NAT_FWD: LruHashMap<NatKey, NatEntry, 262144> = LruHashMap::new();
#[btf_map]
pub static NAT_REV: LruHashMap<NatKey, NatEntry, 262144> = LruHashMap::new();
/// Not preallocated: a value holds up to 1,024 blocks (2 KiB), and a node
/// uses far fewer EIPs than the map's limit.
#[btf_map]
pub static PORT_BLOCKS: HashMap<Addr, PortBlocks, 4096, { BPF_F_NO_PREALLOC as usize }> =
    HashMap::new();
#[btf_map]
pub static REPLY_STEERING: HashMap<SteerKey, SteerTarget, 65536> = HashMap::new();
#[btf_map]
pub static OWNED_EIPS: HashMap<Addr, OwnedEip, 4096> = HashMap::new();
#[btf_map]
pub static CONFIG: Array<DatapathConfig, 1> = Array::new();
/// See `egress_common::maps::ANNOUNCE_UNTIL`: 0, or the instant (ns) after
/// which owned EIPs are no longer answered for.
#[btf_map]
pub static ANNOUNCE_UNTIL: Array<u64, 1> = Array::new();
/// See `egress_common::route`.
#[btf_map]
pub static ROUTES: LpmTrie<Addr, RouteNextHop, 4096> = LpmTrie::new();
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
