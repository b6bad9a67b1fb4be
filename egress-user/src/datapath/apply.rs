//! Writing a desired state into the maps by diffing against what they hold:
//! new and changed entries are written first, then stale ones removed, and
//! an unchanged entry is never touched (no traffic gap on resync). What
//! they hold is read from the kernel, or taken from the [`MapShadow`] of
//! the last apply.

mod endpoints;
mod shadow;

pub use shadow::MapShadow;

use std::{collections::BTreeMap, path::Path};

use aya::{
    maps::{
        lpm_trie::{Key as LpmKeyK, LpmTrie},
        Array, HashMap, Map, MapData, MapError, PerCpuArray, PerCpuValues,
    },
    Pod,
};
use egress_common::{
    addr::Addr,
    config::DatapathConfig,
    maps::*,
    policy::{DstMatch, EgressTarget, GatewaySpread, PolicyStats, SrcMatch},
    ports::PortBlocks,
    route::RouteNextHop,
    steering::{OwnedEip, SteerKey, SteerTarget},
};

use super::{
    desired::DesiredMaps,
    translate::{translate_keeping, Kept, LpmKey, MapContents, StatsSlots, TranslateError},
    Datapath,
};

#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error(transparent)]
    Translate(#[from] TranslateError),
    #[error("map {0} is missing from the loaded object or pin folder")]
    MissingMap(&'static str),
    #[error("map {name}: {source}")]
    Map {
        name: &'static str,
        source: MapError,
    },
    #[error("counting CPUs: {0}")]
    Cpus(String),
}

/// How many entries one apply wrote and removed, per map.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ApplyReport {
    pub written: BTreeMap<&'static str, usize>,
    pub removed: BTreeMap<&'static str, usize>,
    /// Policies left out because they do not fit (see `capacity`).
    pub over_capacity: Vec<crate::datapath::capacity::OverCapacity>,
}

impl ApplyReport {
    pub fn total_written(&self) -> usize {
        self.written.values().sum()
    }
    pub fn total_removed(&self) -> usize {
        self.removed.values().sum()
    }
}

/// Something that hands out the datapath's maps by name.
pub trait MapSource {
    fn map_mut(&mut self, name: &'static str) -> Option<&mut Map>;
}

impl MapSource for Datapath {
    fn map_mut(&mut self, name: &'static str) -> Option<&mut Map> {
        self.ebpf.map_mut(name)
    }
}

/// The maps opened from their pins (another process owns the programs).
pub struct PinnedMaps {
    maps: BTreeMap<&'static str, Map>,
}

impl PinnedMaps {
    /// Opens every pinned map of [`PINNED_MAPS`] that exists under `pin_dir`.
    pub fn open(pin_dir: &Path) -> Result<Self, ApplyError> {
        let mut maps = BTreeMap::new();
        for name in PINNED_MAPS {
            let path = pin_dir.join(name);
            if !path.exists() {
                continue;
            }
            let data =
                MapData::from_pin(&path).map_err(|source| ApplyError::Map { name, source })?;
            let map =
                Map::from_map_data(data).map_err(|source| ApplyError::Map { name, source })?;
            maps.insert(*name, map);
        }
        Ok(Self { maps })
    }
}

impl MapSource for PinnedMaps {
    fn map_mut(&mut self, name: &'static str) -> Option<&mut Map> {
        self.maps.get_mut(name)
    }
}

fn get<'a>(src: &'a mut dyn MapSource, name: &'static str) -> Result<&'a mut Map, ApplyError> {
    src.map_mut(name).ok_or(ApplyError::MissingMap(name))
}

fn wrap(name: &'static str) -> impl Fn(MapError) -> ApplyError {
    move |source| ApplyError::Map { name, source }
}

fn diff_hash<K: Pod + Ord + Send, V: Pod + PartialEq + Send>(
    src: &mut dyn MapSource,
    name: &'static str,
    want: &BTreeMap<K, V>,
    shadow: &mut MapShadow,
    report: &mut ApplyReport,
) -> Result<(), ApplyError> {
    let mut map: HashMap<&mut MapData, K, V> =
        HashMap::try_from(get(src, name)?).map_err(wrap(name))?;
    let have: BTreeMap<K, V> = match shadow.take(name) {
        Some(h) => h,
        None => map.iter().collect::<Result<_, _>>().map_err(wrap(name))?,
    };
    let mut written = 0;
    for (k, v) in want {
        if have.get(k) != Some(v) {
            map.insert(k, v, 0).map_err(wrap(name))?;
            written += 1;
        }
    }
    let mut removed = 0;
    for k in have.keys().filter(|k| !want.contains_key(k)) {
        map.remove(k).map_err(wrap(name))?;
        removed += 1;
    }
    shadow.put(name, want.clone());
    report.written.insert(name, written);
    report.removed.insert(name, removed);
    Ok(())
}

/// Diffs a trie of `cap` entries. New keys go in before stale ones go out
/// (no lookup falls through to a shorter prefix meanwhile), unless that
/// would need more than `cap` entries at once: then the stale keys go
/// first, as a trie filled close to its size needs.
fn diff_lpm<V: Pod + PartialEq + Send>(
    src: &mut dyn MapSource,
    name: &'static str,
    cap: usize,
    want: &BTreeMap<LpmKey, V>,
    shadow: &mut MapShadow,
    report: &mut ApplyReport,
) -> Result<(), ApplyError> {
    let mut map: LpmTrie<&mut MapData, Addr, V> =
        LpmTrie::try_from(get(src, name)?).map_err(wrap(name))?;
    let have: BTreeMap<LpmKey, V> = match shadow.take(name) {
        Some(h) => h,
        None => map
            .iter()
            .map(|r| r.map(|(k, v)| ((k.prefix_len(), k.data()), v)))
            .collect::<Result<_, _>>()
            .map_err(wrap(name))?,
    };
    let stale: Vec<LpmKey> = have
        .keys()
        .filter(|k| !want.contains_key(k))
        .copied()
        .collect();
    let added = want.keys().filter(|k| !have.contains_key(k)).count();
    let remove_first = have.len() + added > cap;
    let remove = |map: &mut LpmTrie<&mut MapData, Addr, V>| {
        for (len, a) in &stale {
            map.remove(&LpmKeyK::new(*len, *a)).map_err(wrap(name))?;
        }
        Ok::<_, ApplyError>(())
    };
    if remove_first {
        remove(&mut map)?;
    }
    let mut written = 0;
    for ((len, a), v) in want {
        if have.get(&(*len, *a)) != Some(v) {
            map.insert(&LpmKeyK::new(*len, *a), v, 0)
                .map_err(wrap(name))?;
            written += 1;
        }
    }
    if !remove_first {
        remove(&mut map)?;
    }
    shadow.put(name, want.clone());
    report.written.insert(name, written);
    report.removed.insert(name, stale.len());
    Ok(())
}

/// Writes the slots `0..want.len()` that differ; slots past it are left
/// as they are.
fn diff_array<V: Pod + PartialEq + Send>(
    src: &mut dyn MapSource,
    name: &'static str,
    want: &[V],
    shadow: &mut MapShadow,
    report: &mut ApplyReport,
) -> Result<(), ApplyError> {
    let mut map: Array<&mut MapData, V> = Array::try_from(get(src, name)?).map_err(wrap(name))?;
    let had: Vec<V> = shadow.take(name).unwrap_or_default();
    let mut written = 0;
    for (i, v) in want.iter().enumerate() {
        let have = match had.get(i) {
            Some(h) => *h,
            None => map.get(&(i as u32), 0).map_err(wrap(name))?,
        };
        if have != *v {
            map.set(i as u32, v, 0).map_err(wrap(name))?;
            written += 1;
        }
    }
    // The slots past `want` keep what they had.
    let mut now = want.to_vec();
    now.extend(had.iter().skip(want.len()).copied());
    shadow.put(name, now);
    report.written.insert(name, written);
    Ok(())
}

/// The counter slots the last apply gave out: the shadow's copy, or (after
/// a start or a resync) what the pinned slot table says, which is then
/// kept as the table's copy for its diff.
fn last_stats_slots(
    src: &mut dyn MapSource,
    shadow: &mut MapShadow,
) -> Result<StatsSlots, ApplyError> {
    if let Some(s) = shadow.take::<StatsSlots>(POLICY_STATS) {
        return Ok(s);
    }
    let targets: Vec<EgressTarget> = match shadow.take(POLICY_TARGETS) {
        Some(t) => t,
        None => {
            let name = POLICY_TARGETS;
            let map: Array<&mut MapData, EgressTarget> =
                Array::try_from(get(src, name)?).map_err(wrap(name))?;
            (0..map.len())
                .map(|i| map.get(&i, 0))
                .collect::<Result<_, _>>()
                .map_err(wrap(name))?
        }
    };
    let slots = StatsSlots::from_targets(&targets);
    shadow.put(POLICY_TARGETS, targets);
    Ok(slots)
}

/// Zeroes the counter slots given to a policy that did not hold them, before
/// any target points there (a slot freed by a gone policy keeps what it
/// counted until it is given out again).
fn reset_fresh_stats(
    src: &mut dyn MapSource,
    prev: &StatsSlots,
    now: &StatsSlots,
    shadow: &mut MapShadow,
    report: &mut ApplyReport,
) -> Result<(), ApplyError> {
    let name = POLICY_STATS;
    let fresh = now.fresh_since(prev);
    if !fresh.is_empty() {
        let mut map: PerCpuArray<&mut MapData, PolicyStats> =
            PerCpuArray::try_from(get(src, name)?).map_err(wrap(name))?;
        let ncpu =
            aya::util::nr_cpus().map_err(|(what, e)| ApplyError::Cpus(format!("{what}: {e}")))?;
        let zero = vec![PolicyStats::default(); ncpu];
        for slot in &fresh {
            let values = PerCpuValues::try_from(zero.clone())
                .map_err(|e| ApplyError::Cpus(e.to_string()))?;
            map.set(*slot, values, 0).map_err(wrap(name))?;
        }
    }
    shadow.put(name, now.clone());
    report.written.insert(name, fresh.len());
    Ok(())
}

/// Entries of the policy tries and of the routes trie, as the object
/// defines them.
const TRIE: usize = egress_common::maps::POLICY_TRIE_SIZE as usize;
const ROUTES_SIZE: usize = egress_common::maps::ROUTES_SIZE as usize;

/// Writes already translated contents (see [`translate_keeping`]); the
/// counters of every slot `m` gives out start from zero.
pub fn apply_contents(src: &mut dyn MapSource, m: &MapContents) -> Result<ApplyReport, ApplyError> {
    apply_contents_with(src, m, &StatsSlots::default(), &mut MapShadow::default())
}

/// [`apply_contents`], diffing against `shadow` where it has a copy (and
/// leaving there what was written); `prev_slots` are the counter slots the
/// maps hold now (those `m` keeps keep their counts).
pub fn apply_contents_with(
    src: &mut dyn MapSource,
    m: &MapContents,
    prev_slots: &StatsSlots,
    shadow: &mut MapShadow,
) -> Result<ApplyReport, ApplyError> {
    let mut r = ApplyReport::default();
    // Order: the endpoints every other table may name by index, then what
    // replies need (so a new flow's reply is never dropped), then config,
    // then the match tables that start new flows.
    endpoints::write(src, &m.endpoints, shadow, &mut r)?;
    diff_hash::<Addr, OwnedEip>(src, OWNED_EIPS, &m.owned, shadow, &mut r)?;
    diff_hash::<SteerKey, SteerTarget>(src, REPLY_STEERING, &m.steering, shadow, &mut r)?;
    diff_hash::<Addr, PortBlocks>(src, PORT_BLOCKS, &m.port_blocks, shadow, &mut r)?;
    // The config goes in before the tables, but with the epochs it
    // already had: a packet that lands between the two writes would
    // otherwise stamp a result from the old tables with the new epoch, and
    // that result would then outlive the change.
    let mut config = m.config;
    let current = current_config(src)?;
    config.policy_epoch = current.map_or(0, |c| c.policy_epoch);
    config.gateway_epoch = current.map_or(0, |c| c.gateway_epoch);
    let mut config_writes = write_config(src, &config)?;
    reset_fresh_stats(src, prev_slots, &m.stats_slots, shadow, &mut r)?;
    diff_lpm::<RouteNextHop>(src, ROUTES, ROUTES_SIZE, &m.routes, shadow, &mut r)?;
    // A target's buckets before the target that points at them.
    diff_hash::<u32, GatewaySpread>(src, GATEWAY_SPREAD, &m.spread, shadow, &mut r)?;
    diff_array::<EgressTarget>(src, POLICY_TARGETS, &m.targets, shadow, &mut r)?;
    diff_lpm::<DstMatch>(src, POLICY_DST, TRIE, &m.policy_dst, shadow, &mut r)?;
    diff_lpm::<SrcMatch>(src, POLICY_SRC, TRIE, &m.policy_src, shadow, &mut r)?;
    // Every table is current: now the epochs may say so.
    config_writes += write_config(src, &m.config)?;
    r.written.insert(CONFIG, config_writes);
    Ok(r)
}

fn current_config(src: &mut dyn MapSource) -> Result<Option<DatapathConfig>, ApplyError> {
    let map: Array<&mut MapData, DatapathConfig> =
        Array::try_from(get(src, CONFIG)?).map_err(wrap(CONFIG))?;
    // A never-written config reads as zeroes: epoch 0 (nothing validated).
    Ok(map.get(&0, 0).ok())
}

/// Writes the config if it differs; returns how many writes that took (0 or 1).
fn write_config(src: &mut dyn MapSource, c: &DatapathConfig) -> Result<usize, ApplyError> {
    let mut r = ApplyReport::default();
    // One entry, read each time: the epochs in it are what `current_config` reads.
    let mut once = MapShadow::default();
    diff_array::<DatapathConfig>(src, CONFIG, std::slice::from_ref(c), &mut once, &mut r)?;
    Ok(r.written.get(CONFIG).copied().unwrap_or(0))
}

/// Translates `desired` and writes it into the maps by diffing.
pub fn apply(src: &mut dyn MapSource, desired: &DesiredMaps) -> Result<ApplyReport, ApplyError> {
    apply_with(src, desired, &mut MapShadow::default())
}

/// [`apply`] with the agent's [`MapShadow`], kept from one apply to the next.
pub fn apply_with(
    src: &mut dyn MapSource,
    desired: &DesiredMaps,
    shadow: &mut MapShadow,
) -> Result<ApplyReport, ApplyError> {
    let kept = Kept {
        stats_slots: last_stats_slots(src, shadow)?,
        endpoints: endpoints::kept(src, shadow, desired.config.node_tunnel_ip.is_ipv6())?,
    };
    let m = translate_keeping(desired, &kept)?;
    let mut report = apply_contents_with(src, &m, &kept.stats_slots, shadow)?;
    report.over_capacity = m.over_capacity;
    Ok(report)
}
