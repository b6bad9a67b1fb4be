//! The agent's loop. One task owns the maps; everything that can change them
//! (datastore events, link events, the fence's deadlines, a periodic resync)
//! only marks the state dirty, and one reconcile pass (`pass`) then computes
//! the whole desired state and writes the difference.
//!
//! The cluster comes from a [`ViewCache`]: every kind is listed once, then
//! kept current from its watch. A change anywhere in the cluster (a pod of
//! another node, a tunnel's status) costs the datastore nothing more than
//! the watch event: with every agent listing every kind on every change, the
//! datastore's load would grow with nodes times changes. The cache is listed
//! again only when a watch fails and every `Datastore::relist_period` (a watch that
//! lost events without an error is not trusted for longer; an etcd member
//! cut off from its quorum ends our watches, see `require_leader`).

use std::{
    collections::BTreeSet,
    net::IpAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::Result;
use egress_control::{
    agent_state::{self, AgentConfig, PreparedCache},
    api::{EgressTunnelStatus, PolicyOverCapacity},
    controller::{Changed, ClusterView, ViewCache},
    datastore::Datastore,
};
use egress_failover::{
    fence::{Announcement, Assignment, Fence},
    timers::FailoverTimers,
};
use tokio::time::Instant;

use super::{
    adapt::NodeFacts,
    bgp::AgentBgp,
    published::{Learned, Published},
    register::{addresses_changed, register, registration_lost, SelfDescription},
    settings::{AgentSettings, LIST_RETRY},
};
use crate::{
    datapath::{lease, links, MapShadow, PinnedMaps},
    node::watch::{LinkEvent, LinkWatch},
};

/// Every EIP assignment in the view, for the fence.
pub(super) fn assignments(view: &ClusterView) -> Vec<Assignment> {
    let mut out = Vec::new();
    for g in &view.gateways {
        for n in g.status.iter().flat_map(|s| &s.node_list) {
            for e in &n.eips {
                for ip in [&e.ipv4, &e.ipv6] {
                    if let Ok(eip) = ip.parse::<IpAddr>() {
                        out.push(Assignment {
                            eip,
                            node: n.name.clone(),
                            epoch: e.epoch,
                        });
                    }
                }
            }
        }
    }
    out
}

/// What the agent holds between passes, apart from its view of the cluster.
pub(super) struct Agent {
    pub s: AgentSettings,
    pub ds: Arc<dyn Datastore>,
    pub handle: rtnetlink::Handle,
    pub pod_veths: super::pod_veths::PodVeths,
    pub maps: PinnedMaps,
    /// What the maps held after the last write; forgotten on each resync.
    pub shadow: MapShadow,
    pub facts: NodeFacts,
    pub me: SelfDescription,
    pub tunnel_ip: IpAddr,
    pub bgp: Option<AgentBgp>,
    pub learned: Option<Learned>,
    pub published: Arc<Mutex<Published>>,
    pub cfg: AgentConfig,
    /// What the node's desired state derives from every kind but pods,
    /// kept while only pods change.
    pub prepared: PreparedCache,
    pub fence: Fence,
    /// The node's EgressTunnel status, for the port-use task.
    pub grants_tx: tokio::sync::watch::Sender<Option<EgressTunnelStatus>>,
    pub announced: BTreeSet<IpAddr>,
    pub eligible: bool,
    pub pod_reach: super::pod_devices::PodReachCheck,
    pub dirty: bool,
    /// When to register again (the addresses changed, or the datastore lost
    /// the registration), and when it was last done.
    pub register_at: Option<Instant>,
    pub last_registered: Instant,
    pub recheck_registration_at: Option<Instant>,
    /// The fence's deadline passed: reconcile from the last view at once,
    /// without waiting for a datastore that may be unreachable.
    pub fence_due: bool,
    pub was_fenced: bool,
    /// The node's ephemeral ports, and the node-IP blocks last seen over them.
    pub ephemeral: Option<(u16, u16)>,
    pub colliding: BTreeSet<(IpAddr, u16)>,
    /// What this run last wrote as `awaitingReconfirmation` (the view may
    /// not show it yet).
    pub asked_published: Option<BTreeSet<Announcement>>,
    /// The policies the maps could not hold, as of the last apply, and as
    /// last written to the datastore.
    pub over_now: Vec<PolicyOverCapacity>,
    pub over_published: Option<Vec<PolicyOverCapacity>>,
}

/// The agent's view of the cluster: the live cache, or (while there is
/// none) the last view it held.
#[derive(Default)]
pub(super) struct Views {
    cache: Option<ViewCache>,
    last: ClusterView,
    have_view: bool,
    relist_due: bool,
}

impl Views {
    /// The view a pass works from; none before the first list.
    fn current(&self) -> Option<&ClusterView> {
        self.have_view
            .then(|| self.cache.as_ref().map_or(&self.last, |c| &c.view))
    }
}

/// The loop's own clocks and event sources.
pub(super) struct Sources {
    pub link_watch: LinkWatch,
    pub learned_changed: Option<Arc<tokio::sync::Notify>>,
    pub relist: tokio::time::Interval,
}

impl Agent {
    /// Runs until the shutdown signal.
    pub(super) async fn run_loop(mut self, mut src: Sources) -> Result<()> {
        let mut views = Views::default();
        let mut heartbeat = tokio::time::interval(self.s.timers.tunnel_update_period);
        let mut resync = tokio::time::interval(self.s.resync);
        let shutdown = crate::signals::shutdown_signal();
        tokio::pin!(shutdown);
        loop {
            self.note_fence_closing();
            // No pass before the worker program is loaded: a policy in the
            // maps means its pods' veths have the program.
            let can_pass = self.pod_veths.is_loaded();
            // (Re)start the cache; not while the fence is due and a pass can
            // run, which must not wait for a datastore that may be unreachable.
            if (views.cache.is_none() || views.relist_due) && !(self.fence_due && can_pass) {
                self.list(&mut views).await;
            }
            if self.dirty {
                if let Some(c) = &views.cache {
                    views.have_view = true;
                    self.on_live_view(&c.view);
                }
            }
            if self.dirty && can_pass {
                self.dirty = false;
                self.fence_due = false;
                if let Some(view) = views.current() {
                    self.reconcile_pass(view).await;
                }
            }
            let fence_deadline = self
                .fence
                .next_deadline(std::time::Instant::now())
                .map(Instant::from_std);
            tokio::select! {
                _ = &mut shutdown => break,
                ev = src.link_watch.next() => self.on_link_event(ev).await?,
                batch = next_batch(&mut views.cache) => self.on_batch(batch, &mut views).await,
                _ = src.relist.tick() => views.relist_due = true,
                // No cache (the datastore could not be listed): try again soon.
                _ = tokio::time::sleep(LIST_RETRY), if views.cache.is_none() => {}
                _ = heartbeat.tick(), if self.eligible => self.renew_heartbeat().await,
                _ = sleep_until_opt(fence_deadline) => {
                    self.dirty = true;
                    self.fence_due = true;
                }
                // The resync also reads every map back from the kernel.
                _ = resync.tick() => {
                    self.shadow.forget();
                    self.dirty = true;
                }
                _ = sleep_until_opt(self.recheck_registration_at) => {
                    self.recheck_registration_at = None;
                    self.dirty = true;
                }
                // The node's addresses changed, the datastore lost its
                // registration, or registering failed: register.
                _ = sleep_until_opt(self.register_at) => self.register_again().await,
                _ = notified(&src.learned_changed) => self.dirty = true,
                loaded = self.pod_veths.loaded() => {
                    self.pod_veths.on_loaded(loaded, &self.published);
                    self.dirty = true;
                }
            }
        }
        tracing::info!("agent stopping; programs stay attached and maps pinned for the next start");
        Ok(())
    }

    /// The fence closed (also while a call was pending): same as its deadline.
    fn note_fence_closing(&mut self) {
        let fenced = self.fence.is_fenced(std::time::Instant::now());
        if fenced && !self.was_fenced {
            self.fence_due = true;
            self.dirty = true;
        }
        self.was_fenced = fenced;
    }

    /// Lists every kind into a new cache. On failure the last view (or the
    /// live cache, on a periodic relist) stays; the fence alone decides what
    /// may still be announced.
    async fn list(&mut self, views: &mut Views) {
        let start = async { Ok(ViewCache::start(self.ds.as_ref()).await?) };
        match ds_call(&self.fence, &self.s.timers, start).await {
            Ok(c) => {
                let mut p = self.published.lock().unwrap();
                p.datastore_lists += 1;
                p.view_pods = c.view.pods.len();
                views.cache = Some(c);
                views.last = ClusterView::default();
                views.relist_due = false;
                self.dirty = true;
            }
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "listing the datastore failed; keeping the last view");
                self.published.lock().unwrap().last_error = Some(e.to_string());
            }
        }
    }

    /// The live view's assignments to the fence, and whether the datastore
    /// still holds this node's registration.
    fn on_live_view(&mut self, view: &ClusterView) {
        // Known before the first pass, so heartbeats start at once.
        self.eligible = agent_state::gateway_eligible(view, &self.s.node);
        self.fence
            .apply_assignments(std::time::Instant::now(), assignments(view));
        if self.register_at.is_some()
            || !registration_lost(view, &self.me, self.ds.writes_cluster_records())
        {
            return;
        }
        if self.last_registered.elapsed() >= LIST_RETRY {
            tracing::warn!(
                "the datastore no longer holds this node's registration; registering again"
            );
            self.register_at = Some(Instant::now());
        } else {
            // The last registration's own events may still be on their way:
            // look again once they had the time (a deletion in that window
            // used to wait for the next resync, 30 s by default).
            self.recheck_registration_at = Some(self.last_registered + LIST_RETRY);
        }
    }

    async fn on_link_event(&mut self, ev: Option<LinkEvent>) -> Result<()> {
        let uplink = self.facts.uplink_ifindex;
        match ev {
            // The uplink can be a veth too (nodes that are containers or
            // namespaces); it is never a pod's.
            Some(LinkEvent::Present(link)) if link.is_pod_veth() && link.index != uplink => {
                self.pod_veths.appeared(link, &self.published)
            }
            Some(LinkEvent::Removed(link)) => {
                self.pod_veths.removed(link.index);
                links::forget_interface(&self.s.pin_dir, link.index);
            }
            Some(LinkEvent::AddressChanged(i)) if i == uplink => {
                if addresses_changed(&self.handle, &self.s, uplink, &mut self.me).await {
                    self.register_at = Some(Instant::now());
                }
            }
            Some(_) => {}
            None => anyhow::bail!("the netlink link watch ended"),
        }
        Ok(())
    }

    async fn on_batch(&mut self, batch: Result<Changed>, views: &mut Views) {
        match batch {
            Ok(changed) => {
                let mut p = self.published.lock().unwrap();
                p.watch_batches += 1;
                p.view_pods = views.cache.as_ref().map_or(0, |c| c.view.pods.len());
                if concerns(&changed, &self.s.node, self.eligible) {
                    self.dirty = true;
                } else {
                    p.batches_skipped += 1;
                }
            }
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "datastore watch failed; listing again");
                if let Some(c) = views.cache.take() {
                    views.last = c.view;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
                self.dirty = true;
            }
        }
    }

    async fn renew_heartbeat(&mut self) {
        let sent = std::time::Instant::now();
        let renew = async {
            Ok(self
                .ds
                .renew_heartbeat(&self.s.node, self.s.timers.eip_eviction_timeout)
                .await?)
        };
        match ds_call(&self.fence, &self.s.timers, renew).await {
            Ok(_) => {
                self.fence.on_heartbeat_renewed(sent);
                self.published.lock().unwrap().last_renewal = Some(std::time::Instant::now());
                let until = sent + self.s.timers.fence_after();
                if let Err(e) = lease::write(&self.s.pin_dir, Some(until)) {
                    tracing::warn!(error = %format!("{e:#}"), "extending the datapath's announce lease failed");
                }
            }
            Err(e) => tracing::warn!(error = %format!("{e:#}"), "heartbeat renewal failed"),
        }
        // Renewals move the fence's deadline; the announcements may change.
        self.dirty = true;
    }

    async fn register_again(&mut self) {
        self.last_registered = Instant::now();
        match ds_call(
            &self.fence,
            &self.s.timers,
            register(self.ds.as_ref(), &self.me),
        )
        .await
        {
            Ok(()) => self.register_at = None,
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "registering the node's addresses failed; trying again");
                self.register_at = Some(Instant::now() + LIST_RETRY);
            }
        }
    }
}

/// Runs one datastore call, but never past the fence's next deadline (one
/// eviction timeout when there is none): a datastore that drops packets
/// (rather than refusing) would otherwise hold the loop for the client's
/// own timeout, and the node would go on announcing after it should have
/// fenced itself.
pub(super) async fn ds_call<T>(
    fence: &Fence,
    timers: &FailoverTimers,
    call: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    let now = std::time::Instant::now();
    let budget = fence
        .next_deadline(now)
        .map(|d| d - now)
        .unwrap_or(timers.eip_eviction_timeout)
        .max(Duration::from_millis(20));
    match tokio::time::timeout(budget, call).await {
        Ok(r) => r,
        Err(_) => anyhow::bail!("the datastore did not answer within {budget:?}"),
    }
}

/// Applies the next batch of watch events to the cache (pending without one).
async fn next_batch(cache: &mut Option<ViewCache>) -> Result<Changed> {
    match cache {
        Some(c) => match c.next_batch().await {
            Some(Ok(changed)) => Ok(changed),
            Some(Err(e)) => Err(e.into()),
            None => anyhow::bail!("watch ended"),
        },
        None => std::future::pending().await,
    }
}

/// Whether a batch of changes can change what `node`'s maps should hold
/// or what its agent writes. Only the node's own pods are in its maps
/// (`agent_state::desired`); a node's grants are its own port blocks and
/// every gateway candidate's reply steering (`eligible`); what an agent
/// reports about its node is read back by that agent only.
fn concerns(changed: &Changed, node: &str, eligible: bool) -> bool {
    let mine = |nodes: &[String]| nodes.iter().any(|n| n == node);
    changed.global
        || (eligible && !changed.grant_nodes.is_empty())
        || mine(&changed.grant_nodes)
        || mine(&changed.pod_nodes)
        || mine(&changed.report_nodes)
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// The BGP speaker learned or lost a route (pending without BGP).
async fn notified(n: &Option<Arc<tokio::sync::Notify>>) {
    match n {
        Some(n) => n.notified().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_concerns_a_node() {
        let names = |nodes: &[&str]| nodes.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        let pods_of = |nodes: &[&str]| Changed {
            pod_nodes: names(nodes),
            ..Default::default()
        };
        // Its own pods only.
        assert!(!concerns(&pods_of(&["w2", "w3"]), "w1", false));
        assert!(concerns(&pods_of(&["w2", "w1"]), "w1", false));
        assert!(!concerns(&Changed::default(), "w1", true));
        // Grants: a gateway candidate steers every worker's blocks; a
        // worker holds its own.
        let grants = Changed {
            grant_nodes: names(&["w2"]),
            ..Default::default()
        };
        assert!(concerns(&grants, "g1", true));
        assert!(concerns(&grants, "w2", false));
        assert!(!concerns(&grants, "w1", false));
        // What an agent reported: that agent only, gateway or not.
        let reports = Changed {
            report_nodes: names(&["w2"]),
            ..Default::default()
        };
        assert!(concerns(&reports, "w2", false));
        assert!(!concerns(&reports, "g1", true));
        let global = Changed {
            global: true,
            ..pods_of(&["w2"])
        };
        assert!(concerns(&global, "w1", false));
    }
}
