//! Grants through whole reconcile passes on the memory datastore: a
//! thousand workers on one EIP, growth from the agents' reports, a
//! policy's quota, and a new controller that takes over mid-grant.

use std::collections::BTreeSet;

use serde_json::json;

use crate::api::EipPortUse;
use crate::controller::tests::{grants, one_eip_gateway, pass, policy, Setup};
use crate::datastore::memory::MemoryDatastore;
use crate::registration::publish_port_use;

async fn report(ds: &MemoryDatastore, node: &str, in_use: u32) {
    let u = EipPortUse {
        gateway: "g1".into(),
        eip: "10.0.0.1".into(),
        in_use,
        released: vec![],
    };
    publish_port_use(ds, node, &[u]).await.unwrap();
}

fn held(g: &std::collections::BTreeMap<(String, String), Vec<u16>>, n: &str) -> Vec<u16> {
    g.get(&(n.to_string(), "10.0.0.1".to_string()))
        .cloned()
        .unwrap_or_default()
}

#[tokio::test]
async fn a_thousand_workers_share_one_eip_none_refused() {
    let ds = one_eip_gateway(&[])
        .g1_policy("p", 1, json!({}), "web")
        .create()
        .await;
    // Each worker's node, then its pod.
    for i in 0..1000u32 {
        let w = format!("w{i:04}");
        let ip = format!("10.{}.{}.2", 100 + i / 256, i % 256);
        Setup::new()
            .workers(&[&w])
            .pod(&format!("p{i}"), "web", &w, &ip)
            .add_to(&ds)
            .await;
    }
    let plan = pass(&ds).await;
    assert!(
        !plan
            .events
            .iter()
            .any(|e| e.reason == "PortBlocksExhausted"),
        "{:?}",
        plan.events
            .iter()
            .find(|e| e.reason == "PortBlocksExhausted")
    );
    let g = grants(&ds).await;
    let mut seen = BTreeSet::new();
    for i in 0..1000u32 {
        let b = held(&g, &format!("w{i:04}"));
        assert_eq!(b.len(), 1, "w{i:04}: {b:?}");
        assert!(seen.insert(b[0]), "block {} granted twice", b[0]);
    }
    let free = plan.addresses.iter().find(|a| a.eip == "10.0.0.1").unwrap();
    assert_eq!((free.total, free.free), (1008, 8));
    assert!(plan.port_facts().all(|p| !p.refused && p.granted == 1));
}

/// Policy `p` of gateway `g1` with one pod on each of `w1` and `w2`.
async fn two_workers_of_one_policy() -> MemoryDatastore {
    one_eip_gateway(&["w1", "w2"])
        .g1_policy("p", 1, json!({}), "web")
        .pod("a", "web", "w1", "10.244.1.2")
        .pod("b", "web", "w2", "10.244.2.2")
        .create()
        .await
}

#[tokio::test]
async fn use_grows_the_grant_and_a_new_controller_keeps_every_number() {
    let ds = two_workers_of_one_policy().await;
    pass(&ds).await;
    assert_eq!(held(&grants(&ds).await, "w1"), vec![16]);
    // w1 reports 100 ports in use: ceil(200 / 64) + 1 = 5 blocks, ahead of need.
    report(&ds, "w1", 100).await;
    pass(&ds).await;
    let g = grants(&ds).await;
    assert_eq!(held(&g, "w1"), vec![16, 18, 19, 20, 21]);
    assert_eq!(held(&g, "w2"), vec![17]);
    // A new leader (a fresh pass from the datastore alone, as after a
    // controller failover between the grant and the next report) keeps
    // every number.
    let before = grants(&ds).await;
    pass(&ds).await;
    assert_eq!(grants(&ds).await, before);
}

#[tokio::test]
async fn a_policy_quota_caps_the_grant_and_is_reported() {
    let mut p = policy("p", 1, "g1", json!({}), "web", None);
    p["spec"]["maxPortsPerNode"] = json!(128);
    let ds = one_eip_gateway(&["w1"])
        .policy(p)
        .pod("a", "web", "w1", "10.244.1.2")
        .create()
        .await;
    pass(&ds).await;
    report(&ds, "w1", 1000).await;
    let plan = pass(&ds).await;
    assert_eq!(held(&grants(&ds).await, "w1"), vec![16, 17]);
    let fact = plan.port_facts().find(|f| &*f.node == "w1").unwrap();
    assert_eq!(fact.quota_reached.as_deref(), Some("default/p"));
    assert!(!fact.refused);
}

#[tokio::test]
async fn an_address_whose_inputs_are_unchanged_is_not_decided_again() {
    use crate::controller::{reconcile, reconcile_with, ControllerConfig, ReconcileMemo};
    use crate::view::load_view;
    let ds = two_workers_of_one_policy().await;
    pass(&ds).await;
    let cfg = ControllerConfig::default();
    let mut memo = ReconcileMemo::default();
    let view = load_view(&ds).await.unwrap();
    let first = reconcile_with(&view, &cfg, &mut memo);
    let decided = memo.grants.decided;
    assert!(decided >= 1, "the EIP's grants were decided");
    assert_eq!(memo.grants.reused, 0);
    let again = reconcile_with(&view, &cfg, &mut memo);
    assert_eq!(again, first);
    assert_eq!(
        memo.grants.decided, decided,
        "nothing changed: nothing decided again"
    );
    assert_eq!(memo.grants.reused, decided);
    // w1's report changes the EIP's inputs: decided again, and grown.
    report(&ds, "w1", 100).await;
    let view = load_view(&ds).await.unwrap();
    let grown = reconcile_with(&view, &cfg, &mut memo);
    assert_eq!(memo.grants.decided, decided + 1);
    assert_eq!(grown, reconcile(&view, &cfg));
    assert_ne!(grown.tunnels["w1"], first.tunnels["w1"], "w1 grows");
}
