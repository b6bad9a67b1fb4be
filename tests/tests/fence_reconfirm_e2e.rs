//! A gateway that fenced itself but was never evicted gets its EIP back.
//!
//! The agent fences itself `fence_after` (a little less than its eviction
//! timeout) after its last successful heartbeat renewal, and announces a
//! fenced EIP again only under a newer epoch. A node whose renewals fail
//! for longer than that but shorter than the controller's eviction timeout
//! is never evicted, so nothing would ever give it a newer epoch: before
//! the agent published `awaitingReconfirmation` and the controller
//! answered it, the EIP stayed dark for good (seen once in
//! `datastore-partition` on a loaded machine). The window is made wide and
//! deterministic here: the agents' eviction timeout (1.5 s) is far shorter
//! than the controller's (30 s), and the owner's datastore traffic is
//! dropped for a few seconds.

use std::time::Duration;

use anyhow::{Context, Result};
use egress_tests::{
    cluster::{wait_until, Cluster, ClusterSpec, Timers},
    scenarios::block_datastore,
    topology::eip,
};
use serde_json::Value;

/// (node, epoch) of every assignment of `address` in the gateway's status.
fn assigned(cluster: &Cluster, address: &str) -> Result<Vec<(String, u64)>> {
    let out = cluster.egress(&["get", "egw", "default", "-o", "json"])?;
    let v: Value = serde_json::from_str(&out).context("egress get egw -o json")?;
    let mut list = Vec::new();
    for n in v["status"]["nodeList"].as_array().into_iter().flatten() {
        for e in n["eips"].as_array().into_iter().flatten() {
            if e["ipv4"].as_str() == Some(address) {
                let node = n["name"].as_str().unwrap_or_default().to_owned();
                list.push((node, e["epoch"].as_u64().unwrap_or(0)));
            }
        }
    }
    Ok(list)
}

/// The node's `awaitingReconfirmation`, as its agent wrote it.
fn asked(cluster: &Cluster, node: &str) -> Result<Vec<Value>> {
    let out = cluster.egress(&["get", "egt", node, "-o", "json"])?;
    let v: Value = serde_json::from_str(&out).context("egress get egt -o json")?;
    Ok(v["status"]["awaitingReconfirmation"]
        .as_array()
        .cloned()
        .unwrap_or_default())
}

egress_tests::on_both_datastores! {
    #[ignore = "needs root: network namespaces, etcd"] fn a_gateway_that_fenced_itself_announces_again_once_reconfirmed;
    /// The same on Kubernetes: the renewals are Lease patches, the request and
    /// the answer status writes by server-side apply under two field managers.
    #[ignore = "needs root: network namespaces"] fn on_kubernetes_a_gateway_that_fenced_itself_announces_again_once_reconfirmed;
    => fenced_then_reconfirmed
}

fn fenced_then_reconfirmed(kubernetes: bool) -> Result<()> {
    let egress = egress_tests::egress_bin()?;
    let spec = ClusterSpec {
        workers: 1,
        gateways: 2,
        pods_per_worker: 1,
        timers: Timers {
            update: "250ms".into(),
            monitor: "250ms".into(),
            eviction: "30s".into(),
            lease: "2s".into(),
            probe: None,
        },
        agent_eviction: Some("1500ms".into()),
        kubernetes,
        ..ClusterSpec::default()
    };
    let cluster = Cluster::start(&egress, spec)?;
    cluster.apply_examples()?;
    let address = eip(0).to_string();
    let owner = cluster.example_eip_owner()?;
    let owner_name = cluster.topo.nodes[owner].name.clone();
    let before = assigned(&cluster, &address)?;
    anyhow::ensure!(
        before.len() == 1 && before[0].0 == owner_name,
        "assigned {before:?}"
    );
    // Nobody but the owner may announce at any point below.
    let only_owner = |who: &[usize]| -> Result<()> {
        anyhow::ensure!(
            who.iter().all(|&i| i == owner),
            "another node announces: {who:?}"
        );
        Ok(())
    };

    // The owner's renewals fail: it fences itself (1.35 s after its last
    // renewal), and the controller, 30 s from evicting it, moves nothing.
    block_datastore(&cluster, owner, true)?;
    let unblock = scopeguard(&cluster, owner);
    wait_until("the owner fences itself", Duration::from_secs(10), || {
        let who = cluster.announcers(&address);
        only_owner(&who)?;
        Ok(who.is_empty())
    })?;
    // Cut a little longer, so that the fence has surely settled its epoch.
    std::thread::sleep(Duration::from_secs(1));
    drop(unblock);

    // Renewals succeed again: the agent asks for its EIP to be reconfirmed,
    // the controller gives it a newer epoch on the same node, and the owner
    // announces again.
    wait_until(
        "the owner announces the EIP again",
        Duration::from_secs(20),
        || {
            let who = cluster.announcers(&address);
            only_owner(&who)?;
            Ok(who == [owner])
        },
    )?;
    let after = assigned(&cluster, &address)?;
    anyhow::ensure!(
        after.len() == 1 && after[0].0 == owner_name && after[0].1 > before[0].1,
        "reconfirmed on the same node with a newer epoch: {before:?} -> {after:?}"
    );
    // Once announcing, the agent withdraws its request.
    wait_until("the request is cleared", Duration::from_secs(10), || {
        Ok(asked(&cluster, &owner_name)?.is_empty())
    })?;
    Ok(())
}

/// Lifts the datastore block when dropped, also when the test fails.
fn scopeguard(cluster: &Cluster, node: usize) -> impl Drop + '_ {
    struct Unblock<'a>(&'a Cluster, usize);
    impl Drop for Unblock<'_> {
        fn drop(&mut self) {
            let _ = block_datastore(self.0, self.1, false);
        }
    }
    Unblock(cluster, node)
}
