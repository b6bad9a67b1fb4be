//! The thin async loop: leader election, heartbeat monitoring, reconcile,
//! and writing only what changed. Only the leader writes.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use egress_failover::monitor::EventType;
use egress_failover::FailoverTimers;
use serde_json::json;
use tokio::time::Instant;

use crate::datastore::{
    Datastore, Event, Kind, ObjectKey, Result, StatusPatch, StatusWrite, Stored,
};

use egress_failover::monitor::{HeartbeatMonitor, PhaseChange};

use super::cache::ViewCache;
use super::config::ControllerConfig;
use super::heartbeat;
use super::plan::{EipMove, FailoverReason, Plan, PortFacts, TunnelGrants};
use super::reconcile::reconcile_with;
use super::stale::StaleTunnels;
use crate::view::ClusterView;

/// Field manager of every write the controller makes.
pub const MANAGER: &str = "egress-controller";
/// The election every controller replica campaigns in.
pub const ELECTION: &str = "egress-controller";
/// Field manager of the port-block grants in EgressTunnel statuses. Its own
/// name, because on Kubernetes a server-side apply removes the fields its
/// manager owned before and leaves out: the tunnel phase is written by
/// [`MANAGER`] in other patches.
pub const PORT_BLOCK_MANAGER: &str = "egress-controller-port-blocks";

#[derive(Clone, Debug)]
pub struct RunConfig {
    pub identity: String,
    /// Election name (the Lease name on Kubernetes).
    pub election: String,
    pub lease_ttl: Duration,
    pub timers: FailoverTimers,
    pub controller: ControllerConfig,
    /// After a change wakes the loop, how long at most to gather further
    /// changes into the same pass: as long as the last pass took, up to
    /// this (heartbeat timeouts are not delayed by this).
    pub coalesce: Duration,
    /// Nodes whose datapath probe is down, kept current by a prober; a
    /// change wakes the loop at once.
    pub probe_down: Option<tokio::sync::watch::Receiver<BTreeSet<String>>>,
}

impl Default for RunConfig {
    fn default() -> Self {
        Self {
            identity: format!("controller-{}", std::process::id()),
            election: ELECTION.into(),
            lease_ttl: Duration::from_secs(15),
            timers: FailoverTimers::default(),
            controller: ControllerConfig::default(),
            coalesce: Duration::from_millis(50),
            probe_down: None,
        }
    }
}

const GATEWAY_FIELDS: &[&str] = &[
    "nodeList",
    "ipUsage",
    // No longer written (grants live in EgressTunnel statuses); owned so a
    // status written by an older controller loses it on the next write.
    "portBlocks",
    "portBlockSize",
    "epoch",
    "conditions",
];
const POLICY_FIELDS: &[&str] = &["eip", "node", "nodes", "conditions"];
const TUNNEL_FIELDS: &[&str] = &["phase", "lastHeartbeatTime"];
const TUNNEL_GRANT_FIELDS: &[&str] = &["portBlocks", "portBlockSize"];

/// The status write of a node's port-block grants (both fields removed when
/// it holds none).
fn grants_patch(g: &TunnelGrants) -> StatusPatch {
    let status = if g.port_blocks.is_empty() {
        json!({})
    } else {
        json!({"portBlocks": g.port_blocks, "portBlockSize": g.port_block_size})
    };
    StatusPatch {
        manager: PORT_BLOCK_MANAGER.into(),
        owned: TUNNEL_GRANT_FIELDS.iter().map(|s| s.to_string()).collect(),
        status,
    }
}

fn patch(owned: &[&str], status: serde_json::Value) -> StatusPatch {
    StatusPatch {
        manager: MANAGER.into(),
        owned: owned.iter().map(|s| s.to_string()).collect(),
        status,
    }
}

/// Writes the statuses of `plan` that differ from `view`, and its events.
/// Returns how many objects were written. Writes go out together
/// ([`Datastore::write_statuses`]): they touch different objects.
pub async fn write_plan(ds: &dyn Datastore, view: &ClusterView, plan: &Plan) -> Result<usize> {
    Ok(write_plan_stored(ds, view, plan).await?.len())
}

/// [`write_plan`], returning the objects as written (to update a cache).
pub async fn write_plan_stored(
    ds: &dyn Datastore,
    view: &ClusterView,
    plan: &Plan,
) -> Result<Vec<Stored>> {
    write_plan_parts(ds, view, plan, true).await
}

/// [`write_plan_stored`], comparing the gateways' and policies' statuses
/// with the view only when `statuses` (a partial pass's are the pass
/// before's, which that pass found written).
async fn write_plan_parts(
    ds: &dyn Datastore,
    view: &ClusterView,
    plan: &Plan,
    statuses: bool,
) -> Result<Vec<Stored>> {
    use futures::stream::{self, StreamExt, TryStreamExt};
    let created = create_tunnels(ds, &plan.new_tunnels).await?;
    let writes = status_writes(view, plan, statuses);
    let mut written = Vec::with_capacity(writes.len());
    for r in ds.write_statuses(&writes).await {
        match r {
            Ok(s) => written.push(s),
            // Deleted since the view was taken: nothing to write.
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e),
        }
    }
    let statuses_written = std::time::Instant::now();
    // Concurrently too (a cold start records thousands), started in the
    // plan's order, which is what orders their keys; each starts as soon
    // as one before it is done (no wait for a whole batch).
    let records: Vec<_> = plan
        .events
        .iter()
        .map(|e| ds.record_event(e.clone()))
        .collect();
    stream::iter(records)
        .buffered(WRITE_CONCURRENCY)
        .try_collect::<Vec<()>>()
        .await?;
    if !plan.events.is_empty() {
        tracing::debug!(
            events = plan.events.len(),
            ms = ms_since(statuses_written),
            "events recorded"
        );
    }
    Ok(created.into_iter().chain(written).collect())
}

/// Creates an EgressTunnel for each of `nodes`; returns those created.
async fn create_tunnels(ds: &dyn Datastore, nodes: &[String]) -> Result<Vec<Stored>> {
    let mut created = Vec::new();
    for node in nodes {
        let tunnel = json!({
            "apiVersion": crate::api::API_VERSION,
            "kind": "EgressTunnel",
            "metadata": { "name": node },
            "spec": {},
        });
        match ds.create(Kind::EgressTunnel, tunnel).await {
            Ok(s) => created.push(s),
            // Its agent (etcd) got there first.
            Err(crate::datastore::DatastoreError::AlreadyExists { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(created)
}

/// The status writes of `plan`: the statuses that differ from `view`'s
/// (the gateways' and policies' only with `statuses`).
fn status_writes(
    view: &ClusterView,
    plan: &Plan,
    statuses: bool,
) -> Vec<(Kind, ObjectKey, StatusPatch)> {
    let mut writes: Vec<(Kind, ObjectKey, StatusPatch)> = Vec::new();
    if statuses {
        gateway_and_policy_writes(view, plan, &mut writes);
    }
    // Port-block grants: only the nodes whose grants changed (a few hundred
    // bytes each), never every grant of a gateway.
    let tunnels: HashMap<&str, &crate::api::EgressTunnel> = view
        .tunnels
        .iter()
        .filter_map(|t| Some((t.metadata.name.as_deref()?, t)))
        .collect();
    let compared: Box<dyn Iterator<Item = (&String, &Arc<TunnelGrants>)>> =
        match &plan.grants_to_compare.0 {
            Some(nodes) => Box::new(nodes.iter().filter_map(|n| plan.tunnels.get_key_value(n))),
            None => Box::new(plan.tunnels.iter()),
        };
    for (node, g) in compared {
        let Some(t) = tunnels.get(node.as_str()) else {
            continue;
        };
        let (size, blocks) = t
            .status
            .as_ref()
            .map(|s| (s.port_block_size, s.port_blocks.as_slice()))
            .unwrap_or((0, &[]));
        if size != g.port_block_size || blocks != g.port_blocks.as_slice() {
            writes.push((
                Kind::EgressTunnel,
                ObjectKey::cluster(node),
                grants_patch(g),
            ));
        }
    }
    writes
}

fn gateway_and_policy_writes(
    view: &ClusterView,
    plan: &Plan,
    writes: &mut Vec<(Kind, ObjectKey, StatusPatch)>,
) {
    let gw_cur: HashMap<&str, _> = view
        .gateways
        .iter()
        .filter_map(|g| Some((g.metadata.name.as_deref()?, g.status.as_ref())))
        .collect();
    for (name, st) in plan.gateways.iter() {
        if gw_cur.get(name.as_str()).copied().flatten() != Some(st) {
            writes.push((
                Kind::EgressGateway,
                ObjectKey::cluster(name),
                patch(GATEWAY_FIELDS, json!(st)),
            ));
        }
    }
    let pol_cur = policy_statuses(view);
    for ((kind, key), st) in plan.policies.iter() {
        let cur = pol_cur.get(&(*kind, key.namespace.as_str(), key.name.as_str()));
        if cur.copied().flatten() != Some(st) {
            writes.push((*kind, key.clone(), patch(POLICY_FIELDS, json!(st))));
        }
    }
}

/// The statuses of every policy and cluster policy in `view`, by kind,
/// namespace and name.
fn policy_statuses(
    view: &ClusterView,
) -> HashMap<(Kind, &str, &str), Option<&crate::api::EgressPolicyStatus>> {
    fn name(m: &kube::core::ObjectMeta) -> &str {
        m.name.as_deref().unwrap_or("")
    }
    view.policies
        .iter()
        .map(|p| {
            let ns = p.metadata.namespace.as_deref().unwrap_or("");
            (
                (Kind::EgressPolicy, ns, name(&p.metadata)),
                p.status.as_ref(),
            )
        })
        .chain(view.cluster_policies.iter().map(|p| {
            let key = (Kind::EgressClusterPolicy, "", name(&p.metadata));
            (key, p.status.as_ref())
        }))
        .collect()
}

/// Events in flight at once.
pub const WRITE_CONCURRENCY: usize = 32;

/// Nodes some gateway's selector picks.
pub fn gateway_eligible(view: &ClusterView) -> BTreeSet<String> {
    view.gateway_candidates(crate::view::Gateways::All)
}

/// Writes the tunnels' new phases (into the cache too) and records their
/// events. Returns how many tunnels were written.
async fn write_phases(
    ds: &dyn Datastore,
    cache: &mut ViewCache,
    changes: &[PhaseChange],
) -> Result<usize> {
    use futures::stream::{self, StreamExt, TryStreamExt};
    let writes: Vec<StatusWrite> = changes
        .iter()
        .map(|c| {
            let st = json!({"phase": c.to, "lastHeartbeatTime": c.last_heartbeat});
            let key = ObjectKey::cluster(&c.node);
            (Kind::EgressTunnel, key, patch(TUNNEL_FIELDS, st))
        })
        .collect();
    let mut events = Vec::new();
    for (c, r) in changes.iter().zip(ds.write_statuses(&writes).await) {
        match r {
            Err(e) if e.is_not_found() => continue,
            r => cache.put_stored(&r?),
        }
        events.push(ds.record_event(phase_event(c)));
    }
    let n = events.len();
    stream::iter(events)
        .buffered(WRITE_CONCURRENCY)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(n)
}

/// The event recorded on the tunnel of a phase change.
fn phase_event(c: &PhaseChange) -> Event {
    let event = match c.event_type() {
        EventType::Normal => Event::normal,
        EventType::Warning => Event::warning,
    };
    event(
        Kind::EgressTunnel,
        ObjectKey::cluster(&c.node),
        c.reason(),
        c.message(),
    )
}

/// What one pass did, for metrics.
#[derive(Clone, Debug, Default)]
pub struct TickReport {
    /// Objects written.
    pub writes: usize,
    /// Failovers written in this pass.
    pub moves: Vec<EipMove>,
    /// When each gateway-eligible node's heartbeat was last seen (the
    /// monitor's start for a node not seen yet).
    pub last_heartbeat: BTreeMap<String, Instant>,
    /// Port grants after this pass (see `ports`).
    pub ports: PortFacts,
}

/// One pass as leader on a [`ViewCache`]: heartbeats, tunnel phases,
/// allocation, writes. No relist; what this pass writes goes into the cache
/// at once, so the next pass never works on a view that lacks its own writes
/// (which would hand out epochs twice). Reports the failovers it wrote and
/// the heartbeats it saw.
pub async fn tick_cached_report(
    ds: &dyn Datastore,
    cache: &mut ViewCache,
    monitor: &mut HeartbeatMonitor,
    cfg: &RunConfig,
) -> Result<TickReport> {
    let now = Instant::now();
    heartbeat::observe(monitor, &ds.heartbeats().await?, now);
    let eligible = gateway_eligible(&cache.view);
    let last_heartbeat = eligible
        .iter()
        .map(|n| (n.clone(), heartbeat::last_seen(monitor, n)))
        .collect();
    let timeout = cfg.timers.eip_eviction_timeout;
    let changes = heartbeat::changes(monitor, &cache.view, &eligible, now, timeout);
    let mut n = write_phases(ds, cache, &changes).await?;
    let t = std::time::Instant::now();
    let kept = (cache.memo.grants.decided, cache.memo.grants.reused);
    let partial = cache.memo.partial_passes;
    let plan = reconcile_with(&cache.view, &cfg.controller, &mut cache.memo);
    let partial = cache.memo.partial_passes > partial;
    let reconciled = t.elapsed();
    // A partial pass follows a pass that wrote no gateway or policy status
    // (each write puts one into the cache, which redoes the structure), or
    // found them all as planned: they are as planned now too. After a
    // failed write, the next pass redoes and compares everything.
    let written = match write_plan_parts(ds, &cache.view, &plan, !partial).await {
        Ok(w) => w,
        Err(e) => {
            cache.memo.redo_everything();
            return Err(e);
        }
    };
    tracing::debug!(
        reconcile_ms = reconciled.as_secs_f64() * 1e3,
        write_ms = (t.elapsed() - reconciled).as_secs_f64() * 1e3,
        addresses_decided = cache.memo.grants.decided - kept.0,
        addresses_reused = cache.memo.grants.reused - kept.1,
        partial,
        objects = written.len(),
        events = plan.events.len(),
        bytes = written
            .iter()
            .map(|s| s.value.to_string().len())
            .sum::<usize>(),
        "pass"
    );
    n += written.len();
    for s in &written {
        cache.put_stored(s);
    }
    Ok(TickReport {
        writes: n,
        ports: PortFacts {
            workers: plan.ports,
            addresses: plan.addresses,
        },
        moves: plan.moves,
        last_heartbeat,
    })
}

/// What the loop reports for metrics and health checks.
#[derive(Debug, Default)]
pub struct LoopStats {
    pub leader: std::sync::atomic::AtomicBool,
    pub term: std::sync::atomic::AtomicU64,
    pub passes: std::sync::atomic::AtomicU64,
    pub writes: std::sync::atomic::AtomicU64,
    pub errors: std::sync::atomic::AtomicU64,
    /// Failovers this replica wrote as leader, by reason.
    pub failovers: Mutex<BTreeMap<FailoverReason, u64>>,
    /// While leading: when each gateway-eligible node's heartbeat was last
    /// seen (empty on a replica that does not lead).
    pub last_heartbeat: Mutex<BTreeMap<String, Instant>>,
    /// Port grants after the last written pass.
    pub ports: Mutex<PortFacts>,
}

impl LoopStats {
    /// Counts the failovers of a written pass and keeps its heartbeat view.
    /// Takes the report: its port facts (one per worker and address, tens
    /// of thousands in a large cluster) are moved, never copied, per pass.
    pub fn record(&self, report: TickReport) {
        let mut f = self.failovers.lock().unwrap_or_else(|e| e.into_inner());
        for m in &report.moves {
            *f.entry(m.reason).or_default() += 1;
        }
        drop(f);
        *self
            .last_heartbeat
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = report.last_heartbeat;
        *self.ports.lock().unwrap_or_else(|e| e.into_inner()) = report.ports;
    }

    /// This replica stopped leading: it no longer watches heartbeats.
    pub fn lost_leadership(&self) {
        self.leader
            .store(false, std::sync::atomic::Ordering::Relaxed);
        self.last_heartbeat
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }
}

/// Campaigns, and while leader reconciles on every change and every
/// monitor period. Returns when `shutdown` completes (resigning first).
pub async fn run_controller(
    ds: Arc<dyn Datastore>,
    cfg: RunConfig,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    run_controller_with_stats(ds, cfg, shutdown, Arc::default()).await
}

/// Resolves when the probe-down set changes; pending forever without a prober.
async fn probe_changed(
    rx: &mut Option<tokio::sync::watch::Receiver<BTreeSet<String>>>,
) -> Result<(), tokio::sync::watch::error::RecvError> {
    match rx {
        Some(rx) => rx.changed().await,
        None => std::future::pending().await,
    }
}

/// How soon a campaign that failed (the datastore unreachable) is tried again.
const CAMPAIGN_RETRY: Duration = Duration::from_secs(1);

/// A leader that cannot read the datastore steps down (resigning if it
/// can; its term fences any write it might still send) and campaigns again,
/// so a datastore restart costs a new term, never the process.
async fn step_down(
    ds: &dyn Datastore,
    lead: &crate::datastore::Leadership,
    stats: &LoopStats,
    why: &str,
) {
    tracing::warn!("stepping down: {why}; campaigning again");
    stats.lost_leadership();
    let _ = ds.fence(None).await;
    let _ = ds.resign(lead).await;
}

/// [`run_controller`], counting into `stats`.
pub async fn run_controller_with_stats(
    ds: Arc<dyn Datastore>,
    cfg: RunConfig,
    shutdown: impl Future<Output = ()>,
    stats: Arc<LoopStats>,
) -> anyhow::Result<()> {
    use std::sync::atomic::Ordering::Relaxed;
    cfg.timers.validate()?;
    tokio::pin!(shutdown);
    let ds = ds.as_ref();
    // Beside campaigning and leading, not before: on a datastore written
    // before the index existed this reads every pod, which used to hold the
    // first pass back by seconds at 50,000 pods. Every replica does it (the
    // writes are conditional, so replicas may race) until it succeeds.
    let indexes = async {
        complete_indexes_until_done(ds, &cfg.identity).await;
        std::future::pending::<()>().await
    };
    let lead = async {
        loop {
            let Some(lead) = campaign(ds, &cfg, &mut shutdown).await else {
                return;
            };
            tracing::info!(identity = %cfg.identity, term = lead.term, "leading");
            stats.leader.store(true, Relaxed);
            stats.term.store(lead.term, Relaxed);
            // From here every status write is fenced by this term.
            if let Err(e) = ds.fence(Some(&lead)).await {
                step_down(ds, &lead, &stats, &e.to_string()).await;
                continue;
            }
            println!("controller {} leading, term {}", cfg.identity, lead.term);
            if let Led::ShutDown = lead_while_leader(ds, &cfg, &lead, &stats, &mut shutdown).await {
                return;
            }
        }
    };
    tokio::select! {
        _ = lead => {}
        _ = indexes => {}
    }
    Ok(())
}

/// Campaigns until this replica leads; `None` when `shutdown` comes first.
async fn campaign<F: Future<Output = ()>>(
    ds: &dyn Datastore,
    cfg: &RunConfig,
    shutdown: &mut Pin<&mut F>,
) -> Option<crate::datastore::Leadership> {
    loop {
        match ds
            .try_acquire(&cfg.election, &cfg.identity, cfg.lease_ttl)
            .await
        {
            Ok(Some(l)) => return Some(l),
            Ok(None) => {}
            // The datastore is down or restarting: campaign again soon,
            // the process stays up.
            Err(e) => {
                tracing::warn!("campaigning failed: {e}; trying again");
                tokio::select! {
                    _ = shutdown.as_mut() => return None,
                    _ = tokio::time::sleep(CAMPAIGN_RETRY.min(cfg.lease_ttl / 3)) => {}
                }
                continue;
            }
        }
        tokio::select! {
            _ = shutdown.as_mut() => return None,
            _ = tokio::time::sleep(cfg.lease_ttl / 3) => {}
        }
    }
}

/// How a term of leading ended.
enum Led {
    /// Leadership lost, or given up: campaign again.
    Lost,
    /// `shutdown` completed; resigned.
    ShutDown,
}

/// While leader: a pass on every change, every monitor period and every
/// change of the probe-down set, until leadership is lost or `shutdown`.
async fn lead_while_leader<F: Future<Output = ()>>(
    ds: &dyn Datastore,
    cfg: &RunConfig,
    lead: &crate::datastore::Leadership,
    stats: &LoopStats,
    shutdown: &mut Pin<&mut F>,
) -> Led {
    let mut monitor = HeartbeatMonitor::new(Instant::now().into_std());
    // None: list every kind before the next pass (at first, and after a
    // watch failed or fell behind).
    let mut cache: Option<ViewCache> = None;
    let mut ticker = tokio::time::interval(cfg.timers.tunnel_monitor_period.min(cfg.lease_ttl / 3));
    let mut probe_down = cfg.probe_down.clone();
    let mut stale = StaleTunnels::default();
    loop {
        let view = match &mut cache {
            Some(c) => c,
            None => match timed_list(ds).await {
                Ok(c) => cache.insert(c),
                Err(e) => {
                    step_down(ds, lead, stats, &format!("listing: {e}")).await;
                    return Led::Lost;
                }
            },
        };
        if let Some(rx) = &probe_down {
            monitor.set_probe_down(rx.borrow().clone());
        }
        if let Err(e) = ds.renew_leadership(lead).await {
            tracing::warn!("lost leadership: {e}");
            stats.lost_leadership();
            let _ = ds.fence(None).await;
            return Led::Lost;
        }
        let started = Instant::now();
        if !pass_as_leader(ds, view, &mut monitor, cfg, stats).await {
            return Led::Lost;
        }
        let last_pass = started.elapsed();
        let ended = Instant::now();
        let grace = stale_tunnel_grace(&cfg.timers);
        for (node, revision) in stale.due(&view.view, std::time::Instant::now(), grace) {
            remove_stale_tunnel(ds, &node, revision, grace).await;
        }
        tokio::select! {
            _ = shutdown.as_mut() => {
                stats.lost_leadership();
                let _ = ds.fence(None).await;
                let _ = ds.resign(lead).await;
                return Led::ShutDown;
            }
            _ = ticker.tick() => {}
            changed = probe_changed(&mut probe_down) => {
                if changed.is_err() {
                    probe_down = None;
                }
            }
            batch = view.next_batch() => match batch {
                Some(Ok(_)) => {
                    // Gather what follows closely into the same pass.
                    let gather = coalesce_wait(cfg.coalesce, last_pass, ended.elapsed());
                    if !gather.is_zero() {
                        tokio::time::sleep(gather).await;
                        while let Some(Some(b)) = futures::FutureExt::now_or_never(view.next_batch()) {
                            if let Err(e) = b {
                                tracing::warn!("watch: {e}; listing again");
                                cache = None;
                                break;
                            }
                        }
                    }
                }
                // A watch failed or fell behind: list again.
                Some(Err(e)) => {
                    tracing::warn!("watch: {e}; listing again");
                    cache = None;
                }
                None => return Led::Lost,
            },
        }
    }
}

/// Lists every kind into a fresh cache, saying how long it took.
async fn timed_list(ds: &dyn Datastore) -> Result<ViewCache> {
    let started = std::time::Instant::now();
    let c = ViewCache::start_for_controller(ds).await?;
    tracing::debug!(ms = ms_since(started), "listed every kind");
    Ok(c)
}

fn ms_since(t: std::time::Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// How long to gather changes before the next pass: until as long after
/// the last pass as it took (`idle` has passed since it ended), at most
/// `most`. A burst of changes then costs at most about half the loop's
/// time in passes, and a change after a quiet spell, or after a cheap
/// pass (a partial one: a few milliseconds), is not held back.
fn coalesce_wait(most: Duration, last_pass: Duration, idle: Duration) -> Duration {
    most.min(last_pass).saturating_sub(idle)
}

/// One counted pass as leader; `false` when a write was fenced off
/// (another replica leads). Other errors are counted and logged: the next
/// pass tries again.
async fn pass_as_leader(
    ds: &dyn Datastore,
    view: &mut ViewCache,
    monitor: &mut HeartbeatMonitor,
    cfg: &RunConfig,
    stats: &LoopStats,
) -> bool {
    use std::sync::atomic::Ordering::Relaxed;
    stats.passes.fetch_add(1, Relaxed);
    match tick_cached_report(ds, view, monitor, cfg).await {
        Ok(report) => {
            let n = report.writes;
            stats.writes.fetch_add(n as u64, Relaxed);
            for m in &report.moves {
                tracing::info!(gateway = %m.gateway, what = %m.what, from = %m.from, to = %m.to, reason = m.reason.as_str(), "failover");
            }
            stats.record(report);
            if n > 0 {
                tracing::debug!(writes = n, "reconciled");
            }
        }
        Err(crate::datastore::DatastoreError::LostLeadership { .. }) => {
            tracing::warn!("a write was fenced off: another replica leads");
            stats.lost_leadership();
            let _ = ds.fence(None).await;
            return false;
        }
        Err(e) => {
            stats.errors.fetch_add(1, Relaxed);
            tracing::warn!("reconcile failed: {e}");
        }
    }
    true
}

/// How long a tunnel's node must have been gone before the tunnel is
/// deleted: four eviction timeouts (a minute with the defaults), well past
/// the moment a new node's tunnel and Node reach the view in either order.
fn stale_tunnel_grace(timers: &FailoverTimers) -> Duration {
    timers.eip_eviction_timeout * 4
}

/// Deletes the EgressTunnel of a removed node (only while it is the
/// version seen: one that changed meanwhile is looked at again next pass),
/// and its heartbeat (a Lease on Kubernetes: they piled up too).
async fn remove_stale_tunnel(ds: &dyn Datastore, node: &str, revision: u64, grace: Duration) {
    let key = ObjectKey::cluster(node);
    match ds.delete(Kind::EgressTunnel, &key, Some(revision)).await {
        Ok(()) => {
            tracing::info!(node, "deleted the EgressTunnel of a removed node");
            if let Err(e) = ds.forget_heartbeat(node).await {
                tracing::warn!(node, "deleting the heartbeat of a removed node: {e}");
            }
            let msg =
                format!("node {node} has been gone for {grace:?}: its EgressTunnel is deleted");
            let _ = ds
                .record_event(Event::normal(Kind::EgressTunnel, key, "NodeRemoved", msg))
                .await;
        }
        Err(e) if e.is_not_found() => {}
        Err(e) => tracing::warn!(node, "deleting the EgressTunnel of a removed node: {e}"),
    }
}

/// Brings the datastore's indexes up to date with objects written before
/// they existed (etcd's pods by node: until it is complete, agents read
/// every pod, as before), trying again after a failure. Says so on stdout
/// once done.
async fn complete_indexes_until_done(ds: &dyn Datastore, identity: &str) {
    loop {
        let started = std::time::Instant::now();
        match ds.complete_indexes().await {
            Ok(()) => {
                tracing::debug!(ms = ms_since(started), "datastore indexes complete");
                println!("controller {identity} datastore indexes complete");
                return;
            }
            Err(e) => tracing::warn!(
                "completing the datastore's indexes failed: {e}; trying again in {INDEX_RETRY:?}"
            ),
        }
        tokio::time::sleep(INDEX_RETRY).await;
    }
}

/// How long after a failed index completion it is tried again.
const INDEX_RETRY: Duration = Duration::from_secs(5);

#[cfg(test)]
mod coalesce_tests {
    use super::*;

    #[test]
    fn the_wait_follows_the_last_pass_up_to_the_setting() {
        let ms = Duration::from_millis;
        assert_eq!(coalesce_wait(ms(50), ms(3), ms(0)), ms(3));
        assert_eq!(coalesce_wait(ms(50), ms(400), ms(0)), ms(50));
        assert_eq!(
            coalesce_wait(Duration::ZERO, ms(400), ms(0)),
            Duration::ZERO
        );
        // What has passed since the last pass counts towards the wait.
        assert_eq!(coalesce_wait(ms(50), ms(40), ms(15)), ms(25));
        assert_eq!(coalesce_wait(ms(50), ms(40), ms(900)), ms(0));
    }
}
