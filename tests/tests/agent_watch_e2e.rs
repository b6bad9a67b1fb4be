//! The agents follow the cluster from their watches (etcd, controller,
//! agents in namespaces): a change anywhere reaches the maps of the node it
//! concerns, and no agent lists the datastore again for it. Counted on
//! etcd's side (its gRPC Range requests) and by each agent (`/state`:
//! `datastore_lists`). With every agent listing every kind on every change,
//! the datastore's load grows with nodes times changes. An agent is not
//! even sent other nodes' pods (etcd's pod index).

use std::time::Duration;

use anyhow::Result;
use egress_tests::cluster::{wait_until, Cluster};

/// Pods added while the agents run.
const PODS: u64 = 30;

#[test]
#[ignore = "needs root: namespaces, BPF, etcd"]
fn agents_apply_changes_from_their_watches_without_listing_again() -> Result<()> {
    let cluster = Cluster::start_default()?;
    cluster.apply_example_policy()?;
    let agents = cluster.topo.nodes.len();
    let lists_before = cluster.agent_lists()?;
    assert!(
        lists_before.iter().all(|&n| n >= 1),
        "every agent lists once at start: {lists_before:?}"
    );
    let ranges_before = etcd_ranges(&cluster)?;

    for i in 0..PODS {
        cluster.add_pod(&format!("extra{i}"), "app=web", "w1", &pod_ip(i))?;
    }
    // Events come in order: once the last pod is in w1's maps, all are.
    let last = format!("{}/32", pod_ip(PODS - 1));
    wait_until(
        "w1 translates the last pod added",
        Duration::from_secs(30),
        || Ok(cluster.policy_sources(0)?.contains(&last)),
    )?;
    let sources = cluster.policy_sources(0)?;
    for i in 0..PODS {
        let want = format!("{}/32", pod_ip(i));
        assert!(
            sources.contains(&want),
            "{want} missing in w1's policy sources"
        );
    }
    // w2 selects none of them (they run on w1), and etcd sends it none of
    // them (it watches its node's part of the pod index): its view holds
    // its own two pods, w1's all of its own.
    assert!(!cluster.policy_sources(1)?.contains(&last));
    let view_pods = |i: usize| -> Result<u64> {
        Ok(cluster.agent_state(i)?["view_pods"].as_u64().unwrap_or(0))
    };
    let on = |node: usize| cluster.topo.nodes[node].pods.len() as u64;
    assert_eq!(view_pods(0)?, on(0) + PODS, "w1's view");
    // w2's own pods may still be on their way to its view (seen once: 0
    // right after the cluster's start); w1's never arrive: it must come to
    // hold exactly its own.
    wait_until(
        "w2's view holds exactly its own pods (none of w1's)",
        Duration::from_secs(10),
        || Ok(view_pods(1)? == on(1)),
    )?;
    assert_eq!(view_pods(1)?, on(1), "w2's view: w1's pods were sent to it");

    let ranges = etcd_ranges(&cluster)? - ranges_before;
    assert_eq!(
        cluster.agent_lists()?,
        lists_before,
        "an agent listed the datastore again for a change its watch brought"
    );
    // What is left is the CLI's own reads (one per pod) and the
    // controller's; agents listing the seven kinds on every change would
    // add about agents x PODS x 7.
    assert!(
        ranges < PODS * agents as u64,
        "etcd served {ranges} Range requests for {PODS} pods added with {agents} agents running"
    );
    eprintln!("etcd Range requests while {PODS} pods were added: {ranges}");
    Ok(())
}

fn pod_ip(i: u64) -> String {
    format!("10.244.1.{}", 100 + i)
}

/// Range requests etcd has answered (every code), from its /metrics.
fn etcd_ranges(cluster: &Cluster) -> Result<u64> {
    let addr = cluster.etcd().endpoint().replace("http://", "");
    let body = cluster.fabric_http(&addr, "/metrics")?;
    let n: f64 = body
        .lines()
        .filter(|l| {
            l.starts_with("grpc_server_handled_total{")
                && l.contains("grpc_method=\"Range\"")
                && l.contains("grpc_service=\"etcdserverpb.KV\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    Ok(n as u64)
}
