use serde_json::json;

use super::*;
use crate::api::{NodeRecord, TunnelPhase};
use crate::controller::tests::{add_node, gateway, node, pass, pod, policy};
use crate::datastore::memory::MemoryDatastore;
use crate::datastore::typed::pod_object;
use crate::datastore::Datastore;
use crate::view::load_view;

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}
fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

async fn cluster() -> MemoryDatastore {
    let ds = MemoryDatastore::new();
    ds.create(
        Kind::EgressGateway,
        gateway("g1", 1, &["10.0.0.1-10.0.0.4"], "", "a"),
    )
    .await
    .unwrap();
    let mut gwn = node("gw", "a");
    gwn.pod_cidrs = vec!["10.244.0.0/24".into()];
    add_node(&ds, &gwn, TunnelPhase::Ready).await;
    let mut w = node("w1", "-");
    w.pod_cidrs = vec!["10.244.1.0/24".into()];
    w.addresses = vec!["172.18.0.11".into()];
    add_node(&ds, &w, TunnelPhase::Ready).await;
    ds.create(
        Kind::Pod,
        pod_object(&pod("web", "web", "w1", "10.244.1.5")),
    )
    .await
    .unwrap();
    ds.create(Kind::Pod, pod_object(&pod("db", "db", "w1", "10.244.1.6")))
        .await
        .unwrap();
    ds
}

fn cfg(node: &str) -> AgentConfig {
    AgentConfig {
        node: node.into(),
        service_cidrs: vec![net("10.96.0.0/12")],
        ..Default::default()
    }
}

/// A useNodeIP policy's unit has no address of its own in the gateway's
/// status: the gateway node owns its own address for it (the one the
/// controller grants blocks of), so its datapath forwards and steers.
#[tokio::test]
async fn a_node_ip_policy_makes_the_gateway_own_its_node_address() {
    let ds = cluster().await;
    ds.create(
        Kind::EgressPolicy,
        policy("p", 1, "g1", json!({"useNodeIP": true}), "web", None),
    )
    .await
    .unwrap();
    pass(&ds).await;
    let view = load_view(&ds).await.unwrap();
    let node_ip = view.node_ip("gw", false).expect("gw has an address");
    let g = desired(&view, &cfg("gw"));
    assert_eq!(g.owned_eips.keys().collect::<Vec<_>>(), [&node_ip]);
    let blocks = desired(&view, &cfg("w1")).port_blocks;
    assert_eq!(
        blocks.keys().collect::<Vec<_>>(),
        [&node_ip],
        "the worker's blocks are of the same address"
    );
    assert!(desired(&view, &cfg("w1")).owned_eips.is_empty());
}

#[tokio::test]
async fn worker_and_gateway_views() {
    let ds = cluster().await;
    let mut p = policy("p", 1, "g1", json!({}), "web", None);
    p["spec"]["destSubnet"] = json!(["203.0.113.0/24"]);
    p["spec"]["excludedSubnet"] = json!(["203.0.113.128/25"]);
    ds.create(Kind::EgressPolicy, p).await.unwrap();
    pass(&ds).await;
    let view = load_view(&ds).await.unwrap();

    let w = desired(&view, &cfg("w1"));
    assert_eq!(w.policies.len(), 1);
    let (id, t) = w.policies.iter().next().unwrap();
    assert_eq!(t.eip_v4, Some("10.0.0.1".parse().unwrap()));
    assert_eq!(t.gateway_node, "gw");
    assert_eq!(t.tunnel_endpoint, Some(ip("192.168.0.1")));
    assert!(!t.local);
    assert_eq!(t.epoch, 1);
    assert_eq!(
        w.rules,
        vec![
            MatchRule {
                src: ip("10.244.1.5"),
                dst: net("203.0.113.0/24"),
                action: RuleAction::Egress(*id)
            },
            MatchRule {
                src: ip("10.244.1.5"),
                dst: net("203.0.113.128/25"),
                action: RuleAction::Skip
            },
        ]
    );
    assert_eq!(
        w.port_blocks,
        BTreeMap::from([(
            ip("10.0.0.1"),
            vec![PortRange {
                block: 16,
                first: 1024,
                last: 1087
            }]
        )])
    );
    assert!(w.owned_eips.is_empty() && w.reply_steering.is_empty() && !w.gateway_eligible);
    let all = w.cluster_cidrs.all();
    for c in [
        "10.244.0.0/24",
        "10.244.1.0/24",
        "10.96.0.0/12",
        "172.18.0.11/32",
    ] {
        assert!(all.contains(&net(c)), "{c} missing from {all:?}");
    }

    let g = desired(&view, &cfg("gw"));
    assert!(g.rules.is_empty(), "no local pods selected");
    assert!(g.gateway_eligible);
    // The cheap reading agrees with the whole computation.
    assert!(gateway_eligible(&view, "gw") && !gateway_eligible(&view, "w1"));
    assert_eq!(g.owned_eips[&ip("10.0.0.1")].epoch, 1);
    assert_eq!(
        g.reply_steering,
        BTreeMap::from([((ip("10.0.0.1"), 16), ip("192.168.0.1"))])
    );
}

#[tokio::test]
async fn priority_decides_overlapping_destinations() {
    let ds = cluster().await;
    // Both select app=web. "wide" covers everything, "narrow" one /24.
    let mut wide = policy(
        "wide",
        1,
        "g1",
        json!({"allocatorPolicy": "rr"}),
        "web",
        Some(10),
    );
    wide["spec"]["destSubnet"] = json!(["0.0.0.0/0"]);
    let mut narrow = policy(
        "narrow",
        2,
        "g1",
        json!({"allocatorPolicy": "rr"}),
        "web",
        Some(20),
    );
    narrow["spec"]["destSubnet"] = json!(["198.51.100.0/24"]);
    ds.create(Kind::EgressPolicy, wide).await.unwrap();
    ds.create(Kind::EgressPolicy, narrow).await.unwrap();
    pass(&ds).await;
    let view = load_view(&ds).await.unwrap();
    let w = desired(&view, &cfg("w1"));
    let id_of = |name: &str| {
        *w.policies
            .iter()
            .find(|(_, t)| t.key.name == name)
            .unwrap()
            .0
    };
    // wide has precedence (10 < 20) and covers the /24: narrow gets nothing.
    assert_eq!(
        w.rules,
        vec![MatchRule {
            src: ip("10.244.1.5"),
            dst: net("0.0.0.0/0"),
            action: RuleAction::Egress(id_of("wide"))
        }]
    );

    // Swap priorities: narrow wins its /24, wide keeps the rest.
    for (name, prio) in [("wide", 30), ("narrow", 5)] {
        let key = ObjectKey::namespaced("default", name);
        let cur = ds.get(Kind::EgressPolicy, &key).await.unwrap().unwrap();
        let mut v = cur.value.clone();
        v["spec"]["priority"] = json!(prio);
        ds.update(Kind::EgressPolicy, v, cur.revision)
            .await
            .unwrap();
    }
    pass(&ds).await;
    let view = load_view(&ds).await.unwrap();
    let w = desired(&view, &cfg("w1"));
    let id_of = |name: &str| {
        *w.policies
            .iter()
            .find(|(_, t)| t.key.name == name)
            .unwrap()
            .0
    };
    let mut want = vec![
        MatchRule {
            src: ip("10.244.1.5"),
            dst: net("198.51.100.0/24"),
            action: RuleAction::Egress(id_of("narrow")),
        },
        MatchRule {
            src: ip("10.244.1.5"),
            dst: net("0.0.0.0/0"),
            action: RuleAction::Egress(id_of("wide")),
        },
    ];
    want.sort();
    assert_eq!(w.rules, want);

    // Equal priority: the older object wins.
    let ds = cluster().await;
    let mut a = policy(
        "older",
        1,
        "g1",
        json!({"allocatorPolicy": "rr"}),
        "web",
        None,
    );
    a["spec"]["destSubnet"] = json!(["198.51.100.0/24"]);
    let mut b = policy(
        "newer",
        2,
        "g1",
        json!({"allocatorPolicy": "rr"}),
        "web",
        None,
    );
    b["spec"]["destSubnet"] = json!(["198.51.100.0/24"]);
    ds.create(Kind::EgressPolicy, b).await.unwrap();
    ds.create(Kind::EgressPolicy, a).await.unwrap();
    pass(&ds).await;
    let w = desired(&load_view(&ds).await.unwrap(), &cfg("w1"));
    let id_older = *w
        .policies
        .iter()
        .find(|(_, t)| t.key.name == "older")
        .unwrap()
        .0;
    assert_eq!(w.rules.len(), 1);
    assert_eq!(w.rules[0].action, RuleAction::Egress(id_older));
}

#[tokio::test]
async fn labels_follow_and_deleted_policy_leaves_normal_way() {
    let ds = cluster().await;
    ds.create(
        Kind::EgressPolicy,
        policy("p", 1, "g1", json!({}), "web", None),
    )
    .await
    .unwrap();
    pass(&ds).await;
    let w = desired(&load_view(&ds).await.unwrap(), &cfg("w1"));
    assert_eq!(
        w.rules.iter().map(|r| r.src).collect::<Vec<_>>(),
        vec![ip("10.244.1.5")]
    );

    // The db pod gets label app=web: it follows.
    let key = ObjectKey::namespaced("default", "db");
    let cur = ds.get(Kind::Pod, &key).await.unwrap().unwrap();
    let mut v = cur.value.clone();
    v["metadata"]["labels"]["app"] = json!("web");
    ds.update(Kind::Pod, v, cur.revision).await.unwrap();
    pass(&ds).await;
    let w = desired(&load_view(&ds).await.unwrap(), &cfg("w1"));
    assert_eq!(w.rules.len(), 2);

    ds.delete(
        Kind::EgressPolicy,
        &ObjectKey::namespaced("default", "p"),
        None,
    )
    .await
    .unwrap();
    pass(&ds).await;
    let w = desired(&load_view(&ds).await.unwrap(), &cfg("w1"));
    assert!(w.rules.is_empty() && w.policies.is_empty() && w.port_blocks.is_empty());
}

#[test]
fn policy_ids_are_stable_and_unique() {
    let keys: Vec<ObjectKey> = (0..2000)
        .map(|i| ObjectKey::namespaced("ns", format!("p{i}")))
        .collect();
    let a = policy_ids(keys.iter().map(|k| (Kind::EgressPolicy, k)));
    let b = policy_ids(keys.iter().rev().map(|k| (Kind::EgressPolicy, k)));
    assert_eq!(a, b);
    let set: BTreeSet<u32> = a.values().copied().collect();
    assert_eq!(set.len(), 2000);
    assert!(!set.contains(&0));
    let _ = NodeRecord::default();
}

/// A policy the controller has not assigned yet selects w1's pod: w1 gets
/// it as pending (fail closed, with its rank and the pod's address); once
/// assigned it is a target and no longer pending. The gateway node, with
/// no selected pod, has nothing pending.
#[tokio::test]
async fn an_unassigned_policy_is_pending_on_the_nodes_of_its_pods() {
    let ds = cluster().await;
    ds.create(
        Kind::EgressPolicy,
        policy("old", 1, "g1", json!({}), "db", None),
    )
    .await
    .unwrap();
    pass(&ds).await;
    ds.create(
        Kind::EgressPolicy,
        policy("p", 2, "g1", json!({}), "web", None),
    )
    .await
    .unwrap();
    let view = load_view(&ds).await.unwrap();
    let w = desired(&view, &cfg("w1"));
    assert_eq!(w.pending.len(), 1, "{:?}", w.pending);
    let p = &w.pending[0];
    assert_eq!(p.key.name, "p");
    assert_eq!(p.reason, PendingReason::NoEip);
    assert_eq!(p.sources, vec![ip("10.244.1.5")]);
    assert_eq!(p.rank, 1, "the older policy ranks first");
    assert!(!w.policies.contains_key(&p.id));
    assert_eq!(w.policies.values().map(|t| t.rank).collect::<Vec<_>>(), [0]);
    assert!(desired(&view, &cfg("gw")).pending.is_empty());

    pass(&ds).await;
    let view = load_view(&ds).await.unwrap();
    let w = desired(&view, &cfg("w1"));
    assert!(w.pending.is_empty(), "{:?}", w.pending);
    assert_eq!(w.policies.len(), 2);
}
