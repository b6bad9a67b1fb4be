//! A useNodeIP policy end to end (etcd, controller, agents in namespaces):
//! the selected pod leaves with its gateway node's own address, on a port
//! from the range the controller reserves for node addresses
//! (`--node-ip-port-range`, default 61000-65535), while the gateway node's
//! own connections to the same server keep working: their ports (the
//! node's ephemeral range) lie in no port block, so the gateway's datapath
//! leaves their replies to the node's stack. The policy is dual-stack: the
//! pod's IPv6 traffic leaves with the node's IPv6 address, which the agent
//! found on its uplink and registered.

use std::{ops::RangeInclusive, time::Duration};

use egress_control::controller::DEFAULT_PORT_BLOCK_SIZE;

/// The whole port blocks of the default range 61000-65535 at the default
/// block size: the ports a node-address flow may get.
fn reserved_ports() -> RangeInclusive<u64> {
    let size = u64::from(DEFAULT_PORT_BLOCK_SIZE);
    61000_u64.div_ceil(size) * size..=65535
}

use anyhow::{Context, Result};
use egress_tests::{
    cluster::{examples_dir, tcp_peer_seen, tcp_peer_seen_at, wait_until, Cluster, ClusterSpec},
    egress_bin,
};
use serde_json::Value;

egress_tests::on_both_datastores! {
    #[ignore = "needs root: namespaces, BPF, etcd"] fn a_node_ip_policy_leaves_with_the_node_address_and_spares_its_own_connections;
    /// The same on Kubernetes, where the node's addresses (the policy's, per
    /// family) come from the Node's InternalIPs and the tunnel's status.
    #[ignore = "needs root: namespaces, BPF"] fn on_kubernetes_a_node_ip_policy_leaves_with_the_node_address;
    => node_ip_policy
}

fn node_ip_policy(kubernetes: bool) -> Result<()> {
    let egress = egress_bin()?;
    let spec = ClusterSpec {
        kubernetes,
        ..ClusterSpec::default()
    };
    let cluster = Cluster::start(&egress, spec)?;
    let ex = examples_dir();
    cluster.apply(&ex.join("gateway.yaml"))?;
    let policy = std::fs::read_to_string(ex.join("policy.yaml"))?
        .replace("useNodeIP: false", "useNodeIP: true");
    let dir = TempDir::new()?;
    let file = dir.0.join("node-ip-policy.yaml");
    std::fs::write(&file, policy)?;
    cluster.apply(&file)?;

    // The policy's gateway node, and its address as the policy's EIP.
    let mut gateway = None;
    wait_until("the policy is placed", Duration::from_secs(30), || {
        let out = cluster.egress(&["get", "egp", "web", "-n", "default", "-o", "json"])?;
        let v: Value = serde_json::from_str(&out).context("egress get egp -o json")?;
        let node = v["status"]["node"].as_str().unwrap_or_default();
        gateway = cluster.topo.nodes.iter().position(|n| n.name == node);
        let eip = |family: &str| v["status"]["eip"][family].as_str().unwrap_or_default();
        Ok(gateway.is_some() && !eip("ipv4").is_empty() && !eip("ipv6").is_empty())
    })?;
    let g = gateway.expect("placed");
    let node_ip = cluster.topo.nodes[g].ip.to_string();
    let node_ip6 = cluster.topo.nodes[g].ip6.to_string();
    wait_until("w1 applies the policy", Duration::from_secs(30), || {
        Ok(cluster.agent_state(0)?["policies"].as_u64() == Some(1))
    })?;

    // The selected pod: the node's address, a port of the reserved range.
    let pod_ns = &cluster.topo.nodes[0].pods[0].ns;
    let mut seen = (String::new(), 0);
    wait_until(
        "p11 leaves with the node's address",
        Duration::from_secs(30),
        || {
            seen = tcp_peer_seen(&cluster, pod_ns, 5000)?;
            Ok(seen.0 == node_ip)
        },
    )
    .with_context(|| diagnostics(&cluster, &egress, g))?;
    assert!(
        reserved_ports().contains(&seen.1),
        "port {} outside the whole blocks of 61000-65535",
        seen.1
    );
    // Its IPv6 traffic: the node's IPv6 address (without it, the pod's own
    // address would leave: the policy would have no IPv6 address).
    let server6 = (egress_tests::topology::SERVER_IP6, 5001).into();
    let seen6 = tcp_peer_seen_at(&cluster, pod_ns, server6)
        .with_context(|| diagnostics(&cluster, &egress, g))?;
    assert_eq!(
        seen6.0, node_ip6,
        "the pod's IPv6 source as the server saw it"
    );
    assert!(
        reserved_ports().contains(&seen6.1),
        "IPv6 port {} outside the whole blocks of 61000-65535",
        seen6.1
    );

    // The gateway node's own connection to the same server and port: its
    // ephemeral port is in no block, so the reply reaches the node.
    let own = tcp_peer_seen(&cluster, &cluster.topo.nodes[g].ns, 5000)?;
    assert_eq!(own.0, node_ip);
    assert!(
        !reserved_ports().contains(&own.1),
        "the node's own port {} is one of the reserved range's",
        own.1
    );
    Ok(())
}

/// A node's IPv6 address that goes and comes back while its agent runs
/// (a global address that comes up after the agent started: duplicate
/// detection, SLAAC, a late DHCPv6 lease) is registered each time: the
/// EgressTunnel's `status.tunnel.ipv6` and the node record follow it.
#[test]
#[ignore = "needs root: namespaces, BPF, etcd"]
fn the_agent_registers_the_nodes_ipv6_address_when_it_changes() -> Result<()> {
    let egress = egress_bin()?;
    let cluster = Cluster::start(&egress, ClusterSpec::default())?;
    let w1 = &cluster.topo.nodes[0];
    let ip6 = w1.ip6.to_string();
    let registered = |want: &str| -> Result<bool> {
        let t: Value = serde_json::from_str(&cluster.egress(&["get", "egt", "w1", "-o", "json"])?)?;
        let n: Value =
            serde_json::from_str(&cluster.egress(&["get", "node", "w1", "-o", "json"])?)?;
        let in_node = n["spec"]["addresses"]
            .as_array()
            .is_some_and(|a| a.iter().any(|x| x == &ip6));
        let want_in_node = !want.is_empty();
        Ok(t["status"]["tunnel"]["ipv6"] == want && in_node == want_in_node)
    };
    wait_until(
        "w1's IPv6 address registered at start",
        Duration::from_secs(30),
        || registered(&ip6),
    )?;
    w1.ns
        .ip(&["-6", "addr", "del", &format!("{ip6}/64"), "dev", "eth0"])?;
    wait_until(
        "w1's IPv6 address gone from its records",
        Duration::from_secs(30),
        || registered(""),
    )?;
    w1.ns.ip(&[
        "-6",
        "addr",
        "add",
        &format!("{ip6}/64"),
        "dev",
        "eth0",
        "nodad",
    ])?;
    wait_until(
        "w1's IPv6 address registered again",
        Duration::from_secs(30),
        || registered(&ip6),
    )?;
    Ok(())
}

/// The worker's and the gateway's datapath state, for a failure message.
fn diagnostics(cluster: &Cluster, egress: &std::path::Path, gateway: usize) -> String {
    [0, gateway]
        .iter()
        .map(|&i| {
            let out = std::process::Command::new(egress)
                .args(["inspect", "--pin-dir"])
                .arg(cluster.pin_dir(i))
                .output();
            let text = out
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_else(|e| e.to_string());
            format!("--- {}:\n{text}", cluster.topo.nodes[i].name)
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A folder of its own under the system's temp dir, removed on drop.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new() -> Result<Self> {
        let dir = std::env::temp_dir().join(egress_tests::unique_name("nodeip"));
        std::fs::create_dir_all(&dir)?;
        Ok(Self(dir))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
