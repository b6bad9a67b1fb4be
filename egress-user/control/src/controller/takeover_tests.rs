//! A leader that dies part-way through writing a pass (some status writes
//! landed, the rest never happen), and the next leader that starts from
//! what the datastore holds: no grant renumbered, no block held by two
//! workers, none handed on while its old holder still drains it.

use std::collections::BTreeMap;

use serde_json::json;

use super::tests::{grants, one_eip_gateway, pass, Setup};
use super::{reconcile, write_plan, ControllerConfig};
use crate::api::EipPortUse;
use crate::datastore::memory::MemoryDatastore;
use crate::datastore::{Datastore, Kind, ObjectKey};
use crate::registration::publish_port_use;
use crate::view::load_view;

const WORKERS: [&str; 6] = ["w1", "w2", "w3", "w4", "w5", "w6"];
const EIP: &str = "10.0.0.1";

/// Per worker: the blocks it holds of the EIP and those draining.
async fn holdings(ds: &MemoryDatastore) -> BTreeMap<String, (Vec<u16>, Vec<u16>)> {
    let view = load_view(ds).await.unwrap();
    view.tunnels
        .iter()
        .filter_map(|t| {
            let st = t.status.as_ref()?;
            let b = st.port_blocks.iter().find(|b| b.eip == EIP)?;
            Some((
                t.metadata.name.clone()?,
                (b.blocks.clone(), b.draining.clone()),
            ))
        })
        .collect()
}

/// No block of the EIP is held by two workers, draining ones included.
fn assert_each_block_once(h: &BTreeMap<String, (Vec<u16>, Vec<u16>)>, when: &str) {
    let mut owner: BTreeMap<u16, &str> = BTreeMap::new();
    for (w, (blocks, draining)) in h {
        for b in blocks.iter().chain(draining) {
            if let Some(other) = owner.insert(*b, w) {
                assert!(
                    other == w,
                    "{when}: block {b} held by {other} and {w}: {h:?}"
                );
            }
        }
    }
}

/// One pass whose writes stop after `k` of them (the leader died); returns
/// whether the pass got through all its writes.
async fn pass_dying_after(ds: &MemoryDatastore, k: u32) -> bool {
    ds.stop_writes_after(Some(k));
    let view = load_view(ds).await.unwrap();
    let plan = reconcile(&view, &ControllerConfig::default());
    let done = write_plan(ds, &view, &plan).await.is_ok();
    ds.stop_writes_after(None);
    done
}

/// The next leader's passes until one writes nothing (a fresh view each
/// time, no memory of the dead leader).
async fn converge(ds: &MemoryDatastore) {
    for _ in 0..5 {
        let view = load_view(ds).await.unwrap();
        let plan = reconcile(&view, &ControllerConfig::default());
        if write_plan(ds, &view, &plan).await.unwrap() == 0 {
            return;
        }
    }
    panic!("the new leader did not settle in five passes");
}

/// Six workers, each with a selected pod.
async fn cluster() -> MemoryDatastore {
    let mut s = one_eip_gateway(&WORKERS).g1_policy("p", 1, json!({}), "web");
    for (i, w) in WORKERS.iter().enumerate() {
        s = s.pod(&format!("pod{i}"), "web", w, &format!("10.244.{}.2", i + 1));
    }
    s.create().await
}

#[tokio::test]
async fn a_leader_dying_mid_grant_leaves_nothing_the_next_one_renumbers() {
    // The whole first pass's writes, counted on a twin cluster.
    let twin = cluster().await;
    let view = load_view(&twin).await.unwrap();
    let plan = reconcile(&view, &ControllerConfig::default());
    let total = write_plan(&twin, &view, &plan).await.unwrap() as u32;
    assert!(total > WORKERS.len() as u32, "a grant per worker and more");
    for k in 0..total {
        let ds = cluster().await;
        assert!(!pass_dying_after(&ds, k).await, "died after {k} writes");
        let before = grants(&ds).await;
        converge(&ds).await;
        let after = grants(&ds).await;
        for (key, blocks) in &before {
            assert_eq!(&after[key], blocks, "k={k}: {key:?} renumbered");
        }
        for w in WORKERS {
            assert!(
                after
                    .get(&(w.to_string(), EIP.to_string()))
                    .is_some_and(|b| !b.is_empty()),
                "k={k}: {w} has no block: {after:?}"
            );
        }
        assert_each_block_once(&holdings(&ds).await, &format!("k={k}"));
    }
}

#[tokio::test]
async fn a_leader_dying_mid_drain_hands_no_draining_block_on() {
    let setup = || async {
        let ds = cluster().await;
        pass(&ds).await;
        // w1 is busy: it grows. w2's pod goes: its block drains.
        let busy = EipPortUse {
            gateway: "g1".into(),
            eip: EIP.into(),
            in_use: 60,
            released: vec![],
        };
        publish_port_use(&ds, "w1", &[busy]).await.unwrap();
        ds.delete(Kind::Pod, &ObjectKey::namespaced("default", "pod1"), None)
            .await
            .unwrap();
        // A new worker arrives at the same time and wants a block.
        Setup::new()
            .workers(&["w7"])
            .pod("pod7", "web", "w7", "10.244.7.2")
            .add_to(&ds)
            .await;
        ds
    };
    let twin = setup().await;
    let view = load_view(&twin).await.unwrap();
    let plan = reconcile(&view, &ControllerConfig::default());
    let total = write_plan(&twin, &view, &plan).await.unwrap() as u32;
    converge(&twin).await;
    let settled = holdings(&twin).await;
    assert!(
        !settled["w2"].1.is_empty(),
        "the set-up drains w2's block: {settled:?}"
    );
    assert!(
        settled["w1"].0.len() > 1,
        "the set-up grows w1: {settled:?}"
    );
    for k in 0..total {
        let ds = setup().await;
        let w2_block = holdings(&ds).await["w2"].0.clone();
        assert!(!pass_dying_after(&ds, k).await, "died after {k} writes");
        converge(&ds).await;
        let h = holdings(&ds).await;
        assert_each_block_once(&h, &format!("k={k}"));
        // Until w2's agent reports the block empty, it stays w2's.
        let (blocks, draining) = &h["w2"];
        for b in &w2_block {
            assert!(
                blocks.contains(b) || draining.contains(b),
                "k={k}: w2's block {b} left it before its flows ended: {h:?}"
            );
        }
        assert!(
            h.get("w7").is_some_and(|(b, _)| !b.is_empty()),
            "k={k}: the new worker got no block: {h:?}"
        );
    }
}
