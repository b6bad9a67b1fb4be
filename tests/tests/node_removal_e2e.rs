//! A node that leaves the cluster does not leave its EgressTunnel behind
//! (etcd, controller, agents in namespaces): once its Node record has been
//! gone for four eviction timeouts the controller deletes the tunnel and
//! its heartbeat, and says so in an event; a node that is present keeps
//! its own. And the
//! controller creates the tunnel of a node whose agent has not (yet); an
//! agent whose tunnel is deleted while it runs registers again.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use egress_control::datastore::{etcd::EtcdDatastore, Datastore};
use egress_tests::{
    cluster::{wait_until, Cluster, ClusterSpec, DatastoreServer, Timers},
    egress_bin,
};

fn tunnel_exists(cluster: &Cluster, node: &str) -> Result<bool> {
    let out = cluster.egress(&["get", "egt", "-o", "json"])?;
    let v: serde_json::Value = serde_json::from_str(&out).context("egress get egt -o json")?;
    let items = v["items"].as_array().cloned().unwrap_or_default();
    Ok(items.iter().any(|t| t["metadata"]["name"] == node))
}

/// The nodes with a heartbeat in the datastore (etcd is read from the
/// fabric namespace, where it listens; the API server's Leases directly).
fn heartbeats(cluster: &Cluster) -> Result<Vec<String>> {
    if let DatastoreServer::Kubernetes(k) = &cluster.datastore {
        return egress_tests::kube_objects::heartbeat_nodes(&k.server);
    }
    let endpoint = cluster.etcd().endpoint();
    cluster.topo.fabric.enter(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(async move {
            let ds = EtcdDatastore::connect(&[endpoint], "/egress").await?;
            Ok(ds.heartbeats().await?.into_iter().map(|h| h.node).collect())
        })
    })
}

egress_tests::on_both_datastores! {
    #[ignore = "needs root: namespaces, BPF, etcd"] fn a_removed_nodes_tunnel_is_deleted_after_the_grace_period;
    /// The same on Kubernetes: `kubectl delete node`, the heartbeat a Lease,
    /// the controller's deletes under the chart's RBAC.
    #[ignore = "needs root: namespaces, BPF"] fn on_kubernetes_a_removed_nodes_tunnel_and_lease_are_deleted;
    => removed_node
}

fn removed_node(kubernetes: bool) -> Result<()> {
    let egress = egress_bin()?;
    let spec = ClusterSpec {
        timers: Timers {
            update: "200ms".into(),
            monitor: "100ms".into(),
            eviction: "1s".into(),
            ..Timers::default()
        },
        kubernetes,
        ..ClusterSpec::default()
    };
    let mut cluster = Cluster::start(&egress, spec)?;
    // Gateway candidates heartbeat: take the one that does not own the EIP.
    cluster.apply_examples()?;
    let owner = cluster.example_eip_owner()?;
    let (gone, name) = (2..4)
        .find(|&i| i != owner)
        .map(|i| (i, cluster.topo.nodes[i].name.clone()))
        .context("a second gateway node")?;
    let owner_name = cluster.topo.nodes[owner].name.clone();
    wait_until("its heartbeat and tunnel", Duration::from_secs(30), || {
        Ok(tunnel_exists(&cluster, &name)? && heartbeats(&cluster)?.contains(&name))
    })?;

    // It goes: its agent stops, its Node record is deleted.
    cluster.kill_agent(gone);
    match &cluster.datastore {
        DatastoreServer::Kubernetes(k) => {
            egress_tests::kube_objects::delete_node(&k.server, &name)?
        }
        DatastoreServer::Etcd(_) => {
            cluster.egress(&["delete", "node", &name])?;
        }
    }
    let gone_at = Instant::now();
    wait_until("its tunnel deleted", Duration::from_secs(30), || {
        Ok(!tunnel_exists(&cluster, &name)?)
    })?;
    // Not before the grace period (4 x 1 s): a node and its tunnel may reach
    // the controller's view in either order.
    assert!(
        gone_at.elapsed() >= Duration::from_secs(3),
        "deleted after {:?}",
        gone_at.elapsed()
    );
    let events = cluster.egress(&["get", "events"])?;
    assert!(
        events.contains(&format!("node {name} has been gone")),
        "no event for the deletion:\n{events}"
    );
    let beating = heartbeats(&cluster)?;
    assert!(
        !beating.contains(&name),
        "its heartbeat is left: {beating:?}"
    );
    assert!(
        beating.contains(&owner_name),
        "the other's is kept: {beating:?}"
    );
    assert!(tunnel_exists(&cluster, "w1")?, "w1 keeps its tunnel");

    // A Node record without an agent (none runs there yet): the controller
    // creates its tunnel.
    if let DatastoreServer::Kubernetes(k) = &cluster.datastore {
        egress_tests::kube_objects::put_node(&k.server, "w9", "10.10.0.99")?;
    } else {
        let dir = std::env::temp_dir().join(egress_tests::unique_name("noderec"));
        std::fs::create_dir_all(&dir)?;
        let file = dir.join("node.yaml");
        std::fs::write(
            &file,
            "apiVersion: standalone.egress.dev/v1\nkind: Node\nmetadata: {name: w9}\nspec: {addresses: [10.10.0.99], ready: true}\n",
        )?;
        let applied = cluster.apply(&file);
        let _ = std::fs::remove_dir_all(&dir);
        applied?;
    }
    wait_until(
        "w9's tunnel created by the controller",
        Duration::from_secs(30),
        || tunnel_exists(&cluster, "w9"),
    )?;
    Ok(())
}

egress_tests::on_both_datastores! {
    /// An EgressTunnel deleted by mistake while its agent runs comes back
    /// registered: the agent sees its registration gone from the view and
    /// registers again (before, the node ran unregistered until its agent
    /// restarted: no port blocks, no tunnel endpoint for the others).
    #[ignore = "needs root: namespaces, BPF, etcd"] fn an_agent_registers_again_when_its_tunnel_is_deleted;
    /// On Kubernetes the agent cannot create its tunnel: the controller
    /// creates it again, then the agent registers in it.
    #[ignore = "needs root: namespaces, BPF"] fn on_kubernetes_an_agent_registers_again_when_its_tunnel_is_deleted;
    => registers_again
}

fn registers_again(kubernetes: bool) -> Result<()> {
    let egress = egress_bin()?;
    let spec = ClusterSpec {
        kubernetes,
        ..ClusterSpec::default()
    };
    let cluster = Cluster::start(&egress, spec)?;
    let ip = cluster.topo.nodes[0].ip.to_string();
    let registered = || -> Result<bool> {
        let out = cluster.egress(&["get", "egt", "w1", "-o", "json"]);
        Ok(match out {
            Ok(out) => {
                let v: serde_json::Value = serde_json::from_str(&out)?;
                v["status"]["tunnel"]["ipv4"] == ip.as_str()
            }
            Err(_) => false,
        })
    };
    wait_until("w1 registered", Duration::from_secs(30), registered)?;
    // Deleted right after the agent registered: it must not wait for its
    // next periodic resync (30 s) to notice.
    cluster.egress(&["delete", "egt", "w1"])?;
    wait_until("w1 registered again", Duration::from_secs(10), registered)?;
    Ok(())
}
