//! Reading the per-CPU counters from pinned maps.

use std::path::Path;

use aya::maps::{MapData, PerCpuArray};
use egress_common::{addr::Addr, maps::IFACE_STATS, TrafficCounter};
use serde_json::json;

/// Sums the per-CPU slots of the `tc_count` program's counter, read from its pin.
pub fn read_iface_stats(pin_dir: &Path) -> anyhow::Result<TrafficCounter> {
    let path = pin_dir.join(IFACE_STATS);
    let data = MapData::from_pin(&path)
        .map_err(|e| anyhow::anyhow!("opening pinned map {}: {e}", path.display()))?;
    let map: PerCpuArray<_, TrafficCounter> =
        PerCpuArray::try_from(aya::maps::Map::PerCpuArray(data))?;
    let mut total = TrafficCounter::default();
    for slot in map.get(&0, 0)?.iter() {
        total.merge(slot);
    }
    Ok(total)
}

/// Dropped packets per reason (summed over CPUs), in `DROP_NAMES` order.
pub fn read_drops(pin_dir: &Path) -> anyhow::Result<Vec<(&'static str, TrafficCounter)>> {
    use egress_common::drops::DROP_NAMES;
    read_counters(pin_dir, egress_common::maps::DROPS, &DROP_NAMES)
}

/// NAT events (translations made, TCP segments that found none), summed
/// over CPUs, in `NAT_EVENT_NAMES` order.
pub fn read_nat_events(pin_dir: &Path) -> anyhow::Result<Vec<(&'static str, TrafficCounter)>> {
    use egress_common::nat::NAT_EVENT_NAMES;
    read_counters(pin_dir, egress_common::maps::NAT_EVENTS, &NAT_EVENT_NAMES)
}

/// What the gateway's XDP program sent back out (`XDP_TX_COUNT`), by
/// path: `XDP_TX_PATHS` order (replies, forwards).
pub fn read_xdp_tx(pin_dir: &Path) -> anyhow::Result<Vec<(&'static str, TrafficCounter)>> {
    use egress_common::maps::{XDP_TX_COUNT, XDP_TX_PATHS};
    read_counters(pin_dir, XDP_TX_COUNT, &XDP_TX_PATHS)
}

/// The per-CPU array `map` of counters, one named slot each.
fn read_counters(
    pin_dir: &Path,
    map: &str,
    names: &[&'static str],
) -> anyhow::Result<Vec<(&'static str, TrafficCounter)>> {
    let path = pin_dir.join(map);
    let data = MapData::from_pin(&path)
        .map_err(|e| anyhow::anyhow!("opening pinned map {}: {e}", path.display()))?;
    let map: PerCpuArray<_, TrafficCounter> =
        PerCpuArray::try_from(aya::maps::Map::PerCpuArray(data))?;
    let mut out = Vec::with_capacity(names.len());
    for (i, name) in names.iter().enumerate() {
        let mut total = TrafficCounter::default();
        // A map pinned by an older object may hold fewer reasons (until the
        // loader replaces it): those read as zero.
        if let Ok(slots) = map.get(&(i as u32), 0) {
            for slot in slots.iter() {
                total.merge(slot);
            }
        }
        out.push((*name, total));
    }
    Ok(out)
}

/// Packets and bytes per policy id and direction (summed over CPUs): the
/// pinned slot table says which counter slot each policy on the node has.
pub fn read_policy_stats(
    pin_dir: &Path,
) -> anyhow::Result<std::collections::BTreeMap<u32, egress_common::policy::PolicyStats>> {
    use egress_common::policy::{EgressTarget, PolicyStats};
    let open = |name: &str| {
        let path = pin_dir.join(name);
        MapData::from_pin(&path)
            .map_err(|e| anyhow::anyhow!("opening pinned map {}: {e}", path.display()))
    };
    let targets: aya::maps::Array<_, EgressTarget> = aya::maps::Array::try_from(
        aya::maps::Map::Array(open(egress_common::maps::POLICY_TARGETS)?),
    )?;
    let slots = crate::datapath::translate::StatsSlots::from_targets(
        &targets.iter().collect::<Result<Vec<_>, _>>()?,
    );
    let map: aya::maps::PerCpuArray<_, PolicyStats> = aya::maps::PerCpuArray::try_from(
        aya::maps::Map::PerCpuArray(open(egress_common::maps::POLICY_STATS)?),
    )?;
    let mut out = std::collections::BTreeMap::new();
    for (id, slot) in slots.by_policy {
        let mut total = PolicyStats::default();
        for v in map.get(&slot, 0)?.iter() {
            total.merge(v);
        }
        out.insert(id, total);
    }
    Ok(out)
}

/// NAT use of one EIP on this worker.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct EipNatUse {
    pub eip: std::net::IpAddr,
    /// Reverse NAT entries (one per translated flow).
    pub entries: u64,
    /// Distinct (protocol, port) pairs in use.
    pub ports_in_use: u64,
}

/// Turns a 16-byte map address back into an `IpAddr` (IPv4 when mapped).
pub fn addr_from_key(a: &egress_common::addr::Addr) -> std::net::IpAddr {
    match egress_common::addr::as_v4(a) {
        Some(v4) => std::net::IpAddr::from(v4),
        None => std::net::IpAddr::from(*a),
    }
}

/// Counts NAT entries and ports in use per EIP from the pinned reverse NAT table.
pub fn read_nat_use(pin_dir: &Path) -> anyhow::Result<Vec<EipNatUse>> {
    use egress_common::nat::{NatEntry, NatKey};
    use std::collections::{BTreeMap, BTreeSet};
    let path = pin_dir.join(egress_common::maps::NAT_REV);
    let data = MapData::from_pin(&path)
        .map_err(|e| anyhow::anyhow!("opening pinned map {}: {e}", path.display()))?;
    let map: aya::maps::HashMap<_, NatKey, NatEntry> =
        aya::maps::HashMap::try_from(aya::maps::Map::LruHashMap(data))?;
    let mut per: BTreeMap<std::net::IpAddr, (u64, BTreeSet<(u8, u16)>)> = BTreeMap::new();
    for r in map.iter() {
        let (k, _) = r?;
        let e = per.entry(addr_from_key(&k.dst)).or_default();
        e.0 += 1;
        e.1.insert((k.proto, k.dport));
    }
    Ok(per
        .into_iter()
        .map(|(eip, (entries, ports))| EipNatUse {
            eip,
            entries,
            ports_in_use: ports.len() as u64,
        })
        .collect())
}

/// A trie key as `address/length` (an IPv4 prefix sits behind the 96
/// mapped bits of the 128-bit key).
fn prefix_text(k: &aya::maps::lpm_trie::Key<egress_common::addr::Addr>) -> String {
    let ip = addr_from_key(&k.data());
    let len = match ip {
        std::net::IpAddr::V4(_) => k.prefix_len().saturating_sub(96),
        std::net::IpAddr::V6(_) => k.prefix_len(),
    };
    format!("{ip}/{len}")
}

/// The slot numbers set in `set`.
fn slot_list(set: &egress_common::policy::SlotSet) -> Vec<usize> {
    (0..egress_common::policy::MAX_POLICY_SLOTS)
        .filter(|i| egress_common::policy::has_slot(set, *i))
        .collect()
}

/// Everything the datapath maps of a node hold, decoded, as JSON (maps that
/// are not pinned are left out). `egress inspect` prints this.
pub fn datapath_snapshot(pin_dir: &Path) -> anyhow::Result<serde_json::Value> {
    use egress_common::maps::*;
    type MapSection = fn(aya::maps::Map) -> anyhow::Result<serde_json::Value>;
    type PinSection = fn(&Path) -> anyhow::Result<serde_json::Value>;
    // Decoded from the opened map; a map that does not open is left out.
    let maps: [(&str, &str, MapSection); 8] = [
        (CONFIG, "config", config_json),
        (POLICY_TARGETS, "policy_targets", policy_targets_json),
        (POLICY_SRC, "policy_sources", policy_sources_json),
        (POLICY_DST, "policy_destinations", policy_destinations_json),
        (PORT_BLOCKS, "port_blocks", port_blocks_json),
        (REPLY_STEERING, "reply_steering", reply_steering_json),
        (OWNED_EIPS, "owned_eips", owned_eips_json),
        (ROUTES, "routes", routes_json),
    ];
    // Their readers open the pin themselves (and fail if it does not
    // open): only whether the pin exists is asked here.
    let pins: [(&str, &str, PinSection); 6] = [
        (DROPS, "drops", drops_json),
        (XDP_TX_COUNT, "xdp_tx", xdp_tx_json),
        (NAT_EVENTS, "nat_events", nat_events_json),
        (POLICY_STATS, "policy_stats", policy_stats_json),
        (ANNOUNCE_UNTIL, "announce_lease_ms", announce_lease_json),
        (NAT_REV, "nat_use", nat_use_json),
    ];
    let mut out = serde_json::Map::new();
    for (map, key, section) in maps {
        if let Some(m) = open_pinned(pin_dir, map) {
            out.insert(key.into(), section(m)?);
        }
    }
    for (pin, key, section) in pins {
        if pin_dir.join(pin).exists() {
            out.insert(key.into(), section(pin_dir)?);
        }
    }
    let mut snapshot = serde_json::Value::from(out);
    let flags = snapshot["config"]["flags"].as_u64().unwrap_or(0) as u32;
    if flags & egress_common::config::CFG_UNDERLAY_V6 != 0 {
        let table = super::stats_endpoints::read_table(pin_dir)?;
        super::stats_endpoints::name_endpoints(&mut snapshot, &table);
    }
    Ok(snapshot)
}

/// The map pinned as `name`, None when it is not pinned.
fn open_pinned(pin_dir: &Path, name: &str) -> Option<aya::maps::Map> {
    let p = pin_dir.join(name);
    let data = MapData::from_pin(&p).ok()?;
    aya::maps::Map::from_map_data(data).ok()
}

/// The datapath configuration (slot 0 of `CONFIG`).
fn config_json(m: aya::maps::Map) -> anyhow::Result<serde_json::Value> {
    let a: aya::maps::Array<_, egress_common::config::DatapathConfig> =
        aya::maps::Array::try_from(m)?;
    let c = a.get(&0, 0)?;
    Ok(json!({
        "vxlan_ifindex": c.vxlan_ifindex, "vni": c.vni, "uplink_ifindex": c.uplink_ifindex,
        "flags": c.flags, "tunnel_mtu": c.tunnel_mtu, "port_block_size": c.port_block_size,
        "node_tunnel_ip": std::net::Ipv4Addr::from(c.node_tunnel_ip).to_string(),
        "vxlan_port": c.vxlan_port, "policy_epoch": c.policy_epoch,
        "gateway_epoch": c.gateway_epoch, "cache_ticks": c.cache_ticks,
    }))
}

/// The policy slots in use (flags set) and their targets.
fn policy_targets_json(m: aya::maps::Map) -> anyhow::Result<serde_json::Value> {
    let a: aya::maps::Array<_, egress_common::policy::EgressTarget> =
        aya::maps::Array::try_from(m)?;
    let mut v = Vec::new();
    for (slot, t) in a.iter().enumerate() {
        let t = t?;
        if t.flags == 0 {
            continue;
        }
        v.push(json!({
            "slot": slot, "policy_id": t.policy_id, "flags": t.flags,
            "eip_v4": addr_from_key(&t.eip_v4).to_string(),
            "eip_v6": addr_from_key(&t.eip_v6).to_string(),
            "gateway_tunnel_ip": std::net::Ipv4Addr::from(t.gateway_tunnel_ip).to_string(),
        }));
    }
    Ok(v.into())
}

/// Which pods this node translates, and for which policy slots.
fn policy_sources_json(m: aya::maps::Map) -> anyhow::Result<serde_json::Value> {
    let t: aya::maps::LpmTrie<_, Addr, egress_common::policy::SrcMatch> =
        aya::maps::LpmTrie::try_from(m)?;
    let mut v = Vec::new();
    for r in t.iter() {
        let (k, m) = r?;
        v.push(json!({ "source": prefix_text(&k), "slots": slot_list(&m.slots) }));
    }
    Ok(v.into())
}

/// Which destinations each slot covers or excludes; cluster CIDRs.
fn policy_destinations_json(m: aya::maps::Map) -> anyhow::Result<serde_json::Value> {
    let t: aya::maps::LpmTrie<_, Addr, egress_common::policy::DstMatch> =
        aya::maps::LpmTrie::try_from(m)?;
    let mut v = Vec::new();
    for r in t.iter() {
        let (k, m) = r?;
        v.push(json!({
            "destination": prefix_text(&k),
            "slots": slot_list(&m.slots),
            "excluded": slot_list(&m.excluded),
            "cluster": m.flags & egress_common::policy::DST_CLUSTER != 0,
        }));
    }
    Ok(v.into())
}

/// The port blocks granted to this node, per EIP.
fn port_blocks_json(m: aya::maps::Map) -> anyhow::Result<serde_json::Value> {
    let h: aya::maps::HashMap<_, Addr, egress_common::ports::PortBlocks> =
        aya::maps::HashMap::try_from(m)?;
    let mut v = Vec::new();
    for r in h.iter() {
        let (k, b) = r?;
        let n = (b.count as usize).min(b.blocks.len());
        v.push(json!({ "eip": addr_from_key(&k).to_string(), "blocks": &b.blocks[..n] }));
    }
    Ok(v.into())
}

/// Which worker each (EIP, port block) of replies goes to.
fn reply_steering_json(m: aya::maps::Map) -> anyhow::Result<serde_json::Value> {
    use egress_common::steering::{SteerKey, SteerTarget};
    let h: aya::maps::HashMap<_, SteerKey, SteerTarget> = aya::maps::HashMap::try_from(m)?;
    let mut v = Vec::new();
    for r in h.iter() {
        let (k, t) = r?;
        v.push(json!({
            "eip": addr_from_key(&k.eip).to_string(), "block": k.block,
            "worker_tunnel_ip": std::net::Ipv4Addr::from(t.worker_tunnel_ip).to_string(),
            "flags": t.flags,
        }));
    }
    Ok(v.into())
}

/// The EIPs this node owns as a gateway.
fn owned_eips_json(m: aya::maps::Map) -> anyhow::Result<serde_json::Value> {
    let h: aya::maps::HashMap<_, Addr, egress_common::steering::OwnedEip> =
        aya::maps::HashMap::try_from(m)?;
    let mut v = Vec::new();
    for r in h.iter() {
        let (k, o) = r?;
        v.push(json!({ "eip": addr_from_key(&k).to_string(), "flags": o.flags, "epoch": o.epoch }));
    }
    Ok(v.into())
}

/// The EIP routes learned over BGP: each EIP's gateway tunnel address.
fn routes_json(m: aya::maps::Map) -> anyhow::Result<serde_json::Value> {
    let t: aya::maps::LpmTrie<_, Addr, egress_common::route::RouteNextHop> =
        aya::maps::LpmTrie::try_from(m)?;
    let mut v = Vec::new();
    for r in t.iter() {
        let (k, n) = r?;
        v.push(json!({
            "eip": addr_from_key(&k.data()).to_string(),
            "tunnel_ip": std::net::Ipv4Addr::from(n.tunnel_ip).to_string(),
            "epoch": n.epoch,
        }));
    }
    Ok(v.into())
}

/// Packets and bytes dropped, by reason.
fn drops_json(pin_dir: &Path) -> anyhow::Result<serde_json::Value> {
    Ok(named_counters_json(read_drops(pin_dir)?))
}

/// `{name: {packets, bytes}}`.
fn named_counters_json(counters: Vec<(&'static str, TrafficCounter)>) -> serde_json::Value {
    let m: serde_json::Map<String, serde_json::Value> = counters
        .into_iter()
        .map(|(n, c)| {
            (
                n.to_string(),
                json!({ "packets": c.packets, "bytes": c.bytes }),
            )
        })
        .collect();
    m.into()
}

/// Packets per NAT event.
fn nat_events_json(pin_dir: &Path) -> anyhow::Result<serde_json::Value> {
    let e: serde_json::Map<String, serde_json::Value> = read_nat_events(pin_dir)?
        .into_iter()
        .map(|(n, c)| (n.to_string(), json!(c.packets)))
        .collect();
    Ok(e.into())
}

/// What the gateway's XDP program sent back out, by path.
fn xdp_tx_json(pin_dir: &Path) -> anyhow::Result<serde_json::Value> {
    Ok(named_counters_json(read_xdp_tx(pin_dir)?))
}

/// Packets and bytes per policy id and direction.
fn policy_stats_json(pin_dir: &Path) -> anyhow::Result<serde_json::Value> {
    let p: serde_json::Map<String, serde_json::Value> = read_policy_stats(pin_dir)?
        .into_iter()
        .map(|(id, s)| {
            (
                id.to_string(),
                json!({
                    "egress_packets": s.egress_packets, "egress_bytes": s.egress_bytes,
                    "reply_packets": s.reply_packets, "reply_bytes": s.reply_bytes,
                }),
            )
        })
        .collect();
    Ok(p.into())
}

/// Milliseconds left of the announce lease (negative: expired, the node
/// answers for no EIP); null: no limit.
fn announce_lease_json(pin_dir: &Path) -> anyhow::Result<serde_json::Value> {
    Ok(match super::lease::read(pin_dir)? {
        super::lease::Lease::Unlimited => serde_json::Value::Null,
        super::lease::Lease::Until(t) => {
            let now = std::time::Instant::now();
            json!(if t >= now {
                (t - now).as_millis() as i64
            } else {
                -((now - t).as_millis() as i64)
            })
        }
    })
}

/// NAT entries and ports in use per EIP.
fn nat_use_json(pin_dir: &Path) -> anyhow::Result<serde_json::Value> {
    Ok(serde_json::to_value(read_nat_use(pin_dir)?)?)
}
