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
