//! Agents as BGP speakers in a real cluster: every agent peers with the
//! reflector (which finds its clients in the datastore), announces its pod
//! CIDRs and the EIPs it owns with itself as next hop, and learns the others'
//! routes through the reflector. An FRR upstream router gets them all.

use anyhow::Context;
use std::time::Duration;

use egress_tests::{
    cluster::{wait_until, Cluster, ClusterSpec, REFLECTOR_ADMIN},
    egress_bin,
    topology::{eip, FABRIC_UNDERLAY_IP},
};

fn learned(cluster: &Cluster, node: usize, prefix: &str) -> Option<String> {
    cluster.agent_state(node).ok()?["bgp_learned"][prefix]
        .as_str()
        .map(str::to_owned)
}

/// Whether node `node`'s ROUTES map (as `egress inspect` shows it) sends
/// `eip` to the tunnel endpoint `tunnel`.
fn routes_eip_to(
    cluster: &Cluster,
    egress: &std::path::Path,
    node: usize,
    eip: &str,
    tunnel: &str,
) -> anyhow::Result<bool> {
    let pin = cluster.pin_dir(node).to_string_lossy().into_owned();
    let out = std::process::Command::new(egress)
        .args(["inspect", "--json", "--pin-dir", &pin])
        .output()?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    Ok(v["datapath"]["routes"].as_array().is_some_and(|r| {
        r.iter()
            .any(|e| e["eip"] == eip && e["tunnel_ip"] == tunnel)
    }))
}

/// Whether the upstream FRR has every node's pod CIDR and `eip_prefix`
/// (the EIP, owned by `owner`), each with its node's underlay address as
/// next hop.
fn upstream_has_every_route(
    cluster: &Cluster,
    eip_prefix: &str,
    owner: &egress_tests::topology::Node,
) -> anyhow::Result<bool> {
    let frr = &cluster.upstream.as_ref().context("upstream")?.frr;
    let routes = frr.ipv4_routes()?;
    let via = |n: &egress_tests::topology::Node| Some(n.underlay_ip.to_string());
    let cidrs_ok = cluster
        .topo
        .nodes
        .iter()
        .all(|n| routes.get(&n.pod_cidr()).cloned() == via(n));
    Ok(cidrs_ok && routes.get(eip_prefix).cloned() == via(owner))
}

/// The reflector's peers, from `egress bgp status --json`.
fn reflector_peers(
    cluster: &Cluster,
    egress: &std::path::Path,
) -> anyhow::Result<Vec<serde_json::Value>> {
    let status = cluster.topo.fabric.exec(&[
        egress.to_str().unwrap(),
        "bgp",
        "status",
        "--admin-addr",
        REFLECTOR_ADMIN,
        "--json",
    ])?;
    let status: serde_json::Value = serde_json::from_str(&status)?;
    Ok(status["peers"].as_array().cloned().unwrap_or_default())
}

/// Reflector clients in the Established state.
fn established_clients(cluster: &Cluster, egress: &std::path::Path) -> anyhow::Result<usize> {
    Ok(reflector_peers(cluster, egress)?
        .iter()
        .filter(|p| p["client"] == true && p["state"] == "Established")
        .count())
}

/// Waits up to 30 s (`what` names the wait) for every node to be an
/// established client of the reflector.
fn wait_all_established(
    cluster: &Cluster,
    egress: &std::path::Path,
    what: &str,
) -> anyhow::Result<()> {
    wait_until(what, Duration::from_secs(30), || {
        Ok(established_clients(cluster, egress)? == cluster.topo.nodes.len())
    })?;
    Ok(())
}

/// Sets an environment variable that the cluster's processes inherit, and
/// removes it when dropped (so later tests in this binary do not see it).
struct EnvVar(&'static str);

impl EnvVar {
    fn set(name: &'static str, value: &str) -> EnvVar {
        std::env::set_var(name, value);
        EnvVar(name)
    }
}

impl Drop for EnvVar {
    fn drop(&mut self) {
        std::env::remove_var(self.0);
    }
}

/// TCP-MD5 between the agents and the reflector: with
/// EGRESS_BGP_PASSWORD set for both (as the chart sets it from a Secret),
/// every agent's session comes up signed; a connection without the key
/// from a node's address is not even answered (the kernel drops it).
#[test]
#[ignore = "needs root: namespaces, BPF, etcd"]
fn agent_sessions_with_the_reflector_are_md5_signed() -> anyhow::Result<()> {
    let egress = egress_bin()?;
    let _key = EnvVar::set("EGRESS_BGP_PASSWORD", "cluster-s3cret");
    let cluster = Cluster::start(
        &egress,
        ClusterSpec {
            bgp: true,
            ..ClusterSpec::default()
        },
    )?;
    wait_all_established(
        &cluster,
        &egress,
        "every node is an established client over TCP-MD5",
    )?;
    let node = &cluster.topo.nodes[0];
    let unsigned = node.ns.exec(&[
        "nc",
        "-z",
        "-w",
        "2",
        &FABRIC_UNDERLAY_IP.to_string(),
        "179",
    ]);
    assert!(
        unsigned.is_err(),
        "an unsigned connection from {} reached the reflector",
        node.ip
    );
    Ok(())
}

#[test]
#[ignore = "needs root: namespaces, BPF, etcd"]
fn agents_announce_pod_cidrs_and_owned_eips_through_the_reflector() -> anyhow::Result<()> {
    let egress = egress_bin()?;
    let cluster = Cluster::start(
        &egress,
        ClusterSpec {
            bgp: true,
            upstream_frr: true,
            ..ClusterSpec::default()
        },
    )?;
    cluster.apply_examples()?;

    // w1 learns w2's pod CIDR with w2 as next hop, through the reflector.
    let w2 = &cluster.topo.nodes[1];
    wait_until("w1 learns w2's pod CIDR", Duration::from_secs(30), || {
        Ok(learned(&cluster, 0, &w2.pod_cidr()).as_deref() == Some(w2.ip.to_string().as_str()))
    })?;

    // The EIP is learned with its owner as next hop.
    let eip = eip(0).to_string();
    let owner = &cluster.topo.nodes[cluster.example_eip_owner()?];
    let eip_prefix = format!("{eip}/32");
    wait_until(
        "w1 learns the EIP via its owner",
        Duration::from_secs(30),
        || Ok(learned(&cluster, 0, &eip_prefix).as_deref() == Some(owner.ip.to_string().as_str())),
    )?;

    // ... and writes it into its datapath's ROUTES map (`egress inspect`),
    // which sends new flows to the EIP's owner.
    wait_until(
        "w1's ROUTES map holds the EIP",
        Duration::from_secs(30),
        || routes_eip_to(&cluster, &egress, 0, &eip, &owner.ip.to_string()),
    )?;

    // The upstream router (FRR, a non-client) receives every node's pod CIDR
    // and the EIP with its owner as next hop.
    wait_until(
        "FRR has every pod CIDR and the EIP",
        Duration::from_secs(30),
        || upstream_has_every_route(&cluster, &eip_prefix, owner),
    )?;

    // The reflector shows every node as an established client.
    // (The last node to register may still be connecting: wait for it.)
    wait_all_established(&cluster, &egress, "every node is an established client")?;
    // ... and lists no peer that cannot come up (a node's IPv6 address,
    // which its agent never connects from, used to sit "Active" forever).
    let stuck: Vec<_> = reflector_peers(&cluster, &egress)?
        .into_iter()
        .filter(|p| p["state"] != "Established")
        .collect();
    assert!(stuck.is_empty(), "peers not established: {stuck:?}");
    // The reflector's /metrics counts the same sessions.
    let metrics = cluster.fabric_http(REFLECTOR_ADMIN, "/metrics")?;
    let line = format!(
        "egress_bgp_sessions{{state=\"Established\"}} {}",
        cluster.topo.nodes.len() + 1
    );
    assert!(
        metrics.lines().any(|l| l == line),
        "no {line:?} (the nodes and FRR) in:\n{metrics}"
    );
    Ok(())
}

/// On an IPv6-only underlay: the agents peer with the reflector over IPv6
/// and announce their IPv4 pod CIDRs and EIPs with their IPv6 tunnel
/// endpoints as next hops (RFC 8950, extended next hop); they learn each
/// other's through the reflector, write the EIP's route into ROUTES, and
/// FRR upstream (extended next hop on its IPv6 session) gets them all.
#[test]
#[ignore = "needs root: namespaces, BPF, etcd"]
fn agents_announce_ipv4_routes_by_ipv6_next_hops_on_an_ipv6_underlay() -> anyhow::Result<()> {
    let egress = egress_bin()?;
    let cluster = Cluster::start(
        &egress,
        ClusterSpec {
            bgp: true,
            upstream_frr: true,
            ipv6_underlay: true,
            ..ClusterSpec::default()
        },
    )?;
    cluster.ensure_ipv6_only()?;
    cluster.apply_examples()?;
    let endpoint = |n: &egress_tests::topology::Node| n.underlay_ip.to_string();

    let w2 = &cluster.topo.nodes[1];
    wait_until(
        "w1 learns w2's pod CIDR via w2's IPv6 endpoint",
        Duration::from_secs(30),
        || Ok(learned(&cluster, 0, &w2.pod_cidr()) == Some(endpoint(w2))),
    )?;
    let eip = eip(0).to_string();
    let owner = &cluster.topo.nodes[cluster.example_eip_owner()?];
    let eip_prefix = format!("{eip}/32");
    wait_until(
        "w1 learns the EIP via its owner's IPv6 endpoint",
        Duration::from_secs(30),
        || Ok(learned(&cluster, 0, &eip_prefix) == Some(endpoint(owner))),
    )?;
    // ... and steers by it: ROUTES holds the EIP, its endpoint field the
    // index of the owner's IPv6 endpoint in TUNNEL_ENDPOINTS, which
    // `egress inspect` shows as that address.
    wait_until(
        "w1's ROUTES map holds the EIP",
        Duration::from_secs(30),
        || routes_eip_to(&cluster, &egress, 0, &eip, &endpoint(owner)),
    )?;

    wait_until(
        "FRR has every pod CIDR and the EIP by IPv6 next hops",
        Duration::from_secs(30),
        || upstream_has_every_route(&cluster, &eip_prefix, owner),
    )?;
    wait_all_established(
        &cluster,
        &egress,
        "every node is an established client over IPv6",
    )?;
    let peers = reflector_peers(&cluster, &egress)?;
    assert!(
        peers
            .iter()
            .all(|p| p["address"].as_str().is_some_and(|a| a.contains(':'))),
        "every session is over IPv6: {peers:?}"
    );
    Ok(())
}
