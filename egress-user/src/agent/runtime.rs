//! The agent's start: the kernel edge (datapath, VXLAN device, programs on
//! the tunnel and the uplink), the node's registration, the BGP speaker and
//! the admin server; then the loop (`event_loop`) takes over.

use std::{
    collections::BTreeSet,
    net::Ipv6Addr,
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::{Context, Result};
use egress_common::maps::{PROG_TUNNEL_INGRESS, PROG_UPLINK_INGRESS};
use egress_control::{agent_state::AgentConfig, api::NodeRecord, datastore::Datastore};
use egress_failover::fence::Fence;
use tokio::time::Instant;

use super::{
    adapt::NodeFacts,
    event_loop::{Agent, Sources},
    published::{admin_handler, Published},
    register::{node_addresses, register, SelfDescription},
    settings::AgentSettings,
    underlay, uplink_addr,
};
use crate::{
    admin,
    datapath::{lease, links, uplink_xdp, Datapath, PinnedMaps},
    node::{vxlan, watch::LinkWatch},
    EBPF_OBJECT,
};

/// First and longest wait between attempts to register at start.
const REGISTER_RETRY_FIRST: Duration = Duration::from_millis(250);
const REGISTER_RETRY_MAX: Duration = Duration::from_secs(5);

pub async fn run(s: AgentSettings, ds: Arc<dyn Datastore>) -> Result<()> {
    s.timers.validate()?;
    let (conn, handle, _) = rtnetlink::new_connection().context("opening netlink")?;
    tokio::spawn(conn);
    // The kernel edge first: a node whose datapath cannot come up must not
    // register as Ready.
    let (s, edge) = attach_edge(s, &handle).await?;
    let link_watch = LinkWatch::start().await?;
    let maps = PinnedMaps::open(&s.pin_dir)?;
    let me = self_description(&s, &edge);
    register_until_done(ds.as_ref(), &me).await;
    let tunnel_ip = edge.facts.tunnel_ip;
    tracing::info!(node = %s.node, %tunnel_ip, node_ipv6 = ?me.ipv6, "registered; datapath attached");

    // The controller's datapath probes are answered by the uplink program
    // (see egress-ebpf/src/probe.rs, `probe_port` in the config), not here:
    // a probe then proves this node's datapath, and an agent restart does
    // not look like a dead gateway.
    let bgp = match &s.bgp {
        Some(cfg) => Some(super::bgp::AgentBgp::start(cfg, tunnel_ip).await?),
        None => None,
    };
    let published = Arc::new(Mutex::new(Published {
        uplink_reply_path: Some(edge.reply_path.clone()),
        ..Published::default()
    }));
    let learned = bgp.as_ref().map(|b| b.learned());
    let speaker = bgp.as_ref().map(|b| b.handle().clone());
    let handler = admin_handler(
        published.clone(),
        learned.clone(),
        speaker,
        s.pin_dir.clone(),
    );
    let (admin, _admin_task) = admin::serve(s.admin_addr, handler).await?;
    println!("ready node={} tunnel={} admin={}", s.node, tunnel_ip, admin);

    let mut fence = Fence::new(&s.node, &s.timers);
    published.lock().unwrap().resumed.announce_lease =
        seed_fence_from_lease(&mut fence, &s.pin_dir, s.timers.fence_after());
    // Port use to the controller, on its own clock (ends with this function).
    // It reads the node's grants from the loop's view, not the datastore.
    let (grants_tx, grants_rx) = tokio::sync::watch::channel(None);
    let _port_use = AbortOnDrop(tokio::spawn(super::port_use::run(
        ds.clone(),
        s.node.clone(),
        s.pin_dir.clone(),
        s.port_release_quarantine,
        grants_rx,
    )));
    // The longest the agent trusts its watches before it lists every kind again.
    let relist_period = ds.relist_period();
    let first_relist = Instant::now() + relist_period + relist_offset(&s.node, relist_period);
    let sources = Sources {
        link_watch,
        learned_changed: bgp.as_ref().map(|b| b.learned_changed()),
        relist: tokio::time::interval_at(first_relist, relist_period),
    };
    let replaced = edge.dp.policy_maps_replaced();
    let agent = Agent {
        cfg: AgentConfig {
            node: s.node.clone(),
            service_cidrs: s.service_cidrs.clone(),
            extra_cidrs: s.extra_cidrs.clone(),
            pod_cidrs: s.pod_cidrs.clone(),
        },
        prepared: Default::default(),
        shadow: Default::default(),
        ephemeral: super::node_ports::ephemeral_range(),
        s,
        ds,
        handle,
        pod_veths: super::pod_veths::PodVeths::start(edge.dp, replaced),
        maps,
        facts: edge.facts,
        me,
        tunnel_ip,
        bgp,
        learned,
        published,
        fence,
        grants_tx,
        announced: BTreeSet::new(),
        eligible: false,
        pod_reach: Default::default(),
        dirty: true,
        register_at: None,
        last_registered: Instant::now(),
        recheck_registration_at: None,
        fence_due: false,
        was_fenced: false,
        colliding: BTreeSet::new(),
        asked_published: None,
        over_now: Vec::new(),
        over_published: None,
    };
    agent.run_loop(sources).await
}

/// The node's datapath, attached, and the facts the maps are built from.
struct Edge {
    dp: Datapath,
    facts: NodeFacts,
    node_ipv6: Option<Ipv6Addr>,
    reply_path: uplink_xdp::ReplyPath,
}

/// Loads the object, ensures the VXLAN device and attaches the tunnel and
/// uplink programs; the settings come back with the tunnel MTU filled in.
async fn attach_edge(
    mut s: AgentSettings,
    handle: &rtnetlink::Handle,
) -> Result<(AgentSettings, Edge)> {
    let mut dp = Datapath::load_with(EBPF_OBJECT, &s.pin_dir, s.map_sizes)?;
    let uplink = vxlan::find_link(handle, &s.uplink)
        .await?
        .with_context(|| format!("uplink interface {} does not exist (--uplink)", s.uplink))?;
    let uplink_addrs = uplink_addr::link_addresses(handle, uplink.index).await?;
    let routes = match s.underlay {
        underlay::UnderlayChoice::Auto => underlay::usable(
            crate::node::route::default_route_families(handle).await?,
            &uplink_addrs,
        ),
        _ => underlay::DefaultRoutes::default(),
    };
    let v6 = underlay::is_ipv6(s.underlay, s.tunnel_ip, routes).map_err(anyhow::Error::msg)?;
    if s.vxlan.mtu == 0 {
        s.vxlan.mtu = uplink.mtu.saturating_sub(underlay::overhead(v6));
    }
    s.vxlan.ipv6_underlay = v6;
    let vxlan_ifindex = vxlan::ensure(handle, &s.vxlan).await?;
    let uplink_mac = uplink
        .mac
        .with_context(|| format!("uplink {} has no Ethernet address", s.uplink))?;
    let tunnel_ip = underlay::endpoint(v6, s.tunnel_ip, &uplink_addrs, &s.uplink)
        .map_err(anyhow::Error::msg)?;
    let node_ipv6 = s.node_ipv6.or_else(|| match tunnel_ip {
        std::net::IpAddr::V6(v6) => Some(v6),
        std::net::IpAddr::V4(_) => uplink_addr::node_ipv6(&uplink_addrs),
    });
    tracing::info!(underlay = if v6 { "ipv6" } else { "ipv4" }, %tunnel_ip, mtu = s.vxlan.mtu, "tunnel");
    links::attach_ingress(&mut dp, PROG_TUNNEL_INGRESS, &s.vxlan.name, vxlan_ifindex)?;
    links::attach_ingress(&mut dp, PROG_UPLINK_INGRESS, &s.uplink, uplink.index)?;
    let reply_path = uplink_xdp::attach(&mut dp, s.uplink_xdp, &s.uplink, uplink.index);
    tracing::info!(
        path = reply_path.path,
        driver = ?reply_path.driver,
        reason = %reply_path.reason,
        "gateway reply path on the uplink"
    );
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
    Ok((
        s,
        Edge {
            dp,
            facts,
            node_ipv6,
            reply_path,
        },
    ))
}

/// What the node registers about itself.
fn self_description(s: &AgentSettings, edge: &Edge) -> SelfDescription {
    let tunnel_ip = edge.facts.tunnel_ip;
    SelfDescription {
        node: NodeRecord {
            name: s.node.clone(),
            labels: s.labels.clone(),
            addresses: node_addresses(tunnel_ip, edge.node_ipv6),
            pod_cidrs: s.pod_cidrs.iter().map(|c| c.to_string()).collect(),
            ready: true,
        },
        tunnel_ip,
        ipv6: edge.node_ipv6,
        mac: edge.facts.uplink_mac,
        parent: s.uplink.clone(),
    }
}

/// Registers, trying again with a growing wait. The datastore may be down
/// (restarting, unreachable): the datapath is attached already and keeps
/// the node's traffic going; better to keep trying than to exit and wait
/// out a crash-loop back-off once it is back.
async fn register_until_done(ds: &dyn Datastore, me: &SelfDescription) {
    let mut wait = REGISTER_RETRY_FIRST;
    while let Err(e) = register(ds, me).await {
        tracing::warn!(error = %format!("{e:#}"), retry_in = ?wait, "registering failed; trying again");
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(REGISTER_RETRY_MAX);
    }
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

/// Where in the relist period `node`'s agent lists (a stable spread over
/// the period), so agents started together do not all list at once.
fn relist_offset(node: &str, period: Duration) -> Duration {
    let h = node.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    Duration::from_millis(h % (period.as_millis() as u64).max(1))
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
}
