//! Pods by node on etcd (a real etcd): an agent's handle lists and watches
//! only its node's pods, a pod that moves or goes away leaves its node's
//! view, and pods written before the index existed are copied into it by
//! `complete_indexes` (until then the agent's handle reads every pod).

use std::{collections::BTreeSet, time::Duration};

use anyhow::{Context, Result};
use egress_control::{
    api::PodRecord,
    datastore::{
        etcd::EtcdDatastore, typed::pod_object, Datastore, Kind, ObjectKey, WatchEvent, WatchStream,
    },
};
use egress_tests::etcd::EtcdServer;
use futures::StreamExt;

fn pod(name: &str, node: &str) -> serde_json::Value {
    pod_object(&PodRecord {
        name: name.into(),
        namespace: "default".into(),
        node: node.into(),
        ips: vec![format!("10.244.0.{}", name.len())],
        ..Default::default()
    })
}

async fn names(ds: &dyn Datastore) -> Result<BTreeSet<String>> {
    let (items, _) = ds.list(Kind::Pod).await?;
    Ok(items.into_iter().map(|s| s.key.name).collect())
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

/// The next event of `w` as ("put"|"deleted", pod name), within 10 s.
async fn next_event(w: &mut WatchStream) -> Result<(&'static str, String)> {
    let ev = tokio::time::timeout(Duration::from_secs(10), w.next())
        .await
        .context("no event within 10 s")?
        .context("watch ended")??;
    Ok(match ev {
        WatchEvent::Put(s) => ("put", s.key.name),
        WatchEvent::Deleted { key, .. } => ("deleted", key.name),
    })
}

async fn connect(etcd: &EtcdServer) -> Result<EtcdDatastore> {
    Ok(EtcdDatastore::connect(&[etcd.endpoint()], "/egress").await?)
}

#[test]
fn an_agents_handle_reads_only_its_nodes_pods() -> Result<()> {
    let etcd = EtcdServer::start()?;
    tokio::runtime::Runtime::new()?.block_on(async {
        let all = connect(&etcd).await?;
        // Pods written before the index (as an older version wrote them).
        all.create(Kind::Pod, pod("old1", "w1")).await?;
        all.create(Kind::Pod, pod("old2", "w2")).await?;
        // An older writer's pods have no index entry: written raw.
        let mut raw = etcd_client::Client::connect([etcd.endpoint()], None).await?;
        raw.delete(
            "/egress/pod-index/",
            Some(etcd_client::DeleteOptions::new().with_prefix()),
        )
        .await?;
        let w1 = connect(&etcd).await?.pods_of_node("w1");
        assert_eq!(
            names(&w1).await?,
            set(&["old1", "old2"]),
            "before the index is complete, every pod"
        );

        all.complete_indexes().await?;
        assert_eq!(names(&w1).await?, set(&["old1"]), "old pods copied in");
        let w2 = connect(&etcd).await?.pods_of_node("w2");
        assert_eq!(names(&w2).await?, set(&["old2"]));
        assert_eq!(
            names(&all).await?,
            set(&["old1", "old2"]),
            "the unscoped handle"
        );

        // Changes after the list reach the node's watch only.
        let (_, rev1) = w1.list(Kind::Pod).await?;
        let mut watch1 = w1.watch(Kind::Pod, rev1).await?;
        let (_, rev2) = w2.list(Kind::Pod).await?;
        let mut watch2 = w2.watch(Kind::Pod, rev2).await?;
        all.create(Kind::Pod, pod("new-on-w2", "w2")).await?;
        all.create(Kind::Pod, pod("new-on-w1", "w1")).await?;
        assert_eq!(next_event(&mut watch1).await?, ("put", "new-on-w1".into()));
        assert_eq!(next_event(&mut watch2).await?, ("put", "new-on-w2".into()));

        // A pod that moves from w1 to w2 leaves w1's view and enters w2's.
        let key = ObjectKey::namespaced("default", "old1");
        let cur = all.get(Kind::Pod, &key).await?.context("old1")?;
        all.update(Kind::Pod, pod("old1", "w2"), cur.revision)
            .await?;
        assert_eq!(next_event(&mut watch1).await?, ("deleted", "old1".into()));
        assert_eq!(next_event(&mut watch2).await?, ("put", "old1".into()));
        assert_eq!(names(&w1).await?, set(&["new-on-w1"]));
        assert_eq!(names(&w2).await?, set(&["old1", "old2", "new-on-w2"]));

        // A deleted pod leaves its node's view.
        all.delete(Kind::Pod, &key, None).await?;
        assert_eq!(next_event(&mut watch2).await?, ("deleted", "old1".into()));
        assert_eq!(names(&w2).await?, set(&["old2", "new-on-w2"]));
        let left = raw
            .get(
                "/egress/pod-index/",
                Some(
                    etcd_client::GetOptions::new()
                        .with_prefix()
                        .with_keys_only(),
                ),
            )
            .await?;
        assert_eq!(left.kvs().len(), 3, "one index entry per pod left");

        // w1 saw nothing of w2's pods: its next event is its own.
        all.create(Kind::Pod, pod("last", "w1")).await?;
        assert_eq!(next_event(&mut watch1).await?, ("put", "last".into()));
        Ok(())
    })
}
