//! Pure translation of [`DesiredMaps`] into the exact keys and values of
//! the BPF maps. No I/O; unit-tested here.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use egress_common::{
    addr::{v4_mapped, Addr},
    config::{DatapathConfig, CFG_GATEWAY, CFG_UNDERLAY_V6, CFG_WORKER},
    policy::*,
    ports::{PortBlocks, MAX_BLOCKS_PER_EIP},
    route::RouteNextHop,
    steering::{
        OwnedEip as OwnedVal, SteerKey, SteerTarget, OWNED_ANSWER_NEIGH, OWNED_NODE_IP, STEER_LOCAL,
    },
};

pub use endpoints::{EndpointIndex, Underlay};
pub use stats_slots::StatsSlots;

use super::{
    capacity::{self, Caps, OverCapacity},
    desired::{Cidr, DesiredMaps, NodeConfig, PolicyRule},
};

/// An LPM key: (prefix length in the 128-bit space, address).
pub type LpmKey = (u32, Addr);

/// The maps' contents, ready to be diffed against the kernel's.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MapContents {
    pub config: DatapathConfig,
    pub policy_src: BTreeMap<LpmKey, SrcMatch>,
    pub policy_dst: BTreeMap<LpmKey, DstMatch>,
    /// Slot -> target; slots not listed are written as empty (flags 0).
    pub targets: Vec<EgressTarget>,
    /// Slot -> flow buckets, for the targets with `TARGET_SPREAD`.
    pub spread: BTreeMap<u32, GatewaySpread>,
    /// Where each policy's counters are (the targets carry the same slots).
    pub stats_slots: StatsSlots,
    /// On an IPv6 underlay, the index of every tunnel endpoint the other
    /// tables name (empty on an IPv4 one).
    pub endpoints: EndpointIndex,
    pub port_blocks: BTreeMap<Addr, PortBlocks>,
    pub steering: BTreeMap<SteerKey, SteerTarget>,
    pub owned: BTreeMap<Addr, OwnedVal>,
    pub routes: BTreeMap<LpmKey, RouteNextHop>,
    /// Policies left out because they do not fit (a fail-closed rule
    /// stands in for each; see [`capacity`]).
    pub over_capacity: Vec<OverCapacity>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TranslateError {
    #[error("EIP {eip}: {count} port blocks granted; at most {MAX_BLOCKS_PER_EIP} per EIP")]
    TooManyBlocks { eip: IpAddr, count: usize },
    #[error("policy {0} has neither an IPv4 nor an IPv6 EIP (and is not marked no_gateway)")]
    NoEip(u32),
    #[error("port block size must be at least 1")]
    BlockSize,
}

/// The 16-byte map form of an address (IPv4 mapped).
pub fn addr_key(a: IpAddr) -> Addr {
    match a {
        IpAddr::V4(v4) => v4_mapped(v4.octets()),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// The trie key of a prefix.
pub fn lpm_key(c: &Cidr) -> LpmKey {
    let c = c.normalized();
    match c.addr {
        IpAddr::V4(_) => (96 + u32::from(c.len), addr_key(c.addr)),
        IpAddr::V6(_) => (u32::from(c.len), addr_key(c.addr)),
    }
}

/// The map sizes this node's policies must fit.
pub const NODE_CAPS: Caps = Caps {
    slots: MAX_POLICY_SLOTS,
    src_entries: egress_common::maps::POLICY_TRIE_SIZE as usize,
    dst_entries: egress_common::maps::POLICY_TRIE_SIZE as usize,
    eips: egress_common::maps::PORT_BLOCKS_SIZE as usize,
};

/// What the maps hold now that a new translation keeps: each policy's
/// counter slot, each IPv6 tunnel endpoint's index.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Kept {
    pub stats_slots: StatsSlots,
    pub endpoints: EndpointIndex,
}

/// [`translate_keeping`] with nothing given out before.
pub fn translate(d: &DesiredMaps) -> Result<MapContents, TranslateError> {
    translate_keeping(d, &Kept::default())
}

/// The maps for `d`; each policy keeps its counter slot and each endpoint
/// its index in `kept`.
pub fn translate_keeping(d: &DesiredMaps, kept: &Kept) -> Result<MapContents, TranslateError> {
    translate_within(d, NODE_CAPS, kept)
}

/// [`translate_keeping`] into maps of the sizes `caps` (smaller in tests).
pub fn translate_within(
    d: &DesiredMaps,
    caps: Caps,
    kept: &Kept,
) -> Result<MapContents, TranslateError> {
    if d.config.port_block_size == 0 {
        return Err(TranslateError::BlockSize);
    }
    let mut sorted: Vec<_> = d.policies.iter().collect();
    // Slot order = priority order: slot 0 wins.
    sorted.sort_by_key(|p| (p.priority, p.id));
    let cluster = cover::aggregate(&d.cluster_cidrs);
    let placed = capacity::place(&sorted, &cluster, caps);
    let policies: Vec<_> = placed.rules.iter().collect();

    let endpoints = match d.config.node_tunnel_ip {
        IpAddr::V6(_) => kept.endpoints.assign(&endpoints::named_v6(d)),
        IpAddr::V4(_) => EndpointIndex::default(),
    };
    let underlay = match d.config.node_tunnel_ip {
        IpAddr::V6(_) => Underlay::V6(&endpoints),
        IpAddr::V4(_) => Underlay::V4,
    };
    let mut out = MapContents {
        targets: vec![EgressTarget::default(); MAX_POLICY_SLOTS],
        over_capacity: placed.over,
        config: datapath_config(&d.config, underlay),
        ..Default::default()
    };
    let ids: BTreeSet<u32> = policies.iter().map(|p| p.id).collect();
    out.stats_slots = kept.stats_slots.assign(&ids);
    for (slot, p) in policies.iter().enumerate() {
        out.targets[slot] = egress_target(p, underlay)?;
        out.targets[slot].stats_slot = out.stats_slots.of(p.id);
        if out.targets[slot].flags & TARGET_SPREAD != 0 {
            let table = spread::spread_table(&p.spread, |g| underlay.field(g));
            out.spread.insert(slot as u32, table);
        }
    }
    fold_prefixes(&policies, &cluster, &mut out);
    for r in &d.routes {
        out.routes.insert(
            (128, addr_key(r.eip)),
            RouteNextHop {
                tunnel_ip: underlay.field(r.tunnel_ip),
                epoch: r.epoch,
            },
        );
    }
    out.config.policy_epoch = policy_epoch(&out);
    write_port_blocks(d, &policies, caps, &mut out)?;
    write_gateway_side(d, underlay, &mut out);
    out.config.gateway_epoch = gateway_epoch(&out);
    out.endpoints = endpoints;
    Ok(out)
}

/// The programs' config (both epochs 0: the caller digests them last).
fn datapath_config(c: &NodeConfig, underlay: Underlay) -> DatapathConfig {
    let v6 = matches!(underlay, Underlay::V6(_));
    DatapathConfig {
        vxlan_ifindex: c.vxlan_ifindex,
        vni: c.vni,
        uplink_ifindex: c.uplink_ifindex,
        flags: if c.is_gateway { CFG_GATEWAY } else { 0 }
            | if c.is_worker { CFG_WORKER } else { 0 }
            | if v6 { CFG_UNDERLAY_V6 } else { 0 },
        tunnel_mtu: c.tunnel_mtu,
        port_block_size: c.port_block_size,
        uplink_mac: c.uplink_mac,
        probe_port: c.probe_port,
        node_tunnel_ip: underlay.field(c.node_tunnel_ip),
        timeouts: c.timeouts,
        policy_epoch: 0,
        gateway_epoch: 0,
        vxlan_port: c.vxlan_port,
        cache_ticks: c.cache_ticks,
        _pad: [0; 4],
    }
}

/// One slot's target: the EIPs, the gateway, and the flags.
fn egress_target(p: &PolicyRule, underlay: Underlay) -> Result<EgressTarget, TranslateError> {
    if p.eip_v4.is_none() && p.eip_v6.is_none() && !p.no_gateway {
        return Err(TranslateError::NoEip(p.id));
    }
    let mut flags = 0;
    if p.no_gateway {
        flags |= TARGET_NO_GATEWAY;
    }
    if p.local_gateway {
        flags |= TARGET_LOCAL_GATEWAY;
    }
    if p.use_node_ip {
        flags |= TARGET_USE_NODE_IP;
    }
    if !p.spread.is_empty() && !p.local_gateway {
        flags |= TARGET_SPREAD;
    }
    let mut t = EgressTarget {
        policy_id: p.id,
        gateway_tunnel_ip: underlay.field(p.gateway_tunnel_ip),
        ..Default::default()
    };
    if let Some(v4) = p.eip_v4 {
        flags |= TARGET_HAS_V4;
        t.eip_v4 = v4_mapped(v4.octets());
    }
    if let Some(v6) = p.eip_v6 {
        flags |= TARGET_HAS_V6;
        t.eip_v6 = v6.octets();
    }
    t.flags = flags;
    Ok(t)
}

/// The source and destination tries: every prefix any slot names, each
/// with the slots of every prefix that covers it folded in (the LPM
/// lookup then finds, in one step, every slot that matches).
fn fold_prefixes(policies: &[&PolicyRule], cluster: &[Cidr], out: &mut MapContents) {
    // "No destSubnet" means everything. Both "everything" prefixes are
    // always in both tries: an IPv4 lookup then never falls through to an
    // IPv6 prefix that covers the IPv4-mapped range (such as `::/0`), and a
    // fail-closed stand-in can always be written (see `capacity`).
    let all_dst = capacity::always_present();
    let mut src_prefixes: BTreeSet<Cidr> = all_dst.into();
    let mut dst_prefixes: BTreeSet<Cidr> = all_dst.into();
    for p in policies {
        src_prefixes.extend(p.sources.iter().map(|c| c.normalized()));
        if p.destinations.is_empty() {
            dst_prefixes.extend(all_dst);
        }
        dst_prefixes.extend(p.destinations.iter().map(|c| c.normalized()));
        dst_prefixes.extend(p.excluded.iter().map(|c| c.normalized()));
    }
    dst_prefixes.extend(cluster.iter().map(|c| c.normalized()));
    let in_cluster = cover::PrefixCover::new(cluster);
    for pre in &src_prefixes {
        let mut m = SrcMatch::default();
        for (slot, p) in policies.iter().enumerate() {
            if p.sources.iter().any(|s| s.contains(pre)) {
                set_slot(&mut m.slots, slot);
            }
        }
        out.policy_src.insert(lpm_key(pre), m);
    }
    for pre in &dst_prefixes {
        let mut m = DstMatch::default();
        for (slot, p) in policies.iter().enumerate() {
            let dsts: &[Cidr] = if p.destinations.is_empty() {
                &all_dst
            } else {
                &p.destinations
            };
            if dsts.iter().any(|s| s.contains(pre)) {
                set_slot(&mut m.slots, slot);
            }
            if p.excluded.iter().any(|s| s.contains(pre)) {
                set_slot(&mut m.excluded, slot);
            }
        }
        if in_cluster.covers(pre) {
            m.flags |= DST_CLUSTER;
        }
        out.policy_dst.insert(lpm_key(pre), m);
    }
}

/// The worker's port blocks per EIP. More EIPs granted than the table
/// holds: only those of the policies placed are written (the others'
/// policies fail closed, reported).
fn write_port_blocks(
    d: &DesiredMaps,
    policies: &[&PolicyRule],
    caps: Caps,
    out: &mut MapContents,
) -> Result<(), TranslateError> {
    let placed_eips: BTreeSet<IpAddr> = policies
        .iter()
        .flat_map(|p| capacity::rule_eips(p))
        .collect();
    let over_eips = d.port_blocks.len() > caps.eips;
    for g in d
        .port_blocks
        .iter()
        .filter(|g| !over_eips || placed_eips.contains(&g.eip))
    {
        let mut blocks: Vec<u16> = g.blocks.clone();
        blocks.sort_unstable();
        blocks.dedup();
        if blocks.len() > MAX_BLOCKS_PER_EIP {
            return Err(TranslateError::TooManyBlocks {
                eip: g.eip,
                count: blocks.len(),
            });
        }
        let entry = out.port_blocks.entry(addr_key(g.eip)).or_default();
        for b in blocks {
            let n = entry.count as usize;
            if entry.blocks[..n].contains(&b) {
                continue;
            }
            if n == MAX_BLOCKS_PER_EIP {
                return Err(TranslateError::TooManyBlocks {
                    eip: g.eip,
                    count: n + 1,
                });
            }
            entry.blocks[n] = b;
            entry.count += 1;
        }
    }
    Ok(())
}

/// The gateway's side: reply steering and the EIPs it owns.
fn write_gateway_side(d: &DesiredMaps, underlay: Underlay, out: &mut MapContents) {
    for s in &d.reply_steering {
        out.steering.insert(
            SteerKey {
                eip: addr_key(s.eip),
                block: s.block,
                _pad: [0; 2],
            },
            SteerTarget {
                worker_tunnel_ip: underlay.field(s.worker_tunnel_ip),
                flags: if s.local { STEER_LOCAL } else { 0 },
            },
        );
    }
    for o in &d.owned_eips {
        let neigh = if o.answer_neigh {
            OWNED_ANSWER_NEIGH
        } else {
            0
        };
        let node_ip = if o.node_ip { OWNED_NODE_IP } else { 0 };
        out.owned.insert(
            addr_key(o.eip),
            OwnedVal {
                flags: neigh | node_ip,
                epoch: o.epoch,
            },
        );
    }
}

/// FNV-1a over bytes, for the epochs: a digest that is never 0 (0 means
/// "nothing validated" to the programs).
struct Fnv1a(u32);

impl Fnv1a {
    fn new() -> Self {
        Self(0x811c_9dc5)
    }

    fn eat(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u32::from(*b);
            self.0 = self.0.wrapping_mul(0x0100_0193);
        }
    }

    fn digest(&self) -> u32 {
        self.0.max(1)
    }
}

/// A digest (FNV-1a, never 0) of everything that decides a flow's policy:
/// both tries, the slot table and the EIP routes. A change makes every NAT entry take the
/// full policy lookup once more.
fn policy_epoch(m: &MapContents) -> u32 {
    let mut h = Fnv1a::new();
    let mut eat = |bytes: &[u8]| h.eat(bytes);
    // The endpoint fields mean addresses on one underlay, indexes on the other.
    eat(&(m.config.flags & CFG_UNDERLAY_V6).to_le_bytes());
    for ((len, a), v) in &m.policy_src {
        eat(&len.to_le_bytes());
        eat(a);
        v.slots.iter().for_each(|w| eat(&w.to_le_bytes()));
    }
    for ((len, a), v) in &m.policy_dst {
        eat(&len.to_le_bytes());
        eat(a);
        v.slots.iter().for_each(|w| eat(&w.to_le_bytes()));
        v.excluded.iter().for_each(|w| eat(&w.to_le_bytes()));
        eat(&v.flags.to_le_bytes());
    }
    for t in &m.targets {
        eat(&t.policy_id.to_le_bytes());
        // NAT entries carry the counter slot: a new one must reach them.
        eat(&t.stats_slot.to_le_bytes());
        eat(&t.flags.to_le_bytes());
        eat(&t.eip_v4);
        eat(&t.eip_v6);
        eat(&t.gateway_tunnel_ip);
    }
    // The buckets decide a flow's gateway, as the slot's gateway does.
    for (slot, s) in &m.spread {
        eat(&slot.to_le_bytes());
        s.tunnel_ips.iter().for_each(|ip| eat(ip));
    }
    // A route decides where a flow's tunnel goes, as the slot's gateway does.
    for ((len, a), r) in &m.routes {
        eat(&len.to_le_bytes());
        eat(a);
        eat(&r.tunnel_ip);
    }
    h.digest()
}

/// A digest (FNV-1a, never 0) of what the gateway paths decide by: owned
/// EIPs, reply steering and the block size. The programs' per-CPU caches
/// hold results computed under one value and ignore them under any other.
fn gateway_epoch(m: &MapContents) -> u32 {
    let mut h = Fnv1a::new();
    let mut eat = |bytes: &[u8]| h.eat(bytes);
    eat(&(m.config.flags & CFG_UNDERLAY_V6).to_le_bytes());
    eat(&m.config.port_block_size.to_le_bytes());
    for (a, o) in &m.owned {
        eat(a);
        eat(&o.flags.to_le_bytes());
    }
    for (k, t) in &m.steering {
        eat(&k.eip);
        eat(&k.block.to_le_bytes());
        eat(&t.worker_tunnel_ip);
        eat(&t.flags.to_le_bytes());
    }
    h.digest()
}

/// What the program would pick for a packet from `src` to `dst`: the
/// policy id, or None for the normal path. The same longest-prefix and
/// bit logic as the program, for tests and for `egress inspect`.
pub fn lookup_policy(m: &MapContents, src: IpAddr, dst: IpAddr) -> Option<u32> {
    fn lpm<V>(t: &BTreeMap<LpmKey, V>, a: IpAddr) -> Option<&V> {
        let host = Cidr::host(a);
        let (hl, _) = lpm_key(&host);
        (0..=hl).rev().find_map(|len| {
            let c = match a {
                IpAddr::V4(_) => Cidr {
                    addr: a,
                    len: (len.checked_sub(96)?) as u8,
                },
                IpAddr::V6(_) => Cidr {
                    addr: a,
                    len: len as u8,
                },
            };
            t.get(&lpm_key(&c))
        })
    }
    let s = lpm(&m.policy_src, src)?;
    let d = lpm(&m.policy_dst, dst)?;
    let slot = pick_slot(s, d)?;
    let t = &m.targets[slot as usize];
    // A fail-closed policy matches (and drops) whatever the family.
    if t.flags & TARGET_NO_GATEWAY != 0 {
        return Some(t.policy_id);
    }
    let fam_ok = match dst {
        IpAddr::V4(_) => t.flags & TARGET_HAS_V4 != 0,
        IpAddr::V6(_) => t.flags & TARGET_HAS_V6 != 0,
    };
    fam_ok.then_some(t.policy_id)
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;
    use crate::datapath::desired::*;

    fn cidrs(v: &[&str]) -> Vec<Cidr> {
        v.iter().map(|s| s.parse().unwrap()).collect()
    }

    fn policy(id: u32, prio: i32, src: &[&str], dst: &[&str], excl: &[&str]) -> PolicyRule {
        PolicyRule {
            id,
            priority: prio,
            sources: cidrs(src),
            destinations: cidrs(dst),
            excluded: cidrs(excl),
            eip_v4: Some(Ipv4Addr::new(198, 51, 100, id as u8)),
            eip_v6: Some(format!("2001:db8::{id}").parse().unwrap()),
            gateway_tunnel_ip: Ipv4Addr::new(10, 0, 0, 1).into(),
            spread: Vec::new(),
            local_gateway: false,
            use_node_ip: false,
            no_gateway: false,
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn gateway_epoch_follows_ownership_and_steering_only() {
        use crate::datapath::{OwnedEip, ReplySteering};
        let eip: IpAddr = "198.51.100.10".parse().unwrap();
        let d = DesiredMaps {
            owned_eips: vec![OwnedEip {
                eip,
                answer_neigh: true,
                node_ip: false,
                epoch: 1,
            }],
            reply_steering: vec![ReplySteering {
                eip,
                block: 40,
                worker_tunnel_ip: Ipv4Addr::new(10, 0, 0, 21).into(),
                local: false,
            }],
            ..Default::default()
        };
        let epoch = |d: &DesiredMaps| translate(d).unwrap().config.gateway_epoch;
        let a = epoch(&d);
        assert_ne!(a, 0);
        let mut d2 = d.clone();
        d2.policies = vec![policy(1, 0, &["10.244.0.0/16"], &[], &[])];
        d2.owned_eips[0].epoch = 2;
        assert_eq!(epoch(&d2), a, "policies and takeover epochs do not matter");
        d2.reply_steering[0].worker_tunnel_ip = Ipv4Addr::new(10, 0, 0, 22).into();
        assert_ne!(epoch(&d2), a, "a block steered elsewhere");
        let mut d3 = d.clone();
        d3.owned_eips.clear();
        assert_ne!(epoch(&d3), a, "an EIP given up");
    }

    #[test]
    fn policy_epoch_follows_the_policy_tables_only() {
        let d = DesiredMaps {
            policies: vec![policy(1, 0, &["10.244.0.0/16"], &[], &[])],
            ..Default::default()
        };
        let a = translate(&d).unwrap().config.policy_epoch;
        assert_ne!(a, 0);
        let mut d2 = d.clone();
        d2.config.vni = 99;
        assert_eq!(
            translate(&d2).unwrap().config.policy_epoch,
            a,
            "config only"
        );
        d2.policies[0].gateway_tunnel_ip = Ipv4Addr::new(10, 0, 0, 2).into();
        assert_ne!(
            translate(&d2).unwrap().config.policy_epoch,
            a,
            "new gateway"
        );
    }

    #[test]
    fn a_spread_policy_gets_its_buckets_and_a_change_of_them_moves_the_epoch() {
        let gws = |n: u8| -> Vec<IpAddr> {
            (1..=n)
                .map(|i| Ipv4Addr::new(10, 100, 0, i).into())
                .collect()
        };
        let mut d = DesiredMaps {
            policies: vec![policy(1, 0, &["10.244.0.0/16"], &[], &[])],
            ..Default::default()
        };
        let plain = translate(&d).unwrap();
        assert_eq!(plain.targets[0].flags & TARGET_SPREAD, 0);
        assert!(plain.spread.is_empty());
        d.policies[0].spread = gws(3);
        let three = translate(&d).unwrap();
        assert_ne!(three.targets[0].flags & TARGET_SPREAD, 0);
        assert_eq!(
            three.spread[&0],
            spread::spread_table(&gws(3), |g| Underlay::V4.field(g))
        );
        assert_ne!(three.config.policy_epoch, plain.config.policy_epoch);
        d.policies[0].spread = gws(2);
        let two = translate(&d).unwrap();
        assert_ne!(two.config.policy_epoch, three.config.policy_epoch);
        // This node holds the EIPs itself: no tunnel, no buckets used.
        d.policies[0].local_gateway = true;
        assert_eq!(translate(&d).unwrap().targets[0].flags & TARGET_SPREAD, 0);
    }

    #[test]
    fn eip_routes_are_host_entries_and_move_the_policy_epoch() {
        let mut d = DesiredMaps {
            policies: vec![policy(1, 0, &["10.244.0.0/16"], &[], &[])],
            ..Default::default()
        };
        let before = translate(&d).unwrap().config.policy_epoch;
        d.routes.push(super::super::desired::EipRoute {
            eip: ip("198.51.100.1"),
            tunnel_ip: "10.100.0.12".parse().unwrap(),
            epoch: 5,
        });
        let m = translate(&d).unwrap();
        assert_ne!(m.config.policy_epoch, before, "a route re-validates flows");
        let r = m.routes[&(128, addr_key(ip("198.51.100.1")))];
        assert_eq!((r.tunnel_ip, r.epoch), ([10, 100, 0, 12], 5));
    }

    #[test]
    fn ipv4_prefixes_are_mapped_into_the_128_bit_space() {
        let (len, a) = lpm_key(&"10.1.2.0/24".parse().unwrap());
        assert_eq!(len, 120);
        assert_eq!(&a[..12], &egress_common::addr::V4_MAPPED_PREFIX);
        assert_eq!(&a[12..], &[10, 1, 2, 0]);
    }

    #[test]
    fn priority_overlap_exclusion_and_cluster_cidrs() {
        let d = DesiredMaps {
            policies: vec![
                // Broad policy, low priority (higher number).
                policy(1, 100, &["10.244.0.0/16"], &[], &["203.0.113.0/24"]),
                // Narrow policy for one pod to one subnet, wins on overlap.
                policy(2, 10, &["10.244.1.5/32"], &["192.0.2.0/24"], &[]),
            ],
            cluster_cidrs: cidrs(&["10.96.0.0/12", "10.244.0.0/16"]),
            ..Default::default()
        };
        let m = translate(&d).unwrap();
        assert_eq!(
            lookup_policy(&m, ip("10.244.1.5"), ip("192.0.2.9")),
            Some(2)
        );
        assert_eq!(lookup_policy(&m, ip("10.244.1.5"), ip("8.8.8.8")), Some(1));
        assert_eq!(
            lookup_policy(&m, ip("10.244.1.6"), ip("192.0.2.9")),
            Some(1)
        );
        assert_eq!(
            lookup_policy(&m, ip("10.244.1.6"), ip("203.0.113.7")),
            None,
            "excluded"
        );
        assert_eq!(
            lookup_policy(&m, ip("10.244.1.6"), ip("10.96.0.1")),
            None,
            "cluster CIDR"
        );
        assert_eq!(
            lookup_policy(&m, ip("10.245.0.1"), ip("8.8.8.8")),
            None,
            "pod outside"
        );
        // Priority reversed: the broad policy wins everywhere it matches.
        let mut d2 = d.clone();
        d2.policies[0].priority = 1;
        let m2 = translate(&d2).unwrap();
        assert_eq!(
            lookup_policy(&m2, ip("10.244.1.5"), ip("192.0.2.9")),
            Some(1)
        );
    }

    #[test]
    fn a_thousand_node_cidrs_take_a_few_trie_keys_and_mean_the_same() {
        // Every node's /24 pod CIDR and /32 address, numbered in order.
        let mut cluster: Vec<Cidr> = (0..1000u32)
            .map(|i| {
                format!("10.{}.{}.0/24", 100 + i / 256, i % 256)
                    .parse()
                    .unwrap()
            })
            .collect();
        cluster.extend((1..=250).map(|i| format!("172.16.0.{i}/32").parse::<Cidr>().unwrap()));
        let d = DesiredMaps {
            policies: vec![
                policy(1, 100, &["10.100.1.7/32"], &[], &["203.0.113.0/24"]),
                // Its destination overlaps part of the cluster's range: a
                // destination there stays in the cluster (no egress).
                policy(2, 10, &["10.100.1.7/32"], &["10.101.0.0/23"], &[]),
            ],
            cluster_cidrs: cluster,
            ..Default::default()
        };
        let m = translate(&d).unwrap();
        assert!(m.policy_dst.len() < 40, "{} keys", m.policy_dst.len());
        let pod = ip("10.100.1.7");
        for (dst, want) in [
            ("10.100.0.1", None),
            ("10.101.1.9", None),
            ("10.103.231.255", None),
            ("172.16.0.250", None),
            // Just outside the nodes' ranges: egress.
            ("10.103.232.0", Some(1)),
            ("10.99.255.255", Some(1)),
            ("172.16.0.251", Some(1)),
            ("172.16.0.0", Some(1)),
            ("203.0.113.7", None),
            ("8.8.8.8", Some(1)),
        ] {
            assert_eq!(lookup_policy(&m, pod, ip(dst)), want, "{dst}");
        }
    }

    #[test]
    fn ipv6_default_destination_does_not_capture_ipv4() {
        let mut p = policy(3, 0, &["fd00:244::/64"], &["::/0"], &[]);
        p.eip_v4 = None;
        let q = policy(4, 5, &["10.244.0.0/16"], &["192.0.2.0/24"], &[]);
        let m = translate(&DesiredMaps {
            policies: vec![p, q],
            ..Default::default()
        })
        .unwrap();
        assert_eq!(
            lookup_policy(&m, ip("fd00:244::5"), ip("2001:db8:e::1")),
            Some(3)
        );
        assert_eq!(lookup_policy(&m, ip("10.244.0.5"), ip("8.8.8.8")), None);
        assert_eq!(
            lookup_policy(&m, ip("10.244.0.5"), ip("192.0.2.1")),
            Some(4)
        );
        // The v4 "any" key is present and holds no v6 slot.
        let any4 = m
            .policy_dst
            .get(&lpm_key(&"0.0.0.0/0".parse().unwrap()))
            .unwrap();
        assert_eq!(any4.slots, SlotSet::default());
    }

    #[test]
    fn blocks_steering_owned_and_limits() {
        let mut d = DesiredMaps::default();
        d.port_blocks.push(PortBlockGrant {
            eip: ip("198.51.100.1"),
            blocks: vec![5, 3, 5],
        });
        d.reply_steering.push(ReplySteering {
            eip: ip("198.51.100.1"),
            block: 3,
            worker_tunnel_ip: Ipv4Addr::new(10, 0, 0, 7).into(),
            local: false,
        });
        d.owned_eips.push(OwnedEip {
            eip: ip("198.51.100.1"),
            answer_neigh: true,
            node_ip: false,
            epoch: 4,
        });
        let m = translate(&d).unwrap();
        let pb = m.port_blocks[&addr_key(ip("198.51.100.1"))];
        assert_eq!((pb.count, &pb.blocks[..2]), (2, &[3u16, 5][..]));
        assert_eq!(m.steering.len(), 1);
        assert_eq!(m.owned[&addr_key(ip("198.51.100.1"))].epoch, 4);

        d.port_blocks[0].blocks = (0..=MAX_BLOCKS_PER_EIP as u16).collect();
        assert!(matches!(
            translate(&d),
            Err(TranslateError::TooManyBlocks { .. })
        ));
        let mut noeip = policy(9, 0, &["10.0.0.0/8"], &[], &[]);
        noeip.eip_v4 = None;
        noeip.eip_v6 = None;
        assert_eq!(
            translate(&DesiredMaps {
                policies: vec![noeip],
                ..Default::default()
            }),
            Err(TranslateError::NoEip(9))
        );
    }

    #[test]
    fn a_no_gateway_policy_matches_without_eips_and_wins_by_priority() {
        let mut pending = policy(7, 0, &["10.244.1.5/32"], &["203.0.113.0/24"], &[]);
        pending.eip_v4 = None;
        pending.eip_v6 = None;
        pending.gateway_tunnel_ip = Ipv4Addr::UNSPECIFIED.into();
        pending.no_gateway = true;
        let d = DesiredMaps {
            policies: vec![pending.clone(), policy(8, 5, &["10.244.1.5/32"], &[], &[])],
            ..Default::default()
        };
        let m = translate(&d).expect("a no_gateway policy needs no EIP");
        let t = m.targets.iter().find(|t| t.policy_id == 7).unwrap();
        assert_eq!(t.flags, TARGET_NO_GATEWAY, "no family bits, no tunnel");
        // Its destinations go to it (the program drops), the rest to policy 8.
        assert_eq!(
            lookup_policy(&m, ip("10.244.1.5"), ip("203.0.113.9")),
            Some(7)
        );
        assert_eq!(
            lookup_policy(&m, ip("10.244.1.5"), ip("198.51.100.1")),
            Some(8)
        );
        // Without the flag the same rule is refused.
        pending.no_gateway = false;
        let d = DesiredMaps {
            policies: vec![pending],
            ..Default::default()
        };
        assert_eq!(translate(&d), Err(TranslateError::NoEip(7)));
    }
}

#[cfg(test)]
mod capacity_tests;

mod cover;
pub mod endpoints;
pub mod spread;
pub mod stats_slots;
