use serde_json::json;

use super::*;
use crate::datastore::memory::MemoryDatastore;

/// Node w1 at 10.10.0.1 on eth0, with this IPv6 address.
pub(crate) fn w1(ipv6: Option<&str>) -> SelfDescription {
    SelfDescription {
        node: NodeRecord {
            name: "w1".into(),
            addresses: vec!["10.10.0.1".into()],
            ready: true,
            ..Default::default()
        },
        tunnel_ip: "10.10.0.1".parse().unwrap(),
        ipv6: ipv6.map(|a| a.parse().unwrap()),
        mac: [2, 0, 0, 0, 0, 1],
        parent: "eth0".into(),
    }
}

#[tokio::test]
async fn registration_writes_node_and_tunnel_facts_not_the_phase() {
    let ds = MemoryDatastore::new();
    let me = w1(Some("fd00:10::1"));
    register(&ds, &me).await.unwrap();
    let view = crate::view::load_view(&ds).await.unwrap();
    let st = view.tunnel("w1").unwrap().status.clone().unwrap();
    assert_eq!(st.tunnel.ipv4, "10.10.0.1");
    assert_eq!(
        st.phase,
        crate::api::TunnelPhase::Pending,
        "registered, not Ready until the controller says so"
    );
    // The controller decided a phase meanwhile: registering again (an
    // agent restart) keeps it.
    ds.write_status(
        Kind::EgressTunnel,
        &ObjectKey::cluster("w1"),
        &StatusPatch {
            manager: "egress-controller".into(),
            owned: vec!["phase".into()],
            status: json!({"phase": "HeartbeatTimeout"}),
        },
    )
    .await
    .unwrap();
    register(&ds, &me).await.unwrap();
    let view = crate::view::load_view(&ds).await.unwrap();
    assert_eq!(view.nodes.len(), 1);
    let t = view.tunnel("w1").expect("tunnel registered");
    let st = t.status.as_ref().unwrap();
    assert_eq!(st.tunnel.ipv4, "10.10.0.1");
    assert_eq!(st.tunnel.ipv6, "fd00:10::1");
    assert_eq!(
        view.node_ip("w1", true),
        Some("fd00:10::1".parse().unwrap()),
        "a useNodeIP policy's IPv6 address"
    );
    assert_eq!(st.tunnel.mac, "02:00:00:00:00:01");
    assert_eq!(st.tunnel.parent.name, "eth0");
    assert_eq!(
        st.phase,
        crate::api::TunnelPhase::HeartbeatTimeout,
        "the agent never writes the phase"
    );
}

#[tokio::test]
async fn a_registration_that_the_datastore_lost_is_noticed() {
    let ds = MemoryDatastore::new();
    let me = w1(None);
    let lost = |ds: &MemoryDatastore| {
        let ds = ds.clone();
        let me = me.clone();
        async move { registration_lost(&crate::view::load_view(&ds).await.unwrap(), &me, true) }
    };
    assert!(lost(&ds).await, "nothing registered yet");
    register(&ds, &me).await.unwrap();
    assert!(!lost(&ds).await);
    // The tunnel deleted (and created again empty, as the controller does).
    let key = ObjectKey::cluster("w1");
    ds.delete(Kind::EgressTunnel, &key, None).await.unwrap();
    assert!(lost(&ds).await);
    let empty = json!({"apiVersion": crate::api::API_VERSION, "kind": "EgressTunnel",
                       "metadata": {"name": "w1"}, "spec": {}});
    ds.create(Kind::EgressTunnel, empty).await.unwrap();
    assert!(lost(&ds).await);
    register(&ds, &me).await.unwrap();
    assert!(!lost(&ds).await);
    // The node record deleted: lost where the agent writes it.
    ds.delete(Kind::Node, &key, None).await.unwrap();
    assert!(lost(&ds).await);
    let view = crate::view::load_view(&ds).await.unwrap();
    assert!(
        !registration_lost(&view, &me, false),
        "not where the kubelet keeps it"
    );
}

#[tokio::test]
async fn on_a_datastore_that_keeps_nodes_itself_only_the_tunnel_is_written() {
    // As on Kubernetes: the Node is the kubelet's, and writing it fails;
    // the tunnel is the controller's to create.
    let ds = MemoryDatastore::with_external_records();
    let me = w1(Some("fd00:10::1"));
    let e = register(&ds, &me).await.unwrap_err();
    assert!(
        format!("{e:#}").contains("the controller creates one"),
        "{e:#}"
    );
    assert!(crate::view::load_view(&ds)
        .await
        .unwrap()
        .tunnels
        .is_empty());
    let tunnel = serde_json::json!({"apiVersion": crate::api::API_VERSION, "kind": "EgressTunnel",
                                    "metadata": {"name": "w1"}, "spec": {}});
    ds.create(Kind::EgressTunnel, tunnel).await.unwrap();
    register(&ds, &me)
        .await
        .expect("registering writes no Node");
    let view = crate::view::load_view(&ds).await.unwrap();
    assert!(view.nodes.is_empty());
    let st = view.tunnel("w1").unwrap().status.clone().unwrap();
    assert_eq!(
        (st.tunnel.ipv4.as_str(), st.tunnel.ipv6.as_str()),
        ("10.10.0.1", "fd00:10::1")
    );
}
