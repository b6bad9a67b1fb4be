//! One reconcile pass of the agent: from its view of the cluster to the
//! maps, the announcements (ARP/NA, BGP) and what it tells the datastore
//! about itself. Every step runs on every pass and writes only differences.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use egress_control::{agent_state::NodeDesired, api::PolicyOverCapacity, controller::ClusterView};
use egress_failover::fence::Announcement;

use super::{
    adapt::desired_maps,
    event_loop::{assignments, ds_call, Agent},
    register::{publish_awaiting_reconfirmation, publish_over_capacity},
};
use crate::datapath::{apply_with, DesiredMaps};

impl Agent {
    /// Brings the node in step with `view`.
    pub(super) async fn reconcile_pass(&mut self, view: &ClusterView) {
        let nd = self.prepared.prepare(view).node(&self.cfg);
        self.eligible = nd.gateway_eligible;
        let now = std::time::Instant::now();
        let desired = self.desired(view, &nd, now).await;
        self.warn_colliding_blocks(&desired);
        let now_announced: BTreeSet<IpAddr> = desired.owned_eips.iter().map(|o| o.eip).collect();
        self.write_maps(&desired, &nd, now, &now_announced);
        announce_new(
            &self.s.uplink,
            &desired,
            &self.announced,
            &now_announced,
            self.s.l2_announce,
        );
        for gone in self.announced.difference(&now_announced) {
            tracing::info!(eip = %gone, "no longer announcing");
        }
        self.sync_bgp(view, &desired).await;
        self.announced = now_announced;
        self.grants_tx
            .send_replace(view.tunnel(&self.s.node).and_then(|t| t.status.clone()));
        self.publish_over_capacity(view).await;
        self.ask_reconfirmation(view, now).await;
    }

    /// What the maps should hold: the view's meaning for this node, only the
    /// EIPs the fence allows, and the EIP routes learned over BGP that are
    /// not older than the view.
    async fn desired(
        &mut self,
        view: &ClusterView,
        nd: &NodeDesired,
        now: std::time::Instant,
    ) -> DesiredMaps {
        let allowed: BTreeSet<IpAddr> = self
            .fence
            .announcements(now)
            .iter()
            .map(|a| a.eip)
            .collect();
        let (mut desired, skipped) = desired_maps(view, nd, &self.facts, &allowed);
        if let Some(l) = &self.learned {
            let v6 = self.facts.tunnel_ip.is_ipv6();
            desired.routes = super::routes::eip_routes(&l.lock().unwrap(), &assignments(view), v6);
        }
        for sk in &skipped {
            tracing::warn!(policy = %sk.policy, why = %sk.why, "policy not applied on this node");
        }
        self.pod_reach
            .check(&self.handle, selected_pod_addresses(&desired))
            .await;
        desired
    }

    /// Warns once per change when port blocks of the node's own address
    /// hold the node's own ports.
    fn warn_colliding_blocks(&mut self, desired: &DesiredMaps) {
        let mut own_ports = vec![(self.facts.vxlan_port, self.facts.vxlan_port)];
        own_ports.extend(self.ephemeral);
        if self.facts.probe_port != 0 {
            own_ports.push((self.facts.probe_port, self.facts.probe_port));
        }
        let collide = super::node_ports::colliding_blocks(desired, &own_ports);
        if collide != self.colliding && !collide.is_empty() {
            tracing::warn!(
                blocks = ?collide,
                ephemeral = ?self.ephemeral,
                vxlan_port = self.facts.vxlan_port,
                probe_port = self.facts.probe_port,
                "port blocks of this node's own address hold its own ports (net.ipv4.ip_local_port_range, the VXLAN or probe port): packets to them go to workers; keep the controller's --node-ip-port-range (chart feature.nodeIpPortRange) clear of them"
            );
        }
        self.colliding = collide;
    }

    /// Writes the maps' differences, records the outcome for `/state` and
    /// the metrics, and lets the pod veths held back for the first write have the program.
    fn write_maps(
        &mut self,
        desired: &DesiredMaps,
        nd: &NodeDesired,
        now: std::time::Instant,
        now_announced: &BTreeSet<IpAddr>,
    ) {
        let report = match apply_with(&mut self.maps, desired, &mut self.shadow) {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(error = %format!("{e:#}"), "writing the maps failed");
                self.published.lock().unwrap().last_error = Some(e.to_string());
                return;
            }
        };
        let mut p = self.published.lock().unwrap();
        p.ready = true;
        p.reconciles += 1;
        p.prepared_rebuilt_by.clone_from(self.prepared.rebuilt_by());
        p.last_error = None;
        // Only gateway-eligible nodes heartbeat: a worker that never renews
        // is not fenced, it has nothing to announce (an alert on the metric
        // must not fire on every worker).
        p.fenced = self.eligible && self.fence.is_fenced(now);
        p.announced = now_announced.iter().copied().collect();
        p.policies = desired.policies.len();
        p.policy_names = nd
            .policies
            .iter()
            .map(|(id, t)| {
                let name = format!("{}/{}/{}", t.kind.name(), t.key.namespace, t.key.name);
                (*id, name)
            })
            .collect();
        p.written = report.total_written();
        p.removed = report.total_removed();
        self.over_now = super::capacity::reports(&report.over_capacity, &nd.policies);
        p.over_capacity = self.over_now.clone();
        drop(p);
        self.pod_veths.release(&self.published);
    }

    /// The BGP announcements: the node's pod CIDRs and the EIPs it owns.
    async fn sync_bgp(&mut self, view: &ClusterView, desired: &DesiredMaps) {
        let Some(bgp) = self.bgp.as_mut() else {
            return;
        };
        // Not the node's own address (useNodeIP): a host route to a node via
        // itself is no route for its neighbours.
        let eips: BTreeMap<IpAddr, u64> = desired
            .owned_eips
            .iter()
            .filter(|o| !o.node_ip)
            .map(|o| (o.eip, u64::from(o.epoch)))
            .collect();
        let pod_cidrs = super::bgp::node_pod_cidrs(&self.s.pod_cidrs, &view.nodes, &self.s.node);
        let want = super::bgp::wanted_routes(&pod_cidrs, &eips, self.tunnel_ip);
        if let Err(e) = bgp.sync(&want).await {
            tracing::warn!(error = %format!("{e:#}"), "BGP announcements not in step");
        }
    }

    /// Writes the policies the maps could not hold, when that changed.
    async fn publish_over_capacity(&mut self, view: &ClusterView) {
        let stored = stored_over_capacity(view, &self.s.node);
        let must =
            super::capacity::must_publish(&self.over_now, &stored, self.over_published.as_deref());
        if !must {
            return;
        }
        let write = publish_over_capacity(self.ds.as_ref(), &self.s.node, &self.over_now);
        match ds_call(&self.fence, &self.s.timers, write).await {
            Ok(()) => {
                for r in &self.over_now {
                    tracing::warn!(policy = %super::capacity::policy_label(r), limit = %r.limit,
                        count = r.count, max = r.max,
                        "policy exceeds this node's datapath: not applied, its traffic is dropped");
                }
                self.over_published = Some(self.over_now.clone());
            }
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "publishing the policies over capacity failed; retrying");
            }
        }
    }

    /// Healthy again after fencing itself: asks for newer epochs of the
    /// EIPs it withholds (once per change of the set).
    async fn ask_reconfirmation(&mut self, view: &ClusterView, now: std::time::Instant) {
        let asked = self.fence.awaiting_reconfirmation();
        if self.fence.is_fenced(now)
            || asked == stored_reconfirmation(view, &self.s.node)
            || self.asked_published.as_ref() == Some(&asked)
        {
            return;
        }
        let write = publish_awaiting_reconfirmation(self.ds.as_ref(), &self.s.node, &asked);
        match ds_call(&self.fence, &self.s.timers, write).await {
            Ok(()) => {
                if !asked.is_empty() {
                    tracing::info!(
                        ?asked,
                        "fenced EIPs: asked the controller to reconfirm them"
                    );
                }
                self.asked_published = Some(asked);
            }
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "asking for reconfirmation failed; retrying");
            }
        }
    }
}

/// The addresses of the single pods the policies select on this node.
fn selected_pod_addresses(d: &DesiredMaps) -> impl Iterator<Item = IpAddr> + '_ {
    d.policies
        .iter()
        .flat_map(|p| &p.sources)
        .filter(|c| c.len == if c.addr.is_ipv4() { 32 } else { 128 })
        .map(|c| c.addr)
}

/// The node's `overCapacity` as the view holds it.
fn stored_over_capacity(view: &ClusterView, node: &str) -> Vec<PolicyOverCapacity> {
    view.tunnel(node)
        .and_then(|t| t.status.as_ref())
        .map(|s| s.over_capacity.clone())
        .unwrap_or_default()
}

/// The node's `awaitingReconfirmation` as the view holds it.
fn stored_reconfirmation(view: &ClusterView, node: &str) -> BTreeSet<Announcement> {
    view.tunnel(node)
        .and_then(|t| t.status.as_ref())
        .into_iter()
        .flat_map(|s| &s.awaiting_reconfirmation)
        .filter_map(|r| {
            Some(Announcement {
                eip: r.eip.parse().ok()?,
                epoch: r.epoch,
            })
        })
        .collect()
}

/// Gratuitous ARP / unsolicited NA for every EIP this node just took over.
fn announce_new(
    uplink: &str,
    desired: &DesiredMaps,
    before: &BTreeSet<IpAddr>,
    now: &BTreeSet<IpAddr>,
    l2: bool,
) {
    if !l2 {
        return;
    }
    for eip in taken_over_and_answered(desired, before, now) {
        match crate::datapath::announce::announce_eip(uplink, eip, 2) {
            Ok(()) => tracing::info!(eip = %eip, "took over; announced with gratuitous ARP/NA"),
            Err(e) => {
                tracing::warn!(eip = %eip, error = %format!("{e:#}"), "gratuitous announcement failed")
            }
        }
    }
}

/// The EIPs new in `now` that this node answers ARP/NDP for: not a node's
/// own address (the kernel answers for it), not an EIP several nodes
/// hold at once (ActiveActive: BGP alone announces it; a gratuitous ARP
/// would pull the segment's traffic for it to one holder).
fn taken_over_and_answered(
    desired: &DesiredMaps,
    before: &BTreeSet<IpAddr>,
    now: &BTreeSet<IpAddr>,
) -> Vec<IpAddr> {
    now.difference(before)
        .filter(|eip| {
            desired
                .owned_eips
                .iter()
                .any(|o| o.eip == **eip && o.answer_neigh)
        })
        .copied()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datapath::OwnedEip;

    #[test]
    fn only_eips_this_node_answers_for_get_a_gratuitous_announcement() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let owned = |eip: &str, answer_neigh: bool| OwnedEip {
            eip: ip(eip),
            answer_neigh,
            node_ip: false,
            epoch: 1,
        };
        let desired = DesiredMaps {
            owned_eips: vec![
                owned("10.10.0.200", true),
                // shared (ActiveActive) or a node address: no answers
                owned("10.20.0.1", false),
                owned("10.10.0.201", true),
            ],
            ..Default::default()
        };
        let before = [ip("10.10.0.201")].into();
        let now = [ip("10.10.0.200"), ip("10.20.0.1"), ip("10.10.0.201")].into();
        assert_eq!(
            taken_over_and_answered(&desired, &before, &now),
            [ip("10.10.0.200")]
        );
    }
}
