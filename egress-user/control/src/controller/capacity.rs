//! Policies that some node's datapath cannot hold: the agents publish them
//! (`status.overCapacity` of their EgressTunnel); here each such policy
//! gets an `Applied: False, reason: OverCapacity` condition naming the
//! nodes, the count and the limit, and an Event when that changes.
//! Derived from the current reports on every reconcile: the condition
//! stays exactly as long as some agent still reports the policy.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::api::{Condition, PolicyOverCapacity};
use crate::datastore::{Event, Kind, ObjectKey};

use super::plan::Plan;
use crate::view::ClusterView;

/// Condition type and reason, and the Event's reason.
pub const APPLIED: &str = "Applied";
pub const OVER_CAPACITY: &str = "OverCapacity";

/// What one node reports about one policy.
type Report<'a> = (&'a str, &'a PolicyOverCapacity);

/// Every report, per policy; nodes in name order.
fn reports(view: &ClusterView) -> BTreeMap<(Kind, ObjectKey), Vec<Report<'_>>> {
    let mut out: BTreeMap<_, Vec<Report<'_>>> = BTreeMap::new();
    for t in &view.tunnels {
        let (Some(node), Some(st)) = (t.metadata.name.as_deref(), t.status.as_ref()) else {
            continue;
        };
        for r in &st.over_capacity {
            let Some(kind) = Kind::parse(&r.kind) else {
                continue;
            };
            let key = if r.namespace.is_empty() {
                ObjectKey::cluster(&r.name)
            } else {
                ObjectKey::namespaced(&r.namespace, &r.name)
            };
            out.entry((kind, key)).or_default().push((node, r));
        }
    }
    for v in out.values_mut() {
        v.sort();
    }
    out
}

/// How one report reads: "node w1: 20000 destination CIDRs, the datapath holds 16384".
pub fn describe(node: &str, r: &PolicyOverCapacity) -> String {
    let what = match r.limit.as_str() {
        "policySlots" => "policies on the node",
        "destinationCIDRs" => "destination CIDRs",
        "sourcePods" => "source pods and subnets",
        "eips" => "EIPs in use on the node",
        other => other,
    };
    format!(
        "node {node}: {} {what}, the datapath holds {}",
        r.count, r.max
    )
}

/// The condition of a policy with these reports.
pub fn condition(reports: &[Report<'_>]) -> Condition {
    let parts: Vec<String> = reports.iter().map(|(n, r)| describe(n, r)).collect();
    Condition {
        type_: APPLIED.into(),
        status: "False".into(),
        reason: OVER_CAPACITY.into(),
        message: format!(
            "{}; its pods' traffic to its destinations is dropped there",
            parts.join("; ")
        ),
    }
}

/// Adds the condition (and, when it is new or changed, an Event) to every
/// planned policy status that some node reports.
pub fn fold_into(view: &ClusterView, plan: &mut Plan) {
    let reports = reports(view);
    if reports.is_empty() {
        return;
    }
    let before: BTreeMap<(Kind, ObjectKey), &[Condition]> = view
        .policy_views()
        .into_iter()
        .filter_map(|p| Some(((p.kind, p.key.clone()), &p.status?.conditions[..])))
        .collect();
    for (k, status) in Arc::make_mut(&mut plan.policies).iter_mut() {
        let Some(r) = reports.get(k) else {
            continue;
        };
        let c = condition(r);
        if !before.get(k).is_some_and(|old| old.contains(&c)) {
            plan.events.push(Event::warning(
                k.0,
                k.1.clone(),
                OVER_CAPACITY,
                c.message.clone(),
            ));
        }
        status.conditions.push(c);
    }
}

#[cfg(test)]
mod tests;
