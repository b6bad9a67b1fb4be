//! The agent's look-up of how the node reaches a pod address, against real
//! devices in a namespace: pod veths and bridges are seen by the worker
//! program; a macvlan device (ipvlan and netkit are not in this kernel)
//! and a veth without a pod on its other end are reported.

use egress_tests::{link_veth, Netns};
use egress_user::agent::pod_devices::{reach_of, PodReach};

fn reach(node: &Netns, addr: &str) -> anyhow::Result<PodReach> {
    let addr: std::net::IpAddr = addr.parse()?;
    node.enter(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(async {
            let (conn, handle, _) = rtnetlink::new_connection()?;
            tokio::spawn(conn);
            reach_of(&handle, addr).await
        })
    })
}

#[test]
#[ignore = "needs root: creates namespaces"]
fn pod_veths_and_bridges_are_seen_other_devices_are_reported() -> anyhow::Result<()> {
    let node = Netns::new("reach")?;
    let pod = Netns::new("reachpod")?;
    link_veth(&node, "vpod", &pod, "eth0")?;
    node.ip(&["link", "set", "vpod", "up"])?;
    node.route(&["10.244.1.5/32", "dev", "vpod"])?;
    node.route(&["fd00:244:1::5/128", "dev", "vpod"])?;
    node.bridge("cni0")?;
    node.addr("cni0", "10.244.2.1/24")?;
    // A veth pair inside the node (no pod on the other end) as the parent.
    node.ip(&[
        "link", "add", "uplink", "type", "veth", "peer", "name", "uplink1",
    ])?;
    node.ip(&["link", "set", "uplink", "up"])?;
    node.ip(&["link", "add", "mv0", "link", "uplink", "type", "macvlan"])?;
    node.ip(&["link", "set", "mv0", "up"])?;
    node.route(&["10.244.3.5/32", "dev", "mv0"])?;
    node.route(&["10.244.4.5/32", "dev", "uplink"])?;

    assert_eq!(reach(&node, "10.244.1.5")?, PodReach::Veth, "routed veth");
    assert_eq!(
        reach(&node, "fd00:244:1::5")?,
        PodReach::Veth,
        "routed veth, IPv6"
    );
    assert_eq!(
        reach(&node, "10.244.2.9")?,
        PodReach::Veth,
        "behind the bridge"
    );
    assert_eq!(
        reach(&node, "10.244.3.5")?,
        PodReach::Unsupported {
            device: "mv0".into(),
            kind: "macvlan".into()
        }
    );
    assert!(matches!(
        reach(&node, "10.244.4.5")?,
        PodReach::Unsupported { device, .. } if device == "uplink"
    ));
    assert_eq!(
        reach(&node, "192.0.2.1")?,
        PodReach::NoDevice,
        "no route at all"
    );
    Ok(())
}
