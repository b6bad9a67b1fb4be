//! The gateways' parts of every node's desired state, parsed once per view:
//! which nodes each gateway may use, every worker's port blocks of its
//! addresses (from the workers' EgressTunnels), the reply steering those
//! blocks need, and who owns which EIP.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use super::{tunnel_endpoint, OwnedEip, PortRange};
use crate::view::ClusterView;

/// One gateway's status and the port blocks of its addresses, parsed once
/// per view.
pub(super) struct GatewayParts {
    pub eligible: BTreeSet<String>,
    /// node -> EIP -> its blocks.
    pub blocks: BTreeMap<String, BTreeMap<IpAddr, Vec<PortRange>>>,
    pub steering: BTreeMap<(IpAddr, u16), IpAddr>,
    /// node -> EIPs it owns.
    pub owned: BTreeMap<String, BTreeMap<IpAddr, OwnedEip>>,
}

/// The block size of the grants in the view: any tunnel's (the controller
/// grants every block with one size), else any gateway's status.
pub(super) fn grant_block_size(view: &ClusterView) -> u16 {
    let tunnels = view.tunnels.iter().filter_map(|t| t.status.as_ref());
    let gateways = view.gateways.iter().filter_map(|g| g.status.as_ref());
    tunnels
        .map(|s| s.port_block_size)
        .chain(gateways.map(|s| s.port_block_size))
        .find(|s| *s != 0)
        .unwrap_or(0)
}

pub(super) fn gateway_parts(view: &ClusterView) -> Vec<GatewayParts> {
    let mut out = Vec::new();
    for g in &view.gateways {
        let Some(st) = &g.status else { continue };
        let gw_name = g.metadata.name.clone().unwrap_or_default();
        let mut parts = GatewayParts {
            eligible: view
                .nodes
                .iter()
                .filter(|n| g.spec.node_selector.selector.matches(&n.labels))
                .map(|n| n.name.clone())
                .collect(),
            blocks: BTreeMap::new(),
            steering: BTreeMap::new(),
            owned: BTreeMap::new(),
        };
        // The grants of this gateway's addresses, from every worker's
        // EgressTunnel (where the controller records them).
        for t in &view.tunnels {
            let (Some(node), Some(ts)) = (t.metadata.name.as_deref(), t.status.as_ref()) else {
                continue;
            };
            let size = ts.port_block_size.max(1) as u32;
            let endpoint = tunnel_endpoint(view, node);
            for b in ts.port_blocks.iter().filter(|b| b.gateway == gw_name) {
                let Ok(eip) = b.eip.parse::<IpAddr>() else {
                    continue;
                };
                if let Some(ep) = endpoint {
                    for &i in &b.blocks {
                        parts.steering.insert((eip, i), ep);
                    }
                }
                // The node chooses new flows' ports only in blocks that
                // are not draining; replies to every held block are
                // steered to it. None active and none refused: nothing to
                // choose from, and nothing to refuse either.
                let active: Vec<u16> = b
                    .blocks
                    .iter()
                    .copied()
                    .filter(|i| !b.draining.contains(i))
                    .collect();
                if active.is_empty() && !b.exhausted {
                    continue;
                }
                let ranges = parts
                    .blocks
                    .entry(node.to_string())
                    .or_default()
                    .entry(eip)
                    .or_default();
                ranges.extend(active.into_iter().map(|i| {
                    let first = (i as u32 * size).min(65535) as u16;
                    PortRange {
                        block: i,
                        first,
                        last: (first as u32 + size - 1).min(65535) as u16,
                    }
                }));
                ranges.sort();
            }
        }
        let active_active = g.spec.mode == crate::api::GatewayMode::ActiveActive;
        for n in &st.node_list {
            for e in &n.eips {
                // A useNodeIP unit has no addresses of its own: it is the
                // node's, as the controller grants its blocks.
                let node_ip = e.ipv4.is_empty() && e.ipv6.is_empty();
                let addrs: Vec<IpAddr> = if node_ip {
                    [false, true]
                        .into_iter()
                        .filter_map(|v6| view.node_ip(&n.name, v6))
                        .collect()
                } else {
                    [&e.ipv4, &e.ipv6]
                        .into_iter()
                        .filter_map(|a| a.parse().ok())
                        .collect()
                };
                for ip in addrs {
                    parts.owned.entry(n.name.clone()).or_default().insert(
                        ip,
                        OwnedEip {
                            gateway: gw_name.clone(),
                            epoch: e.epoch,
                            shared: active_active && !node_ip,
                        },
                    );
                }
            }
        }
        out.push(parts);
    }
    out
}
