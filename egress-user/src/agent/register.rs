//! The records an agent keeps about its own node: the node record (labels,
//! addresses, pod CIDRs) and its EgressTunnel (tunnel endpoint, MAC, parent
//! interface). The agent reports facts; the controller alone decides the
//! tunnel's phase (Ready, HeartbeatTimeout, ...) from them and from the
//! heartbeats.

use std::{
    collections::BTreeSet,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use anyhow::{Context, Result};
use egress_control::{
    api::{EipEpoch, NodeRecord},
    controller::ClusterView,
    datastore::{typed, Datastore, DatastoreError, Kind, ObjectKey, StatusPatch},
};
use egress_failover::fence::Announcement;
use serde_json::json;

/// Field manager of the agent's writes.
pub const MANAGER: &str = "egress-agent";

/// What the agent says about itself.
#[derive(Clone, Debug)]
pub struct SelfDescription {
    pub node: NodeRecord,
    pub tunnel_ip: Ipv4Addr,
    /// The node's IPv6 address on the underlay, if it has one: a useNodeIP
    /// policy's IPv6 address (the tunnel itself runs over IPv4).
    pub ipv6: Option<Ipv6Addr>,
    pub mac: [u8; 6],
    pub parent: String,
}

pub fn mac_string(mac: &[u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Writes the node record (where the datastore keeps one: not on
/// Kubernetes) and the EgressTunnel's `status.tunnel` (never the phase: the
/// controller sets it once the tunnel is registered and, on a gateway
/// candidate, its heartbeat is seen).
pub async fn register(ds: &dyn Datastore, me: &SelfDescription) -> Result<()> {
    // On Kubernetes the Node is the kubelet's (and writing it is refused):
    // its addresses and labels are already there.
    if ds.writes_cluster_records() {
        typed::apply(ds, Kind::Node, typed::node_object(&me.node))
            .await
            .with_context(|| format!("registering node {}", me.node.name))?;
    }
    let key = ObjectKey::cluster(&me.node.name);
    if ds.get(Kind::EgressTunnel, &key).await?.is_none() {
        let tunnel = json!({
            "apiVersion": egress_control::api::API_VERSION,
            "kind": "EgressTunnel",
            "metadata": { "name": me.node.name },
            "spec": {},
        });
        match ds.create(Kind::EgressTunnel, tunnel).await {
            Ok(_) => {}
            Err(DatastoreError::AlreadyExists { .. }) => {}
            Err(e) => {
                return Err(e).context(
                    "creating the EgressTunnel (the controller creates one for every node; \
                     on Kubernetes the agent waits for it)",
                )
            }
        }
    }
    let status = json!({
        "tunnel": {
            "ipv4": me.tunnel_ip.to_string(),
            "ipv6": me.ipv6.map(|a| a.to_string()).unwrap_or_default(),
            "mac": mac_string(&me.mac),
            "parent": { "name": me.parent },
        },
    });
    ds.write_status(
        Kind::EgressTunnel,
        &key,
        &StatusPatch {
            manager: MANAGER.into(),
            owned: vec!["tunnel".into()],
            status,
        },
    )
    .await
    .context("writing the EgressTunnel status")?;
    Ok(())
}

/// Writes the EIPs the agent withholds after fencing itself
/// (`status.awaitingReconfirmation` of its EgressTunnel: see
/// [`Fence::awaiting_reconfirmation`](egress_failover::fence::Fence::awaiting_reconfirmation));
/// the controller answers with newer epochs. An empty set clears it.
pub async fn publish_awaiting_reconfirmation(
    ds: &dyn Datastore,
    node: &str,
    asked: &BTreeSet<Announcement>,
) -> Result<()> {
    let asked: Vec<EipEpoch> = asked
        .iter()
        .map(|a| EipEpoch {
            eip: a.eip.to_string(),
            epoch: a.epoch,
        })
        .collect();
    ds.write_status(
        Kind::EgressTunnel,
        &ObjectKey::cluster(node),
        &StatusPatch {
            manager: MANAGER.into(),
            owned: vec![AWAITING_RECONFIRMATION.into()],
            status: json!({ AWAITING_RECONFIRMATION: asked }),
        },
    )
    .await
    .context("writing the EIPs awaiting reconfirmation")?;
    Ok(())
}

/// The status field of [`publish_awaiting_reconfirmation`].
const AWAITING_RECONFIRMATION: &str = "awaitingReconfirmation";

/// The uplink's addresses changed: the node's IPv6 address is registered
/// again when it is not fixed by `--node-ipv6` and is no longer the
/// registered one (a global address may come up after the agent started: duplicate
/// detection, SLAAC, a late DHCPv6 lease). The tunnel endpoint is not
/// changed while running (the datapath, BGP and every peer's maps use it):
/// its loss is logged for the operator.
/// Returns whether `me` changed (and must be registered).
pub async fn addresses_changed(
    handle: &rtnetlink::Handle,
    s: &super::AgentSettings,
    uplink_ifindex: u32,
    me: &mut SelfDescription,
) -> bool {
    let addrs = match super::uplink_addr::link_addresses(handle, uplink_ifindex).await {
        Ok(a) => a,
        Err(e) => {
            tracing::warn!(error = %format!("{e:#}"), "listing the uplink's addresses failed");
            return false;
        }
    };
    if !addrs.iter().any(|a| a.addr == IpAddr::V4(me.tunnel_ip)) {
        tracing::error!(tunnel_ip = %me.tunnel_ip, uplink = %s.uplink,
            "the tunnel endpoint is no longer an address of the uplink; restart the agent to register a new one");
    }
    if s.node_ipv6.is_some() {
        return false;
    }
    let now = super::uplink_addr::node_ipv6(&addrs);
    if now == me.ipv6 {
        return false;
    }
    tracing::info!(was = ?me.ipv6, now = ?now, "the node's IPv6 address changed; registering it");
    me.ipv6 = now;
    me.node.addresses = node_addresses(me.tunnel_ip, now);
    true
}

/// The node record's addresses: the tunnel endpoint, then the IPv6 address.
pub fn node_addresses(tunnel_ip: Ipv4Addr, ipv6: Option<Ipv6Addr>) -> Vec<String> {
    std::iter::once(IpAddr::V4(tunnel_ip))
        .chain(ipv6.map(IpAddr::V6))
        .map(|a| a.to_string())
        .collect()
}

/// Whether the datastore no longer holds what the agent registered: its
/// EgressTunnel (or, where the agent writes it, its node record) was
/// deleted, or the tunnel's registered fields differ (an operator's
/// mistake, a restore from backup). The agent then registers again instead
/// of running unregistered (no port blocks, no tunnel endpoint for peers)
/// until its next restart.
pub fn registration_lost(view: &ClusterView, me: &SelfDescription, writes_node: bool) -> bool {
    if writes_node && view.node(&me.node.name).is_none() {
        return true;
    }
    let Some(st) = view.tunnel(&me.node.name).and_then(|t| t.status.as_ref()) else {
        return true;
    };
    let t = &st.tunnel;
    t.ipv4 != me.tunnel_ip.to_string()
        || t.ipv6 != me.ipv6.map(|a| a.to_string()).unwrap_or_default()
        || t.mac != mac_string(&me.mac)
        || t.parent.name != me.parent
}

#[cfg(test)]
mod tests {
    use super::*;
    use egress_control::datastore::memory::MemoryDatastore;

    /// Node w1 at 10.10.0.1 on eth0, with this IPv6 address.
    fn w1(ipv6: Option<&str>) -> SelfDescription {
        SelfDescription {
            node: NodeRecord {
                name: "w1".into(),
                addresses: vec!["10.10.0.1".into()],
                ready: true,
                ..Default::default()
            },
            tunnel_ip: "10.10.0.1".parse().unwrap(),
            ipv6: ipv6.map(|a| a.parse().unwrap()),
            mac: [2, 0, 0, 0, 0, 1],
            parent: "eth0".into(),
        }
    }

    #[tokio::test]
    async fn registration_writes_node_and_tunnel_facts_not_the_phase() {
        let ds = MemoryDatastore::new();
        let me = w1(Some("fd00:10::1"));
        register(&ds, &me).await.unwrap();
        let view = typed::load_view(&ds).await.unwrap();
        let st = view.tunnel("w1").unwrap().status.clone().unwrap();
        assert_eq!(st.tunnel.ipv4, "10.10.0.1");
        assert_eq!(
            st.phase,
            egress_control::api::TunnelPhase::Pending,
            "registered, not Ready until the controller says so"
        );
        // The controller decided a phase meanwhile: registering again (an
        // agent restart) keeps it.
        ds.write_status(
            Kind::EgressTunnel,
            &ObjectKey::cluster("w1"),
            &StatusPatch {
                manager: "egress-controller".into(),
                owned: vec!["phase".into()],
                status: json!({"phase": "HeartbeatTimeout"}),
            },
        )
        .await
        .unwrap();
        register(&ds, &me).await.unwrap();
        let view = typed::load_view(&ds).await.unwrap();
        assert_eq!(view.nodes.len(), 1);
        let t = view.tunnel("w1").expect("tunnel registered");
        let st = t.status.as_ref().unwrap();
        assert_eq!(st.tunnel.ipv4, "10.10.0.1");
        assert_eq!(st.tunnel.ipv6, "fd00:10::1");
        assert_eq!(
            view.node_ip("w1", true),
            Some("fd00:10::1".parse().unwrap()),
            "a useNodeIP policy's IPv6 address"
        );
        assert_eq!(st.tunnel.mac, "02:00:00:00:00:01");
        assert_eq!(st.tunnel.parent.name, "eth0");
        assert_eq!(
            st.phase,
            egress_control::api::TunnelPhase::HeartbeatTimeout,
            "the agent never writes the phase"
        );
    }

    #[tokio::test]
    async fn a_registration_that_the_datastore_lost_is_noticed() {
        let ds = MemoryDatastore::new();
        let me = w1(None);
        let lost = |ds: &MemoryDatastore| {
            let ds = ds.clone();
            let me = me.clone();
            async move { registration_lost(&typed::load_view(&ds).await.unwrap(), &me, true) }
        };
        assert!(lost(&ds).await, "nothing registered yet");
        register(&ds, &me).await.unwrap();
        assert!(!lost(&ds).await);
        // The tunnel deleted (and created again empty, as the controller does).
        let key = ObjectKey::cluster("w1");
        ds.delete(Kind::EgressTunnel, &key, None).await.unwrap();
        assert!(lost(&ds).await);
        let empty = json!({"apiVersion": egress_control::api::API_VERSION, "kind": "EgressTunnel",
                           "metadata": {"name": "w1"}, "spec": {}});
        ds.create(Kind::EgressTunnel, empty).await.unwrap();
        assert!(lost(&ds).await);
        register(&ds, &me).await.unwrap();
        assert!(!lost(&ds).await);
        // The node record deleted: lost where the agent writes it.
        ds.delete(Kind::Node, &key, None).await.unwrap();
        assert!(lost(&ds).await);
        let view = typed::load_view(&ds).await.unwrap();
        assert!(
            !registration_lost(&view, &me, false),
            "not where the kubelet keeps it"
        );
    }

    #[tokio::test]
    async fn on_a_datastore_that_keeps_nodes_itself_only_the_tunnel_is_written() {
        // As on Kubernetes: the Node is the kubelet's, and writing it fails.
        let ds = MemoryDatastore::with_external_records();
        let me = w1(Some("fd00:10::1"));
        register(&ds, &me)
            .await
            .expect("registering writes no Node");
        let view = typed::load_view(&ds).await.unwrap();
        assert!(view.nodes.is_empty());
        let st = view.tunnel("w1").unwrap().status.clone().unwrap();
        assert_eq!(
            (st.tunnel.ipv4.as_str(), st.tunnel.ipv6.as_str()),
            ("10.10.0.1", "fd00:10::1")
        );
    }

    #[tokio::test]
    async fn the_eips_awaiting_reconfirmation_are_published_and_cleared() {
        let ds = MemoryDatastore::new();
        let me = SelfDescription {
            node: NodeRecord {
                name: "g1".into(),
                ready: true,
                ..Default::default()
            },
            tunnel_ip: "10.10.0.2".parse().unwrap(),
            ipv6: None,
            mac: [2, 0, 0, 0, 0, 2],
            parent: "eth0".into(),
        };
        register(&ds, &me).await.unwrap();
        let asked: BTreeSet<Announcement> = [
            Announcement {
                eip: "198.51.100.10".parse().unwrap(),
                epoch: 7,
            },
            Announcement {
                eip: "2001:db8::10".parse().unwrap(),
                epoch: 7,
            },
        ]
        .into();
        publish_awaiting_reconfirmation(&ds, "g1", &asked)
            .await
            .unwrap();
        let status = |view: &egress_control::controller::ClusterView| {
            view.tunnel("g1").unwrap().status.clone().unwrap()
        };
        let st = status(&typed::load_view(&ds).await.unwrap());
        assert_eq!(
            st.awaiting_reconfirmation,
            [
                EipEpoch {
                    eip: "198.51.100.10".into(),
                    epoch: 7
                },
                EipEpoch {
                    eip: "2001:db8::10".into(),
                    epoch: 7
                }
            ]
        );
        assert_eq!(st.tunnel.ipv4, "10.10.0.2", "the tunnel facts stay");

        publish_awaiting_reconfirmation(&ds, "g1", &BTreeSet::new())
            .await
            .unwrap();
        let st = status(&typed::load_view(&ds).await.unwrap());
        assert!(st.awaiting_reconfirmation.is_empty());
        assert_eq!(st.tunnel.ipv4, "10.10.0.2");
    }
}
