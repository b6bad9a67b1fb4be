//! The over-capacity condition: derived from the agents' reports, kept
//! while they last, gone with them; one Event per change.

use super::*;
use crate::api::EgressPolicyStatus;
use crate::controller::tests::{gateway_with_two_policies, pass, policy_status};
use crate::datastore::{memory::MemoryDatastore, Datastore};
use crate::registration::publish_over_capacity;

fn report(name: &str, count: u64) -> PolicyOverCapacity {
    PolicyOverCapacity {
        kind: "EgressPolicy".into(),
        namespace: "default".into(),
        name: name.into(),
        limit: "destinationCIDRs".into(),
        count,
        max: 16384,
    }
}

fn over_capacity(s: &EgressPolicyStatus) -> Option<&Condition> {
    s.conditions.iter().find(|c| c.reason == OVER_CAPACITY)
}

async fn capacity_events(ds: &MemoryDatastore) -> Vec<Event> {
    let all = ds.events().await.unwrap();
    all.into_iter()
        .filter(|e| e.reason == OVER_CAPACITY)
        .collect()
}

#[test]
fn the_message_names_node_count_and_limit() {
    let r = report("p1", 20000);
    let c = condition(&[("w1", &r)]);
    assert_eq!((c.type_.as_str(), c.status.as_str()), ("Applied", "False"));
    assert!(
        c.message
            .starts_with("node w1: 20000 destination CIDRs, the datapath holds 16384"),
        "{}",
        c.message
    );
    let slots = PolicyOverCapacity {
        limit: "policySlots".into(),
        count: 1100,
        max: 1024,
        ..r
    };
    assert_eq!(
        describe("w2", &slots),
        "node w2: 1100 policies on the node, the datapath holds 1024"
    );
}

#[tokio::test]
async fn a_reported_policy_keeps_its_condition_while_the_report_stays() {
    let ds = gateway_with_two_policies(&["n1", "n2"]).await;
    assert!(over_capacity(&policy_status(&ds, "p1").await).is_none());
    publish_over_capacity(&ds, "n2", &[report("p1", 20000)])
        .await
        .unwrap();
    for round in 0..3 {
        pass(&ds).await;
        let st = policy_status(&ds, "p1").await;
        let c = over_capacity(&st).unwrap_or_else(|| panic!("pass {round}: {st:?}"));
        assert!(
            c.message.contains("node n2: 20000 destination CIDRs"),
            "{c:?}"
        );
        assert!(!st.eip.ipv4.is_empty(), "the rest of the status is kept");
        assert!(over_capacity(&policy_status(&ds, "p2").await).is_none());
    }
    let events = capacity_events(&ds).await;
    assert_eq!(events.len(), 1, "one Event, not one per pass: {events:?}");
    assert_eq!(events[0].key.name, "p1");
    assert_eq!(events[0].type_, "Warning");

    // A second node reports it too: the condition names both, a new Event.
    publish_over_capacity(&ds, "n1", &[report("p1", 20000)])
        .await
        .unwrap();
    pass(&ds).await;
    let c = over_capacity(&policy_status(&ds, "p1").await)
        .cloned()
        .unwrap();
    assert!(
        c.message.contains("node n1:") && c.message.contains("node n2:"),
        "{c:?}"
    );
    assert_eq!(capacity_events(&ds).await.len(), 2);

    // The cause gone on every node: the condition goes with it.
    publish_over_capacity(&ds, "n1", &[]).await.unwrap();
    publish_over_capacity(&ds, "n2", &[]).await.unwrap();
    pass(&ds).await;
    assert!(over_capacity(&policy_status(&ds, "p1").await).is_none());
    assert_eq!(
        capacity_events(&ds).await.len(),
        2,
        "no Event for the clearing"
    );
}

#[tokio::test]
async fn a_report_for_an_unknown_policy_changes_nothing() {
    let ds = gateway_with_two_policies(&["n1"]).await;
    publish_over_capacity(&ds, "n1", &[report("gone", 5)])
        .await
        .unwrap();
    let plan = pass(&ds).await;
    assert!(plan.events.is_empty(), "{:?}", plan.events);
}
