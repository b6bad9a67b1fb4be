//! The gateways' parts of every node's desired state: which nodes each
//! gateway may use and who owns which EIP (parsed once per view), the
//! reply steering of every worker's blocks (once, when a candidate asks),
//! and a node's own blocks of the gateway's addresses (from its
//! EgressTunnel, where the controller records them).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::{Arc, OnceLock};

use super::{endpoint_of, OwnedEip, PortRange, Steering};
use crate::view::ClusterView;

/// One gateway's candidates and owners, parsed once per view. Its reply
/// steering (every worker's blocks, thousands of entries at 1,000 nodes)
/// is parsed the first time a candidate asks for it: a worker never does.
/// A node's own blocks come from its own tunnel when it asks.
pub(super) struct GatewayParts {
    pub name: String,
    pub eligible: BTreeSet<String>,
    steering: OnceLock<Arc<Steering>>,
    /// node -> EIPs it owns.
    pub owned: BTreeMap<String, BTreeMap<IpAddr, OwnedEip>>,
}

impl GatewayParts {
    /// Every held block of this gateway's addresses -> the worker's tunnel
    /// endpoint, from `view` (one with the same grants as the one these
    /// parts came from).
    pub fn steering(&self, view: &ClusterView) -> &Arc<Steering> {
        self.steering
            .get_or_init(|| Arc::new(steering_of(view, &self.name)))
    }
}

/// The blocks of gateway `gateway`'s addresses the tunnel of `t` holds, as
/// (address, grant) pairs.
fn grants_of<'a>(
    t: &'a crate::api::EgressTunnelStatus,
    gateway: &'a str,
) -> impl Iterator<Item = (IpAddr, &'a crate::api::EipPortBlocks)> + 'a {
    t.port_blocks
        .iter()
        .filter(move |b| b.gateway == gateway)
        .filter_map(|b| Some((b.eip.parse::<IpAddr>().ok()?, b)))
}

fn steering_of(view: &ClusterView, gateway: &str) -> Steering {
    let mut steering = BTreeMap::new();
    for t in &view.tunnels {
        // The tunnel at hand, not a search of every tunnel by its name:
        // that made this quadratic in the nodes (a million comparisons at
        // 1,000 nodes, on every grant anywhere, for every gateway candidate).
        let (Some(_), Some(ts)) = (t.metadata.name.as_deref(), t.status.as_ref()) else {
            continue;
        };
        let Some(ep) = endpoint_of(ts) else {
            continue;
        };
        for (eip, b) in grants_of(ts, gateway) {
            for &i in &b.blocks {
                steering.insert((eip, i), ep);
            }
        }
    }
    steering
}

/// Node `node`'s blocks of gateway `gateway`'s addresses, from its own
/// tunnel: the node chooses new flows' ports only in blocks that are not
/// draining (replies to every held block are steered to it). None active
/// and none refused: nothing to choose from, and nothing to refuse either.
pub(super) fn node_blocks(
    view: &ClusterView,
    gateway: &str,
    node: &str,
) -> BTreeMap<IpAddr, Vec<PortRange>> {
    let mut out: BTreeMap<IpAddr, Vec<PortRange>> = BTreeMap::new();
    let Some(ts) = view.tunnel(node).and_then(|t| t.status.as_ref()) else {
        return out;
    };
    let size = ts.port_block_size.max(1) as u32;
    for (eip, b) in grants_of(ts, gateway) {
        let active: Vec<u16> = b
            .blocks
            .iter()
            .copied()
            .filter(|i| !b.draining.contains(i))
            .collect();
        if active.is_empty() && !b.exhausted {
            continue;
        }
        let ranges = out.entry(eip).or_default();
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
    out
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
            steering: OnceLock::new(),
            owned: BTreeMap::new(),
            name: gw_name.clone(),
        };
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
