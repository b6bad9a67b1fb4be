//! The agent's side of its node's records: the registration itself lives
//! in the control crate ([`egress_control::registration`], where it is
//! also driven against the Kubernetes API at the HTTP level); here, what
//! needs the agent's own parts (the fence's announcements, the uplink).

use std::collections::BTreeSet;

use anyhow::Result;
pub use egress_control::registration::{
    mac_string, node_addresses, publish_over_capacity, register, registration_lost,
    SelfDescription, CAPACITY_MANAGER, MANAGER, RECONFIRMATION_MANAGER,
};
use egress_control::{
    api::EipEpoch, datastore::Datastore, registration::write_tunnel_status_field,
};
use egress_failover::fence::Announcement;

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
    write_tunnel_status_field(
        ds,
        node,
        RECONFIRMATION_MANAGER,
        AWAITING_RECONFIRMATION,
        asked,
        "writing the EIPs awaiting reconfirmation",
    )
    .await
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
    if !addrs.iter().any(|a| a.addr == me.tunnel_ip) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use egress_control::{api::NodeRecord, datastore::memory::MemoryDatastore, view::load_view};

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
        let st = status(&load_view(&ds).await.unwrap());
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
        let st = status(&load_view(&ds).await.unwrap());
        assert!(st.awaiting_reconfirmation.is_empty());
        assert_eq!(st.tunnel.ipv4, "10.10.0.2");
    }
}
