//! The conditions a reconcile pass puts on policy statuses, and the rule
//! that a refusal is also an Event the first time it is seen.

use crate::api::{Condition, EgressPolicyStatus, PolicyRef};
use crate::datastore::Event;
use crate::view::PolicyView;

use super::plan::Plan;

/// A status condition (`status` "True" when `ok`).
pub fn cond(type_: &str, ok: bool, reason: &str, message: impl Into<String>) -> Condition {
    Condition {
        type_: type_.into(),
        status: if ok { "True" } else { "False" }.into(),
        reason: reason.into(),
        message: message.into(),
    }
}

/// Whether the status written last time holds `c` already.
pub fn had_condition(status: Option<&EgressPolicyStatus>, c: &Condition) -> bool {
    status.is_some_and(|s| s.conditions.iter().any(|o| o == c))
}

/// Puts `c` on `p`'s planned status (which must be planned already), with
/// a warning Event named by the condition's reason unless the status
/// written last time holds `c`: a standing refusal is told once.
pub fn refuse(plan: &mut Plan, p: &PolicyView<'_>, c: Condition) {
    if !had_condition(p.status, &c) {
        plan.events.push(Event::warning(
            p.kind,
            p.key.clone(),
            &c.reason,
            c.message.clone(),
        ));
    }
    plan.policies_mut()
        .get_mut(&(p.kind, p.key.clone()))
        .expect("the policy's status is planned")
        .conditions
        .push(c);
}

/// A policy as the messages name it: `namespace/name`, or `name`.
pub fn policy_name(p: &PolicyRef) -> String {
    if p.namespace.is_empty() {
        p.name.clone()
    } else {
        format!("{}/{}", p.namespace, p.name)
    }
}
