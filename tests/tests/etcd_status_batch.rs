//! Status writes in batches on a real etcd: many statuses share one read
//! and one write, each result is what a single write would give (written,
//! unchanged, not found), and a batch whose leader fence broke writes
//! nothing.

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use egress_control::datastore::{
    etcd::EtcdDatastore, Datastore, DatastoreError, Kind, ObjectKey, StatusPatch, StatusWrite,
};
use egress_tests::etcd::EtcdServer;
use serde_json::json;

const TUNNELS: usize = 150;

fn tunnel(name: &str) -> serde_json::Value {
    json!({
        "apiVersion": egress_control::api::API_VERSION,
        "kind": "EgressTunnel",
        "metadata": {"name": name},
        "spec": {},
    })
}

fn phase(name: &str, phase: &str) -> StatusWrite {
    (
        Kind::EgressTunnel,
        ObjectKey::cluster(name),
        StatusPatch {
            manager: "egress-controller".into(),
            owned: vec!["phase".into()],
            status: json!({ "phase": phase }),
        },
    )
}

async fn seeded(etcd: &EtcdServer) -> Result<EtcdDatastore> {
    let ds = EtcdDatastore::connect(&[etcd.endpoint()], "/egress").await?;
    for i in 0..TUNNELS {
        ds.create(Kind::EgressTunnel, tunnel(&format!("n{i}")))
            .await?;
    }
    Ok(ds)
}

#[test]
fn many_statuses_share_few_requests_and_each_result_is_its_own() -> Result<()> {
    let etcd = EtcdServer::start()?;
    tokio::runtime::Runtime::new()?.block_on(async {
        let ds = seeded(&etcd).await?;
        let mut writes: Vec<StatusWrite> = (0..TUNNELS)
            .map(|i| phase(&format!("n{i}"), "Ready"))
            .collect();
        writes.insert(70, phase("gone", "Ready"));
        let results = ds.write_statuses(&writes).await;
        ensure!(results.len() == writes.len(), "one result per write");
        let mut revisions = std::collections::BTreeSet::new();
        for (w, r) in writes.iter().zip(&results) {
            if w.1.name == "gone" {
                ensure!(
                    matches!(r, Err(e) if e.is_not_found()),
                    "a missing object is NotFound: {r:?}"
                );
                continue;
            }
            let s = r
                .as_ref()
                .map_err(|e| anyhow::anyhow!("{}: {e}", w.1.name))?;
            ensure!(s.key == w.1, "results in the writes' order");
            revisions.insert(s.revision);
            let stored = ds.get(Kind::EgressTunnel, &w.1).await?.context("stored")?;
            ensure!(
                stored.value["status"]["phase"] == "Ready",
                "{}: written",
                w.1.name
            );
            ensure!(stored.revision == s.revision, "the revision as stored");
        }
        // One write per batch of 64: 150 statuses in 3 revisions, where
        // writes one by one take 150.
        ensure!(
            revisions.len() <= 3,
            "{} revisions for {TUNNELS} writes",
            revisions.len()
        );

        // The same statuses again change nothing.
        writes.remove(70);
        let again = ds.write_statuses(&writes).await;
        for (r, first) in again.iter().zip(results.iter().filter(|r| r.is_ok())) {
            let (r, first) = (r.as_ref().unwrap(), first.as_ref().unwrap());
            ensure!(
                r.revision == first.revision,
                "{}: not rewritten",
                r.key.name
            );
        }
        Ok(())
    })
}

#[test]
fn a_batch_under_a_broken_fence_writes_nothing() -> Result<()> {
    let etcd = EtcdServer::start()?;
    tokio::runtime::Runtime::new()?.block_on(async {
        let ds = seeded(&etcd).await?;
        let ttl = Duration::from_secs(15);
        let lead = ds.try_acquire("ctl", "a", ttl).await?.context("a leads")?;
        ds.fence(Some(&lead)).await?;
        let fenced: Vec<StatusWrite> = (0..TUNNELS)
            .map(|i| phase(&format!("n{i}"), "Ready"))
            .collect();
        for r in ds.write_statuses(&fenced).await {
            r.context("written while leading")?;
        }

        // Another replica takes over; the old handle's fence still names
        // the old term.
        ds.resign(&lead).await?;
        let other = EtcdDatastore::connect(&[etcd.endpoint()], "/egress").await?;
        other
            .try_acquire("ctl", "b", ttl)
            .await?
            .context("b leads")?;
        let late: Vec<StatusWrite> = (0..TUNNELS)
            .map(|i| phase(&format!("n{i}"), "NotReady"))
            .collect();
        for r in ds.write_statuses(&late).await {
            ensure!(
                matches!(r, Err(DatastoreError::LostLeadership { .. })),
                "a write after the takeover: {r:?}"
            );
        }
        for i in 0..TUNNELS {
            let key = ObjectKey::cluster(format!("n{i}"));
            let s = ds.get(Kind::EgressTunnel, &key).await?.context("stored")?;
            ensure!(s.value["status"]["phase"] == "Ready", "n{i} unchanged");
        }
        Ok(())
    })
}
