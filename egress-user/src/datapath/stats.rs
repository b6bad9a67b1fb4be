//! Reading the per-CPU counters from pinned maps.

use std::path::Path;

use aya::maps::{MapData, PerCpuArray};
use egress_common::{maps::IFACE_STATS, TrafficCounter};

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
    use egress_common::drops::{DROP_NAMES, DROP_REASONS};
    let path = pin_dir.join(egress_common::maps::DROPS);
    let data = MapData::from_pin(&path)
        .map_err(|e| anyhow::anyhow!("opening pinned map {}: {e}", path.display()))?;
    let map: PerCpuArray<_, TrafficCounter> =
        PerCpuArray::try_from(aya::maps::Map::PerCpuArray(data))?;
    let mut out = Vec::with_capacity(DROP_REASONS);
    for (i, name) in DROP_NAMES.iter().enumerate() {
        let mut total = TrafficCounter::default();
        for slot in map.get(&(i as u32), 0)?.iter() {
            total.merge(slot);
        }
        out.push((*name, total));
    }
    Ok(out)
}

/// Packets and bytes per policy id and direction (summed over CPUs).
pub fn read_policy_stats(
    pin_dir: &Path,
) -> anyhow::Result<std::collections::BTreeMap<u32, egress_common::policy::PolicyStats>> {
    use egress_common::policy::PolicyStats;
    let path = pin_dir.join(egress_common::maps::POLICY_STATS);
    let data = MapData::from_pin(&path)
        .map_err(|e| anyhow::anyhow!("opening pinned map {}: {e}", path.display()))?;
    let map: aya::maps::PerCpuHashMap<_, u32, PolicyStats> =
        aya::maps::PerCpuHashMap::try_from(aya::maps::Map::PerCpuHashMap(data))?;
    let mut out = std::collections::BTreeMap::new();
    for r in map.iter() {
        let (id, values) = r?;
        let mut total = PolicyStats::default();
        for v in values.iter() {
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
