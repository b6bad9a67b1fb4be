//! Writing `TUNNEL_ENDPOINTS` (IPv6 underlay; see `translate::endpoints`).
//! Entries are only ever added or overwritten, never cleared: an index
//! given up keeps its address until it is handed out again, so nothing
//! that still carries it (a NAT entry awaiting revalidation, a fragment
//! entry) is sent into nothing.

use aya::maps::{Array, MapData};
use egress_common::{endpoints::TunnelEndpoint, maps::TUNNEL_ENDPOINTS};

use super::{get, wrap, ApplyError, ApplyReport, MapShadow};
use crate::datapath::translate::EndpointIndex;

/// The shadow's copy: the last assignment and the table as written.
struct EndpointTable {
    index: EndpointIndex,
    table: Vec<TunnelEndpoint>,
}

/// The indexes the maps hold now: the shadow's, or (after a start or a
/// resync) what the pinned table says. Nothing is read on an IPv4
/// underlay, where no field is an index.
pub(super) fn kept(
    src: &mut dyn super::MapSource,
    shadow: &mut MapShadow,
    v6_underlay: bool,
) -> Result<EndpointIndex, ApplyError> {
    if !v6_underlay {
        return Ok(EndpointIndex::default());
    }
    let t = table(src, shadow)?;
    let index = t.index.clone();
    shadow.put(TUNNEL_ENDPOINTS, t);
    Ok(index)
}

fn table(
    src: &mut dyn super::MapSource,
    shadow: &mut MapShadow,
) -> Result<EndpointTable, ApplyError> {
    if let Some(t) = shadow.take::<EndpointTable>(TUNNEL_ENDPOINTS) {
        return Ok(t);
    }
    let name = TUNNEL_ENDPOINTS;
    let map: Array<&mut MapData, TunnelEndpoint> =
        Array::try_from(get(src, name)?).map_err(wrap(name))?;
    let table: Vec<TunnelEndpoint> = (0..map.len())
        .map(|i| map.get(&i, 0))
        .collect::<Result<_, _>>()
        .map_err(wrap(name))?;
    Ok(EndpointTable {
        index: EndpointIndex::from_table(&table),
        table,
    })
}

/// Writes the entries of `index` that the table does not hold yet.
pub(super) fn write(
    src: &mut dyn super::MapSource,
    index: &EndpointIndex,
    shadow: &mut MapShadow,
    report: &mut ApplyReport,
) -> Result<(), ApplyError> {
    if index.by_addr.is_empty() {
        return Ok(());
    }
    let name = TUNNEL_ENDPOINTS;
    let mut t = table(src, shadow)?;
    let mut map: Array<&mut MapData, TunnelEndpoint> =
        Array::try_from(get(src, name)?).map_err(wrap(name))?;
    let mut written = 0;
    for (i, e) in index.entries() {
        let Some(have) = t.table.get_mut(i as usize) else {
            continue;
        };
        if *have != e {
            map.set(i, e, 0).map_err(wrap(name))?;
            *have = e;
            written += 1;
        }
    }
    t.index = index.clone();
    shadow.put(name, t);
    report.written.insert(name, written);
    Ok(())
}
