//! The etcd backend against a real etcd started by the test.

use std::sync::Arc;
use std::time::Duration;

use egress_control::api::{EgressGateway, EgressPolicy, TunnelPhase, API_VERSION};
use egress_control::controller::{self, ClusterView, RunConfig};
use egress_control::datastore::etcd::EtcdDatastore;
use egress_control::datastore::typed::{decode, node_object};
use egress_control::datastore::{
    Datastore, DatastoreError, Kind, ObjectKey, StatusPatch, WatchEvent,
};
use egress_control::view::load_view;
use egress_tests::etcd::EtcdServer;
use futures::StreamExt;
use serde_json::json;

async fn connect(e: &EtcdServer, prefix: &str) -> EtcdDatastore {
    EtcdDatastore::connect(&[e.endpoint()], prefix)
        .await
        .unwrap()
}

fn gw(name: &str) -> serde_json::Value {
    json!({"apiVersion": API_VERSION, "kind": "EgressGateway", "metadata": {"name": name},
           "spec": {"ippools": {"ipv4": ["10.0.0.1-10.0.0.9"]},
                    "nodeSelector": {"selector": {"matchLabels": {"gw": "yes"}}}}})
}

async fn next(w: &mut egress_control::datastore::WatchStream) -> WatchEvent {
    tokio::time::timeout(Duration::from_secs(5), w.next())
        .await
        .expect("a watch event within 5 s")
        .expect("the watch is open")
        .expect("no watch error")
}

#[tokio::test]
async fn crud_conflicts_watch_and_status() {
    let etcd = EtcdServer::start().unwrap();
    let ds = connect(&etcd, "/t1").await;

    let a = ds.create(Kind::EgressGateway, gw("a")).await.unwrap();
    assert!(a.value["metadata"]["uid"].is_string());
    assert_eq!(
        a.value["metadata"]["resourceVersion"],
        a.revision.to_string()
    );
    assert!(matches!(
        ds.create(Kind::EgressGateway, gw("a")).await,
        Err(DatastoreError::AlreadyExists { .. })
    ));
    let (items, list_rev) = ds.list(Kind::EgressGateway).await.unwrap();
    assert_eq!(items.len(), 1);
    let mut w = ds.watch(Kind::EgressGateway, list_rev).await.unwrap();

    // Optimistic concurrency: a stale revision is refused and changes nothing.
    let mut v = gw("a");
    v["spec"]["clusterDefault"] = json!(true);
    let b = ds
        .update(Kind::EgressGateway, v.clone(), a.revision)
        .await
        .unwrap();
    assert!(b.revision > a.revision);
    let err = ds
        .update(Kind::EgressGateway, gw("a"), a.revision)
        .await
        .unwrap_err();
    assert!(err.is_conflict(), "{err}");
    let cur = ds
        .get(Kind::EgressGateway, &ObjectKey::cluster("a"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(cur.revision, b.revision);
    assert_eq!(cur.value["spec"]["clusterDefault"], true);
    assert_eq!(
        cur.value["metadata"]["uid"], a.value["metadata"]["uid"],
        "uid kept"
    );

    // Status: two writers, each owning its fields.
    let k = ObjectKey::cluster("a");
    ds.write_status(
        Kind::EgressGateway,
        &k,
        &StatusPatch::owning_all("x", json!({"epoch": 7, "ipUsage": {"ipv4Total": 9}})),
    )
    .await
    .unwrap();
    ds.write_status(
        Kind::EgressGateway,
        &k,
        &StatusPatch {
            manager: "y".into(),
            owned: vec!["ipUsage".into()],
            status: json!({}),
        },
    )
    .await
    .unwrap();
    let g: EgressGateway =
        decode(&ds.get(Kind::EgressGateway, &k).await.unwrap().unwrap()).unwrap();
    let st = g.status.unwrap();
    assert_eq!(
        (st.epoch, st.ip_usage.ipv4_total),
        (7, 0),
        "owned-and-absent is removed, others kept"
    );
    // An update does not touch the status.
    let cur = ds.get(Kind::EgressGateway, &k).await.unwrap().unwrap();
    ds.update(Kind::EgressGateway, v, cur.revision)
        .await
        .unwrap();
    let after = ds.get(Kind::EgressGateway, &k).await.unwrap().unwrap();
    assert_eq!(after.value["status"]["epoch"], 7);
    assert!(matches!(
        ds.write_status(Kind::Node, &k, &StatusPatch::owning_all("x", json!({})))
            .await,
        Err(DatastoreError::NoStatus { .. })
    ));

    // Delete with a stale revision is refused; without, it goes.
    assert!(ds
        .delete(Kind::EgressGateway, &k, Some(a.revision))
        .await
        .unwrap_err()
        .is_conflict());
    ds.delete(Kind::EgressGateway, &k, None).await.unwrap();
    assert!(ds
        .delete(Kind::EgressGateway, &k, None)
        .await
        .unwrap_err()
        .is_not_found());

    // The watch saw every change in order: update, 2 status, update, delete.
    let mut revs = vec![];
    for want_put in [true, true, true, true, false] {
        let ev = next(&mut w).await;
        assert_eq!(matches!(ev, WatchEvent::Put(_)), want_put, "{ev:?}");
        revs.push(ev.revision());
    }
    assert!(revs.windows(2).all(|p| p[0] < p[1]));

    // Namespaced kinds need a namespace; the error names the field.
    let e = ds
        .create(
            Kind::EgressPolicy,
            json!({"apiVersion": API_VERSION, "kind": "EgressPolicy", "metadata": {"name": "p"}}),
        )
        .await
        .unwrap_err();
    assert!(e.to_string().contains("metadata.namespace"), "{e}");

    // Prefixes isolate datastores.
    let other = connect(&etcd, "/t2").await;
    assert!(other.list(Kind::EgressGateway).await.unwrap().0.is_empty());
}

#[tokio::test]
async fn watch_from_an_old_revision_replays() {
    let etcd = EtcdServer::start().unwrap();
    let ds = connect(&etcd, "/w").await;
    let (_, rev) = ds.list(Kind::Node).await.unwrap();
    for n in ["n1", "n2"] {
        let rec = egress_control::api::NodeRecord {
            name: n.into(),
            ready: true,
            ..Default::default()
        };
        ds.create(Kind::Node, node_object(&rec)).await.unwrap();
    }
    ds.delete(Kind::Node, &ObjectKey::cluster("n1"), None)
        .await
        .unwrap();
    let mut w = ds.watch(Kind::Node, rev).await.unwrap();
    let names: Vec<String> = {
        let mut v = vec![];
        for _ in 0..3 {
            v.push(match next(&mut w).await {
                WatchEvent::Put(s) => format!("put {}", s.key.name),
                WatchEvent::Deleted { key, .. } => format!("del {}", key.name),
            });
        }
        v
    };
    assert_eq!(names, ["put n1", "put n2", "del n1"]);
}

#[tokio::test]
async fn heartbeats_and_leader_election() {
    let etcd = EtcdServer::start().unwrap();
    let a = connect(&etcd, "/le").await;
    let b = connect(&etcd, "/le").await;

    let h1 = a
        .renew_heartbeat("n1", Duration::from_secs(5))
        .await
        .unwrap();
    let h2 = a
        .renew_heartbeat("n1", Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(h2.counter, h1.counter + 1);
    let seen = b.heartbeats().await.unwrap();
    assert_eq!(seen.len(), 1);
    assert_eq!((seen[0].node.as_str(), seen[0].counter), ("n1", h2.counter));
    // A removed node's heartbeat is forgotten; forgetting it twice is fine.
    a.renew_heartbeat("n2", Duration::from_secs(5))
        .await
        .unwrap();
    b.forget_heartbeat("n2").await.unwrap();
    b.forget_heartbeat("n2").await.unwrap();
    let seen = b.heartbeats().await.unwrap();
    assert_eq!(
        seen.iter().map(|h| h.node.as_str()).collect::<Vec<_>>(),
        ["n1"]
    );

    let ttl = Duration::from_secs(2);
    let la = a
        .try_acquire("ctl", "a", ttl)
        .await
        .unwrap()
        .expect("a leads");
    assert!(
        b.try_acquire("ctl", "b", ttl).await.unwrap().is_none(),
        "b must not lead too"
    );
    assert_eq!(b.leader("ctl").await.unwrap().unwrap().identity, "a");
    a.renew_leadership(&la).await.unwrap();
    a.resign(&la).await.unwrap();
    let lb = b
        .try_acquire("ctl", "b", ttl)
        .await
        .unwrap()
        .expect("b leads after a resigned");
    assert!(
        lb.term > la.term,
        "terms grow: {} then {}",
        la.term,
        lb.term
    );
    assert!(
        a.renew_leadership(&la).await.is_err(),
        "a's old term is fenced off"
    );

    // b stops renewing: its lease runs out on the server and a can take over.
    // Wait on etcd's own expiry (observed by polling the leader key).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    let lc = loop {
        if let Some(l) = a.try_acquire("ctl", "a", ttl).await.unwrap() {
            break l;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "b's lease never expired"
        );
        tokio::time::sleep(Duration::from_millis(200)).await; // poll interval, not a synchronisation
    };
    assert!(lc.term > lb.term);
    let e = b.renew_leadership(&lb).await.unwrap_err();
    assert!(matches!(e, DatastoreError::LostLeadership { .. }), "{e}");

    // Events.
    let ev = egress_control::datastore::Event::normal(
        Kind::EgressTunnel,
        ObjectKey::cluster("n1"),
        "Ready",
        "hello",
    );
    a.record_event(ev).await.unwrap();
    let evs = b.events().await.unwrap();
    assert_eq!(evs.len(), 1);
    assert_eq!(evs[0].message, "hello");
    assert!(!evs[0].time.is_empty());
}

#[tokio::test]
async fn controller_reconciles_through_etcd() {
    let etcd = EtcdServer::start().unwrap();
    let ds: Arc<dyn Datastore> = Arc::new(connect(&etcd, "/ctl").await);
    ds.create(Kind::EgressGateway, gw("g")).await.unwrap();
    for n in ["gw1", "gw2"] {
        let rec = egress_control::api::NodeRecord {
            name: n.into(),
            labels: [("gw".to_string(), "yes".to_string())].into(),
            ready: true,
            ..Default::default()
        };
        ds.create(Kind::Node, node_object(&rec)).await.unwrap();
        ds.create(Kind::EgressTunnel, json!({"apiVersion": API_VERSION, "kind": "EgressTunnel", "metadata": {"name": n}, "spec": {}}))
            .await
            .unwrap();
        ds.write_status(
            Kind::EgressTunnel,
            &ObjectKey::cluster(n),
            &StatusPatch {
                manager: "agent".into(),
                owned: vec!["tunnel".into()],
                status: json!({"tunnel": {"ipv4": "192.168.1.1"}}),
            },
        )
        .await
        .unwrap();
        ds.renew_heartbeat(n, Duration::from_secs(5)).await.unwrap();
    }
    ds.create(
        Kind::EgressPolicy,
        json!({"apiVersion": API_VERSION, "kind": "EgressPolicy",
               "metadata": {"name": "p", "namespace": "default"},
               "spec": {"egressGatewayName": "g", "appliedTo": {"podSelector": {"matchLabels": {"app": "x"}}}}}),
    )
    .await
    .unwrap();

    // Two replicas: exactly one leads and writes the assignment.
    let (tx, rx) = tokio::sync::watch::channel(false);
    let mut handles = vec![];
    for id in ["r1", "r2"] {
        let mut rx = rx.clone();
        let cfg = RunConfig {
            identity: id.into(),
            lease_ttl: Duration::from_secs(2),
            ..Default::default()
        };
        handles.push(tokio::spawn(controller::run_controller(
            ds.clone(),
            cfg,
            async move {
                let _ = rx.wait_for(|v| *v).await;
            },
        )));
    }
    let mut w = {
        let (_, rev) = ds.list(Kind::EgressPolicy).await.unwrap();
        ds.watch(Kind::EgressPolicy, rev).await.unwrap()
    };
    let view: ClusterView = loop {
        let v = load_view(ds.as_ref()).await.unwrap();
        if v.policies[0]
            .status
            .as_ref()
            .is_some_and(|s| !s.node.is_empty())
        {
            break v;
        }
        next(&mut w).await;
    };
    let p: &EgressPolicy = &view.policies[0];
    let st = p.status.as_ref().unwrap();
    assert_eq!(st.eip.ipv4, "10.0.0.1");
    assert_eq!(st.node, "gw1");
    assert_eq!(view.phase("gw1"), TunnelPhase::Ready);
    let leader = ds.leader(controller::ELECTION).await.unwrap().unwrap();
    assert!(["r1", "r2"].contains(&leader.identity.as_str()));
    tx.send(true).unwrap();
    for h in handles {
        h.await.unwrap().unwrap();
    }
}

#[tokio::test]
async fn status_writes_are_fenced_by_the_leader_term() {
    let etcd = EtcdServer::start().unwrap();
    let old = connect(&etcd, "/f").await;
    let new = connect(&etcd, "/f").await;
    old.create(Kind::EgressGateway, gw("g")).await.unwrap();
    let k = ObjectKey::cluster("g");
    let w = |e: u64| StatusPatch::owning_all("c", json!({"epoch": e}));
    let lead = old
        .try_acquire("ctl", "old", Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    old.fence(Some(&lead)).await.unwrap();
    old.write_status(Kind::EgressGateway, &k, &w(1))
        .await
        .unwrap();
    // The old leader is deposed (its key goes; a new term starts) while
    // it still believes it leads: its next write must not land.
    old.resign(&lead).await.unwrap();
    let l2 = new
        .try_acquire("ctl", "new", Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    new.fence(Some(&l2)).await.unwrap();
    let e = old
        .write_status(Kind::EgressGateway, &k, &w(99))
        .await
        .unwrap_err();
    assert!(matches!(e, DatastoreError::LostLeadership { .. }), "{e}");
    new.write_status(Kind::EgressGateway, &k, &w(2))
        .await
        .unwrap();
    let g: EgressGateway =
        decode(&new.get(Kind::EgressGateway, &k).await.unwrap().unwrap()).unwrap();
    assert_eq!(g.status.unwrap().epoch, 2);
}

/// A list larger than one page (500 keys) and larger than one gRPC answer
/// may be (4 MiB) comes back whole, at one revision: 1,210 pods, 30 of them
/// carrying 200 kB each.
#[tokio::test]
async fn a_list_larger_than_a_page_and_a_message_comes_back_whole() {
    let etcd = EtcdServer::start().unwrap();
    let ds = connect(&etcd, "/paged").await;
    let pod = |i: usize, bulk: usize| {
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": format!("p{i:04}"), "namespace": "ns",
                            "annotations": {"bulk": "x".repeat(bulk)}},
               "spec": {"nodeName": "w1"}, "status": {"podIPs": [{"ip": "10.0.0.1"}]}})
    };
    futures::stream::iter(0..1210)
        .for_each_concurrent(32, |i| {
            let ds = &ds;
            async move {
                let bulk = if i % 40 == 0 { 200_000 } else { 0 };
                ds.create(Kind::Pod, pod(i, bulk)).await.unwrap();
            }
        })
        .await;
    let (items, rev) = ds.list(Kind::Pod).await.unwrap();
    let names: std::collections::BTreeSet<String> =
        items.iter().map(|s| s.key.name.clone()).collect();
    assert_eq!((items.len(), names.len()), (1210, 1210));
    assert!(items.iter().all(|s| s.revision <= rev));
    // The revision is the list's: a watch from it sees what came after.
    let mut w = ds.watch(Kind::Pod, rev).await.unwrap();
    ds.create(Kind::Pod, pod(9999, 0)).await.unwrap();
    match next(&mut w).await {
        WatchEvent::Put(s) => assert_eq!(s.key.name, "p9999"),
        other => panic!("expected the new pod, got {other:?}"),
    }
}
