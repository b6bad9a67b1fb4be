//! The controller's datapath probes: one BFD-style session to every
//! gateway-eligible node's tunnel address. A session that was up and fails
//! marks the node's datapath down, and the controller moves its EIPs as after
//! a heartbeat timeout, while the datastore may still be perfectly healthy.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, SocketAddr},
    sync::Arc,
    time::Duration,
};

use anyhow::{Context, Result};
use egress_control::{
    controller::{gateway_eligible, ClusterView},
    datastore::{Datastore, Kind},
    view::load_kinds,
};
use egress_failover::{
    monitor::ProbeHealth,
    probe::SessionConfig,
    prober::{Prober, ProberConfig},
};
use tokio::sync::watch;

/// What the probe targets are computed from: nodes, gateways, tunnels. Not
/// pods: every replica reads this each second, and the cluster's pods would
/// cost far more than these few objects.
const PROBE_KINDS: [Kind; 3] = [Kind::Node, Kind::EgressGateway, Kind::EgressTunnel];

/// The part of the cluster the probe targets are computed from.
pub async fn probe_view(ds: &dyn Datastore) -> Result<ClusterView> {
    Ok(load_kinds(ds, &PROBE_KINDS).await?)
}

/// Pure: the probe targets of a view (gateway-eligible node -> tunnel
/// endpoint: its IPv4 address, or on an IPv6 underlay, where the status
/// publishes no IPv4 one, its IPv6 address).
pub fn probe_targets(view: &ClusterView, port: u16) -> BTreeMap<SocketAddr, String> {
    gateway_eligible(view)
        .into_iter()
        .filter_map(|node| {
            let t = &view.tunnel(&node)?.status.as_ref()?.tunnel;
            let ip: IpAddr = match t.ipv4.as_str() {
                "" => t.ipv6.parse().ok()?,
                v4 => v4.parse().ok()?,
            };
            Some((SocketAddr::new(ip, port), node))
        })
        .collect()
}

/// Pure: the nodes whose probe health is Down.
pub fn down_nodes(
    health: &BTreeMap<SocketAddr, ProbeHealth>,
    targets: &BTreeMap<SocketAddr, String>,
) -> BTreeSet<String> {
    health
        .iter()
        .filter(|(_, h)| **h == ProbeHealth::Down)
        .filter_map(|(peer, _)| targets.get(peer).cloned())
        .collect()
}

/// Pure: every probed node's health (Unknown until its session has news).
pub fn node_health(
    health: &BTreeMap<SocketAddr, ProbeHealth>,
    targets: &BTreeMap<SocketAddr, String>,
) -> BTreeMap<String, ProbeHealth> {
    targets
        .iter()
        .map(|(peer, node)| (node.clone(), health.get(peer).copied().unwrap_or_default()))
        .collect()
}

/// What the prober publishes.
pub struct ProbeWatch {
    /// Nodes whose datapath probe failed (drives the controller).
    pub down: watch::Receiver<BTreeSet<String>>,
    /// Every probed node's health (for the metrics).
    pub health: watch::Receiver<BTreeMap<String, ProbeHealth>>,
}

/// The prober on any local port (the agents answer to the source of each
/// probe, and several controller replicas may share a network namespace),
/// dual-stack so that it reaches IPv4 and IPv6 underlays alike; IPv4 only
/// where the host has no IPv6.
async fn start_prober(
    session: SessionConfig,
) -> Result<(
    Prober,
    tokio::sync::mpsc::UnboundedReceiver<egress_failover::prober::ProbeEvent>,
)> {
    let config = |ip: IpAddr| ProberConfig {
        bind: SocketAddr::new(ip, 0),
        session,
        accept_unknown_peers: false,
    };
    match Prober::start(config(std::net::Ipv6Addr::UNSPECIFIED.into())).await {
        Ok(started) => Ok(started),
        Err(e) => {
            tracing::warn!(%e, "no IPv6 probe socket; probing IPv4 tunnel endpoints only");
            Prober::start(config(std::net::Ipv4Addr::UNSPECIFIED.into()))
                .await
                .context("starting the datapath prober")
        }
    }
}

/// Starts the prober and the task that keeps its peers and the down set current.
pub async fn start(
    ds: Arc<dyn Datastore>,
    session: SessionConfig,
    port: u16,
    refresh: Duration,
) -> Result<ProbeWatch> {
    let (prober, mut events) = start_prober(session).await?;
    let (tx, rx) = watch::channel(BTreeSet::new());
    let (health_tx, health_rx) = watch::channel(BTreeMap::new());
    tokio::spawn(async move {
        let mut targets: BTreeMap<SocketAddr, String> = BTreeMap::new();
        let mut health: BTreeMap<SocketAddr, ProbeHealth> = BTreeMap::new();
        let mut tick = tokio::time::interval(refresh);
        loop {
            tokio::select! {
                ev = events.recv() => match ev {
                    Some(ev) => {
                        let h = ProbeHealth::after(ev.event);
                        tracing::info!(peer = %ev.peer, health = ?h, "datapath probe");
                        health.insert(ev.peer, h);
                    }
                    None => break,
                },
                _ = tick.tick() => {
                    if let Ok(view) = probe_view(ds.as_ref()).await {
                        let want = probe_targets(&view, port);
                        for gone in targets.keys().filter(|p| !want.contains_key(p)) {
                            prober.remove_peer(*gone);
                            health.remove(gone);
                        }
                        for new in want.keys().filter(|p| !targets.contains_key(p)) {
                            prober.add_peer(*new);
                        }
                        targets = want;
                    }
                }
            }
            let down = down_nodes(&health, &targets);
            tx.send_if_modified(|cur| {
                let changed = *cur != down;
                *cur = down;
                changed
            });
            let per_node = node_health(&health, &targets);
            health_tx.send_if_modified(|cur| {
                let changed = *cur != per_node;
                *cur = per_node;
                changed
            });
        }
    });
    Ok(ProbeWatch {
        down: rx,
        health: health_rx,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use egress_control::{
        api::{NodeRecord, PodRecord},
        datastore::{
            memory::MemoryDatastore,
            typed::{node_object, pod_object},
        },
    };
    use serde_json::json;

    /// The example EgressGateway of the docs (selects `egress-gateway=true`).
    fn example_gateway() -> serde_json::Value {
        serde_yaml::from_str(
            &std::fs::read_to_string(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../docs/examples/gateway.yaml"
            ))
            .unwrap(),
        )
        .unwrap()
    }

    #[tokio::test]
    async fn the_probe_targets_come_from_nodes_gateways_and_tunnels_not_pods() {
        let ds = MemoryDatastore::new();
        let node = NodeRecord {
            name: "g1".into(),
            labels: [("egress-gateway".to_string(), "true".to_string())].into(),
            addresses: vec!["10.10.0.3".into()],
            ready: true,
            ..Default::default()
        };
        ds.create(Kind::Node, node_object(&node)).await.unwrap();
        ds.create(Kind::EgressGateway, example_gateway())
            .await
            .unwrap();
        let tunnel = json!({"apiVersion": egress_control::api::API_VERSION, "kind": "EgressTunnel",
                            "metadata": {"name": "g1"}, "spec": {},
                            "status": {"tunnel": {"ipv4": "10.10.0.3", "mac": "02:00:00:00:00:03"}}});
        ds.create(Kind::EgressTunnel, tunnel).await.unwrap();
        let pod = PodRecord {
            name: "p".into(),
            namespace: "d".into(),
            node: "w1".into(),
            ips: vec!["10.244.1.11".into()],
            ..Default::default()
        };
        ds.create(Kind::Pod, pod_object(&pod)).await.unwrap();

        let view = probe_view(&ds).await.unwrap();
        assert!(view.pods.is_empty(), "the prober read the pods");
        assert_eq!(
            probe_targets(&view, 13784),
            BTreeMap::from([("10.10.0.3:13784".parse().unwrap(), "g1".to_string())])
        );
    }

    #[tokio::test]
    async fn an_ipv6_underlay_node_is_probed_at_its_ipv6_endpoint() {
        let ds = MemoryDatastore::new();
        for (name, v4, v6) in [("g6", "", "fd00:10::3"), ("g4", "10.10.0.4", "fd00:10::4")] {
            let node = NodeRecord {
                name: name.into(),
                labels: [("egress-gateway".to_string(), "true".to_string())].into(),
                ready: true,
                ..Default::default()
            };
            ds.create(Kind::Node, node_object(&node)).await.unwrap();
            let tunnel = json!({"apiVersion": egress_control::api::API_VERSION, "kind": "EgressTunnel",
                                "metadata": {"name": name}, "spec": {},
                                "status": {"tunnel": {"ipv4": v4, "ipv6": v6, "mac": "02:00:00:00:00:03"}}});
            ds.create(Kind::EgressTunnel, tunnel).await.unwrap();
        }
        ds.create(Kind::EgressGateway, example_gateway())
            .await
            .unwrap();
        let view = probe_view(&ds).await.unwrap();
        assert_eq!(
            probe_targets(&view, 13784),
            BTreeMap::from([
                ("[fd00:10::3]:13784".parse().unwrap(), "g6".to_string()),
                // A dual-stack node on an IPv4 underlay: its IPv4 endpoint.
                ("10.10.0.4:13784".parse().unwrap(), "g4".to_string()),
            ])
        );
    }

    #[test]
    fn only_failed_sessions_count_as_down() {
        let a: SocketAddr = "10.10.0.3:13784".parse().unwrap();
        let b: SocketAddr = "10.10.0.4:13784".parse().unwrap();
        let c: SocketAddr = "10.10.0.5:13784".parse().unwrap();
        let targets = BTreeMap::from([
            (a, "g1".to_string()),
            (b, "g2".to_string()),
            (c, "g3".to_string()),
        ]);
        let health = BTreeMap::from([
            (a, ProbeHealth::Down),
            (b, ProbeHealth::AdminDown),
            (c, ProbeHealth::Up),
        ]);
        assert_eq!(
            down_nodes(&health, &targets),
            BTreeSet::from(["g1".to_string()])
        );
        // A peer no longer targeted (node gone) is not reported.
        let fewer = BTreeMap::from([(b, "g2".to_string())]);
        assert!(down_nodes(&health, &fewer).is_empty());
    }

    #[test]
    fn every_target_has_a_health_unknown_until_its_session_reports() {
        let a: SocketAddr = "10.10.0.3:13784".parse().unwrap();
        let b: SocketAddr = "10.10.0.4:13784".parse().unwrap();
        let gone: SocketAddr = "10.10.0.9:13784".parse().unwrap();
        let targets = BTreeMap::from([(a, "g1".to_string()), (b, "g2".to_string())]);
        let health = BTreeMap::from([(a, ProbeHealth::Down), (gone, ProbeHealth::Up)]);
        assert_eq!(
            node_health(&health, &targets),
            BTreeMap::from([
                ("g1".to_string(), ProbeHealth::Down),
                ("g2".to_string(), ProbeHealth::Unknown),
            ])
        );
    }
}
