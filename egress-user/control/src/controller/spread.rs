//! Placement of an ActiveActive gateway's EIPs: every Ready node holds
//! every EIP unit at once, all at one epoch per unit. The epoch grows
//! whenever the set of nodes changes, so the nodes still holding it
//! announce it with a higher LOCAL_PREF than any path a dead node left
//! behind (a lingering session, a graceful-restart stale copy): at every
//! router the dead node's path drops out of the multipath set at once.
//! A node's own address (useNodeIP) stays on one node (`gateway_pass`).

use std::collections::{BTreeMap, BTreeSet};

use crate::api::EgressGatewayStatus;
use crate::datastore::Event;

use super::plan::{EipMove, FailoverReason, Plan};
use super::unit::{asks_reconfirmation, Unit, Units};

/// Where each spread unit is: its nodes (sorted) and their shared epoch.
pub(super) type Spread = BTreeMap<Unit, (BTreeSet<String>, u64)>;

/// The spread units of the last pass, from the gateway's status: every
/// node that listed a unit, and the highest epoch listed for it.
pub(super) fn previous_spread(prev: &EgressGatewayStatus) -> Spread {
    let mut out = Spread::new();
    for n in &prev.node_list {
        for e in n
            .eips
            .iter()
            .filter(|e| !e.ipv4.is_empty() || !e.ipv6.is_empty())
        {
            let u = Unit {
                v4: e.ipv4.clone(),
                v6: e.ipv6.clone(),
                node_ip_of: None,
            };
            let (nodes, epoch) = out.entry(u).or_default();
            nodes.insert(n.name.clone());
            *epoch = (*epoch).max(e.epoch);
        }
    }
    out
}

/// What spreading one gateway's units reads.
pub(super) struct SpreadInput<'a> {
    pub gateway: &'a str,
    pub view: &'a crate::view::ClusterView,
    /// The gateway's Ready nodes.
    pub ready: &'a BTreeSet<&'a str>,
    /// Every node the gateway's selector picks.
    pub selected: &'a BTreeSet<&'a str>,
}

/// Places every unit with addresses on all Ready nodes; `epoch` is the
/// gateway's epoch counter, raised once for every unit whose node set
/// changed or that a node asked to have reconfirmed.
pub(super) fn spread_units(
    input: &SpreadInput<'_>,
    units: &Units<'_, '_>,
    before: &Spread,
    epoch: &mut u64,
    plan: &mut Plan,
) -> Spread {
    let now: BTreeSet<String> = input.ready.iter().map(|n| n.to_string()).collect();
    let mut out = Spread::new();
    for u in units.keys().filter(|u| u.node_ip_of.is_none()) {
        let old = before.get(u);
        if now.is_empty() {
            continue; // `no_ready_node` warns, as for a single-owner unit
        }
        let reconfirm = old.is_some_and(|(nodes, ep)| {
            nodes
                .iter()
                .any(|n| now.contains(n) && asks_reconfirmation(input.view, n, u, *ep))
        });
        let kept = old.filter(|(nodes, _)| *nodes == now && !reconfirm);
        let ep = match kept {
            Some((_, ep)) => *ep,
            None => {
                *epoch += 1;
                tell_change(input, u, old.map(|(n, _)| n), &now, *epoch, plan);
                *epoch
            }
        };
        out.insert(u.clone(), (now.clone(), ep));
    }
    out
}

/// The event (and failover records) of a unit whose node set changed.
fn tell_change(
    input: &SpreadInput<'_>,
    u: &Unit,
    old: Option<&BTreeSet<String>>,
    now: &BTreeSet<String>,
    epoch: u64,
    plan: &mut Plan,
) {
    let list = |s: &BTreeSet<String>| s.iter().cloned().collect::<Vec<_>>().join(", ");
    let (reason, message) = match old {
        None => (
            "EipAssigned",
            format!(
                "{} served by nodes {} (active-active), epoch {epoch}",
                u.label(),
                list(now)
            ),
        ),
        Some(o) if o == now => (
            "EipReconfirmed",
            format!(
                "{} reconfirmed on nodes {}, epoch {epoch}",
                u.label(),
                list(now)
            ),
        ),
        Some(o) => (
            "EipSpread",
            format!(
                "{} now served by nodes {} (was {}), epoch {epoch}",
                u.label(),
                list(now),
                list(o)
            ),
        ),
    };
    for gone in old.into_iter().flatten().filter(|n| !now.contains(*n)) {
        plan.moves.push(EipMove {
            gateway: input.gateway.to_string(),
            what: u.label(),
            from: gone.clone(),
            to: list(now),
            reason: FailoverReason::of(
                input.view.phase(gone),
                input.selected.contains(gone.as_str()),
            ),
        });
    }
    plan.events.push(Event::normal(
        crate::datastore::Kind::EgressGateway,
        crate::datastore::ObjectKey::cluster(input.gateway),
        reason,
        message,
    ));
}
