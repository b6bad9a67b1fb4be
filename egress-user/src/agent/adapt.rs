//! Pure glue: the control plane's view of one node ([`NodeDesired`]) becomes
//! the datapath's [`DesiredMaps`]. Kept apart from both so each side stays in
//! its own terms, and so the mapping is a unit test, not a guess.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use egress_control::{
    agent_state::{NodeDesired, PolicyTarget, RuleAction},
    controller::ClusterView,
};
use ipnet::IpNet;

use crate::datapath::{
    Cidr, DesiredMaps, NodeConfig, OwnedEip, PolicyRule, PortBlockGrant, ReplySteering,
};

/// What the agent knows about its own node's devices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeFacts {
    /// This node's tunnel endpoint; its family is the underlay's.
    pub tunnel_ip: IpAddr,
    pub vxlan_ifindex: u32,
    pub uplink_ifindex: u32,
    pub uplink_mac: [u8; 6],
    pub vni: u32,
    pub tunnel_mtu: u16,
    /// Answer ARP/NDP for owned EIPs (L2 mode).
    pub l2_announce: bool,
    /// UDP port of the controller's probes, answered by the datapath (0: off).
    pub probe_port: u16,
    /// UDP port of the VXLAN tunnel.
    pub vxlan_port: u16,
}

/// A policy that selects pods on this node but cannot be applied here yet
/// (no EIP assigned, no gateway node, or its gateway has no usable tunnel
/// endpoint). It is not left out of the maps: it fails closed, its matching
/// packets are dropped (`no_gateway`) until the EIP and the gateway exist.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skipped {
    pub policy: String,
    pub why: String,
}

fn cidr(n: &IpNet) -> Cidr {
    Cidr::new(n.addr(), n.prefix_len()).expect("an IpNet's prefix length is valid")
}

fn fail_closed(policy: String, why: String) -> Skipped {
    Skipped {
        policy,
        why: format!("{why}: its pods' traffic to its destinations is dropped (no_gateway)"),
    }
}

/// The fail-closed rules of the policies not assigned yet
/// ([`NodeDesired::pending`], where the control plane decides them).
fn pending_rules(nd: &NodeDesired, policies: &mut Vec<PolicyRule>, skipped: &mut Vec<Skipped>) {
    for p in &nd.pending {
        skipped.push(fail_closed(
            format!("{}/{}/{}", p.kind.name(), p.key.namespace, p.key.name),
            p.reason.describe().into(),
        ));
        policies.push(PolicyRule::fail_closed(
            p.id,
            p.rank,
            p.sources.iter().map(|ip| Cidr::host(*ip)).collect(),
            p.destinations.iter().map(cidr).collect(),
            p.excluded.iter().map(cidr).collect(),
        ));
    }
}

/// Builds the maps' desired contents. `announce` is the set of EIPs the
/// fence allows this node to answer for right now.
pub fn desired_maps(
    view: &ClusterView,
    nd: &NodeDesired,
    facts: &NodeFacts,
    announce: &BTreeSet<IpAddr>,
) -> (DesiredMaps, Vec<Skipped>) {
    let mut skipped = Vec::new();
    let mut policies = policy_rules(nd, facts, &mut skipped);
    pending_rules(nd, &mut policies, &mut skipped);
    let (port_blocks, block_size) = port_blocks(nd);
    let config = NodeConfig {
        is_worker: true,
        is_gateway: nd.gateway_eligible,
        vxlan_ifindex: facts.vxlan_ifindex,
        vni: facts.vni,
        uplink_ifindex: facts.uplink_ifindex,
        uplink_mac: facts.uplink_mac,
        tunnel_mtu: facts.tunnel_mtu,
        port_block_size: Some(nd.port_block_size)
            .filter(|s| *s != 0)
            .or(block_size)
            .unwrap_or(NodeConfig::default().port_block_size),
        node_tunnel_ip: facts.tunnel_ip,
        probe_port: facts.probe_port,
        vxlan_port: facts.vxlan_port,
        ..NodeConfig::default()
    };
    let maps = DesiredMaps {
        config,
        policies,
        cluster_cidrs: nd.cluster_cidrs.all().iter().map(cidr).collect(),
        port_blocks,
        reply_steering: reply_steering(nd, facts),
        owned_eips: owned_eips(view, nd, facts, announce),
        // Filled by the caller from the routes BGP learned (agent::routes).
        routes: Vec::new(),
    };
    (maps, skipped)
}

/// The rules of the assigned policies that select local pods; those this
/// datapath cannot carry yet fail closed (and are reported in `skipped`).
fn policy_rules(
    nd: &NodeDesired,
    facts: &NodeFacts,
    skipped: &mut Vec<Skipped>,
) -> Vec<PolicyRule> {
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
        let Some(srcs) = sources.get(id) else {
            continue; // no local pod: nothing to match
        };
        let destinations: Vec<Cidr> = dests
            .get(id)
            .map(|d| d.iter().copied().collect())
            .unwrap_or_default();
        let excluded: Vec<Cidr> = target.excluded.iter().map(cidr).collect();
        let sources = srcs.iter().copied().collect();
        if let Some(why) = not_carried(target, facts.tunnel_ip.is_ipv6()) {
            let name = format!(
                "{}/{}/{}",
                target.kind.name(),
                target.key.namespace,
                target.key.name
            );
            skipped.push(fail_closed(name, why));
            policies.push(PolicyRule::fail_closed(
                *id,
                target.rank,
                sources,
                destinations,
                excluded,
            ));
            continue;
        }
        let v6 = facts.tunnel_ip.is_ipv6();
        let spread = spread_endpoints(target, v6);
        let gateway_tunnel_ip = match (target.tunnel_endpoint, spread.first()) {
            (_, Some(ip)) => *ip,
            (Some(ip), None) if ip.is_ipv6() == v6 => ip,
            _ => facts.tunnel_ip, // local gateway (see `not_carried`)
        };
        policies.push(PolicyRule {
            id: *id,
            priority: target.rank,
            sources,
            destinations,
            excluded,
            eip_v4: target.eip_v4,
            eip_v6: target.eip_v6,
            gateway_tunnel_ip,
            spread,
            local_gateway: target.local,
            use_node_ip: target.use_node_ip,
            no_gateway: false,
        });
    }
    policies
}

/// The tunnel endpoints of an ActiveActive policy's gateways on the
/// underlay's family (a gateway without one yet takes no flows).
fn spread_endpoints(target: &PolicyTarget, v6_underlay: bool) -> Vec<IpAddr> {
    target
        .spread
        .iter()
        .filter_map(|(_, e)| e.filter(|ip| ip.is_ipv6() == v6_underlay))
        .collect()
}

/// The underlay's name in messages.
fn family(v6_underlay: bool) -> &'static str {
    if v6_underlay {
        "IPv6"
    } else {
        "IPv4"
    }
}

/// Why this datapath cannot send an assigned policy's traffic yet (no EIP,
/// or no tunnel endpoint of the underlay's family for a remote gateway);
/// `None` when it can.
fn not_carried(target: &PolicyTarget, v6_underlay: bool) -> Option<String> {
    let spread = !target.spread.is_empty();
    let fam = family(v6_underlay);
    match target.tunnel_endpoint {
        _ if target.eip_v4.is_none() && target.eip_v6.is_none() => {
            Some("no EIP assigned yet".to_string())
        }
        _ if target.local => None,
        _ if spread && spread_endpoints(target, v6_underlay).is_empty() => Some(format!(
            "none of the policy's gateway nodes has an {fam} tunnel endpoint yet"
        )),
        _ if spread => None,
        Some(ip) if ip.is_ipv6() == v6_underlay => None,
        None if target.local => None,
        Some(_) => Some(format!(
            "the gateway's tunnel endpoint is not {fam}; the underlay is {fam}",
        )),
        None => Some(format!(
            "gateway node {} has no tunnel endpoint yet",
            target.gateway_node
        )),
    }
}

/// This node's port blocks per EIP, and the block size they were granted
/// with (the first range's length).
fn port_blocks(nd: &NodeDesired) -> (Vec<PortBlockGrant>, Option<u16>) {
    let mut block_size = None;
    let grants = nd
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
    (grants, block_size)
}

/// Where replies to each (EIP, block) go; worker endpoints of the other
/// family than the underlay's are left out (no tunnel reaches them).
fn reply_steering(nd: &NodeDesired, facts: &NodeFacts) -> Vec<ReplySteering> {
    let v6 = facts.tunnel_ip.is_ipv6();
    nd.reply_steering
        .iter()
        .filter(|(_, worker)| worker.is_ipv6() == v6)
        .map(|((eip, block), worker)| ReplySteering {
            eip: *eip,
            block: *block,
            worker_tunnel_ip: *worker,
            local: *worker == facts.tunnel_ip,
        })
        .collect()
}

/// The EIPs this node answers for: those the fence allows, and the node's
/// own addresses (useNodeIP), which are not fenced: no other node can claim
/// them, and nothing announces them (the kernel answers ARP for them, and
/// they go to no BGP route).
fn owned_eips(
    view: &ClusterView,
    nd: &NodeDesired,
    facts: &NodeFacts,
    announce: &BTreeSet<IpAddr>,
) -> Vec<OwnedEip> {
    let node_ips: BTreeSet<IpAddr> = view
        .node(&nd.node)
        .map(|n| n.addresses.iter().filter_map(|a| a.parse().ok()).collect())
        .unwrap_or_default();
    nd.owned_eips
        .iter()
        .filter(|(eip, _)| announce.contains(eip) || node_ips.contains(eip))
        .map(|(eip, owned)| OwnedEip {
            eip: *eip,
            // A shared (active-active) EIP lives on several nodes: only
            // BGP may announce it.
            answer_neigh: facts.l2_announce && !owned.shared && !node_ips.contains(eip),
            node_ip: node_ips.contains(eip),
            epoch: owned.epoch as u32,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use egress_control::{
        agent_state::{desired, AgentConfig},
        api::*,
    };
    use serde_json::json;

    use super::*;

    const POD: &str = "10.244.1.5";
    const POD6: &str = "fd00:244:1::5";

    fn facts() -> NodeFacts {
        NodeFacts {
            tunnel_ip: "192.168.0.11".parse().unwrap(),
            vxlan_ifindex: 7,
            uplink_ifindex: 2,
            uplink_mac: [2, 0, 0, 0, 0, 1],
            vni: 1,
            tunnel_mtu: 1450,
            l2_announce: true,
            probe_port: 0,
            vxlan_port: 4789,
        }
    }

    /// One worker `w1` with a dual-stack pod (app=web), a gateway node `gw`,
    /// gateway `g1` (IPv4 pool) and policy `p` selecting app=web towards
    /// 203.0.113.0/24, in the state the case describes.
    struct Case {
        name: &'static str,
        /// The policy's status: (EIP, gateway node); None: no status yet.
        status: Option<(&'static str, &'static str)>,
        /// The gateway node's EgressTunnel endpoint (None: no tunnel yet).
        gw_tunnel: Option<&'static str>,
        /// The gateway `g1` exists.
        gateway: bool,
        /// Expected: Some(no_gateway) when the policy is in the maps.
        rule: Option<bool>,
        /// Expected: the rule's sources.
        sources: &'static [&'static str],
        skipped: bool,
    }

    fn view(c: &Case) -> ClusterView {
        let mut v = ClusterView::default();
        if c.gateway {
            let spec: EgressGatewaySpec = serde_json::from_value(json!({
                "ippools": {"ipv4": ["203.0.113.100-203.0.113.110"]},
                "nodeSelector": {"selector": {"matchLabels": {"egress": "gw"}}},
            }))
            .unwrap();
            v.gateways.push(EgressGateway::new("g1", spec));
        }
        let spec: EgressPolicySpec = serde_json::from_value(json!({
            "egressGatewayName": "g1",
            "appliedTo": {"podSelector": {"matchLabels": {"app": "web"}}},
            "destSubnet": ["203.0.113.0/24"],
        }))
        .unwrap();
        let mut p = EgressPolicy::new("p", spec);
        p.metadata.namespace = Some("default".into());
        p.status = c.status.map(|(eip, node)| EgressPolicyStatus {
            eip: PolicyEip {
                ipv4: eip.into(),
                ipv6: String::new(),
            },
            node: node.into(),
            nodes: vec![],
            conditions: vec![],
        });
        v.policies.push(p);
        for (name, labels, ip) in [
            ("gw", json!({"egress": "gw"}), "172.18.0.2"),
            ("w1", json!({}), "172.18.0.11"),
        ] {
            v.nodes.push(
                serde_json::from_value(json!({
                    "name": name, "labels": labels, "addresses": [ip],
                }))
                .unwrap(),
            );
        }
        if let Some(ep) = c.gw_tunnel {
            let mut t = EgressTunnel::new("gw", EgressTunnelSpec {});
            t.status = Some(
                serde_json::from_value(json!({"tunnel": {"ipv4": ep}, "phase": "Ready"})).unwrap(),
            );
            v.tunnels.push(t);
        }
        v.pods.push(
            serde_json::from_value(json!({
                "name": "web", "namespace": "default", "labels": {"app": "web"},
                "node": "w1", "ips": [POD, POD6],
            }))
            .unwrap(),
        );
        v
    }

    #[test]
    fn unappliable_policies_fail_closed() {
        let cases = [
            Case {
                name: "applied: EIP, gateway node with a tunnel endpoint",
                status: Some(("203.0.113.100", "gw")),
                gw_tunnel: Some("192.168.0.2"),
                gateway: true,
                rule: Some(false),
                sources: &[POD],
                skipped: false,
            },
            Case {
                name: "gateway node has no tunnel endpoint yet",
                status: Some(("203.0.113.100", "gw")),
                gw_tunnel: None,
                gateway: true,
                rule: Some(true),
                sources: &[POD],
                skipped: true,
            },
            Case {
                name: "gateway node has only an IPv6 endpoint",
                status: Some(("203.0.113.100", "gw")),
                gw_tunnel: Some("fd00::2"),
                gateway: true,
                rule: Some(true),
                sources: &[POD],
                skipped: true,
            },
            Case {
                name: "no status yet (no EIP, no gateway node)",
                status: None,
                gw_tunnel: Some("192.168.0.2"),
                gateway: true,
                // The gateway has an IPv4 pool only: the pod's IPv6 address
                // would never be translated, so only IPv4 is held back.
                rule: Some(true),
                sources: &[POD],
                skipped: true,
            },
            Case {
                name: "EIP but no gateway node",
                status: Some(("203.0.113.100", "")),
                gw_tunnel: Some("192.168.0.2"),
                gateway: true,
                rule: Some(true),
                sources: &[POD],
                skipped: true,
            },
            Case {
                name: "the gateway does not exist: both families held back",
                status: None,
                gw_tunnel: None,
                gateway: false,
                rule: Some(true),
                sources: &[POD, POD6],
                skipped: true,
            },
        ];
        for c in &cases {
            let v = view(c);
            let nd = desired(
                &v,
                &AgentConfig {
                    node: "w1".into(),
                    ..Default::default()
                },
            );
            let (maps, skipped) = desired_maps(&v, &nd, &facts(), &BTreeSet::new());
            let rule = maps.policies.first();
            assert_eq!(maps.policies.len(), 1, "{}: one rule", c.name);
            assert_eq!(rule.map(|r| r.no_gateway), c.rule, "{}", c.name);
            let r = rule.unwrap();
            let want: Vec<Cidr> = c
                .sources
                .iter()
                .map(|s| Cidr::host(s.parse().unwrap()))
                .collect();
            let mut got = r.sources.clone();
            got.sort();
            let mut want_sorted = want.clone();
            want_sorted.sort();
            assert_eq!(got, want_sorted, "{}: sources", c.name);
            assert_eq!(
                r.destinations,
                vec!["203.0.113.0/24".parse::<Cidr>().unwrap()],
                "{}: destinations",
                c.name
            );
            assert_eq!(!skipped.is_empty(), c.skipped, "{}: {skipped:?}", c.name);
            if r.no_gateway {
                assert!(
                    skipped[0].why.contains("dropped (no_gateway)"),
                    "{}",
                    c.name
                );
                assert_eq!((r.eip_v4, r.eip_v6), (None, None));
            } else {
                assert_eq!(r.eip_v4, Some("203.0.113.100".parse().unwrap()));
                assert_eq!(
                    r.gateway_tunnel_ip,
                    "192.168.0.2".parse::<IpAddr>().unwrap()
                );
            }
            // Whatever the case, the maps translate.
            crate::datapath::translate::translate(&maps)
                .unwrap_or_else(|e| panic!("{}: {e}", c.name));
        }
    }

    #[test]
    fn a_pending_policy_without_local_pods_adds_nothing() {
        let c = Case {
            name: "",
            status: None,
            gw_tunnel: None,
            gateway: true,
            rule: None,
            sources: &[],
            skipped: false,
        };
        let mut v = view(&c);
        v.pods[0].node = "elsewhere".into();
        let nd = desired(
            &v,
            &AgentConfig {
                node: "w1".into(),
                ..Default::default()
            },
        );
        let (maps, skipped) = desired_maps(&v, &nd, &facts(), &BTreeSet::new());
        assert!(maps.policies.is_empty() && skipped.is_empty());
    }

    /// The fence gates what a gateway announces for EIPs; the node's own
    /// address (useNodeIP) is owned without it (no other node can claim
    /// it), and without answering ARP/NDP for it (the kernel does).
    #[test]
    fn the_node_address_is_owned_whatever_the_fence_says() {
        use egress_control::agent_state::OwnedEip as Owned;
        let c = Case {
            name: "",
            status: Some(("172.18.0.2", "gw")),
            gw_tunnel: Some("172.18.0.2"),
            gateway: true,
            rule: None,
            sources: &[],
            skipped: false,
        };
        let v = view(&c);
        let mut nd = desired(
            &v,
            &AgentConfig {
                node: "gw".into(),
                ..Default::default()
            },
        );
        let (node_ip, eip): (IpAddr, IpAddr) = (
            "172.18.0.2".parse().unwrap(),
            "203.0.113.100".parse().unwrap(),
        );
        for a in [node_ip, eip] {
            nd.owned_eips.insert(
                a,
                Owned {
                    gateway: "g1".into(),
                    epoch: 3,
                    shared: false,
                },
            );
        }
        let owned = |announce: &[IpAddr]| {
            let (maps, _) = desired_maps(&v, &nd, &facts(), &announce.iter().copied().collect());
            maps.owned_eips
                .iter()
                .map(|o| (o.eip, o.node_ip, o.answer_neigh))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            owned(&[]),
            [(node_ip, true, false)],
            "fenced: the node's own only"
        );
        assert_eq!(owned(&[eip]), [(node_ip, true, false), (eip, false, true)]);
    }
}
