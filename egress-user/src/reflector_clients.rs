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

/// Pure: one passive client per node address, except addresses that are
/// configured peers already (upstream routers) or the reflector itself.
pub fn client_peers(
    nodes: &[NodeRecord],
    asn: u32,
    exclude: &BTreeSet<IpAddr>,
) -> BTreeMap<IpAddr, PeerSpec> {
    nodes
        .iter()
        .flat_map(|n| n.addresses.iter().filter_map(|a| a.parse::<IpAddr>().ok()))
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

/// Keeps the speaker's client list equal to the registered nodes, for as
/// long as the task runs.
pub async fn keep_in_step(
    ds: Arc<dyn Datastore>,
    speaker: SpeakerHandle,
    asn: u32,
    exclude: BTreeSet<IpAddr>,
) {
    let mut current: BTreeSet<IpAddr> = BTreeSet::new();
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
}
