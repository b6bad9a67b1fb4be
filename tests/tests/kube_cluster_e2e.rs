//! The whole cluster on the Kubernetes datastore: the controller and one
//! agent per node, as separate processes, talk to an API server over HTTP
//! (the in-memory one of `egress_tests::kube_api`: a real one cannot be
//! installed here) while the datapath runs on the real kernel. The test
//! plays the kubelet: it writes the Nodes and Pods. The agents and the
//! controller each run with the RBAC the Helm chart gives their service
//! account (`egress_tests::chart_rbac`), the CLI as a cluster admin.
//!
//! Before this test, every `--datastore kubernetes` process panicked at
//! start (no TLS crypto provider), and an agent could not register (it
//! wrote its Node; nothing created its EgressTunnel): none of the unit
//! tests ran a process against an API server.

use std::{net::IpAddr, time::Duration};

use anyhow::{ensure, Result};
use egress_tests::{
    cluster::{wait_until, Cluster, ClusterSpec, Timers},
    egress_bin,
    topology::{eip, FABRIC_UNDERLAY_IP},
};

#[test]
#[ignore = "needs root: namespaces, BPF"]
fn the_cluster_runs_on_the_kubernetes_datastore_and_fails_over() -> Result<()> {
    let egress = egress_bin()?;
    let spec = ClusterSpec {
        kubernetes: true,
        timers: Timers {
            update: "500ms".into(),
            monitor: "250ms".into(),
            eviction: "3s".into(),
            ..Timers::default()
        },
        ..ClusterSpec::default()
    };
    let mut cluster = Cluster::start(&egress, spec)?;
    // p11 (app=web) leaves with the EIP; p12 (app=other) with its own address.
    let (eip, owner) = cluster.examples_up_and_checked()?;
    let p12 = cluster.topo.nodes[0].pods[1].ip.to_string();
    // The kubelet relabels p12 to app=web: it follows.
    cluster.add_pod("p12", "app=web", "w1", &p12)?;
    cluster.wait_pod_source(0, 1, &eip, "p12 leaves with the EIP")?;

    // The owner's agent dies: its heartbeat Lease stops, the controller
    // moves the EIP to the other gateway, and p11 leaves with it there.
    cluster.kill_owner_and_wait_failover(owner, &eip, "another gateway announces the EIP")?;

    // What the agents asked of the API server: writes only of their own
    // node's objects (so never of what Kubernetes keeps: Nodes, Pods,
    // Namespaces), and pods only of their own node.
    let api = cluster.api_server();
    let requests = api.requests();
    let node_ips: Vec<(IpAddr, String)> = cluster
        .topo
        .nodes
        .iter()
        .map(|n| (IpAddr::V4(n.ip), n.name.clone()))
        .collect();
    // Each process ran with the chart's RBAC for its service account.
    let refused: Vec<_> = requests.iter().filter(|r| r.refused()).collect();
    assert!(
        refused.is_empty(),
        "requests the chart's RBAC refuses: {refused:#?}"
    );
    let (mut agent_requests, mut agent_writes) = (0, 0);
    for r in &requests {
        let Some((_, node)) = node_ips.iter().find(|(ip, _)| *ip == r.peer) else {
            assert_eq!(r.peer, IpAddr::V4(FABRIC_UNDERLAY_IP), "{r:?}");
            continue;
        };
        agent_requests += 1;
        // An agent writes only its own node's objects (what the chart's
        // admission policy enforces): its EgressTunnel's status and its
        // heartbeat Lease (created by a POST to the collection).
        if !r.line.starts_with("GET ") {
            agent_writes += 1;
            let path = r.line.split(['?', ' ']).nth(1).unwrap_or_default();
            let own = [
                format!("/apis/egressgateway.egress.dev/v1beta1/egresstunnels/{node}/status"),
                format!("/apis/coordination.k8s.io/v1/namespaces/egress-system/leases/egress-node-{node}"),
                "/apis/coordination.k8s.io/v1/namespaces/egress-system/leases".to_string(),
            ];
            assert!(
                own.iter().any(|p| p == path),
                "agent of {node} wrote beyond its own objects: {}",
                r.line
            );
        }
        if r.line.contains("/api/v1/pods") {
            assert!(
                r.line
                    .contains(&format!("fieldSelector=spec.nodeName%3D{node}")),
                "agent of {node} read pods beyond its node: {}",
                r.line
            );
        }
    }
    assert!(
        agent_requests > 0 && agent_writes > 0,
        "no request, or no write, came from an agent: {requests:?}"
    );
    Ok(())
}

/// An API server restart that lost the watch history (every watch ends;
/// resuming from an older resourceVersion gets 410 Gone, so the processes
/// list again), then the leading controller dies: the other takes its
/// Lease and handles the next gateway failure.
#[test]
#[ignore = "needs root: namespaces, BPF"]
fn the_cluster_rides_out_an_api_server_restart_and_a_leader_change() -> Result<()> {
    let egress = egress_bin()?;
    let spec = ClusterSpec {
        kubernetes: true,
        controllers: 2,
        timers: Timers {
            update: "500ms".into(),
            monitor: "250ms".into(),
            eviction: "3s".into(),
            lease: "3s".into(),
            ..Timers::default()
        },
        ..ClusterSpec::default()
    };
    let mut cluster = Cluster::start(&egress, spec)?;
    cluster.wait_leading(0, Duration::from_secs(30))?;
    cluster.apply_examples()?;
    let eip = eip(0).to_string();
    let owner = cluster.example_eip_owner()?;
    cluster.wait_pod_source(0, 0, &eip, "p11 leaves with the EIP")?;

    let api = cluster.api_server();
    api.restart(true);
    let p12 = cluster.topo.nodes[0].pods[1].ip.to_string();
    cluster.add_pod("p12", "app=web", "w1", &p12)?;
    cluster.wait_pod_source(0, 1, &eip, "p12 leaves with the EIP after the restart")?;
    ensure!(
        cluster.api_server().expired_watches() > 0,
        "no watch resumed from a compacted resourceVersion: the restart tested nothing"
    );

    cluster.kill_controller(0);
    cluster.wait_leading(1, Duration::from_secs(30))?;
    cluster.kill_owner_and_wait_failover(owner, &eip, "the new leader moves the EIP")?;
    Ok(())
}

/// As the chart runs it: the route reflector inside the controller, its
/// clients the Kubernetes Nodes. Every agent announces its pod CIDRs and
/// the EIP's owner the EIP; an FRR upstream router gets them all.
#[test]
#[ignore = "needs root: namespaces, BPF, FRR"]
fn the_reflector_in_the_controller_finds_its_clients_among_the_nodes() -> Result<()> {
    let egress = egress_bin()?;
    let spec = ClusterSpec {
        kubernetes: true,
        bgp: true,
        upstream_frr: true,
        reflector_in_controller: true,
        ..ClusterSpec::default()
    };
    let cluster = Cluster::start(&egress, spec)?;
    cluster.apply_examples()?;
    let owner = &cluster.topo.nodes[cluster.example_eip_owner()?];
    let eip_prefix = format!("{}/32", eip(0));
    let frr = &cluster.upstream.as_ref().expect("an upstream").frr;
    wait_until(
        "FRR has every pod CIDR and the EIP",
        Duration::from_secs(30),
        || {
            let routes = frr.ipv4_routes()?;
            Ok(cluster
                .topo
                .nodes
                .iter()
                .all(|n| routes.get(&n.pod_cidr()) == Some(&n.ip.to_string()))
                && routes.get(&eip_prefix) == Some(&owner.ip.to_string()))
        },
    )?;
    let status: serde_json::Value =
        serde_json::from_str(&cluster.controller_http(0, "/bgp/status")?)?;
    let clients = status["peers"]
        .as_array()
        .map(|p| {
            p.iter()
                .filter(|p| p["client"] == true && p["state"] == "Established")
                .count()
        })
        .unwrap_or(0);
    assert_eq!(clients, cluster.topo.nodes.len(), "{status}");
    Ok(())
}
