//! The controller's pass alone, in this process, on the memory datastore:
//! the CPU one reconcile pass costs at each size, from nothing kept and with
//! what the last pass kept, after one pod's relabel. No etcd, no other
//! process: the figure the end-to-end run's `controller_cpu_per_change_ms`
//! is made of, without the noise of the agents beside it.

use std::time::Instant;

use egress_control::controller::{
    reconcile, reconcile_with, write_plan, ControllerConfig, ReconcileMemo,
};
use egress_control::datastore::memory::MemoryDatastore;
use egress_control::datastore::{Datastore, Kind};
use egress_control::view::load_view;
use serde_json::{json, Map, Value};

use super::seed::{self, pod_key, seed};
use super::Size;

/// Passes written until one writes nothing (the grants settled).
const SETTLE_PASSES: usize = 20;
/// Relabels measured per size.
const CHANGES: usize = 15;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// `pass_full_ms` (every address decided again) and `pass_kept_ms` (with
/// the memo of the pass before), each the median over [`CHANGES`] passes
/// that follow one pod's relabel; the addresses decided per such pass.
pub async fn measure(size: Size) -> Map<String, Value> {
    let ds = MemoryDatastore::new();
    seed(&ds, size).await;
    let cfg = ControllerConfig::default();
    let mut memo = ReconcileMemo::default();
    for _ in 0..SETTLE_PASSES {
        let view = load_view(&ds).await.unwrap();
        let plan = reconcile_with(&view, &cfg, &mut memo);
        if write_plan(&ds, &view, &plan).await.unwrap() == 0 {
            break;
        }
    }
    let (mut full, mut kept) = (Vec::new(), Vec::new());
    let decided_before = memo.grants.decided;
    for i in 0..CHANGES {
        relabel(&ds, size, i).await;
        let view = load_view(&ds).await.unwrap();
        let t = Instant::now();
        let plan = reconcile_with(&view, &cfg, &mut memo);
        kept.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        let fresh = reconcile(&view, &cfg);
        full.push(t.elapsed().as_secs_f64() * 1e3);
        assert_eq!(plan, fresh, "the kept pass planned otherwise");
        write_plan(&ds, &view, &plan).await.unwrap();
    }
    let decided = (memo.grants.decided - decided_before) as f64 / CHANGES as f64;
    let mut out = Map::new();
    out.insert("pass_full_ms".into(), json!(round(median(full))));
    out.insert("pass_kept_ms".into(), json!(round(median(kept))));
    out.insert("pass_addresses_decided".into(), json!(decided));
    out
}

fn round(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// Seeded pod `k` moves to another policy of its namespace (as the
/// end-to-end run's relabels do).
async fn relabel(ds: &dyn Datastore, size: Size, i: usize) {
    let k = (i * 37) % size.pods;
    let cur = ds
        .get(Kind::Pod, &pod_key(size, k))
        .await
        .unwrap()
        .expect("a seeded pod");
    let mut v = cur.value.clone();
    seed::relabel(size, k, &mut v);
    ds.update(Kind::Pod, v, cur.revision).await.unwrap();
}
