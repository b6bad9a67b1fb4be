use serde_json::json;

use super::*;
use crate::api::{NodeRecord, TunnelPhase};
use crate::controller::tests::{node, pass, policy, Setup};
use crate::datastore::memory::MemoryDatastore;
use crate::datastore::Datastore;
use crate::view::load_view;

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}
fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// Gateway `g1` on the node `gw`, the worker `w1` with the pods `web`
/// and `db`; no policy yet.
async fn cluster() -> MemoryDatastore {
    let mut gwn = node("gw", "a");
    gwn.pod_cidrs = vec!["10.244.0.0/24".into()];
    let mut w = node("w1", "-");
    w.pod_cidrs = vec!["10.244.1.0/24".into()];
    w.addresses = vec!["172.18.0.11".into()];
    Setup::new()
        .g1(&["10.0.0.1-10.0.0.4"])
        .node_record(gwn, TunnelPhase::Ready)
        .node_record(w, TunnelPhase::Ready)
        .pod("web", "web", "w1", "10.244.1.5")
        .pod("db", "db", "w1", "10.244.1.6")
        .create()
        .await
}

/// An `rr` policy of `g1` for the `web` pods, to `dest` only.
fn web_policy(name: &str, age: u32, priority: Option<i64>, dest: &str) -> serde_json::Value {
    let mut p = policy(
        name,
        age,
        "g1",
        json!({"allocatorPolicy": "rr"}),
        "web",
        priority,
    );
    p["spec"]["destSubnet"] = json!([dest]);
    p
}

/// The id the node's dataplane gives policy `name`.
fn id_of(w: &NodeDesired, name: &str) -> u32 {
    *w.policies
        .iter()
        .find(|(_, t)| t.key.name == name)
        .unwrap()
        .0
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
        *g.reply_steering,
        BTreeMap::from([((ip("10.0.0.1"), 16), ip("192.168.0.1"))])
    );
}

#[tokio::test]
async fn priority_decides_overlapping_destinations() {
    let ds = cluster().await;
    // Both select app=web. "wide" covers everything, "narrow" one /24.
    Setup::new()
        .policy(web_policy("wide", 1, Some(10), "0.0.0.0/0"))
        .policy(web_policy("narrow", 2, Some(20), "198.51.100.0/24"))
        .add_to(&ds)
        .await;
    pass(&ds).await;
    let view = load_view(&ds).await.unwrap();
    let w = desired(&view, &cfg("w1"));
    // wide has precedence (10 < 20) and covers the /24: narrow gets nothing.
    assert_eq!(
        w.rules,
        vec![MatchRule {
            src: ip("10.244.1.5"),
            dst: net("0.0.0.0/0"),
            action: RuleAction::Egress(id_of(&w, "wide"))
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
    let mut want = vec![
        MatchRule {
            src: ip("10.244.1.5"),
            dst: net("198.51.100.0/24"),
            action: RuleAction::Egress(id_of(&w, "narrow")),
        },
        MatchRule {
            src: ip("10.244.1.5"),
            dst: net("0.0.0.0/0"),
            action: RuleAction::Egress(id_of(&w, "wide")),
        },
    ];
    want.sort();
    assert_eq!(w.rules, want);

    // Equal priority: the older object wins.
    let ds = cluster().await;
    // The newer one is created first.
    Setup::new()
        .policy(web_policy("newer", 2, None, "198.51.100.0/24"))
        .policy(web_policy("older", 1, None, "198.51.100.0/24"))
        .add_to(&ds)
        .await;
    pass(&ds).await;
    let w = desired(&load_view(&ds).await.unwrap(), &cfg("w1"));
    assert_eq!(w.rules.len(), 1);
    assert_eq!(w.rules[0].action, RuleAction::Egress(id_of(&w, "older")));
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

/// Applies watch batches until `done` holds for the view.
async fn follow_until(c: &mut crate::controller::ViewCache, done: impl Fn(&ClusterView) -> bool) {
    while !done(&c.view) {
        c.next_batch().await.unwrap().unwrap();
    }
}

/// While only pods change, the kept parts give what a fresh preparation
/// gives; a change of any other kind is not served from them.
#[tokio::test]
async fn kept_parts_give_what_fresh_ones_give() {
    use crate::api::PodRecord;
    use crate::datastore::typed::pod_object;
    let ds = cluster().await;
    ds.create(Kind::EgressPolicy, web_policy("p", 1, None, "0.0.0.0/0"))
        .await
        .unwrap();
    pass(&ds).await;
    let mut c = crate::controller::ViewCache::start(&ds).await.unwrap();
    let mut cache = PreparedCache::default();
    let first = cache.prepare(&c.view).node(&cfg("w1"));
    assert_eq!(first, desired(&c.view, &cfg("w1")));
    assert_eq!(first.rules.len(), 1, "{:?}", first.rules);

    let pod = PodRecord {
        name: "web2".into(),
        namespace: "default".into(),
        labels: [("app".to_string(), "web".to_string())].into(),
        node: "w1".into(),
        ips: vec!["10.244.1.7".into()],
    };
    ds.create(Kind::Pod, pod_object(&pod)).await.unwrap();
    follow_until(&mut c, |v| v.pods.len() == 3).await;
    let kept = cache.prepare(&c.view).node(&cfg("w1"));
    assert_eq!(cache.reused(), 1);
    assert!(cache.rebuilt_by().is_empty(), "{:?}", cache.rebuilt_by());
    assert_eq!(kept, desired(&c.view, &cfg("w1")));
    assert_eq!(kept.rules.len(), 2, "the new pod's rule: {:?}", kept.rules);

    ds.create(
        Kind::EgressPolicy,
        policy("q", 2, "g1", json!({}), "db", None),
    )
    .await
    .unwrap();
    pass(&ds).await;
    follow_until(&mut c, |v| {
        v.policies.iter().any(|p| {
            p.status.as_ref().is_some_and(|s| !s.node.is_empty())
                && p.metadata.name.as_deref() == Some("q")
        })
    })
    .await;
    let again = cache.prepare(&c.view).node(&cfg("w1"));
    assert_eq!(
        cache.reused(),
        1,
        "a new policy is not served from kept parts"
    );
    assert_eq!(cache.rebuilt_by().get("policies"), Some(&1));
    assert_eq!(again, desired(&c.view, &cfg("w1")));
    assert_eq!(again.policies.len(), 2);
}

/// A change of a tunnel's grants alone rebuilds only the parts grants make
/// (the gateway's reply steering, a node's own blocks): the gateway node
/// steers the new block at once, and both nodes get what a fresh
/// preparation gives.
#[tokio::test]
async fn a_grant_alone_rebuilds_only_the_grant_parts() {
    use crate::controller::PORT_BLOCK_MANAGER;
    use crate::datastore::{ObjectKey, StatusPatch};
    let ds = cluster().await;
    ds.create(Kind::EgressPolicy, web_policy("p", 1, None, "0.0.0.0/0"))
        .await
        .unwrap();
    pass(&ds).await;
    let mut c = crate::controller::ViewCache::start(&ds).await.unwrap();
    let mut cache = PreparedCache::default();
    let before = cache.prepare(&c.view).node(&cfg("gw"));
    let held = c.view.tunnel("w1").unwrap().status.clone().unwrap();
    let mut grant = held.port_blocks[0].clone();
    let new_block = grant.blocks.iter().max().unwrap() + 1;
    grant.blocks.push(new_block);
    let patch = StatusPatch {
        manager: PORT_BLOCK_MANAGER.into(),
        owned: vec!["portBlocks".into(), "portBlockSize".into()],
        status: json!({"portBlocks": [grant], "portBlockSize": held.port_block_size}),
    };
    ds.write_status(Kind::EgressTunnel, &ObjectKey::cluster("w1"), &patch)
        .await
        .unwrap();
    follow_until(&mut c, |v| {
        v.tunnel("w1").unwrap().status.as_ref().unwrap().port_blocks[0]
            .blocks
            .contains(&new_block)
    })
    .await;

    let prep = cache.prepare(&c.view);
    let (gw, w1) = (prep.node(&cfg("gw")), prep.node(&cfg("w1")));
    assert_eq!(cache.reused(), 1, "the policy parts are kept");
    assert_eq!(
        cache.rebuilt_by().iter().collect::<Vec<_>>(),
        [(&"grants", &1)],
        "only the grant parts are rebuilt"
    );
    assert_eq!(gw, desired(&c.view, &cfg("gw")));
    assert_eq!(w1, desired(&c.view, &cfg("w1")));
    let eip: IpAddr = grant.eip.parse().unwrap();
    assert!(!before.reply_steering.contains_key(&(eip, new_block)));
    assert!(
        gw.reply_steering.contains_key(&(eip, new_block)),
        "the gateway steers the new block: {:?}",
        gw.reply_steering
    );
    assert!(w1.port_blocks[&eip].iter().any(|r| r.block == new_block));
}
