//! The agent's loop. One task owns the maps; everything that can change them
//! (datastore events, link events, the fence's deadlines, a periodic resync)
//! only marks the state dirty, and one reconcile pass then computes the whole
//! desired state and writes the difference.
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
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::{Context, Result};
use egress_common::maps::{PROG_TUNNEL_INGRESS, PROG_UPLINK_INGRESS, PROG_WORKER_EGRESS};
use egress_control::{
    agent_state::{self, AgentConfig},
    api::{NodeRecord, PolicyOverCapacity},
    controller::{Changed, ClusterView, ViewCache},
    datastore::Datastore,
};
use egress_failover::{
    fence::{Announcement, Assignment, Fence},
    timers::FailoverTimers,
};
use ipnet::IpNet;
use tokio::time::Instant;

use super::{
    adapt::{desired_maps, NodeFacts},
    published::{admin_handler, Published},
    register::{
        addresses_changed, node_addresses, publish_awaiting_reconfirmation, publish_over_capacity,
        register, registration_lost, SelfDescription,
    },
    uplink_addr,
};
use crate::{
    admin,
    datapath::{apply, lease, links, Datapath, DesiredMaps, PinnedMaps},
    node::{
        link::ObservedLink,
        vxlan::{self, VxlanSpec},
        watch::{LinkEvent, LinkWatch},
    },
    EBPF_OBJECT,
};

/// Everything the agent is told at start.
#[derive(Clone, Debug)]
pub struct AgentSettings {
    pub node: String,
    pub labels: BTreeMap<String, String>,
    pub uplink: String,
    /// Tunnel endpoint; the uplink's first IPv4 address when not given.
    pub tunnel_ip: Option<Ipv4Addr>,
    /// The node's IPv6 address (useNodeIP); the uplink's first global one
    /// when not given.
    pub node_ipv6: Option<Ipv6Addr>,
    pub vxlan: VxlanSpec,
    pub vni: u32,
    pub pod_cidrs: Vec<IpNet>,
    pub service_cidrs: Vec<IpNet>,
    pub extra_cidrs: Vec<IpNet>,
    pub timers: FailoverTimers,
    /// Answer ARP/NDP and send gratuitous announcements for owned EIPs.
    pub l2_announce: bool,
    pub pin_dir: PathBuf,
    /// Sizes of the maps the agent creates (the NAT tables).
    pub map_sizes: crate::datapath::MapSizes,
    pub admin_addr: SocketAddr,
    /// A full reconcile at least this often, whatever the watches say.
    pub resync: Duration,
    /// Answer datapath probes on (tunnel address, port) with these settings.
    pub probe: Option<(egress_failover::probe::SessionConfig, u16)>,
    /// Peer with these reflectors and announce pod CIDRs and owned EIPs.
    pub bgp: Option<super::bgp::AgentBgpConfig>,
}

/// First and longest wait between attempts to register at start.
const REGISTER_RETRY_FIRST: Duration = Duration::from_millis(250);
const REGISTER_RETRY_MAX: Duration = Duration::from_secs(5);
/// How soon a failed list of the datastore is tried again.
const LIST_RETRY: Duration = Duration::from_secs(1);

/// Every EIP assignment in the view, for the fence.
pub fn assignments(view: &ClusterView) -> Vec<Assignment> {
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

/// The addresses of the single pods the policies select on this node.
fn selected_pod_addresses(d: &crate::datapath::DesiredMaps) -> impl Iterator<Item = IpAddr> + '_ {
    d.policies
        .iter()
        .flat_map(|p| &p.sources)
        .filter(|c| c.len == if c.addr.is_ipv4() { 32 } else { 128 })
        .map(|c| c.addr)
}

pub async fn run(s: AgentSettings, ds: Arc<dyn Datastore>) -> Result<()> {
    s.timers.validate()?;
    let (conn, handle, _) = rtnetlink::new_connection().context("opening netlink")?;
    tokio::spawn(conn);

    // The kernel edge first: a node whose datapath cannot come up must not
    // register as Ready.
    let mut dp = Datapath::load_with(EBPF_OBJECT, &s.pin_dir, s.map_sizes)?;
    let uplink = vxlan::find_link(&handle, &s.uplink)
        .await?
        .with_context(|| format!("uplink interface {} does not exist (--uplink)", s.uplink))?;
    let mut s = s;
    if s.vxlan.mtu == 0 {
        // VXLAN over IPv4 adds 50 bytes.
        s.vxlan.mtu = uplink.mtu.saturating_sub(50);
    }
    let vxlan_ifindex = vxlan::ensure(&handle, &s.vxlan).await?;
    let uplink_mac = uplink
        .mac
        .with_context(|| format!("uplink {} has no Ethernet address", s.uplink))?;
    let uplink_addrs = uplink_addr::link_addresses(&handle, uplink.index).await?;
    let tunnel_ip = match s.tunnel_ip {
        Some(ip) => ip,
        None => uplink_addr::first_ipv4(&uplink_addrs)
            .with_context(|| format!("uplink {} has no IPv4 address; set --tunnel-ip", s.uplink))?,
    };
    let node_ipv6 = s
        .node_ipv6
        .or_else(|| uplink_addr::node_ipv6(&uplink_addrs));
    links::attach_ingress(&mut dp, PROG_TUNNEL_INGRESS, &s.vxlan.name, vxlan_ifindex)?;
    links::attach_ingress(&mut dp, PROG_UPLINK_INGRESS, &s.uplink, uplink.index)?;
    // Loaded now, not when the node's first pod appears: that load, inside
    // the loop, held the heartbeat back for the verifier's seconds.
    let load_started = Instant::now();
    links::load(&mut dp, PROG_WORKER_EGRESS)?;
    tracing::debug!(took = ?load_started.elapsed(), "worker program loaded");
    let mut link_watch = LinkWatch::start().await?;
    let mut maps = PinnedMaps::open(&s.pin_dir)?;
    let facts = NodeFacts {
        tunnel_ip,
        vxlan_ifindex,
        uplink_ifindex: uplink.index,
        uplink_mac,
        vni: s.vni,
        tunnel_mtu: s.vxlan.mtu as u16,
        l2_announce: s.l2_announce,
        // The datapath answers the controller's probes itself, so an agent
        // restart is not a dead gateway.
        probe_port: s.probe.map_or(0, |(_, port)| port),
        vxlan_port: s.vxlan.port,
    };

    let mut me = SelfDescription {
        node: NodeRecord {
            name: s.node.clone(),
            labels: s.labels.clone(),
            addresses: node_addresses(tunnel_ip, node_ipv6),
            pod_cidrs: s.pod_cidrs.iter().map(|c| c.to_string()).collect(),
            ready: true,
        },
        tunnel_ip,
        ipv6: node_ipv6,
        mac: uplink_mac,
        parent: s.uplink.clone(),
    };
    // The datastore may be down (restarting, unreachable): the datapath is
    // attached already and keeps the node's traffic going; keep trying
    // rather than exit and wait out a crash-loop back-off once it is back.
    let mut wait = REGISTER_RETRY_FIRST;
    while let Err(e) = register(ds.as_ref(), &me).await {
        tracing::warn!(error = %format!("{e:#}"), retry_in = ?wait, "registering failed; trying again");
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(REGISTER_RETRY_MAX);
    }
    tracing::info!(node = %s.node, %tunnel_ip, ?node_ipv6, "registered; datapath attached");

    // The controller's datapath probes are answered by the uplink program
    // (see egress-ebpf/src/probe.rs, `probe_port` in the config), not here:
    // a probe then proves this node's datapath, and an agent restart does
    // not look like a dead gateway.
    let mut bgp = match &s.bgp {
        Some(cfg) => Some(super::bgp::AgentBgp::start(cfg, tunnel_ip).await?),
        None => None,
    };
    let published = Arc::new(Mutex::new(Published::default()));
    let learned = bgp.as_ref().map(|b| b.learned());
    let speaker = bgp.as_ref().map(|b| b.handle().clone());
    let learned_changed = bgp.as_ref().map(|b| b.learned_changed());
    let (admin, _admin_task) = admin::serve(
        s.admin_addr,
        admin_handler(
            published.clone(),
            learned.clone(),
            speaker,
            s.pin_dir.clone(),
        ),
    )
    .await?;
    println!("ready node={} tunnel={} admin={}", s.node, tunnel_ip, admin);

    let cfg = AgentConfig {
        node: s.node.clone(),
        service_cidrs: s.service_cidrs.clone(),
        extra_cidrs: s.extra_cidrs.clone(),
        pod_cidrs: s.pod_cidrs.clone(),
    };
    let mut fence = Fence::new(&s.node, &s.timers);
    // Port use to the controller, on its own clock (ends with this function).
    // It reads the node's grants from this loop's view, not the datastore.
    let (grants_tx, grants_rx) = tokio::sync::watch::channel(None);
    let _port_use = AbortOnDrop(tokio::spawn(super::port_use::run(
        ds.clone(),
        s.node.clone(),
        s.pin_dir.clone(),
        grants_rx,
    )));
    published.lock().unwrap().resumed.announce_lease =
        seed_fence_from_lease(&mut fence, &s.pin_dir, s.timers.fence_after());
    // The live cache, or (while there is none) the last view it held.
    let mut cache: Option<ViewCache> = None;
    let mut last_view = ClusterView::default();
    let mut have_view = false;
    // The longest the agent trusts its watches before it lists every kind again.
    let relist_period = ds.relist_period();
    let first_relist = Instant::now() + relist_period + relist_offset(&s.node, relist_period);
    let mut relist = tokio::time::interval_at(first_relist, relist_period);
    let mut relist_due = false;
    let mut announced: BTreeSet<IpAddr> = BTreeSet::new();
    let mut eligible = false;
    let mut heartbeat = tokio::time::interval(s.timers.tunnel_update_period);
    let mut resync = tokio::time::interval(s.resync);
    let shutdown = crate::signals::shutdown_signal();
    tokio::pin!(shutdown);
    let mut pod_reach = super::pod_devices::PodReachCheck::default();
    let mut dirty = true;
    // When to register again (the addresses changed, or the datastore lost
    // the registration), and when it was last done.
    let mut register_at: Option<Instant> = None;
    let mut last_registered = Instant::now();
    let mut recheck_registration_at: Option<Instant> = None;
    // The fence's deadline passed: reconcile from the last view at once,
    // without waiting for a datastore that may be unreachable.
    let mut fence_due = false;
    let mut was_fenced = false;
    // The node's ephemeral ports, and the node-IP blocks last seen over them.
    let ephemeral = super::node_ports::ephemeral_range();
    let mut colliding = BTreeSet::new();
    // What this run last wrote as `awaitingReconfirmation` (the view may
    // not show it yet).
    let mut asked_published = None;
    // The policies the maps could not hold, as of the last apply, and as
    // last written to the datastore.
    let mut over_now: Vec<PolicyOverCapacity> = Vec::new();
    let mut over_published: Option<Vec<PolicyOverCapacity>> = None;
    // Policy maps created anew (their pins had an older layout): pod veths
    // keep the previous program, with its filled maps, until the first
    // apply has filled the new ones; a new program would match no policy
    // and let selected pods' traffic out untranslated.
    let mut held_links: Option<Vec<ObservedLink>> = dp.policy_maps_replaced().then(Vec::new);

    loop {
        // The fence closed (also while a call was pending): same as its deadline.
        let fenced = fence.is_fenced(std::time::Instant::now());
        if fenced && !was_fenced {
            fence_due = true;
            dirty = true;
        }
        was_fenced = fenced;
        // (Re)start the cache; not while the fence is due, which must not
        // wait for a datastore that may be unreachable.
        if (cache.is_none() || relist_due) && !fence_due {
            let start = async { Ok(ViewCache::start(ds.as_ref()).await?) };
            match ds_call(&fence, &s.timers, start).await {
                Ok(c) => {
                    let mut p = published.lock().unwrap();
                    p.datastore_lists += 1;
                    p.view_pods = c.view.pods.len();
                    cache = Some(c);
                    last_view = ClusterView::default();
                    relist_due = false;
                    dirty = true;
                }
                Err(e) => {
                    // Keep the last view (or the live cache, on a periodic
                    // relist); the fence alone decides what may still be announced.
                    tracing::warn!(error = %format!("{e:#}"), "listing the datastore failed; keeping the last view");
                    published.lock().unwrap().last_error = Some(e.to_string());
                }
            }
        }
        if dirty {
            dirty = false;
            fence_due = false;
            if let Some(c) = &cache {
                have_view = true;
                fence.apply_assignments(std::time::Instant::now(), assignments(&c.view));
                if register_at.is_none()
                    && registration_lost(&c.view, &me, ds.writes_cluster_records())
                {
                    if last_registered.elapsed() >= LIST_RETRY {
                        tracing::warn!(
                            "the datastore no longer holds this node's registration; registering again"
                        );
                        register_at = Some(Instant::now());
                    } else {
                        // The last registration's own events may still be
                        // on their way: look again once they had the time
                        // (a deletion in that window used to wait for the
                        // next resync, 30 s by default).
                        recheck_registration_at = Some(last_registered + LIST_RETRY);
                    }
                }
            }
            let view = cache.as_ref().map_or(&last_view, |c| &c.view);
            if have_view {
                let nd = agent_state::desired(view, &cfg);
                eligible = nd.gateway_eligible;
                let now = std::time::Instant::now();
                let allowed: BTreeSet<IpAddr> =
                    fence.announcements(now).iter().map(|a| a.eip).collect();
                let (mut desired, skipped) = desired_maps(view, &nd, &facts, &allowed);
                // EIP routes learned over BGP that are not older than the view.
                if let Some(l) = &learned {
                    desired.routes =
                        super::routes::eip_routes(&l.lock().unwrap(), &assignments(view));
                }
                for sk in &skipped {
                    tracing::warn!(policy = %sk.policy, why = %sk.why, "policy not applied on this node");
                }
                pod_reach
                    .check(&handle, selected_pod_addresses(&desired))
                    .await;
                let mut own_ports = vec![(facts.vxlan_port, facts.vxlan_port)];
                own_ports.extend(ephemeral);
                if facts.probe_port != 0 {
                    own_ports.push((facts.probe_port, facts.probe_port));
                }
                let collide = super::node_ports::colliding_blocks(&desired, &own_ports);
                if collide != colliding && !collide.is_empty() {
                    tracing::warn!(
                        blocks = ?collide,
                        ephemeral = ?ephemeral,
                        vxlan_port = facts.vxlan_port,
                        probe_port = facts.probe_port,
                        "port blocks of this node's own address hold its own ports (net.ipv4.ip_local_port_range, the VXLAN or probe port): packets to them go to workers; keep the controller's --node-ip-port-range (chart feature.nodeIpPortRange) clear of them"
                    );
                }
                colliding = collide;
                let now_announced: BTreeSet<IpAddr> =
                    desired.owned_eips.iter().map(|o| o.eip).collect();
                match apply(&mut maps, &desired) {
                    Ok(report) => {
                        let mut p = published.lock().unwrap();
                        p.ready = true;
                        p.reconciles += 1;
                        p.last_error = None;
                        // Only gateway-eligible nodes heartbeat: a worker
                        // that never renews is not fenced, it has nothing
                        // to announce (an alert on the metric must not fire
                        // on every worker).
                        p.fenced = eligible && fence.is_fenced(now);
                        p.announced = now_announced.iter().copied().collect();
                        p.policies = desired.policies.len();
                        p.policy_names = nd
                            .policies
                            .iter()
                            .map(|(id, t)| {
                                (
                                    *id,
                                    format!("{}/{}/{}", t.kind.name(), t.key.namespace, t.key.name),
                                )
                            })
                            .collect();
                        p.written = report.total_written();
                        p.removed = report.total_removed();
                        over_now = super::capacity::reports(&report.over_capacity, &nd.policies);
                        p.over_capacity = over_now.clone();
                        drop(p);
                        for link in held_links.take().unwrap_or_default() {
                            attach_pod_veth(&mut dp, &link, &published);
                        }
                    }
                    Err(e) => {
                        tracing::error!(error = %format!("{e:#}"), "writing the maps failed");
                        published.lock().unwrap().last_error = Some(e.to_string());
                    }
                }
                announce_new(
                    &s.uplink,
                    &desired,
                    &announced,
                    &now_announced,
                    s.l2_announce,
                );
                for gone in announced.difference(&now_announced) {
                    tracing::info!(eip = %gone, "no longer announcing");
                }
                if let Some(bgp) = bgp.as_mut() {
                    // Not the node's own address (useNodeIP): a host route
                    // to a node via itself is no route for its neighbours.
                    let eips: BTreeMap<IpAddr, u64> = desired
                        .owned_eips
                        .iter()
                        .filter(|o| !o.node_ip)
                        .map(|o| (o.eip, u64::from(o.epoch)))
                        .collect();
                    let pod_cidrs = super::bgp::node_pod_cidrs(&s.pod_cidrs, &view.nodes, &s.node);
                    let want = super::bgp::wanted_routes(&pod_cidrs, &eips, IpAddr::V4(tunnel_ip));
                    if let Err(e) = bgp.sync(&want).await {
                        tracing::warn!(error = %format!("{e:#}"), "BGP announcements not in step");
                    }
                }
                announced = now_announced;
                grants_tx.send_replace(view.tunnel(&s.node).and_then(|t| t.status.clone()));
                let stored = stored_over_capacity(view, &s.node);
                if super::capacity::must_publish(&over_now, &stored, over_published.as_deref()) {
                    let write = publish_over_capacity(ds.as_ref(), &s.node, &over_now);
                    match ds_call(&fence, &s.timers, write).await {
                        Ok(()) => {
                            for r in &over_now {
                                tracing::warn!(policy = %super::capacity::policy_label(r), limit = %r.limit,
                                    count = r.count, max = r.max,
                                    "policy exceeds this node's datapath: not applied, its traffic is dropped");
                            }
                            over_published = Some(over_now.clone());
                        }
                        Err(e) => {
                            tracing::warn!(error = %format!("{e:#}"), "publishing the policies over capacity failed; retrying");
                        }
                    }
                }
                // Healthy again after fencing itself: ask for newer epochs
                // of the EIPs it withholds (once per change of the set).
                let asked = fence.awaiting_reconfirmation();
                if !fence.is_fenced(now)
                    && asked != stored_reconfirmation(view, &s.node)
                    && asked_published.as_ref() != Some(&asked)
                {
                    let write = publish_awaiting_reconfirmation(ds.as_ref(), &s.node, &asked);
                    match ds_call(&fence, &s.timers, write).await {
                        Ok(()) => {
                            if !asked.is_empty() {
                                tracing::info!(
                                    ?asked,
                                    "fenced EIPs: asked the controller to reconfirm them"
                                );
                            }
                            asked_published = Some(asked);
                        }
                        Err(e) => {
                            tracing::warn!(error = %format!("{e:#}"), "asking for reconfirmation failed; retrying");
                        }
                    }
                }
            }
        }

        let fence_deadline = fence
            .next_deadline(std::time::Instant::now())
            .map(Instant::from_std);
        tokio::select! {
            _ = &mut shutdown => break,
            ev = link_watch.next() => match ev {
                // The uplink can be a veth too (nodes that are containers or
                // namespaces); it is never a pod's.
                Some(LinkEvent::Present(link)) if link.is_pod_veth() && link.index != facts.uplink_ifindex => {
                    match held_links.as_mut() {
                        Some(held) => held.push(link),
                        None => attach_pod_veth(&mut dp, &link, &published),
                    }
                }
                Some(LinkEvent::Removed(link)) if held_links.is_some() => {
                    held_links.iter_mut().for_each(|h| h.retain(|l| l.index != link.index));
                    links::forget_interface(&s.pin_dir, link.index);
                }
                Some(LinkEvent::Removed(link)) => links::forget_interface(&s.pin_dir, link.index),
                Some(LinkEvent::AddressChanged(i)) if i == facts.uplink_ifindex => {
                    if addresses_changed(&handle, &s, facts.uplink_ifindex, &mut me).await {
                        register_at = Some(Instant::now());
                    }
                }
                Some(_) => {}
                None => anyhow::bail!("the netlink link watch ended"),
            },
            batch = next_batch(&mut cache) => {
                match batch {
                    Ok(changed) => {
                        let mut p = published.lock().unwrap();
                        p.watch_batches += 1;
                        p.view_pods = cache.as_ref().map_or(0, |c| c.view.pods.len());
                        if concerns(&changed, &s.node) {
                            dirty = true;
                        } else {
                            p.batches_skipped += 1;
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %format!("{e:#}"), "datastore watch failed; listing again");
                        if let Some(c) = cache.take() {
                            last_view = c.view;
                        }
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        dirty = true;
                    }
                }
            }
            _ = relist.tick() => relist_due = true,
            // No cache (the datastore could not be listed): try again soon.
            _ = tokio::time::sleep(LIST_RETRY), if cache.is_none() => {}
            _ = heartbeat.tick(), if eligible => {
                let sent = std::time::Instant::now();
                let renew = async {
                    Ok(ds.renew_heartbeat(&s.node, s.timers.eip_eviction_timeout).await?)
                };
                match ds_call(&fence, &s.timers, renew).await {
                    Ok(_) => {
                        fence.on_heartbeat_renewed(sent);
                        published.lock().unwrap().last_renewal = Some(std::time::Instant::now());
                        let until = sent + s.timers.fence_after();
                        if let Err(e) = lease::write(&s.pin_dir, Some(until)) {
                            tracing::warn!(error = %format!("{e:#}"), "extending the datapath's announce lease failed");
                        }
                    }
                    Err(e) => tracing::warn!(error = %format!("{e:#}"), "heartbeat renewal failed"),
                }
                // Renewals move the fence's deadline; the announcements may change.
                dirty = true;
            }
            _ = sleep_until_opt(fence_deadline) => {
                dirty = true;
                fence_due = true;
            }
            _ = resync.tick() => dirty = true,
            _ = sleep_until_opt(recheck_registration_at) => {
                recheck_registration_at = None;
                dirty = true;
            }
            // The node's addresses changed, the datastore lost its
            // registration, or registering failed: register.
            _ = sleep_until_opt(register_at) => {
                last_registered = Instant::now();
                match ds_call(&fence, &s.timers, register(ds.as_ref(), &me)).await {
                    Ok(()) => register_at = None,
                    Err(e) => {
                        tracing::warn!(error = %format!("{e:#}"), "registering the node's addresses failed; trying again");
                        register_at = Some(Instant::now() + LIST_RETRY);
                    }
                }
            }
            _ = async {
                match &learned_changed {
                    Some(n) => n.notified().await,
                    None => std::future::pending().await,
                }
            } => dirty = true,
        }
    }
    tracing::info!("agent stopping; programs stay attached and maps pinned for the next start");
    Ok(())
}

/// Puts the worker program on a pod's veth (taking over a previous
/// agent's attachment).
fn attach_pod_veth(dp: &mut Datapath, link: &ObservedLink, published: &Mutex<Published>) {
    match links::attach_ingress(dp, PROG_WORKER_EGRESS, &link.name, link.index) {
        Ok(how) => {
            let mut p = published.lock().unwrap();
            match how {
                links::Attached::TakenOver => p.resumed.pod_links_taken_over += 1,
                links::Attached::New => p.resumed.pod_links_new += 1,
            }
            tracing::info!(iface = %link.name, ?how, "worker program on pod veth")
        }
        Err(e) => {
            tracing::error!(iface = %link.name, error = %format!("{e:#}"), "attaching to pod veth failed")
        }
    }
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

/// After a restart the pinned announce lease still holds the previous run's
/// deadline (its last renewal + `fence_after`): the fence starts from that
/// renewal, so the EIPs stay announced across the restart instead of going
/// silent until this run's first renewal. An expired lease changes nothing.
/// Returns whether it did.
fn seed_fence_from_lease(
    fence: &mut Fence,
    pin_dir: &std::path::Path,
    fence_after: Duration,
) -> bool {
    match lease::read(pin_dir) {
        Ok(lease::Lease::Until(until)) if until > std::time::Instant::now() => {
            let Some(renewed) = until.checked_sub(fence_after) else {
                return false;
            };
            tracing::info!(
                left_ms = (until - std::time::Instant::now()).as_millis() as u64,
                "announce lease of the previous run still valid; the fence starts from it"
            );
            fence.on_heartbeat_renewed(renewed);
            true
        }
        Ok(_) => false,
        Err(e) => {
            tracing::warn!(error = %format!("{e:#}"), "reading the announce lease failed");
            false
        }
    }
}

/// Runs one datastore call, but never past the fence's next deadline (one
/// eviction timeout when there is none): a datastore that drops packets
/// (rather than refusing) would otherwise hold the loop for the client's
/// own timeout, and the node would go on announcing after it should have
/// fenced itself.
async fn ds_call<T>(
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

/// Where in the relist period `node`'s agent lists (a stable spread over
/// the period), so agents started together do not all list at once.
fn relist_offset(node: &str, period: Duration) -> Duration {
    let h = node.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    Duration::from_millis(h % (period.as_millis() as u64).max(1))
}

/// Whether a batch of changes can change what `node`'s maps should hold.
/// Only the node's own pods are in its maps (`agent_state::desired`); port
/// grants are few and concern gateways too, so any of them counts.
fn concerns(changed: &Changed, node: &str) -> bool {
    changed.global || !changed.grant_nodes.is_empty() || changed.pod_nodes.iter().any(|n| n == node)
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
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
    for eip in now.difference(before) {
        let node_ip = desired
            .owned_eips
            .iter()
            .any(|o| o.eip == *eip && o.node_ip);
        if node_ip {
            continue;
        }
        match crate::datapath::announce::announce_eip(uplink, *eip, 2) {
            Ok(()) => tracing::info!(eip = %eip, "took over; announced with gratuitous ARP/NA"),
            Err(e) => {
                tracing::warn!(eip = %eip, error = %format!("{e:#}"), "gratuitous announcement failed")
            }
        }
    }
}

/// Aborts its task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agents_list_again_at_different_points_of_the_period() {
        let period = Duration::from_secs(300);
        let offsets: BTreeSet<Duration> = (0..100)
            .map(|i| relist_offset(&format!("node-{i}"), period))
            .collect();
        assert!(offsets.iter().all(|o| *o < period));
        assert!(
            offsets.len() > 95,
            "{} distinct offsets of 100",
            offsets.len()
        );
        assert_eq!(relist_offset("w1", period), relist_offset("w1", period));
        assert_eq!(relist_offset("w1", Duration::ZERO), Duration::ZERO);
    }

    #[test]
    fn only_changes_of_its_own_pods_grants_or_anything_else_concern_a_node() {
        let pods_of = |nodes: &[&str]| Changed {
            pod_nodes: nodes.iter().map(|n| n.to_string()).collect(),
            ..Default::default()
        };
        assert!(!concerns(&pods_of(&["w2", "w3"]), "w1"));
        assert!(concerns(&pods_of(&["w2", "w1"]), "w1"));
        assert!(!concerns(&Changed::default(), "w1"));
        let grants = Changed {
            grant_nodes: vec!["w2".into()],
            ..Default::default()
        };
        assert!(concerns(&grants, "g1"));
        let global = Changed {
            global: true,
            ..pods_of(&["w2"])
        };
        assert!(concerns(&global, "w1"));
    }
}
