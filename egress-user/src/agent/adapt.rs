//! Pure glue: the control plane's view of one node ([`NodeDesired`]) becomes
//! the datapath's [`DesiredMaps`]. Kept apart from both so each side stays in
//! its own terms, and so the mapping is a unit test, not a guess.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, Ipv4Addr},
};

use egress_control::{
    agent_state::{NodeDesired, RuleAction},
    controller::ClusterView,
    datastore::{Kind, ObjectKey},
};
use ipnet::IpNet;

use crate::datapath::{
    Cidr, DesiredMaps, NodeConfig, OwnedEip, PolicyRule, PortBlockGrant, ReplySteering,
};

/// What the agent knows about its own node's devices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeFacts {
    pub tunnel_ip: Ipv4Addr,
    pub vxlan_ifindex: u32,
    pub uplink_ifindex: u32,
    pub uplink_mac: [u8; 6],
    pub vni: u32,
    pub tunnel_mtu: u16,
    /// Answer ARP/NDP for owned EIPs (L2 mode).
    pub l2_announce: bool,
}

/// Problems that leave a policy out of the maps (the rest still applies).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skipped {
    pub policy: String,
    pub why: String,
}

fn cidr(n: &IpNet) -> Cidr {
    Cidr::new(n.addr(), n.prefix_len()).expect("an IpNet's prefix length is valid")
}

/// Precedence rank of every policy (0 wins): lower `spec.priority`, then older.
fn ranks(view: &ClusterView) -> BTreeMap<(Kind, ObjectKey), i32> {
    let mut views = view.policy_views();
    views.sort_by(|a, b| a.precedence().cmp(&b.precedence()));
    views
        .into_iter()
        .enumerate()
        .map(|(i, p)| ((p.kind, p.key.clone()), i as i32))
        .collect()
}

fn excluded_of(view: &ClusterView, kind: Kind, key: &ObjectKey) -> Vec<Cidr> {
    view.policy_views()
        .into_iter()
        .find(|p| p.kind == kind && &p.key == key)
        .map(|p| {
            p.fields
                .excluded_subnet
                .iter()
                .filter_map(|s| s.parse::<Cidr>().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Builds the maps' desired contents. `announce` is the set of EIPs the
/// fence allows this node to answer for right now.
pub fn desired_maps(
    view: &ClusterView,
    nd: &NodeDesired,
    facts: &NodeFacts,
    announce: &BTreeSet<IpAddr>,
) -> (DesiredMaps, Vec<Skipped>) {
    let ranks = ranks(view);
    let mut skipped = Vec::new();
    let mut sources: BTreeMap<u32, BTreeSet<Cidr>> = BTreeMap::new();
    let mut dests: BTreeMap<u32, BTreeSet<Cidr>> = BTreeMap::new();
    for rule in &nd.rules {
        if let RuleAction::Egress(id) = rule.action {
            sources.entry(id).or_default().insert(Cidr::host(rule.src));
            dests.entry(id).or_default().insert(cidr(&rule.dst));
        }
    }
    let mut policies = Vec::new();
    for (id, target) in &nd.policies {
        let name = format!(
            "{}/{}/{}",
            target.kind.name(),
            target.key.namespace,
            target.key.name
        );
        let Some(srcs) = sources.get(id) else {
            continue;
        }; // no local pod: nothing to match
        let gateway_tunnel_ip = match target.tunnel_endpoint {
            Some(IpAddr::V4(ip)) => ip,
            Some(IpAddr::V6(_)) => {
                skipped.push(Skipped {
                    policy: name,
                    why: "the gateway has only an IPv6 tunnel endpoint; the underlay is IPv4"
                        .into(),
                });
                continue;
            }
            None if target.local => facts.tunnel_ip,
            None => {
                skipped.push(Skipped {
                    policy: name,
                    why: format!(
                        "gateway node {} has no tunnel endpoint yet",
                        target.gateway_node
                    ),
                });
                continue;
            }
        };
        if target.eip_v4.is_none() && target.eip_v6.is_none() {
            skipped.push(Skipped {
                policy: name,
                why: "no EIP assigned yet".into(),
            });
            continue;
        }
        policies.push(PolicyRule {
            id: *id,
            priority: ranks
                .get(&(target.kind, target.key.clone()))
                .copied()
                .unwrap_or(i32::MAX),
            sources: srcs.iter().copied().collect(),
            destinations: dests
                .get(id)
                .map(|d| d.iter().copied().collect())
                .unwrap_or_default(),
            excluded: excluded_of(view, target.kind, &target.key),
            eip_v4: target.eip_v4,
            eip_v6: target.eip_v6,
            gateway_tunnel_ip,
            local_gateway: target.local,
            use_node_ip: target.use_node_ip,
        });
    }

    let mut block_size = None;
    let port_blocks = nd
        .port_blocks
        .iter()
        .map(|(eip, ranges)| {
            if let Some(r) = ranges.first() {
                block_size.get_or_insert(r.last - r.first + 1);
            }
            PortBlockGrant {
                eip: *eip,
                blocks: ranges.iter().map(|r| r.block).collect(),
            }
        })
        .collect();

    let reply_steering = nd
        .reply_steering
        .iter()
        .filter_map(|((eip, block), worker)| match worker {
            IpAddr::V4(w) => Some(ReplySteering {
                eip: *eip,
                block: *block,
                worker_tunnel_ip: *w,
                local: *w == facts.tunnel_ip,
            }),
            IpAddr::V6(_) => None,
        })
        .collect();

    let node_ips: BTreeSet<IpAddr> = view
        .node(&nd.node)
        .map(|n| n.addresses.iter().filter_map(|a| a.parse().ok()).collect())
        .unwrap_or_default();
    let owned_eips = nd
        .owned_eips
        .iter()
        .filter(|(eip, _)| announce.contains(eip))
        .map(|(eip, owned)| OwnedEip {
            eip: *eip,
            answer_neigh: facts.l2_announce && !node_ips.contains(eip),
            node_ip: node_ips.contains(eip),
            epoch: owned.epoch as u32,
        })
        .collect();

    let config = NodeConfig {
        is_worker: true,
        is_gateway: nd.gateway_eligible,
        vxlan_ifindex: facts.vxlan_ifindex,
        vni: facts.vni,
        uplink_ifindex: facts.uplink_ifindex,
        uplink_mac: facts.uplink_mac,
        tunnel_mtu: facts.tunnel_mtu,
        port_block_size: block_size.unwrap_or(NodeConfig::default().port_block_size),
        node_tunnel_ip: facts.tunnel_ip,
        ..NodeConfig::default()
    };
    let maps = DesiredMaps {
        config,
        policies,
        cluster_cidrs: nd.cluster_cidrs.all().iter().map(cidr).collect(),
        port_blocks,
        reply_steering,
        owned_eips,
    };
    (maps, skipped)
}
