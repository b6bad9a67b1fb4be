//! The controller's pass alone, in this process, on the memory datastore:
//! the CPU one reconcile pass costs at each size, from nothing kept and with
//! what the last pass kept, after one pod's relabel. No etcd, no other
//! process: the figure the end-to-end run's `controller_cpu_per_change_ms`
//! is made of, without the noise of the agents beside it.

use std::time::Instant;

use egress_control::controller::{
    reconcile, reconcile_with, write_plan_stored, ControllerConfig, ViewCache,
};
use egress_control::datastore::memory::MemoryDatastore;
use egress_control::datastore::{Datastore, Kind};
use futures::FutureExt;
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

/// Applies every change the cache's watches have queued; lists again
/// when a watch fell behind (as the leader does), which a settling pass's
/// thousands of writes may make it.
async fn catch_up(ds: &MemoryDatastore, cache: &mut ViewCache) {
    while let Some(b) = cache.next_batch().now_or_never() {
        if b.expect("watches open").is_err() {
            *cache = ViewCache::start_for_controller(ds).await.unwrap();
            return;
        }
    }
}

/// One pass on the cache as the leader runs it (written, and its writes
/// put into the cache); how many objects it wrote.
async fn leader_pass(ds: &MemoryDatastore, cache: &mut ViewCache, cfg: &ControllerConfig) -> usize {
    let plan = reconcile_with(&cache.view, cfg, &mut cache.memo);
    let written = write_plan_stored(ds, &cache.view, &plan).await.unwrap();
    for s in &written {
        cache.put_stored(s);
    }
    written.len()
}

/// `pass_full_ms` (every address decided again) and `pass_kept_ms` (on a
/// view cache, with what the passes before kept and what changed since),
/// each the median over [`CHANGES`] passes that follow one pod's relabel;
/// the addresses decided per such pass, and how many were partial.
pub async fn measure(size: Size) -> Map<String, Value> {
    let ds = MemoryDatastore::new();
    seed(&ds, size).await;
    let cfg = ControllerConfig::default();
    let mut cache = ViewCache::start_for_controller(&ds).await.unwrap();
    for _ in 0..SETTLE_PASSES {
        let n = leader_pass(&ds, &mut cache, &cfg).await;
        catch_up(&ds, &mut cache).await;
        if n == 0 {
            break;
        }
    }
    let (mut full, mut kept) = (Vec::new(), Vec::new());
    let decided_before = cache.memo.grants.decided;
    let partial_before = cache.memo.partial_passes;
    for i in 0..CHANGES {
        relabel(&ds, size, i).await;
        catch_up(&ds, &mut cache).await;
        let t = Instant::now();
        let plan = reconcile_with(&cache.view, &cfg, &mut cache.memo);
        kept.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        let fresh = reconcile(&cache.view, &cfg);
        full.push(t.elapsed().as_secs_f64() * 1e3);
        assert_eq!(plan, fresh, "the kept pass planned otherwise");
        for s in write_plan_stored(&ds, &cache.view, &plan).await.unwrap() {
            cache.put_stored(&s);
        }
        catch_up(&ds, &mut cache).await;
    }
    let decided = (cache.memo.grants.decided - decided_before) as f64 / CHANGES as f64;
    let partial = cache.memo.partial_passes - partial_before;
    let mut out = Map::new();
    out.insert("pass_full_ms".into(), json!(round(median(full))));
    out.insert("pass_kept_ms".into(), json!(round(median(kept))));
    out.insert("pass_addresses_decided".into(), json!(decided));
    out.insert("pass_partial".into(), json!(partial));
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
