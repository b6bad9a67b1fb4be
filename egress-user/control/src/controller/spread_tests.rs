//! ActiveActive gateways: refused without BGP; every Ready node holds every
//! EIP at one epoch, which grows whenever the set of nodes changes.

use serde_json::json;

use super::tests::{gateway, gw_status, pass_with, policy_status, set_phase, Setup};
use super::*;
use crate::agent_state::{desired, AgentConfig};
use crate::api::*;
use crate::datastore::Datastore;
use crate::view::load_view;

fn bgp() -> ControllerConfig {
    ControllerConfig {
        bgp: true,
        ..Default::default()
    }
}

/// Gateway `g1` in ActiveActive mode over the nodes labelled `a`: three
/// Ready gateway nodes, one worker with a selected pod.
fn active_active() -> Setup {
    let mut g = gateway("g1", 1, &["10.0.0.1"], "", "a");
    g["spec"]["mode"] = json!("ActiveActive");
    Setup::new()
        .gateway(g)
        .gateway_nodes(&["gw1", "gw2", "gw3"], TunnelPhase::Ready)
        .workers(&["w1"])
        .g1_policy("p", 1, json!({}), "web")
        .pod("a", "web", "w1", "10.244.1.2")
}

/// (node, epoch) of every node listing 10.0.0.1 in the gateway's status.
async fn holders(ds: &crate::datastore::memory::MemoryDatastore) -> Vec<(String, u64)> {
    gw_status(ds, "g1")
        .await
        .node_list
        .iter()
        .flat_map(|n| {
            n.eips
                .iter()
                .filter(|e| e.ipv4 == "10.0.0.1")
                .map(|e| (n.name.clone(), e.epoch))
        })
        .collect()
}

#[tokio::test]
async fn active_active_without_bgp_is_refused_naming_the_field() {
    let ds = active_active().create().await;
    pass_with(&ds, &ControllerConfig::default()).await;
    let st = gw_status(&ds, "g1").await;
    let c = st
        .conditions
        .iter()
        .find(|c| c.type_ == "Valid")
        .expect("a Valid condition");
    assert_eq!(c.reason, "InvalidSpec");
    assert!(
        c.message.contains("spec.mode") && c.message.contains("BGP"),
        "{c:?}"
    );
    assert!(holders(&ds).await.is_empty(), "nothing placed");
    let p = policy_status(&ds, "p").await;
    assert!(p.node.is_empty() && p.nodes.is_empty(), "{p:?}");
}

#[tokio::test]
async fn every_ready_node_holds_the_eip_at_one_epoch() {
    let ds = active_active().create().await;
    let plan = pass_with(&ds, &bgp()).await;
    let h = holders(&ds).await;
    let names: Vec<&str> = h.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["gw1", "gw2", "gw3"]);
    assert!(h.iter().all(|(_, e)| *e == h[0].1 && *e > 0), "{h:?}");
    let p = policy_status(&ds, "p").await;
    assert_eq!(p.nodes, ["gw1", "gw2", "gw3"]);
    assert!(p.node.is_empty());
    assert_eq!(p.eip.ipv4, "10.0.0.1");
    assert_eq!(
        plan.events
            .iter()
            .filter(|e| e.reason == "EipAssigned")
            .count(),
        1,
        "{:?}",
        plan.events
    );
    // A pass with nothing changed keeps the epoch and says nothing.
    let again = pass_with(&ds, &bgp()).await;
    assert_eq!(holders(&ds).await, h);
    assert!(again.events.iter().all(|e| !e.reason.starts_with("Eip")));

    // The worker spreads over all three; each gateway announces the EIP
    // as shared (BGP only, no ARP/NDP answers).
    let view = load_view(&ds).await.unwrap();
    let cfg = |n: &str| AgentConfig {
        node: n.into(),
        ..Default::default()
    };
    let w = desired(&view, &cfg("w1"));
    let t = w.policies.values().next().expect("the policy's target");
    let spread: Vec<&str> = t.spread.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(spread, ["gw1", "gw2", "gw3"]);
    assert!(t.spread.iter().all(|(_, e)| e.is_some()), "{t:?}");
    assert!(!t.local);
    for gw in ["gw1", "gw2", "gw3"] {
        let d = desired(&view, &cfg(gw));
        let owned = &d.owned_eips[&"10.0.0.1".parse().unwrap()];
        assert!(owned.shared && owned.epoch == h[0].1, "{gw}: {owned:?}");
    }
}

#[tokio::test]
async fn a_failed_node_leaves_the_set_at_a_higher_epoch_and_comes_back() {
    let ds = active_active().create().await;
    pass_with(&ds, &bgp()).await;
    let first = holders(&ds).await[0].1;

    set_phase(&ds, "gw2", TunnelPhase::HeartbeatTimeout).await;
    let plan = pass_with(&ds, &bgp()).await;
    let h = holders(&ds).await;
    assert_eq!(
        h.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
        ["gw1", "gw3"]
    );
    let second = h[0].1;
    assert!(second > first && h[1].1 == second, "{h:?}");
    assert_eq!(plan.moves.len(), 1, "{:?}", plan.moves);
    let m = &plan.moves[0];
    assert_eq!(
        (m.from.as_str(), m.reason),
        ("gw2", FailoverReason::HeartbeatTimeout)
    );
    assert_eq!(policy_status(&ds, "p").await.nodes, ["gw1", "gw3"]);

    set_phase(&ds, "gw2", TunnelPhase::Ready).await;
    pass_with(&ds, &bgp()).await;
    let h = holders(&ds).await;
    assert_eq!(h.len(), 3, "{h:?}");
    assert!(h.iter().all(|(_, e)| *e > second), "{h:?}");
}

#[tokio::test]
async fn with_no_ready_node_the_policy_waits_and_is_told() {
    let ds = active_active().create().await;
    pass_with(&ds, &bgp()).await;
    for gw in ["gw1", "gw2", "gw3"] {
        set_phase(&ds, gw, TunnelPhase::Failed).await;
    }
    let plan = pass_with(&ds, &bgp()).await;
    assert!(holders(&ds).await.is_empty());
    assert!(plan.events.iter().any(|e| e.reason == "NoReadyGatewayNode"));
    let p = policy_status(&ds, "p").await;
    assert!(p.nodes.is_empty() && p.node.is_empty(), "{p:?}");
    assert_eq!(plan.moves.len(), 0, "the set did not change: it has none");
}

#[tokio::test]
async fn a_node_address_stays_on_one_node_in_active_active_mode() {
    let ds = active_active()
        .g1_policy("n", 2, json!({"useNodeIP": true}), "web")
        .create()
        .await;
    pass_with(&ds, &bgp()).await;
    let st = gw_status(&ds, "g1").await;
    let node_ip_units = st
        .node_list
        .iter()
        .flat_map(|n| &n.eips)
        .filter(|e| e.ipv4.is_empty() && e.ipv6.is_empty())
        .count();
    assert_eq!(node_ip_units, 1, "{st:?}");
    let n = policy_status(&ds, "n").await;
    assert!(!n.node.is_empty() && n.nodes.is_empty(), "{n:?}");
}

#[tokio::test]
async fn switching_a_gateway_to_active_active_spreads_its_eip() {
    let ds = Setup::new()
        .gateway(gateway("g1", 1, &["10.0.0.1"], "", "a"))
        .gateway_nodes(&["gw1", "gw2"], TunnelPhase::Ready)
        .workers(&["w1"])
        .g1_policy("p", 1, json!({}), "web")
        .pod("a", "web", "w1", "10.244.1.2")
        .create()
        .await;
    pass_with(&ds, &bgp()).await;
    let before = holders(&ds).await;
    assert_eq!(before.len(), 1, "active-standby: one node");
    let mut g = gateway("g1", 1, &["10.0.0.1"], "", "a");
    g["spec"]["mode"] = json!("ActiveActive");
    let kind = crate::datastore::Kind::EgressGateway;
    let key = crate::datastore::ObjectKey::cluster("g1");
    let stored = ds.get(kind, &key).await.unwrap().unwrap();
    let mut value = stored.value.clone();
    value["spec"] = g["spec"].clone();
    ds.update(kind, value, stored.revision).await.unwrap();
    pass_with(&ds, &bgp()).await;
    let after = holders(&ds).await;
    assert_eq!(after.len(), 2, "{after:?}");
    assert!(after.iter().all(|(_, e)| *e > before[0].1), "{after:?}");
}
