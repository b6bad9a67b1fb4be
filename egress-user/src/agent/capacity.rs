//! The policies this node's maps could not hold, as the agent publishes
//! them (its EgressTunnel's `status.overCapacity`, the
//! `egress_policy_over_capacity` metric) and decides when to write them.

use std::collections::BTreeMap;

use egress_control::{agent_state::PolicyTarget, api::PolicyOverCapacity};

use crate::datapath::capacity::OverCapacity;

/// The translation's left-out policies, named; sorted, one per policy.
/// Ids the node does not know (none in practice) are left out.
pub fn reports(
    over: &[OverCapacity],
    targets: &BTreeMap<u32, PolicyTarget>,
) -> Vec<PolicyOverCapacity> {
    let mut out: Vec<PolicyOverCapacity> = over
        .iter()
        .filter_map(|o| {
            let t = targets.get(&o.policy_id)?;
            Some(PolicyOverCapacity {
                kind: t.kind.name().into(),
                namespace: t.key.namespace.clone(),
                name: t.key.name.clone(),
                limit: o.limit.as_str().into(),
                count: o.count as u64,
                max: o.max as u64,
            })
        })
        .collect();
    out.sort();
    out.dedup_by(|a, b| (&a.kind, &a.namespace, &a.name) == (&b.kind, &b.namespace, &b.name));
    out
}

/// Whether `now` must be written: it differs from what the datastore
/// holds (`stored`) and was not just written (`published`; the view may
/// not show the write yet).
pub fn must_publish(
    now: &[PolicyOverCapacity],
    stored: &[PolicyOverCapacity],
    published: Option<&[PolicyOverCapacity]>,
) -> bool {
    now != stored && published != Some(now)
}

/// The metric's label of a report: "kind/namespace/name", as the policy
/// counters name policies.
pub fn policy_label(r: &PolicyOverCapacity) -> String {
    format!("{}/{}/{}", r.kind, r.namespace, r.name)
}

#[cfg(test)]
mod tests {
    use egress_control::datastore::{Kind, ObjectKey};

    use super::*;
    use crate::datapath::capacity::Limit;

    fn target(name: &str) -> PolicyTarget {
        PolicyTarget {
            kind: Kind::EgressPolicy,
            key: ObjectKey::namespaced("ns", name),
            eip_v4: None,
            eip_v6: None,
            gateway_node: String::new(),
            tunnel_endpoint: None,
            spread: Vec::new(),
            local: false,
            use_node_ip: false,
            epoch: 0,
            rank: 0,
            excluded: Vec::new(),
        }
    }

    #[test]
    fn left_out_policies_are_named_with_their_limit() {
        let targets = BTreeMap::from([(7, target("big")), (8, target("late"))]);
        let over = [
            OverCapacity {
                policy_id: 8,
                limit: Limit::PolicySlots,
                count: 1100,
                max: 1024,
            },
            OverCapacity {
                policy_id: 7,
                limit: Limit::DestinationCidrs,
                count: 20000,
                max: 16384,
            },
            OverCapacity {
                policy_id: 99,
                limit: Limit::PolicySlots,
                count: 1100,
                max: 1024,
            },
        ];
        let r = reports(&over, &targets);
        assert_eq!(r.len(), 2, "{r:?}");
        assert_eq!(
            (
                r[0].name.as_str(),
                r[0].limit.as_str(),
                r[0].count,
                r[0].max
            ),
            ("big", "destinationCIDRs", 20000, 16384)
        );
        assert_eq!(
            (r[1].name.as_str(), r[1].limit.as_str()),
            ("late", "policySlots")
        );
        assert_eq!(policy_label(&r[0]), "EgressPolicy/ns/big");
    }

    #[test]
    fn written_when_it_differs_from_the_store_and_was_not_just_written() {
        let targets = BTreeMap::from([(7, target("big"))]);
        let one = reports(
            &[OverCapacity {
                policy_id: 7,
                limit: Limit::SourcePods,
                count: 9,
                max: 4,
            }],
            &targets,
        );
        assert!(must_publish(&one, &[], None));
        assert!(
            !must_publish(&one, &[], Some(&one)),
            "written, not yet seen"
        );
        assert!(!must_publish(&one, &one, None), "the store has it");
        assert!(
            must_publish(&[], &one, Some(&one)),
            "the cause is gone: clear it"
        );
        assert!(!must_publish(&[], &[], None));
    }
}
