//! Table-driven tests of the reconcile logic, run through the memory
//! datastore the way the controller loop runs it.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{json, Value};

use super::run::{write_plan, write_plan_stored};
use super::*;
use crate::api::*;
use crate::datastore::memory::MemoryDatastore;
use crate::datastore::typed::{self, node_object, pod_object};
use crate::datastore::{Datastore, Kind, ObjectKey, StatusPatch};
use crate::registration::publish_port_use;
use crate::view::load_view;

pub(crate) fn ts(n: u32) -> String {
    format!("2026-01-01T00:00:{n:02}Z")
}

pub(crate) fn gateway(name: &str, age: u32, v4: &[&str], default4: &str, label: &str) -> Value {
    json!({
        "apiVersion": API_VERSION, "kind": "EgressGateway",
        "metadata": {"name": name, "creationTimestamp": ts(age)},
        "spec": {
            "ippools": {"ipv4": v4, "ipv4DefaultEIP": default4},
            "nodeSelector": {"selector": {"matchLabels": {"gw": label}}}
        }
    })
}

pub(crate) fn policy(
    name: &str,
    age: u32,
    gw: &str,
    egress_ip: Value,
    app: &str,
    priority: Option<i64>,
) -> Value {
    let mut spec = json!({
        "egressGatewayName": gw,
        "egressIP": egress_ip,
        "appliedTo": {"podSelector": {"matchLabels": {"app": app}}},
    });
    if let Some(p) = priority {
        spec["priority"] = json!(p);
    }
    json!({
        "apiVersion": API_VERSION, "kind": "EgressPolicy",
        "metadata": {"name": name, "namespace": "default", "creationTimestamp": ts(age)},
        "spec": spec
    })
}

pub(crate) fn node(name: &str, gw_label: &str) -> NodeRecord {
    NodeRecord {
        name: name.into(),
        labels: [("gw".to_string(), gw_label.to_string())].into(),
        addresses: vec![format!(
            "172.18.0.{}",
            name.len() + name.as_bytes()[name.len() - 1] as usize % 50
        )],
        pod_cidrs: vec![],
        ready: true,
    }
}

pub(crate) fn pod(name: &str, app: &str, on: &str, ip: &str) -> PodRecord {
    PodRecord {
        name: name.into(),
        namespace: "default".into(),
        labels: [("app".to_string(), app.to_string())].into(),
        node: on.into(),
        ips: vec![ip.into()],
    }
}

pub(crate) async fn add_node(ds: &MemoryDatastore, n: &NodeRecord, phase: TunnelPhase) {
    ds.create(Kind::Node, node_object(n)).await.unwrap();
    let t = json!({"apiVersion": API_VERSION, "kind": "EgressTunnel", "metadata": {"name": n.name}, "spec": {}});
    ds.create(Kind::EgressTunnel, t).await.unwrap();
    set_phase(ds, &n.name, phase).await;
}

pub(crate) async fn set_phase(ds: &MemoryDatastore, node: &str, phase: TunnelPhase) {
    let st = json!({"tunnel": {"ipv4": "192.168.0.1", "mac": "02:00:00:00:00:01"}, "phase": phase});
    ds.write_status(
        Kind::EgressTunnel,
        &ObjectKey::cluster(node),
        &StatusPatch::owning_all("test", st),
    )
    .await
    .unwrap();
}

/// A cluster to start a test from, created in the memory datastore in the
/// order a cluster comes up: gateways, nodes (with their tunnels), policies,
/// pods, each in the order given.
#[derive(Default)]
pub(crate) struct Setup {
    gateways: Vec<Value>,
    /// With the tunnel's phase; `None`: a Node without an EgressTunnel.
    nodes: Vec<(NodeRecord, Option<TunnelPhase>)>,
    policies: Vec<Value>,
    pods: Vec<PodRecord>,
}

impl Setup {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    pub(crate) fn gateway(mut self, g: Value) -> Self {
        self.gateways.push(g);
        self
    }

    /// Gateway `g1` (age 1, no default EIP) over the nodes labelled `a`.
    pub(crate) fn g1(self, v4: &[&str]) -> Self {
        self.gateway(gateway("g1", 1, v4, "", "a"))
    }

    /// A node labelled `label` whose tunnel is registered in `phase`.
    pub(crate) fn node(mut self, name: &str, label: &str, phase: TunnelPhase) -> Self {
        self.nodes.push((node(name, label), Some(phase)));
        self
    }

    /// A node as given, its tunnel registered in `phase`.
    pub(crate) fn node_record(mut self, n: NodeRecord, phase: TunnelPhase) -> Self {
        self.nodes.push((n, Some(phase)));
        self
    }

    /// Nodes of gateway `g1` (label `a`), all in `phase`.
    pub(crate) fn gateway_nodes(self, names: &[&str], phase: TunnelPhase) -> Self {
        names.iter().fold(self, |s, n| s.node(n, "a", phase))
    }

    /// Ready nodes outside every gateway (label `-`).
    pub(crate) fn workers(self, names: &[&str]) -> Self {
        names
            .iter()
            .fold(self, |s, n| s.node(n, "-", TunnelPhase::Ready))
    }

    /// A Node (label `-`) without an EgressTunnel: no agent yet.
    pub(crate) fn bare_node(mut self, name: &str) -> Self {
        self.nodes.push((node(name, "-"), None));
        self
    }

    pub(crate) fn policy(mut self, p: Value) -> Self {
        self.policies.push(p);
        self
    }

    /// Policy `name` of age `age` on `g1`, for the pods labelled `app`.
    pub(crate) fn g1_policy(self, name: &str, age: u32, egress_ip: Value, app: &str) -> Self {
        self.policy(policy(name, age, "g1", egress_ip, app, None))
    }

    /// Pod `name` (label `app`) on node `on`.
    pub(crate) fn pod(mut self, name: &str, app: &str, on: &str, ip: &str) -> Self {
        self.pods.push(pod(name, app, on, ip));
        self
    }

    /// A new datastore holding the cluster.
    pub(crate) async fn create(self) -> MemoryDatastore {
        let ds = MemoryDatastore::new();
        self.add_to(&ds).await;
        ds
    }

    /// Adds the cluster's objects to `ds`.
    pub(crate) async fn add_to(self, ds: &MemoryDatastore) {
        for g in self.gateways {
            ds.create(Kind::EgressGateway, g).await.unwrap();
        }
        for (n, phase) in &self.nodes {
            match phase {
                Some(phase) => add_node(ds, n, *phase).await,
                None => {
                    ds.create(Kind::Node, node_object(n)).await.unwrap();
                }
            }
        }
        for p in self.policies {
            ds.create(Kind::EgressPolicy, p).await.unwrap();
        }
        for p in &self.pods {
            ds.create(Kind::Pod, pod_object(p)).await.unwrap();
        }
    }
}

pub(crate) async fn pass(ds: &MemoryDatastore) -> Plan {
    pass_with(ds, &ControllerConfig::default()).await
}

thread_local! {
    /// What this test's passes kept for one another, as the leader keeps it.
    static MEMO: std::cell::RefCell<ReconcileMemo> = Default::default();
    /// A view cache following this test's datastore (by its address), as
    /// the leader's: its passes redo only what changed.
    static CACHE: std::cell::RefCell<Option<(usize, ViewCache)>> = Default::default();
}

/// A pass on the cache that follows `ds`, with what it tracked since its
/// last pass, must plan exactly what a pass from nothing plans on the same
/// view. Says whether it redid only what changed.
pub(crate) async fn cached_pass_agrees(ds: &MemoryDatastore, cfg: &ControllerConfig) -> bool {
    use futures::FutureExt;
    let id = ds as *const MemoryDatastore as usize;
    let kept = CACHE
        .with_borrow_mut(|c| c.take())
        .filter(|(at, _)| *at == id);
    let mut cache = match kept {
        Some((_, c)) => c,
        None => ViewCache::start_for_controller(ds).await.unwrap(),
    };
    loop {
        match cache.next_batch().now_or_never() {
            None => break,
            Some(Some(Ok(_))) => {}
            // Fell behind, or the datastore is gone: start over.
            Some(_) => {
                cache = ViewCache::start_for_controller(ds).await.unwrap();
                break;
            }
        }
    }
    let partial = cache.memo.partial_passes;
    let kept = reconcile_with(&cache.view, cfg, &mut cache.memo);
    assert_eq!(
        kept,
        reconcile(&cache.view, cfg),
        "a pass on the cache planned otherwise"
    );
    let partial = cache.memo.partial_passes > partial;
    CACHE.with_borrow_mut(|c| *c = Some((id, cache)));
    partial
}

/// One pass from the datastore, written. Every test's passes also run with
/// a memo kept across them (as the leader's loop runs them), which must
/// plan exactly what a pass from nothing plans.
pub(crate) async fn pass_with(ds: &MemoryDatastore, cfg: &ControllerConfig) -> Plan {
    let view = load_view(ds).await.unwrap();
    let plan = reconcile(&view, cfg);
    let kept = MEMO.with_borrow_mut(|memo| reconcile_with(&view, cfg, memo));
    assert_eq!(kept, plan, "a pass with the memo planned otherwise");
    cached_pass_agrees(ds, cfg).await;
    write_plan(ds, &view, &plan).await.unwrap();
    plan
}

pub(crate) async fn policy_status(ds: &MemoryDatastore, name: &str) -> EgressPolicyStatus {
    let s = ds
        .get(Kind::EgressPolicy, &ObjectKey::namespaced("default", name))
        .await
        .unwrap()
        .unwrap();
    typed::decode::<EgressPolicy>(&s)
        .unwrap()
        .status
        .unwrap_or_default()
}

/// Every port-block grant, from the EgressTunnel statuses: (node, EIP) -> blocks.
pub(crate) async fn grants(ds: &MemoryDatastore) -> BTreeMap<(String, String), Vec<u16>> {
    let view = load_view(ds).await.unwrap();
    let mut out = BTreeMap::new();
    for t in &view.tunnels {
        let Some(st) = &t.status else { continue };
        for b in &st.port_blocks {
            out.insert(
                (t.metadata.name.clone().unwrap_or_default(), b.eip.clone()),
                b.blocks.clone(),
            );
        }
    }
    out
}

pub(crate) async fn gw_status(ds: &MemoryDatastore, name: &str) -> EgressGatewayStatus {
    let s = ds
        .get(Kind::EgressGateway, &ObjectKey::cluster(name))
        .await
        .unwrap()
        .unwrap();
    typed::decode::<EgressGateway>(&s)
        .unwrap()
        .status
        .unwrap_or_default()
}

/// Expected outcome per policy: (EIP v4, node) or the reason of a condition.
#[derive(Debug)]
enum Want {
    Eip(&'static str, &'static str),
    Cond(&'static str),
}

struct Case {
    name: &'static str,
    setup: Setup,
    want: Vec<(&'static str, Want)>,
}

/// The cases of [`allocation_table`].
fn allocation_cases() -> Vec<Case> {
    let g1 = || Setup::new().gateway(gateway("g1", 1, &["10.0.0.1-10.0.0.3"], "10.0.0.1", "a"));
    let r = TunnelPhase::Ready;
    vec![
        Case {
            name: "default allocator shares the default EIP",
            setup: g1()
                .gateway_nodes(&["n1", "n2"], r)
                .g1_policy("p1", 1, json!({}), "x")
                .g1_policy("p2", 2, json!({}), "y"),
            want: vec![
                ("p1", Want::Eip("10.0.0.1", "n1")),
                ("p2", Want::Eip("10.0.0.1", "n1")),
            ],
        },
        Case {
            name: "rr gives each policy its own EIP, spread over the fewest-loaded nodes",
            setup: g1()
                .gateway_nodes(&["n1", "n2"], r)
                .g1_policy("p1", 1, json!({"allocatorPolicy": "rr"}), "x")
                .g1_policy("p2", 2, json!({"allocatorPolicy": "rr"}), "y"),
            want: vec![
                ("p1", Want::Eip("10.0.0.1", "n1")),
                ("p2", Want::Eip("10.0.0.2", "n2")),
            ],
        },
        Case {
            name: "rr past the pool's end shares the least shared EIP, first in pool order",
            setup: g1()
                .gateway_nodes(&["n1", "n2"], r)
                .g1_policy("p1", 1, json!({"allocatorPolicy": "rr"}), "x")
                .g1_policy("p2", 2, json!({"allocatorPolicy": "rr"}), "y")
                .g1_policy("p3", 3, json!({"allocatorPolicy": "rr"}), "z")
                .g1_policy("p4", 4, json!({"allocatorPolicy": "rr"}), "v")
                .g1_policy("p5", 5, json!({"allocatorPolicy": "rr"}), "w"),
            want: vec![
                ("p1", Want::Eip("10.0.0.1", "n1")),
                ("p2", Want::Eip("10.0.0.2", "n2")),
                ("p3", Want::Eip("10.0.0.3", "n1")),
                ("p4", Want::Eip("10.0.0.1", "n1")),
                ("p5", Want::Eip("10.0.0.2", "n2")),
            ],
        },
        Case {
            name: "explicit EIP; an explicit EIP outside the pool is refused with the field named",
            setup: g1()
                .gateway_nodes(&["n1"], r)
                .g1_policy("p1", 1, json!({"ipv4": "10.0.0.3"}), "x")
                .g1_policy("p2", 2, json!({"ipv4": "10.9.9.9"}), "y"),
            want: vec![
                ("p1", Want::Eip("10.0.0.3", "n1")),
                (
                    "p2",
                    Want::Cond(
                        "spec.egressIP.ipv4: 10.9.9.9 is outside the ipv4 pool of gateway g1",
                    ),
                ),
            ],
        },
        Case {
            name: "only Ready gateway nodes get EIPs; nodes outside the selector never",
            setup: g1()
                .gateway_nodes(&["n1"], TunnelPhase::HeartbeatTimeout)
                .gateway_nodes(&["n2"], r)
                .node("n3", "b", r)
                .g1_policy("p1", 1, json!({}), "x"),
            want: vec![("p1", Want::Eip("10.0.0.1", "n2"))],
        },
        Case {
            name: "no Ready node: no node, a condition",
            setup: g1().gateway_nodes(&["n1"], TunnelPhase::Init).g1_policy(
                "p1",
                1,
                json!({}),
                "x",
            ),
            want: vec![("p1", Want::Cond("gateway g1 has no Ready node"))],
        },
        Case {
            name: "a missing gateway is accepted with a condition",
            setup: g1().gateway_nodes(&["n1"], r).policy(policy(
                "p1",
                1,
                "nope",
                json!({}),
                "x",
                None,
            )),
            want: vec![(
                "p1",
                Want::Cond("spec.egressGatewayName: gateway nope does not exist"),
            )],
        },
        Case {
            name: "useNodeIP leaves with the gateway node's address",
            setup: g1().gateway_nodes(&["n1"], r).g1_policy(
                "p1",
                1,
                json!({"useNodeIP": true}),
                "x",
            ),
            want: vec![("p1", Want::Eip("192.168.0.1", "n1"))],
        },
        Case {
            name: "overlapping pools: the older gateway keeps them, the newer is refused",
            setup: g1()
                .gateway(gateway("g0", 5, &["10.0.0.3/32"], "", "a"))
                .gateway_nodes(&["n1"], r)
                .policy(policy("p1", 1, "g0", json!({}), "x", None)),
            want: vec![("p1", Want::Cond("gateway g0 is invalid"))],
        },
    ]
}

#[tokio::test]
async fn allocation_table() {
    for c in allocation_cases() {
        let ds = c.setup.create().await;
        pass(&ds).await;
        for (p, want) in &c.want {
            let st = policy_status(&ds, p).await;
            match want {
                Want::Eip(ip, node) => {
                    assert_eq!(
                        (st.eip.ipv4.as_str(), st.node.as_str()),
                        (*ip, *node),
                        "{}: {p}",
                        c.name
                    )
                }
                Want::Cond(msg) => assert!(
                    st.conditions
                        .iter()
                        .any(|cd| cd.status == "False" && cd.message.contains(msg)),
                    "{}: {p}: no condition with {msg:?} in {:?}",
                    c.name,
                    st.conditions
                ),
            }
        }
        // A second pass over the written state changes nothing and records nothing.
        let view = load_view(&ds).await.unwrap();
        let again = reconcile(&view, &ControllerConfig::default());
        assert_eq!(
            write_plan(&ds, &view, &again).await.unwrap(),
            0,
            "{}: not stable",
            c.name
        );
        assert!(
            again.events.is_empty(),
            "{}: events on a no-op pass: {:?}",
            c.name,
            again.events
        );
    }
}

/// Gateway `g1` (pool 10.0.0.1-4) on the Ready `nodes`, policies `p1` and
/// `p2` using it, after one controller pass.
pub(crate) async fn gateway_with_two_policies(nodes: &[&str]) -> MemoryDatastore {
    let rr = || json!({"allocatorPolicy": "rr"});
    let ds = Setup::new()
        .g1(&["10.0.0.1-10.0.0.4"])
        .gateway_nodes(nodes, TunnelPhase::Ready)
        .g1_policy("p1", 0, rr(), "p1")
        .g1_policy("p2", 1, rr(), "p2")
        .create()
        .await;
    pass(&ds).await;
    ds
}

#[tokio::test]
async fn eip_moves_only_with_cause_and_epoch_grows() {
    let ds = gateway_with_two_policies(&["n1"]).await;
    assert_eq!(policy_status(&ds, "p1").await.node, "n1");
    assert_eq!(policy_status(&ds, "p2").await.node, "n1");
    let e0 = gw_status(&ds, "g1").await.epoch;
    assert_eq!(e0, 2);

    // A new Ready node is no cause: nothing moves.
    add_node(&ds, &node("n2", "a"), TunnelPhase::Ready).await;
    let plan = pass(&ds).await;
    assert!(plan.events.is_empty(), "{:?}", plan.events);
    assert_eq!(policy_status(&ds, "p2").await.node, "n1");

    // n1 stops heartbeating: both EIPs move to n2, each with a new epoch.
    set_phase(&ds, "n1", TunnelPhase::HeartbeatTimeout).await;
    let plan = pass(&ds).await;
    assert_eq!(policy_status(&ds, "p1").await.node, "n2");
    assert_eq!(policy_status(&ds, "p2").await.node, "n2");
    let st = gw_status(&ds, "g1").await;
    assert_eq!(st.epoch, 4);
    let epochs: Vec<u64> = st
        .node_list
        .iter()
        .flat_map(|n| n.eips.iter().map(|e| e.epoch))
        .collect();
    assert!(epochs.iter().all(|e| *e > e0), "{epochs:?}");
    assert_eq!(
        plan.events
            .iter()
            .filter(|e| e.reason == "EipMoved")
            .count(),
        2
    );
    assert!(plan.events[0]
        .message
        .contains("from node n1 (HeartbeatTimeout) to node n2"));
    // The same moves as plain data, for the failover counter.
    assert_eq!(plan.moves.len(), 2, "{:?}", plan.moves);
    assert!(plan.moves.iter().all(|m| m.from == "n1"
        && m.to == "n2"
        && m.gateway == "g1"
        && m.reason == FailoverReason::HeartbeatTimeout));

    // n1 comes back: nothing moves back (no flapping).
    set_phase(&ds, "n1", TunnelPhase::Ready).await;
    let plan = pass(&ds).await;
    assert!(plan.events.is_empty());
    assert!(plan.moves.is_empty());
    assert_eq!(policy_status(&ds, "p1").await.node, "n2");

    // A third policy goes to the node with the fewest EIPs: n1.
    Setup::new()
        .g1_policy("p3", 9, json!({"allocatorPolicy": "rr"}), "p3")
        .add_to(&ds)
        .await;
    pass(&ds).await;
    let p3 = policy_status(&ds, "p3").await;
    assert_eq!((p3.eip.ipv4.as_str(), p3.node.as_str()), ("10.0.0.3", "n1"));
    assert_eq!(gw_status(&ds, "g1").await.ip_usage.ipv4_free, 1);
}

/// The epoch of `eip` on `node` in the gateway's status.
async fn epoch_of(ds: &MemoryDatastore, gateway: &str, node: &str, eip: &str) -> Option<u64> {
    gw_status(ds, gateway)
        .await
        .node_list
        .iter()
        .filter(|n| n.name == node)
        .flat_map(|n| &n.eips)
        .find(|e| e.ipv4 == eip)
        .map(|e| e.epoch)
}

/// What the agent writes when it withholds EIPs after fencing itself.
async fn ask_reconfirmation(ds: &MemoryDatastore, node: &str, asked: &[(&str, u64)]) {
    let asked: Vec<_> = asked
        .iter()
        .map(|(eip, epoch)| json!({"eip": eip, "epoch": epoch}))
        .collect();
    ds.write_status(
        Kind::EgressTunnel,
        &ObjectKey::cluster(node),
        &StatusPatch::owning_all(
            crate::registration::RECONFIRMATION_MANAGER,
            json!({"awaitingReconfirmation": asked}),
        ),
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn a_node_that_fenced_itself_gets_its_eips_reconfirmed_with_a_new_epoch() {
    let ds = gateway_with_two_policies(&["n1", "n2"]).await;
    let p1 = policy_status(&ds, "p1").await;
    let (eip, owner) = (p1.eip.ipv4.clone(), p1.node.clone());
    let e0 = epoch_of(&ds, "g1", &owner, &eip).await.unwrap();
    let other = policy_status(&ds, "p2").await;
    let other_epoch = epoch_of(&ds, "g1", &other.node, &other.eip.ipv4).await;

    // A request for another epoch (an older one, already answered) or
    // another address: nothing changes.
    ask_reconfirmation(&ds, &owner, &[(&eip, e0 - 1), ("10.0.0.9", e0)]).await;
    let plan = pass(&ds).await;
    assert!(plan.events.is_empty(), "{:?}", plan.events);
    assert_eq!(epoch_of(&ds, "g1", &owner, &eip).await, Some(e0));

    // The owner asks for its EIP at the epoch it holds: same node, a newer
    // epoch; the other policy's EIP keeps its own.
    ask_reconfirmation(&ds, &owner, &[(&eip, e0)]).await;
    let plan = pass(&ds).await;
    let e1 = epoch_of(&ds, "g1", &owner, &eip).await.unwrap();
    assert!(e1 > e0, "{e1} after {e0}");
    assert_eq!(policy_status(&ds, "p1").await.node, owner, "not moved");
    assert!(plan.moves.is_empty());
    assert_eq!(
        plan.events
            .iter()
            .map(|e| e.reason.as_str())
            .collect::<Vec<_>>(),
        ["EipReconfirmed"]
    );
    assert_eq!(
        epoch_of(&ds, "g1", &other.node, &other.eip.ipv4).await,
        other_epoch
    );

    // The request stays until the agent clears it, but it names the old
    // epoch now: answered once.
    let plan = pass(&ds).await;
    assert!(plan.events.is_empty(), "{:?}", plan.events);
    assert_eq!(epoch_of(&ds, "g1", &owner, &eip).await, Some(e1));

    // A node that is not Ready is not reconfirmed: its EIP moves.
    ask_reconfirmation(&ds, &owner, &[(&eip, e1)]).await;
    set_phase(&ds, &owner, TunnelPhase::HeartbeatTimeout).await;
    pass(&ds).await;
    assert_ne!(policy_status(&ds, "p1").await.node, owner);
}

#[tokio::test]
async fn conflicting_explicit_pairs_precedence_by_priority_then_age() {
    // Two policies claim 10.0.0.1 with different IPv6 partners: the pair of
    // the policy with precedence wins, the other gets a condition.
    let cases = [
        // (priority a, age a, priority b, age b, winner)
        (Some(10), 5, Some(20), 1, "a"),
        (Some(20), 1, Some(10), 5, "b"),
        (None, 1, None, 5, "a"),
        (None, 5, None, 1, "b"),
        (Some(5), 9, None, 1, "a"),
    ];
    for (pa, aa, pb, ab, winner) in cases {
        let mut g = gateway("g1", 1, &["10.0.0.1-10.0.0.2"], "", "a");
        g["spec"]["ippools"]["ipv6"] = json!(["fd00::1-fd00::2"]);
        let pair = |v6: &str| json!({"ipv4": "10.0.0.1", "ipv6": v6});
        let ds = Setup::new()
            .gateway(g)
            .gateway_nodes(&["n1"], TunnelPhase::Ready)
            .policy(policy("a", aa, "g1", pair("fd00::1"), "x", pa))
            .policy(policy("b", ab, "g1", pair("fd00::2"), "y", pb))
            .create()
            .await;
        pass(&ds).await;
        let loser = if winner == "a" { "b" } else { "a" };
        let w = policy_status(&ds, winner).await;
        let l = policy_status(&ds, loser).await;
        assert_eq!(w.eip.ipv4, "10.0.0.1", "{pa:?}/{aa} vs {pb:?}/{ab}");
        assert!(l.eip.ipv4.is_empty());
        assert!(
            l.conditions.iter().any(|c| c.reason == "EipConflict"
                && c.message.contains(&format!("by policy default/{winner}"))),
            "{:?}",
            l.conditions
        );
    }
}

#[test]
fn whole_blocks_lie_inside_the_range() {
    assert_eq!(whole_blocks(61000, 65535, 1024), 60..64);
    assert_eq!(whole_blocks(1024, 65535, 1024), 1..64);
    assert_eq!(whole_blocks(0, 65535, 64), 0..1024);
    assert_eq!(whole_blocks(49152, 65535, 4096), 12..16);
    assert!(whole_blocks(61000, 61100, 1024).is_empty());
    assert!(whole_blocks(61000, 61000, 64).is_empty());
}

/// The set-up of gateway `g1` with the one address 10.0.0.1 on the Ready
/// node `gw`, and the Ready worker nodes `workers`.
pub(crate) fn one_eip_gateway(workers: &[&str]) -> Setup {
    Setup::new()
        .g1(&["10.0.0.1"])
        .gateway_nodes(&["gw"], TunnelPhase::Ready)
        .workers(workers)
}

/// A gateway node's own address hands out blocks only from the reserved
/// range (61000-65535: blocks 60-63 of 1024 ports), never its listeners'
/// or ephemeral ports; an EIP of the same gateway still from block 1.
#[tokio::test]
async fn node_ip_blocks_come_only_from_the_reserved_range() {
    let workers = ["w1", "w2", "w3", "w4", "w5"];
    let mut setup = one_eip_gateway(&workers)
        .g1_policy("n", 1, json!({"useNodeIP": true}), "web")
        .g1_policy("e", 1, json!({}), "db");
    for (i, w) in workers.iter().enumerate() {
        setup = setup.pod(&format!("web{i}"), "web", w, &format!("10.244.{}.2", i + 1));
    }
    let ds = setup.pod("db", "db", "w1", "10.244.1.3").create().await;
    let big = ControllerConfig {
        port_block_size: 1024,
        ..Default::default()
    };
    let plan = pass_with(&ds, &big).await;
    let g = grants(&ds).await;
    let node_ip: Vec<_> = g
        .iter()
        .filter(|((_, addr), _)| addr != "10.0.0.1")
        .collect();
    let blocks: BTreeSet<u16> = node_ip
        .iter()
        .flat_map(|(_, b)| b.iter().copied())
        .collect();
    assert_eq!(blocks, (60..64).collect(), "{g:?}");
    assert_eq!(
        node_ip.iter().filter(|(_, b)| !b.is_empty()).count(),
        4,
        "four whole blocks for five workers: {g:?}"
    );
    // The fifth is told it has none (its agent refuses new flows at once).
    let view = load_view(&ds).await.unwrap();
    let refused: Vec<&str> = view
        .tunnels
        .iter()
        .filter(|t| {
            t.status
                .iter()
                .flat_map(|s| &s.port_blocks)
                .any(|b| b.exhausted && b.blocks.is_empty())
        })
        .filter_map(|t| t.metadata.name.as_deref())
        .collect();
    assert_eq!(refused.len(), 1, "{g:?}");
    assert!(
        plan.events
            .iter()
            .any(|e| e.reason == "PortBlocksExhausted"),
        "{:?}",
        plan.events
    );
    assert_eq!(
        g.get(&("w1".to_string(), "10.0.0.1".to_string())),
        Some(&vec![1])
    );
}

/// Every node gets an EgressTunnel from the controller (on Kubernetes the
/// agent may not create one); only a node whose agent registered its
/// tunnel (an address in its status) draws port blocks.
#[tokio::test]
async fn the_controller_creates_a_tunnel_per_node_and_grants_only_registered_ones() {
    // w2 and w3: Nodes without a tunnel (no agent yet, or one that may not create it).
    let ds = one_eip_gateway(&["w1"])
        .bare_node("w2")
        .bare_node("w3")
        .g1_policy("p", 1, json!({}), "web")
        .pod("a", "web", "w1", "10.244.1.2")
        .pod("b", "web", "w2", "10.244.2.2")
        .create()
        .await;
    let plan = pass(&ds).await;
    assert_eq!(plan.new_tunnels, ["w2", "w3"]);
    let view = load_view(&ds).await.unwrap();
    for w in ["w2", "w3"] {
        let t = view.tunnel(w).expect("created by the controller");
        assert!(t.status.as_ref().is_none_or(|s| s.tunnel.ipv4.is_empty()));
    }
    let eip = |n: &str| (n.to_string(), "10.0.0.1".to_string());
    let plan = pass(&ds).await;
    assert!(plan.new_tunnels.is_empty());
    assert_eq!(
        grants(&ds).await,
        BTreeMap::from([(eip("w1"), vec![16])]),
        "w2 has a tunnel now, but no agent registered it"
    );
    // w2's agent registers (its address in the status): w2 draws a block.
    set_phase(&ds, "w2", TunnelPhase::Ready).await;
    pass(&ds).await;
    assert_eq!(
        grants(&ds).await,
        BTreeMap::from([(eip("w1"), vec![16]), (eip("w2"), vec![17])])
    );
}

#[tokio::test]
async fn port_blocks_on_demand_and_taken_back() {
    let ds = one_eip_gateway(&["w1", "w2"])
        .g1_policy("p", 1, json!({}), "web")
        .create()
        .await;
    pass(&ds).await;
    assert!(grants(&ds).await.is_empty(), "no pods, no blocks");

    Setup::new()
        .pod("a", "web", "w1", "10.244.1.2")
        .pod("b", "web", "w2", "10.244.2.2")
        .pod("c", "web", "w2", "10.244.2.3")
        .pod("other", "db", "gw", "10.244.0.2")
        .add_to(&ds)
        .await;
    pass(&ds).await;
    let eip = |n: &str| (n.to_string(), "10.0.0.1".to_string());
    assert_eq!(
        grants(&ds).await,
        BTreeMap::from([(eip("w1"), vec![16]), (eip("w2"), vec![17])])
    );
    // Each grant names its gateway and block size, in the worker's tunnel.
    let view = load_view(&ds).await.unwrap();
    let w1 = view.tunnel("w1").unwrap().status.clone().unwrap();
    assert_eq!(w1.port_block_size, 64);
    assert_eq!(w1.port_blocks[0].gateway, "g1");
    assert_eq!(w1.tunnel.ipv4, "192.168.0.1", "the agent's fields are kept");

    // w1's last pod goes: its block drains (still w1's, so replies to its
    // flows still reach it); w2 keeps its own. Only w1's small record is
    // written: the gateway's status does not change.
    ds.delete(Kind::Pod, &ObjectKey::namespaced("default", "a"), None)
        .await
        .unwrap();
    let view = load_view(&ds).await.unwrap();
    let plan = reconcile(&view, &ControllerConfig::default());
    let written = write_plan_stored(&ds, &view, &plan).await.unwrap();
    assert_eq!(
        written
            .iter()
            .map(|s| (s.kind, s.key.name.as_str()))
            .collect::<Vec<_>>(),
        [(Kind::EgressTunnel, "w1")]
    );
    let held = |ds: &MemoryDatastore| {
        let ds = ds.clone();
        async move {
            let view = load_view(&ds).await.unwrap();
            view.tunnel("w1").unwrap().status.clone().unwrap()
        }
    };
    let w1 = held(&ds).await;
    assert_eq!(
        (
            w1.port_blocks[0].blocks.clone(),
            w1.port_blocks[0].draining.clone()
        ),
        (vec![16], vec![16])
    );
    // A new worker meanwhile gets another block, not w1's draining one.
    Setup::new()
        .pod("d", "web", "gw", "10.244.0.3")
        .add_to(&ds)
        .await;
    pass(&ds).await;
    assert_eq!(grants(&ds).await[&eip("gw")], vec![18]);
    // w1's agent reports the block emptied: it goes back to the pool.
    let released = EipPortUse {
        gateway: "g1".into(),
        eip: "10.0.0.1".into(),
        in_use: 0,
        released: vec![16],
    };
    publish_port_use(&ds, "w1", &[released]).await.unwrap();
    pass(&ds).await;
    let w1 = held(&ds).await;
    assert!(
        w1.port_blocks.is_empty() && w1.port_block_size == 0,
        "{w1:?}"
    );
    assert_eq!(w1.phase, TunnelPhase::Ready, "the phase is kept");
    // Nothing changed: nothing is written.
    let view = load_view(&ds).await.unwrap();
    let plan = reconcile(&view, &ControllerConfig::default());
    assert!(write_plan_stored(&ds, &view, &plan)
        .await
        .unwrap()
        .is_empty());

    // A pod on a node without an EgressTunnel (no agent) gets no block.
    Setup::new()
        .bare_node("bare")
        .pod("e", "web", "bare", "10.244.3.2")
        .add_to(&ds)
        .await;
    pass(&ds).await;
    assert_eq!(grants(&ds).await.len(), 2);
}

#[tokio::test]
async fn status_writes_survive_conflicts_and_invalid_objects_harm_nothing() {
    let mut bad = policy("bad", 2, "g1", json!({}), "y", None);
    bad["spec"]["appliedTo"]["podSubnet"] = json!(["10.244.0.0/33"]);
    let ds = Setup::new()
        .g1(&["10.0.0.1-10.0.0.2"])
        .gateway_nodes(&["n1"], TunnelPhase::Ready)
        .g1_policy("good", 1, json!({}), "x")
        .policy(bad)
        .create()
        .await;

    // Two writes are refused with a conflict first, as if another writer won.
    ds.inject_conflicts(2);
    let view = load_view(&ds).await.unwrap();
    let plan = reconcile(&view, &ControllerConfig::default());
    assert!(
        write_plan(&ds, &view, &plan).await.is_err(),
        "a conflict surfaces"
    );
    // The loop's next pass retries from fresh state and gets through.
    let mut monitor = HeartbeatMonitor::new(tokio::time::Instant::now().into_std());
    let cfg = RunConfig::default();
    let mut cache = ViewCache::start_for_controller(&ds).await.unwrap();
    let mut tries = 0;
    while tick_cached_report(&ds, &mut cache, &mut monitor, &cfg)
        .await
        .is_err()
    {
        tries += 1;
        assert!(tries < 3);
    }
    let good = policy_status(&ds, "good").await;
    assert_eq!(
        (good.eip.ipv4.as_str(), good.node.as_str()),
        ("10.0.0.1", "n1")
    );
    let bad = policy_status(&ds, "bad").await;
    assert!(bad.node.is_empty());
    let c = &bad.conditions[0];
    assert!(
        c.message
            .contains("spec.appliedTo: podSelector and podSubnet are both set"),
        "{c:?}"
    );
    assert!(
        c.message
            .contains("spec.appliedTo.podSubnet[0]: \"10.244.0.0/33\" is not a valid CIDR"),
        "{c:?}"
    );
    let events = ds.events().await.unwrap();
    assert_eq!(
        events.iter().filter(|e| e.reason == "InvalidSpec").count(),
        1,
        "{events:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn heartbeat_timeout_and_recovery() {
    use std::time::Duration;
    let ds = Setup::new()
        .g1(&["10.0.0.1"])
        .gateway_nodes(&["n1", "n2"], TunnelPhase::Init)
        .node("w", "-", TunnelPhase::Pending)
        .g1_policy("p", 1, json!({}), "x")
        .create()
        .await;
    let cfg = RunConfig {
        timers: egress_failover::FailoverTimers {
            tunnel_update_period: Duration::from_millis(100),
            tunnel_monitor_period: Duration::from_millis(100),
            eip_eviction_timeout: Duration::from_millis(300),
        },
        ..Default::default()
    };
    let mut mon = HeartbeatMonitor::new(tokio::time::Instant::now().into_std());
    let mut cache = ViewCache::start_for_controller(&ds).await.unwrap();
    for n in ["n1", "n2"] {
        ds.renew_heartbeat(n, Duration::from_secs(1)).await.unwrap();
    }
    tick_cached_report(&ds, &mut cache, &mut mon, &cfg)
        .await
        .unwrap();
    let view = load_view(&ds).await.unwrap();
    assert_eq!(view.phase("n1"), TunnelPhase::Ready);
    assert_eq!(
        view.phase("w"),
        TunnelPhase::Ready,
        "non-gateway nodes need no heartbeat"
    );
    assert_eq!(policy_status(&ds, "p").await.node, "n1");

    // n2 keeps heartbeating, n1 stops.
    for _ in 0..4 {
        tokio::time::advance(Duration::from_millis(100)).await;
        ds.renew_heartbeat("n2", Duration::from_secs(1))
            .await
            .unwrap();
        tick_cached_report(&ds, &mut cache, &mut mon, &cfg)
            .await
            .unwrap();
    }
    let view = load_view(&ds).await.unwrap();
    assert_eq!(view.phase("n1"), TunnelPhase::HeartbeatTimeout);
    assert_eq!(policy_status(&ds, "p").await.node, "n2");
    let events = ds.events().await.unwrap();
    assert!(events
        .iter()
        .any(|e| e.message == "EgressTunnel n1 status changes to HeartbeatTimeout"));

    ds.renew_heartbeat("n1", Duration::from_secs(1))
        .await
        .unwrap();
    tick_cached_report(&ds, &mut cache, &mut mon, &cfg)
        .await
        .unwrap();
    assert_eq!(
        load_view(&ds).await.unwrap().phase("n1"),
        TunnelPhase::Ready
    );
    assert_eq!(policy_status(&ds, "p").await.node, "n2", "no move back");
}

#[tokio::test(start_paused = true)]
async fn only_the_leader_writes() {
    use std::sync::Arc;
    use std::time::Duration;
    let ds = Setup::new().g1(&["10.0.0.1"]).create().await;
    let other = ds
        .try_acquire(run::ELECTION, "someone-else", Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let dsa: Arc<dyn Datastore> = Arc::new(ds.clone());
    let h = tokio::spawn(run_controller(
        dsa,
        RunConfig {
            identity: "me".into(),
            lease_ttl: Duration::from_secs(3),
            ..Default::default()
        },
        async {
            let _ = rx.await;
        },
    ));
    tokio::time::sleep(Duration::from_secs(10)).await; // paused clock: virtual time
    assert!(
        gw_status(&ds, "g1").await == EgressGatewayStatus::default(),
        "a follower wrote"
    );
    ds.resign(&other).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        ds.leader(run::ELECTION).await.unwrap().unwrap().identity,
        "me"
    );
    assert_eq!(
        gw_status(&ds, "g1").await.port_block_size,
        64,
        "the leader wrote"
    );
    tx.send(()).unwrap();
    h.await.unwrap().unwrap();
    assert!(
        ds.leader(run::ELECTION).await.unwrap().is_none(),
        "resigned on shutdown"
    );
}

#[tokio::test]
async fn cached_passes_see_their_own_writes_at_once() {
    let ds = Setup::new()
        .g1(&["10.0.0.1-10.0.0.2"])
        .gateway_nodes(&["n1"], TunnelPhase::Ready)
        .g1_policy("p", 1, json!({}), "x")
        .create()
        .await;
    let cfg = RunConfig::default();
    let mut mon = HeartbeatMonitor::new(tokio::time::Instant::now().into_std());
    let mut cache = ViewCache::start_for_controller(&ds).await.unwrap();
    assert!(
        tick_cached_report(&ds, &mut cache, &mut mon, &cfg)
            .await
            .unwrap()
            .writes
            > 0
    );
    // No watch event applied yet: the pass still sees its own writes.
    assert_eq!(
        tick_cached_report(&ds, &mut cache, &mut mon, &cfg)
            .await
            .unwrap()
            .writes,
        0
    );
    let assigned =
        |evs: &[crate::datastore::Event]| evs.iter().filter(|e| e.reason == "EipAssigned").count();
    assert_eq!(assigned(&ds.events().await.unwrap()), 1);
    // Then the watch delivers the same writes: still nothing to do.
    cache.next_batch().await.unwrap().unwrap();
    assert_eq!(
        tick_cached_report(&ds, &mut cache, &mut mon, &cfg)
            .await
            .unwrap()
            .writes,
        0
    );
    assert_eq!(gw_status(&ds, "g1").await.epoch, 1);
    // A change from outside reaches the cache through the watch.
    Setup::new()
        .g1_policy("q", 2, json!({"allocatorPolicy": "rr"}), "y")
        .add_to(&ds)
        .await;
    while !cache
        .view
        .policies
        .iter()
        .any(|p| p.metadata.name.as_deref() == Some("q"))
    {
        cache.next_batch().await.unwrap().unwrap();
    }
    assert!(
        tick_cached_report(&ds, &mut cache, &mut mon, &cfg)
            .await
            .unwrap()
            .writes
            > 0
    );
    assert_eq!(policy_status(&ds, "q").await.eip.ipv4, "10.0.0.2");
}

#[tokio::test(start_paused = true)]
async fn a_deposed_leader_cannot_write() {
    use std::time::Duration;
    let ds = Setup::new().g1(&["10.0.0.1"]).create().await;
    let old = ds.handle();
    let new = ds.handle();
    let lead = old
        .try_acquire("e", "old", Duration::from_secs(2))
        .await
        .unwrap()
        .unwrap();
    old.fence(Some(&lead)).await.unwrap();
    let w = |st: serde_json::Value| StatusPatch::owning_all("c", st);
    old.write_status(
        Kind::EgressGateway,
        &ObjectKey::cluster("g1"),
        &w(json!({"epoch": 1})),
    )
    .await
    .unwrap();
    // The old leader stalls past its lease; another replica takes over.
    tokio::time::advance(Duration::from_secs(3)).await;
    let l2 = new
        .try_acquire("e", "new", Duration::from_secs(2))
        .await
        .unwrap()
        .unwrap();
    assert!(l2.term > lead.term);
    new.fence(Some(&l2)).await.unwrap();
    let e = old
        .write_status(
            Kind::EgressGateway,
            &ObjectKey::cluster("g1"),
            &w(json!({"epoch": 99})),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(e, crate::datastore::DatastoreError::LostLeadership { .. }),
        "{e}"
    );
    new.write_status(
        Kind::EgressGateway,
        &ObjectKey::cluster("g1"),
        &w(json!({"epoch": 2})),
    )
    .await
    .unwrap();
    assert_eq!(gw_status(&ds, "g1").await.epoch, 2);
}

#[tokio::test]
async fn failover_reasons_follow_the_old_nodes_phase() {
    let ds = Setup::new()
        .g1(&["10.0.0.1-10.0.0.4"])
        .gateway_nodes(&["n1"], TunnelPhase::Ready)
        .g1_policy("p1", 1, json!({}), "p1")
        .create()
        .await;
    let plan = pass(&ds).await;
    assert!(plan.moves.is_empty(), "a first assignment is no failover");
    add_node(&ds, &node("n2", "a"), TunnelPhase::Ready).await;
    pass(&ds).await;

    // A failed datapath probe on n1: the EIP moves, reason probe_failed.
    set_phase(&ds, "n1", TunnelPhase::Failed).await;
    let plan = pass(&ds).await;
    assert_eq!(plan.moves.len(), 1, "{:?}", plan.moves);
    assert_eq!(plan.moves[0].reason, FailoverReason::ProbeFailed);
    assert_eq!(plan.moves[0].what, "EIP 10.0.0.1");
    assert_eq!(
        (plan.moves[0].from.as_str(), plan.moves[0].to.as_str()),
        ("n1", "n2")
    );
    // Written: the next pass moves nothing again.
    assert!(pass(&ds).await.moves.is_empty());

    // n2 is deleted while n1 is Ready again: node_removed.
    set_phase(&ds, "n1", TunnelPhase::Ready).await;
    ds.delete(Kind::Node, &ObjectKey::cluster("n2"), None)
        .await
        .unwrap();
    let plan = pass(&ds).await;
    assert_eq!(plan.moves.len(), 1, "{:?}", plan.moves);
    assert_eq!(plan.moves[0].reason, FailoverReason::NodeRemoved);
    assert_eq!(FailoverReason::NodeRemoved.as_str(), "node_removed");
    assert_eq!(
        FailoverReason::of(TunnelPhase::NodeNotReady, true),
        FailoverReason::NodeNotReady
    );
}
