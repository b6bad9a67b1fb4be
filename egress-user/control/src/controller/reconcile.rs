//! The controller's decisions as one pure function: from a [`ClusterView`]
//! (with the statuses written last time) to the statuses to write and the
//! events to record. No I/O, no clock: the async loop feeds it and writes
//! what it returns. The cluster-wide steps are here (tunnels, which
//! gateways and policies are valid, the workers of each policy); each
//! gateway's own are in [`super::gateway_pass`].

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::api::{EgressGateway, EgressGatewayStatus, EgressPolicyStatus};
use crate::datastore::{Event, Kind, ObjectKey};
use crate::validate::{self, IpPool};
use crate::view::{gateway_created, ClusterView, PolicyView};

use super::capacity::fold_into;
use super::conditions::{cond, refuse};
use super::config::ControllerConfig;
use super::dirty::Dirty;
use super::gateway_grants::{grant_ports, GrantInput};
use super::gateway_pass::GatewayPass;
use super::plan::Plan;
use super::ports::GrantMemo;
use super::workers::WorkersMemo;

/// The IPv4 and IPv6 pools of each valid gateway.
type Pools = BTreeMap<String, (IpPool, IpPool)>;

/// The valid policies of each valid gateway, in order of precedence.
type PoliciesOf<'p, 'v> = BTreeMap<String, Vec<&'p PolicyView<'v>>>;

/// What a pass keeps for the next one, to skip work whose inputs did not
/// change. It never changes a decision: a pass with it plans exactly what
/// a pass without it would.
#[derive(Debug, Default)]
pub struct ReconcileMemo {
    pub grants: GrantMemo,
    /// Passes that redid only what changed since the pass before.
    pub partial_passes: u64,
    pub(crate) workers: WorkersMemo,
    /// The last pass's structure (see [`Structure`]).
    structure: Option<Structure>,
    /// What changed since the last pass, while a view cache follows the
    /// view this memo's passes run on (`None`: not known, so a pass redoes
    /// every step).
    pub(crate) dirty: Option<Dirty>,
    /// The settings of the last pass: other settings redo every step.
    cfg: Option<ControllerConfig>,
}

impl ReconcileMemo {
    /// The next pass redoes every step (a write of the last plan failed).
    pub fn redo_everything(&mut self) {
        if let Some(d) = &mut self.dirty {
            d.global = true;
        }
    }

    /// What changed since the last pass, when only pods, grants and
    /// reports did (and the settings are the same); clears it for the next.
    fn take_dirty(&mut self, cfg: &ControllerConfig) -> Option<Dirty> {
        let dirty = self.dirty.take();
        self.dirty = dirty.as_ref().map(|_| Dirty::default());
        if self.cfg.as_ref() != Some(cfg) {
            self.cfg = Some(cfg.clone());
            return None;
        }
        dirty.filter(|d| !d.global)
    }
}

/// Runs every decision of the controller once, from nothing kept.
pub fn reconcile(view: &ClusterView, cfg: &ControllerConfig) -> Plan {
    reconcile_with(view, cfg, &mut ReconcileMemo::default())
}

/// [`reconcile`], reusing what earlier passes kept in `memo`.
pub fn reconcile_with(
    view: &ClusterView,
    cfg: &ControllerConfig,
    memo: &mut ReconcileMemo,
) -> Plan {
    let since = memo.take_dirty(cfg);
    // A partial pass with no pod changed reads no policy.
    let reads_policies = since.as_ref().is_none_or(|d| !d.pod_nodes.is_empty())
        || memo.structure.is_none()
        || !memo.workers.is_built();
    let policies = if reads_policies {
        view.policy_views()
    } else {
        Vec::new()
    };
    memo.workers
        .update(view, &policies, since.as_ref().map(|d| &d.pod_nodes));
    // Nothing the structure reads changed: it is the last pass's.
    let structure = match (&since, memo.structure.take()) {
        (Some(_), Some(kept)) => {
            memo.partial_passes += 1;
            kept
        }
        _ => plan_structure(view, cfg, &policies),
    };
    let mut plan = structure.plan.clone();
    if since.is_some() {
        // The grants as the last pass left them; each gateway's step
        // changes those of the addresses it reaches.
        // Taken, not copied: a node's grants are then changed in place
        // (once the caller has let go of the last plan).
        plan.tunnels = std::mem::take(&mut memo.grants.tunnels);
        plan.grants_to_compare.0 = since.as_ref().map(|d| d.grant_nodes.clone());
    }
    for input in &structure.grants {
        grant_ports(
            view,
            cfg,
            input,
            &memo.workers,
            since.as_ref(),
            &mut memo.grants,
            &mut plan,
        );
    }
    memo.structure = Some(structure);
    memo.grants.end_pass();
    memo.grants.tunnels = plan.tunnels.clone();
    fold_into(view, &mut plan);
    plan
}

/// What a pass plans before the port blocks: the statuses of the gateways
/// and policies with their validation, placement and events, empty grants
/// for every node, and what each valid gateway's port-block step reads.
/// It reads neither pods nor grants nor the agents' port reports.
#[derive(Debug)]
pub(crate) struct Structure {
    plan: Plan,
    grants: Vec<GrantInput>,
}

fn plan_structure(
    view: &ClusterView,
    cfg: &ControllerConfig,
    policies: &[PolicyView<'_>],
) -> Structure {
    let mut plan = Plan::default();
    plan_tunnels(view, &mut plan);
    // Gateways in order of age: on overlapping pools the older one keeps them.
    let mut gateways: Vec<&EgressGateway> = view.gateways.iter().collect();
    gateways.sort_by_key(|g| (gateway_created(g), g.metadata.name.clone()));
    let pools = check_gateways(&gateways, cfg, &mut plan);
    let by_gw = check_policies(view, policies, &pools, &mut plan);
    let mut grants = Vec::new();
    for g in &gateways {
        let name = g.metadata.name.clone().unwrap_or_default();
        let Some((v4, v6)) = pools.get(&name) else {
            continue;
        };
        let pass = GatewayPass {
            view,
            gateway: g,
            v4,
            v6,
        };
        let pols = by_gw.get(&name).map_or(&[][..], Vec::as_slice);
        grants.push(pass.run(pols, &mut plan));
    }
    Structure { plan, grants }
}

/// Empty grants for every node with an EgressTunnel (the gateways fill
/// them in), and the nodes that have none yet.
fn plan_tunnels(view: &ClusterView, plan: &mut Plan) {
    for t in &view.tunnels {
        if let Some(n) = &t.metadata.name {
            plan.tunnels.insert(n.clone(), Arc::default());
        }
    }
    plan.new_tunnels = view
        .nodes
        .iter()
        .filter(|n| !plan.tunnels.contains_key(&n.name))
        .map(|n| n.name.clone())
        .collect();
}

/// Validates the gateways (in order of age) and plans a status for each;
/// returns the pools of the valid ones.
fn check_gateways(gateways: &[&EgressGateway], cfg: &ControllerConfig, plan: &mut Plan) -> Pools {
    // In order of acceptance: an overlap is told against every older one.
    let mut accepted: Vec<(String, IpPool, IpPool)> = Vec::new();
    for g in gateways {
        let name = g.metadata.name.clone().unwrap_or_default();
        let problems = gateway_problems(g, cfg, &accepted);
        if problems.is_empty() {
            let (p4, p6) = validate::gateway_pools(&g.spec).expect("validated");
            accepted.push((name.clone(), p4, p6));
        }
        let prev = g.status.clone().unwrap_or_default();
        let mut status = EgressGatewayStatus {
            epoch: prev.epoch,
            port_block_size: cfg.port_block_size,
            ..Default::default()
        };
        if !problems.is_empty() {
            let c = cond("Valid", false, "InvalidSpec", problems.join("; "));
            if !prev.conditions.contains(&c) {
                plan.events.push(Event::warning(
                    Kind::EgressGateway,
                    ObjectKey::cluster(&name),
                    "InvalidSpec",
                    c.message.clone(),
                ));
            }
            status.conditions.push(c);
        }
        plan.gateways_mut().insert(name, status);
    }
    accepted
        .into_iter()
        .map(|(name, p4, p6)| (name, (p4, p6)))
        .collect()
}

/// What is wrong with `g`'s spec, or with its pools against the older
/// gateways `accepted` before it.
fn gateway_problems(
    g: &EgressGateway,
    cfg: &ControllerConfig,
    accepted: &[(String, IpPool, IpPool)],
) -> Vec<String> {
    let mut problems: Vec<String> = validate::gateway(&g.spec)
        .iter()
        .chain(&validate::gateway_mode(&g.spec, cfg.bgp))
        .map(|e| e.to_string())
        .collect();
    if problems.is_empty() {
        let (p4, p6) = validate::gateway_pools(&g.spec).expect("validated");
        for (other, o4, o6) in accepted {
            if let Some(ip) = p4.overlap(o4).or_else(|| p6.overlap(o6)) {
                problems.push(format!(
                    "spec.ippools: {ip} is also in the pool of gateway {other}, which is older and keeps it"
                ));
            }
        }
    }
    problems
}

/// Validates the policies and plans a status for each; returns the valid
/// ones grouped by their (valid) gateway.
fn check_policies<'p, 'v>(
    view: &ClusterView,
    policies: &'p [PolicyView<'v>],
    pools: &Pools,
    plan: &mut Plan,
) -> PoliciesOf<'p, 'v> {
    let mut by_gw = PoliciesOf::new();
    for p in policies {
        if let Some(gw) = check_policy(view, p, pools, plan) {
            by_gw.entry(gw).or_default().push(p);
        }
    }
    by_gw
}

/// Plans `p`'s status; returns its gateway when the policy is valid and
/// the gateway exists and is valid, else a condition says which is not.
fn check_policy(
    view: &ClusterView,
    p: &PolicyView<'_>,
    pools: &Pools,
    plan: &mut Plan,
) -> Option<String> {
    plan.policies_mut()
        .insert((p.kind, p.key.clone()), EgressPolicyStatus::default());
    let gw = view.gateway_for(p.fields.gateway);
    let problems = validate::policy(&p.fields, gw);
    if !problems.is_empty() {
        let msg = problems
            .iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .join("; ");
        refuse(plan, p, cond("Valid", false, "InvalidSpec", msg));
        return None;
    }
    let Some(gw) = gw else {
        let msg = if p.fields.gateway.is_empty() {
            "spec.egressGatewayName: empty and no gateway has clusterDefault: true".to_string()
        } else {
            format!(
                "spec.egressGatewayName: gateway {} does not exist",
                p.fields.gateway
            )
        };
        refuse(plan, p, cond("GatewayFound", false, "GatewayNotFound", msg));
        return None;
    };
    let gw_name = gw.metadata.name.clone().unwrap_or_default();
    if !pools.contains_key(&gw_name) {
        // No Event: the gateway's own status tells what is wrong.
        let c = cond(
            "GatewayFound",
            false,
            "GatewayInvalid",
            format!("spec.egressGatewayName: gateway {gw_name} is invalid (see its status)"),
        );
        plan.policies_mut()
            .get_mut(&(p.kind, p.key.clone()))
            .expect("planned above")
            .conditions
            .push(c);
        return None;
    }
    Some(gw_name)
}
