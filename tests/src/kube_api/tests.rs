//! The fake API server driven by the egress Kubernetes datastore over
//! HTTP: what the datastore sends is served with the API server's rules.

use std::time::Duration;

use egress_control::datastore::{
    kube::KubeDatastore, Datastore, DatastoreError, Kind, ObjectKey, StatusPatch, WatchEvent,
};
use futures::StreamExt;
use serde_json::json;

use super::*;

async fn datastore(server: &FakeApiServer) -> KubeDatastore {
    let kc = kube::config::Kubeconfig::read_from(server.kubeconfig()).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    KubeDatastore::new(kube::Client::try_from(cfg).unwrap(), "egress-system")
}

fn server() -> FakeApiServer {
    let s = FakeApiServer::start("127.0.0.1:0".parse().unwrap()).unwrap();
    s.install_chart_crds().unwrap();
    s
}

/// The next item of a watch, within 5 s.
async fn next_item<S: futures::Stream + Unpin>(w: &mut S) -> S::Item {
    tokio::time::timeout(Duration::from_secs(5), w.next())
        .await
        .expect("an event within 5 s")
        .expect("the watch goes on")
}

fn tunnel(name: &str) -> Value {
    json!({"apiVersion": "egressgateway.egress.dev/v1beta1", "kind": "EgressTunnel",
           "metadata": {"name": name}, "spec": {}})
}

#[tokio::test]
async fn custom_resources_round_trip_with_conflicts_and_status_by_manager() {
    let s = server();
    let ds = datastore(&s).await;
    let made = ds.create(Kind::EgressTunnel, tunnel("w1")).await.unwrap();
    assert!(matches!(
        ds.create(Kind::EgressTunnel, tunnel("w1")).await,
        Err(DatastoreError::AlreadyExists { .. })
    ));
    let key = ObjectKey::cluster("w1");
    let agent = StatusPatch::owning_all("egress-agent", json!({"tunnel": {"ipv4": "10.10.0.1"}}));
    ds.write_status(Kind::EgressTunnel, &key, &agent)
        .await
        .unwrap();
    let ctl = StatusPatch::owning_all("egress-controller", json!({"phase": "Ready"}));
    let after = ds
        .write_status(Kind::EgressTunnel, &key, &ctl)
        .await
        .unwrap();
    // Both managers' fields are kept (the schema's defaults fill the rest).
    assert_eq!(after.value["status"]["tunnel"]["ipv4"], "10.10.0.1");
    assert_eq!(after.value["status"]["phase"], "Ready");
    // A write from a stale revision is a conflict; from the current one it lands.
    let stale = ds
        .update(Kind::EgressTunnel, tunnel("w1"), made.revision)
        .await;
    assert!(
        matches!(stale, Err(DatastoreError::Conflict { .. })),
        "{stale:?}"
    );
    let ok = ds
        .update(Kind::EgressTunnel, tunnel("w1"), after.revision)
        .await
        .unwrap();
    assert_eq!(
        ok.value["status"]["phase"], "Ready",
        "replace keeps the status"
    );
    ds.delete(Kind::EgressTunnel, &key, Some(ok.revision))
        .await
        .unwrap();
    assert!(ds.get(Kind::EgressTunnel, &key).await.unwrap().is_none());
}

#[tokio::test]
async fn a_watch_from_a_list_revision_sees_what_follows_and_only_its_nodes_pods() {
    let s = server();
    let ds = datastore(&s).await.pods_of_node("w1");
    let pod = |name: &str, node: &str| {
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": "default", "labels": {"app": "web"}},
               "spec": {"nodeName": node}, "status": {"podIPs": [{"ip": "10.244.1.5"}]}})
    };
    let pods = Resource::new("v1", "pods");
    s.change(|st| st.create(&pods, "default", pod("a", "w1")))
        .unwrap();
    s.change(|st| st.create(&pods, "default", pod("b", "w2")))
        .unwrap();
    let (items, rev) = ds.list(Kind::Pod).await.unwrap();
    assert_eq!(items.len(), 1);
    assert_eq!(items[0].value["spec"]["ips"], json!(["10.244.1.5"]));
    let mut w = ds.watch(Kind::Pod, rev).await.unwrap();
    s.change(|st| st.create(&pods, "default", pod("c", "w2")))
        .unwrap();
    s.change(|st| st.create(&pods, "default", pod("d", "w1")))
        .unwrap();
    let next = next_item(&mut w).await.unwrap();
    let WatchEvent::Put(p) = next else {
        panic!("{next:?}")
    };
    assert_eq!(p.key.name, "d");
    let reqs = s.requests();
    assert!(
        reqs.iter()
            .filter(|r| r.line.contains("/api/v1/pods"))
            .all(|r| r.line.contains("fieldSelector=spec.nodeName%3Dw1")),
        "{reqs:?}"
    );
}

#[tokio::test]
async fn heartbeats_leadership_and_events_are_leases_and_events() {
    let s = server();
    let ds = datastore(&s).await;
    ds.renew_heartbeat("w1", Duration::from_secs(15))
        .await
        .unwrap();
    let second = ds
        .renew_heartbeat("w1", Duration::from_secs(15))
        .await
        .unwrap();
    let beats = ds.heartbeats().await.unwrap();
    assert_eq!(beats.len(), 1);
    assert_eq!(beats[0].counter, second.counter);
    ds.forget_heartbeat("w1").await.unwrap();
    ds.forget_heartbeat("w1").await.unwrap();
    assert!(ds.heartbeats().await.unwrap().is_empty());

    let ttl = Duration::from_secs(15);
    let lead = ds
        .try_acquire("egress-controller", "c0", ttl)
        .await
        .unwrap()
        .unwrap();
    assert!(ds
        .try_acquire("egress-controller", "c1", ttl)
        .await
        .unwrap()
        .is_none());
    ds.renew_leadership(&lead).await.unwrap();
    assert_eq!(
        ds.leader("egress-controller")
            .await
            .unwrap()
            .unwrap()
            .identity,
        "c0"
    );
    ds.resign(&lead).await.unwrap();
    let next = ds
        .try_acquire("egress-controller", "c1", ttl)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(next.term, lead.term + 1);
    assert!(
        ds.renew_leadership(&lead).await.is_err(),
        "the old term is over"
    );

    ds.record_event(egress_control::datastore::Event {
        kind: Kind::EgressTunnel,
        key: ObjectKey::cluster("w1"),
        type_: "Normal".into(),
        reason: "Registered".into(),
        message: "m".into(),
        time: String::new(),
    })
    .await
    .unwrap();
    let evs = ds.events().await.unwrap();
    assert_eq!((evs.len(), evs[0].reason.as_str()), (1, "Registered"));
}

#[test]
fn paths_name_collections_objects_and_status() {
    let t = parse_path("/apis/egressgateway.egress.dev/v1beta1/egresstunnels/w1/status").unwrap();
    assert_eq!(
        t,
        Target::Object {
            r: Resource::new("egressgateway.egress.dev/v1beta1", "egresstunnels"),
            ns: String::new(),
            name: "w1".into(),
            status: true
        }
    );
    assert_eq!(
        parse_path("/api/v1/namespaces/default").unwrap(),
        Target::Object {
            r: Resource::new("v1", "namespaces"),
            ns: String::new(),
            name: "default".into(),
            status: false
        }
    );
    assert_eq!(
        parse_path("/api/v1/namespaces/default/pods").unwrap(),
        Target::Collection {
            r: Resource::new("v1", "pods"),
            ns: "default".into()
        }
    );
    assert_eq!(percent_decode("spec.nodeName%3Dw1"), "spec.nodeName=w1");
}

#[tokio::test]
async fn a_restart_ends_watches_and_an_old_resource_version_is_gone() {
    let s = server();
    let ds = datastore(&s).await;
    ds.create(Kind::EgressTunnel, tunnel("w1")).await.unwrap();
    let (_, rev) = ds.list(Kind::EgressTunnel).await.unwrap();
    let mut w = ds.watch(Kind::EgressTunnel, rev).await.unwrap();
    ds.create(Kind::EgressTunnel, tunnel("w2")).await.unwrap();
    let first = next_item(&mut w).await;
    assert!(
        matches!(first, Ok(WatchEvent::Put(ref p)) if p.key.name == "w2"),
        "{first:?}"
    );
    // The server restarts with its history compacted: the datastore
    // resumes from the last revision it saw, which is still current, then
    // a write it missed cannot be replayed from an older one.
    s.restart(true);
    ds.create(Kind::EgressTunnel, tunnel("w3")).await.unwrap();
    let next = next_item(&mut w).await;
    assert!(
        matches!(next, Ok(WatchEvent::Put(ref p)) if p.key.name == "w3"),
        "{next:?}"
    );
    let mut old = ds.watch(Kind::EgressTunnel, rev).await.unwrap();
    let gone = next_item(&mut old).await;
    assert!(
        matches!(gone, Err(DatastoreError::Compacted(_))),
        "{gone:?}"
    );
    assert_eq!(s.expired_watches(), 1);
}
