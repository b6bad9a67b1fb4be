//! Reflectors learn their clients from the datastore: every registered node
//! is a passive route-reflector client (the agents connect out), so adding a
//! node needs no reflector configuration and no restart.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    sync::Arc,
    time::Duration,
};

use egress_bgp::speaker::{PeerSpec, SpeakerHandle};
use egress_control::{
    api::NodeRecord,
    datastore::{typed::node_record, Datastore, Kind},
};
use futures::StreamExt;

/// Pure: one passive client per node, at the address its agent connects
/// from: its first IPv4 address (agents peer with the reflectors over
/// IPv4, the underlay's family; IPv6 routes ride the same session), or its
/// first IPv6 address on a node without IPv4. Its other addresses never
/// open a session, so they would stay "Active" forever. Addresses that are
/// configured peers already (upstream routers) or the reflector itself
/// are left out.
pub fn client_peers(
    nodes: &[NodeRecord],
    asn: u32,
    exclude: &BTreeSet<IpAddr>,
) -> BTreeMap<IpAddr, PeerSpec> {
    nodes
        .iter()
        .filter_map(session_address)
        .filter(|a| !exclude.contains(a))
        .map(|a| {
            (
                a,
                PeerSpec {
                    client: true,
                    passive: true,
                    ..PeerSpec::new(a, asn)
                },
            )
        })
        .collect()
}

/// The address node `n`'s agent opens its sessions from.
fn session_address(n: &NodeRecord) -> Option<IpAddr> {
    let addrs: Vec<IpAddr> = n.addresses.iter().filter_map(|a| a.parse().ok()).collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or_else(|| addrs.first())
        .copied()
}

/// How long a starting reflector waits for the datastore's node list.
const INITIAL_LIST_TIMEOUT: Duration = Duration::from_secs(5);

/// The clients registered now, for the speaker's configuration at start.
/// A restarting reflector defers route selection until every configured
/// peer sent End-of-RIB (RFC 4724 4.1): its clients must be among them, or
/// it would advertise (and send End-of-RIB to the upstream routers, which
/// then flush what they kept as stale) before the clients that had not
/// reconnected yet announced their routes again. Empty when the datastore
/// does not answer in time (the clients are then added as they come, and
/// the deferral timer bounds the wait).
pub async fn initial_clients(
    ds: &dyn Datastore,
    asn: u32,
    exclude: &BTreeSet<IpAddr>,
) -> Vec<PeerSpec> {
    match tokio::time::timeout(INITIAL_LIST_TIMEOUT, ds.list(Kind::Node)).await {
        Ok(Ok((objs, _))) => {
            let nodes: Vec<NodeRecord> = objs.iter().map(|s| node_record(&s.value)).collect();
            client_peers(&nodes, asn, exclude).into_values().collect()
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "listing nodes before the reflector starts failed; clients come later");
            Vec::new()
        }
        Err(_) => {
            tracing::warn!("the datastore did not list nodes in time; clients come later");
            Vec::new()
        }
    }
}

/// Keeps the speaker's client list equal to the registered nodes, for as
/// long as the task runs; `initial` are the clients it was started with.
pub async fn keep_in_step(
    ds: Arc<dyn Datastore>,
    speaker: SpeakerHandle,
    asn: u32,
    exclude: BTreeSet<IpAddr>,
    initial: BTreeSet<IpAddr>,
) {
    let mut current = initial;
    loop {
        let listed = ds.list(Kind::Node).await;
        let rev = match listed {
            Ok((objs, rev)) => {
                let nodes: Vec<NodeRecord> = objs.iter().map(|s| node_record(&s.value)).collect();
                let want = client_peers(&nodes, asn, &exclude);
                for gone in current
                    .iter()
                    .filter(|a| !want.contains_key(a))
                    .copied()
                    .collect::<Vec<_>>()
                {
                    if speaker.remove_peer(gone).await.is_ok() {
                        tracing::info!(peer = %gone, "reflector client removed (node gone)");
                        current.remove(&gone);
                    }
                }
                for (addr, spec) in want {
                    if !current.contains(&addr) && speaker.add_peer(spec).await.is_ok() {
                        tracing::info!(peer = %addr, "reflector client added");
                        current.insert(addr);
                    }
                }
                Some(rev)
            }
            Err(e) => {
                tracing::warn!(error = %e, "listing nodes for reflector clients failed");
                None
            }
        };
        // Wait for a node change (or re-list every 30 s, or after an error).
        let wait = async {
            if let Some(rev) = rev {
                if let Ok(mut w) = ds.watch(Kind::Node, rev).await {
                    let _ = w.next().await;
                    return;
                }
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        };
        let _ = tokio::time::timeout(Duration::from_secs(30), wait).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_node_address_is_a_passive_client_except_excluded_ones() {
        let nodes = vec![
            NodeRecord {
                name: "w1".into(),
                addresses: vec!["10.10.0.1".into()],
                ..Default::default()
            },
            NodeRecord {
                name: "g1".into(),
                addresses: vec!["10.10.0.3".into(), "bogus".into()],
                ..Default::default()
            },
        ];
        let exclude: BTreeSet<IpAddr> = ["10.10.0.3".parse().unwrap()].into();
        let peers = client_peers(&nodes, 64512, &exclude);
        assert_eq!(peers.len(), 1);
        let p = &peers[&"10.10.0.1".parse::<IpAddr>().unwrap()];
        assert!(p.client && p.passive);
        assert_eq!(p.asn, 64512);
    }

    #[test]
    fn a_dual_stack_node_is_one_client_at_its_ipv4_address() {
        let nodes = vec![
            NodeRecord {
                name: "w1".into(),
                addresses: vec!["fd00:10::1".into(), "10.10.0.1".into()],
                ..Default::default()
            },
            NodeRecord {
                name: "v6only".into(),
                addresses: vec!["fd00:10::9".into()],
                ..Default::default()
            },
        ];
        let peers = client_peers(&nodes, 64512, &BTreeSet::new());
        let addrs: Vec<String> = peers.keys().map(ToString::to_string).collect();
        assert_eq!(addrs, ["10.10.0.1", "fd00:10::9"]);
    }
}
