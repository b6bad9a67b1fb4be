//! The shared cluster topology works without any of our programs: pods reach
//! the external server with their own address, both families.

use egress_tests::topology::{Topology, SERVER_IP, SERVER_IP6};

#[test]
#[ignore = "needs root: creates namespaces"]
fn pods_reach_the_server_the_normal_way() -> anyhow::Result<()> {
    let mut topo = Topology::build(&["w1", "g1"])?;
    topo.add_pod(0, "p1")?;
    topo.add_pod(0, "p2")?;
    let pod = &topo.nodes[0].pods[1];
    pod.ns
        .exec(&["ping", "-c", "1", "-W", "2", &SERVER_IP.to_string()])?;
    pod.ns
        .exec(&["ping", "-6", "-c", "1", "-W", "2", &SERVER_IP6.to_string()])?;
    // Nodes reach each other and the fabric over the underlay.
    topo.nodes[0]
        .ns
        .exec(&["ping", "-c", "1", "-W", "2", &topo.nodes[1].ip.to_string()])?;
    // A cut node is unreachable, and reachable again once restored.
    topo.cut_node(1)?;
    assert!(topo.nodes[0]
        .ns
        .exec(&["ping", "-c", "1", "-W", "1", &topo.nodes[1].ip.to_string()])
        .is_err());
    topo.restore_node(1)?;
    topo.nodes[0]
        .ns
        .exec(&["ping", "-c", "1", "-W", "2", &topo.nodes[1].ip.to_string()])?;
    Ok(())
}
