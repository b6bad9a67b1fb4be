//! Passes that redo only what changed (pods, grants, agents' reports),
//! step by step through a cluster's life: each must be partial, must plan
//! what a pass from nothing plans, and must show the change's effect.

use serde_json::json;

use super::tests::{cached_pass_agrees, grants, pass, pod, policy_status, Setup};
use super::{tick_cached_report, ControllerConfig, HeartbeatMonitor, RunConfig, ViewCache};
use crate::api::{EipPortUse, PodRecord, PolicyOverCapacity, TunnelPhase};
use crate::datastore::memory::MemoryDatastore;
use crate::datastore::typed::pod_object;
use crate::datastore::{Datastore, Kind, ObjectKey};
use crate::registration::{publish_over_capacity, publish_port_use};

/// Creates `p`, or replaces the pod of its name.
async fn put_pod(ds: &MemoryDatastore, p: &PodRecord) {
    let key = ObjectKey::namespaced("default", &p.name);
    match ds.get(Kind::Pod, &key).await.unwrap() {
        Some(cur) => ds.update(Kind::Pod, pod_object(p), cur.revision).await,
        None => ds.create(Kind::Pod, pod_object(p)).await,
    }
    .unwrap();
}

/// The change just made is met by a partial pass, then written.
async fn partial_then_written(ds: &MemoryDatastore, step: &str) {
    assert!(
        cached_pass_agrees(ds, &ControllerConfig::default()).await,
        "{step}: the pass redid everything"
    );
    // Written, and the writes (grants only) followed by partial passes too.
    for _ in 0..3 {
        pass(ds).await;
    }
}

/// The blocks `node` holds of `eip`, draining ones included.
async fn held(ds: &MemoryDatastore, node: &str, eip: &str) -> Vec<u16> {
    grants(ds)
        .await
        .get(&(node.to_string(), eip.to_string()))
        .cloned()
        .unwrap_or_default()
}

async fn eip_of(ds: &MemoryDatastore, policy: &str) -> String {
    policy_status(ds, policy).await.eip.ipv4
}

#[tokio::test]
async fn pod_grant_and_report_changes_redo_only_their_addresses() {
    let rr = || json!({"allocatorPolicy": "rr"});
    let ds = Setup::new()
        .g1(&["10.0.0.1", "10.0.0.2", "10.0.0.3"])
        .gateway_nodes(&["gw"], TunnelPhase::Ready)
        .workers(&["w1", "w2", "w3", "w4"])
        .g1_policy("p1", 1, rr(), "x")
        .g1_policy("p2", 2, rr(), "y")
        .g1_policy("p3", 3, rr(), "z")
        .pod("a", "x", "w1", "10.244.1.2")
        .pod("b", "y", "w2", "10.244.2.2")
        .pod("c", "z", "w3", "10.244.3.2")
        .create()
        .await;
    for _ in 0..3 {
        pass(&ds).await;
    }
    let (e1, e3) = (eip_of(&ds, "p1").await, eip_of(&ds, "p3").await);
    assert!(held(&ds, "w4", &e1).await.is_empty());

    put_pod(&ds, &pod("d", "x", "w4", "10.244.4.2")).await;
    partial_then_written(&ds, "a new pod").await;
    assert_eq!(held(&ds, "w4", &e1).await.len(), 1, "the new pod's node");

    put_pod(&ds, &pod("b", "x", "w2", "10.244.2.2")).await;
    partial_then_written(&ds, "a relabelled pod").await;
    assert_eq!(held(&ds, "w2", &e1).await.len(), 1, "the relabelled pod's");

    put_pod(&ds, &pod("c", "z", "w1", "10.244.1.3")).await;
    partial_then_written(&ds, "a pod on another node").await;
    assert_eq!(held(&ds, "w1", &e3).await.len(), 1, "the pod's new node");
    let left = held(&ds, "w3", &e3).await;
    assert_eq!(left.len(), 1, "its old node keeps the block, draining");

    let report = |in_use: u32, released: Vec<u16>, eip: &str| EipPortUse {
        gateway: "g1".into(),
        eip: eip.into(),
        in_use,
        released,
    };
    publish_port_use(&ds, "w4", &[report(3000, vec![], &e1)])
        .await
        .unwrap();
    partial_then_written(&ds, "a report of more use").await;
    assert!(held(&ds, "w4", &e1).await.len() > 1, "the grant grows");

    publish_port_use(&ds, "w3", &[report(0, left, &e3)])
        .await
        .unwrap();
    partial_then_written(&ds, "a report of released blocks").await;
    assert!(
        held(&ds, "w3", &e3).await.is_empty(),
        "released, taken back"
    );

    ds.delete(Kind::Pod, &ObjectKey::namespaced("default", "d"), None)
        .await
        .unwrap();
    partial_then_written(&ds, "a deleted pod").await;
}

/// The leader's side of a cluster of one gateway node, one worker, one
/// policy with one pod: its cache, monitor and settings.
struct Leader {
    ds: MemoryDatastore,
    monitor: HeartbeatMonitor,
    cfg: RunConfig,
    cache: ViewCache,
}

impl Leader {
    async fn new() -> Self {
        let ds = super::tests::one_eip_gateway(&["w1"])
            .g1_policy("p", 1, json!({}), "web")
            .pod("a", "web", "w1", "10.244.1.2")
            .create()
            .await;
        let cache = ViewCache::start_for_controller(&ds).await.unwrap();
        Self {
            ds,
            monitor: HeartbeatMonitor::new(tokio::time::Instant::now().into_std()),
            cfg: RunConfig::default(),
            cache,
        }
    }

    /// As the leader's loop: a pass, then the changes that came meanwhile.
    async fn tick(&mut self) -> crate::datastore::Result<usize> {
        let r = tick_cached_report(&self.ds, &mut self.cache, &mut self.monitor, &self.cfg).await;
        self.catch_up();
        Ok(r?.writes)
    }

    /// Passes until one writes nothing: the next is partial.
    async fn settle(&mut self) {
        for round in 0.. {
            if self.tick().await.unwrap() == 0 {
                return;
            }
            assert!(round < 10, "the passes never settle");
        }
    }

    fn catch_up(&mut self) {
        while let Some(Some(b)) = futures::FutureExt::now_or_never(self.cache.next_batch()) {
            b.unwrap();
        }
    }
}

/// After a pass whose writes failed, the next pass (nothing changed in
/// between) compares and writes every status again.
#[tokio::test]
async fn after_a_failed_write_the_next_pass_writes_every_status() {
    let mut leader = Leader::new().await;
    leader.ds.inject_conflicts(1000);
    assert!(leader.tick().await.is_err(), "every status write fails");
    leader.ds.inject_conflicts(0);
    leader.tick().await.unwrap();
    let st = policy_status(&leader.ds, "p").await;
    assert_eq!((st.eip.ipv4.as_str(), st.node.as_str()), ("10.0.0.1", "gw"));
}

/// A policy an agent reports over its datapath's capacity gets its
/// condition written, though nothing but a report changed.
#[tokio::test]
async fn a_report_over_capacity_is_written_into_the_policy_status() {
    let mut leader = Leader::new().await;
    leader.settle().await;
    let report = PolicyOverCapacity {
        kind: "EgressPolicy".into(),
        namespace: "default".into(),
        name: "p".into(),
        limit: "destinationCIDRs".into(),
        count: 20000,
        max: 16384,
    };
    publish_over_capacity(&leader.ds, "w1", &[report])
        .await
        .unwrap();
    leader.catch_up();
    leader.tick().await.unwrap();
    let st = policy_status(&leader.ds, "p").await;
    assert!(
        st.conditions.iter().any(|c| c.reason == "OverCapacity"),
        "{st:?}"
    );
}

/// A partial pass compares only the grants it changed and those whose
/// view changed: grants another writer took away are written back by it.
#[tokio::test]
async fn grants_changed_by_another_writer_are_written_back_by_a_partial_pass() {
    let mut leader = Leader::new().await;
    leader.settle().await;
    let ours = held(&leader.ds, "w1", "10.0.0.1").await;
    assert!(!ours.is_empty(), "w1 holds a block");
    let wipe = crate::datastore::StatusPatch {
        manager: super::run::PORT_BLOCK_MANAGER.into(),
        owned: vec!["portBlocks".into(), "portBlockSize".into()],
        status: json!({}),
    };
    let key = ObjectKey::cluster("w1");
    leader
        .ds
        .write_status(Kind::EgressTunnel, &key, &wipe)
        .await
        .unwrap();
    assert!(held(&leader.ds, "w1", "10.0.0.1").await.is_empty());
    leader.catch_up();
    let partial = leader.cache.memo.partial_passes;
    assert_eq!(leader.tick().await.unwrap(), 1, "w1's grants written back");
    assert_eq!(
        leader.cache.memo.partial_passes,
        partial + 1,
        "a partial pass"
    );
    assert_eq!(held(&leader.ds, "w1", "10.0.0.1").await, ours);
}
