//! The Kubernetes backend at the HTTP level: a `tower-test` mock stands in
//! for the API server; each test checks the requests the backend sends and
//! how it reacts to the answers.

use ::kube::client::Body;
use ::kube::Client;
use futures::StreamExt;
use http::{Request, Response, StatusCode};
use serde_json::{json, Value};

use super::*;

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

fn mock() -> (KubeDatastore, Handle) {
    let (svc, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    (
        KubeDatastore::new(Client::new(svc, "default"), "egress-system"),
        handle,
    )
}

/// Answers a watch request with these events, one JSON object a line, as
/// the API server streams them.
fn send_watch_events(send: tower_test::mock::SendResponse<Response<Body>>, events: &[Value]) {
    let lines: String = events.iter().map(|e| format!("{e}\n")).collect();
    send.send_response(
        Response::builder()
            .body(Body::from(lines.into_bytes()))
            .unwrap(),
    );
}

struct Seen {
    method: String,
    path_and_query: String,
    content_type: String,
    body: Value,
}

/// Waits for the next request and answers it.
async fn answer(h: &mut Handle, status: u16, reply: Value) -> Seen {
    let (req, send) = tokio::time::timeout(std::time::Duration::from_secs(5), h.next_request())
        .await
        .expect("a request within 5 s")
        .expect("the client is alive");
    let method = req.method().to_string();
    let path_and_query = req
        .uri()
        .path_and_query()
        .map(|p| p.to_string())
        .unwrap_or_default();
    let content_type = req
        .headers()
        .get(http::header::CONTENT_TYPE)
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    let bytes = req.into_body().collect_bytes().await.unwrap();
    let body = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()))
    };
    send.send_response(
        Response::builder()
            .status(StatusCode::from_u16(status).unwrap())
            .body(Body::from(serde_json::to_vec(&reply).unwrap()))
            .unwrap(),
    );
    Seen {
        method,
        path_and_query,
        content_type,
        body,
    }
}

fn status(code: u16, reason: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "message": reason, "code": code})
}

fn gateway(rv: &str) -> Value {
    json!({"apiVersion": "egressgateway.egress.dev/v1beta1", "kind": "EgressGateway",
           "metadata": {"name": "g", "resourceVersion": rv}, "spec": {}})
}

fn lease(holder: &str, transitions: u64, renew: &str, rv: &str) -> Value {
    json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
           "metadata": {"name": "egress-controller", "namespace": "egress-system", "resourceVersion": rv},
           "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15, "renewTime": renew,
                    "leaseTransitions": transitions}})
}

#[tokio::test]
async fn list_then_watch_from_the_list_revision_and_resume() {
    let (ds, mut h) = mock();
    let list = tokio::spawn(async move {
        let (items, rev) = ds.list(Kind::EgressGateway).await.unwrap();
        (ds, items, rev)
    });
    let seen = answer(
        &mut h,
        200,
        json!({"apiVersion": "egressgateway.egress.dev/v1beta1", "kind": "EgressGatewayList",
               "metadata": {"resourceVersion": "10"}, "items": [gateway("9")]}),
    )
    .await;
    assert_eq!(seen.method, "GET");
    assert_eq!(
        seen.path_and_query,
        "/apis/egressgateway.egress.dev/v1beta1/egressgateways?"
    );
    let (ds, items, rev) = list.await.unwrap();
    assert_eq!((items.len(), items[0].revision, rev), (1, 9, 10));

    let mut w = ds.watch(Kind::EgressGateway, rev).await.unwrap();
    let reader = tokio::spawn(async move {
        let mut got = vec![];
        for _ in 0..3 {
            got.push(w.next().await.unwrap().unwrap());
        }
        got
    });
    // First long poll: two events, then the server ends it.
    let (req, send) = h.next_request().await.unwrap();
    let q = req.uri().query().unwrap().to_string();
    assert!(
        q.contains("watch=true") && q.contains("resourceVersion=10"),
        "{q}"
    );
    send_watch_events(
        send,
        &[
            json!({"type": "MODIFIED", "object": gateway("11")}),
            json!({"type": "BOOKMARK", "object": {"kind": "EgressGateway", "apiVersion": "egressgateway.egress.dev/v1beta1", "metadata": {"resourceVersion": "13"}}}),
        ],
    );
    // The backend resumes from the bookmark's revision.
    let (req, send) = h.next_request().await.unwrap();
    let q = req.uri().query().unwrap().to_string();
    assert!(
        q.contains("resourceVersion=13"),
        "resumes from the last revision: {q}"
    );
    send_watch_events(
        send,
        &[
            json!({"type": "ADDED", "object": {"apiVersion": "egressgateway.egress.dev/v1beta1", "kind": "EgressGateway", "metadata": {"name": "h", "resourceVersion": "14"}, "spec": {}}}),
            json!({"type": "DELETED", "object": gateway("15")}),
        ],
    );
    let got = reader.await.unwrap();
    assert!(matches!(&got[0], WatchEvent::Put(s) if s.revision == 11 && s.key.name == "g"));
    assert!(matches!(&got[1], WatchEvent::Put(s) if s.revision == 14 && s.key.name == "h"));
    assert!(matches!(&got[2], WatchEvent::Deleted { key, revision: 15, .. } if key.name == "g"));
}

#[tokio::test]
async fn status_by_server_side_apply_with_409_retry() {
    let (ds, mut h) = mock();
    let patch = StatusPatch {
        manager: "egress-controller".into(),
        owned: vec!["epoch".into(), "nodeList".into()],
        status: json!({"epoch": 3, "somethingElse": 1}),
    };
    let call = tokio::spawn(async move {
        ds.write_status(Kind::EgressGateway, &ObjectKey::cluster("g"), &patch)
            .await
    });
    let first = answer(&mut h, 409, status(409, "Conflict")).await;
    assert_eq!(first.method, "PATCH");
    assert!(first
        .path_and_query
        .starts_with("/apis/egressgateway.egress.dev/v1beta1/egressgateways/g/status?"));
    assert!(first
        .path_and_query
        .contains("fieldManager=egress-controller"));
    assert!(first.path_and_query.contains("force=true"));
    assert_eq!(first.content_type, "application/apply-patch+yaml");
    // Only the owned fields that have a value are sent.
    assert_eq!(first.body["status"], json!({"epoch": 3}));
    assert_eq!(first.body["kind"], "EgressGateway");
    let mut stored = gateway("21");
    stored["status"] = json!({"epoch": 3});
    let second = answer(&mut h, 200, stored).await;
    assert_eq!(second.body, first.body, "the retry sends the same apply");
    let s = call.await.unwrap().unwrap();
    assert_eq!(s.revision, 21);
    assert_eq!(s.value["status"]["epoch"], 3);
}

#[tokio::test]
async fn status_gives_up_after_repeated_409() {
    let (mut ds, mut h) = mock();
    ds.status_retries = 2;
    let call = tokio::spawn(async move {
        ds.write_status(
            Kind::EgressGateway,
            &ObjectKey::cluster("g"),
            &StatusPatch::owning_all("m", json!({"epoch": 1})),
        )
        .await
    });
    answer(&mut h, 409, status(409, "Conflict")).await;
    answer(&mut h, 409, status(409, "Conflict")).await;
    assert!(call.await.unwrap().unwrap_err().is_conflict());
}

#[tokio::test]
async fn update_sends_the_revision_and_maps_409_to_conflict() {
    let (ds, mut h) = mock();
    let call = tokio::spawn(async move {
        let mut v = gateway("");
        v["status"] = json!({"epoch": 99});
        ds.update(Kind::EgressGateway, v, 7).await
    });
    let seen = answer(&mut h, 409, status(409, "Conflict")).await;
    assert_eq!(seen.method, "PUT");
    assert_eq!(seen.body["metadata"]["resourceVersion"], "7");
    assert!(
        seen.body.get("status").is_none(),
        "an update never writes status"
    );
    let e = call.await.unwrap().unwrap_err();
    assert!(
        matches!(e, DatastoreError::Conflict { expected: 7, .. }),
        "{e}"
    );
}

#[tokio::test]
async fn lease_acquire_renew_and_loss() {
    let (ds, mut h) = mock();
    let ds = std::sync::Arc::new(ds);
    let ttl = Duration::from_secs(15);

    // No Lease yet: create it, term 1.
    let d = ds.clone();
    let call = tokio::spawn(async move { d.try_acquire("egress-controller", "me", ttl).await });
    let get = answer(&mut h, 404, status(404, "NotFound")).await;
    assert_eq!(
        get.path_and_query,
        "/apis/coordination.k8s.io/v1/namespaces/egress-system/leases/egress-controller"
    );
    let now = now_micro();
    let post = answer(&mut h, 201, lease("me", 1, &now, "5")).await;
    assert_eq!(post.method, "POST");
    assert_eq!(post.body["spec"]["holderIdentity"], "me");
    assert_eq!(post.body["spec"]["leaseDurationSeconds"], 15);
    let lead = call.await.unwrap().unwrap().expect("leader");
    assert_eq!(lead.term, 1);

    // Renewal: read, check it is still ours, write a new renewTime.
    let d = ds.clone();
    let l2 = lead.clone();
    let call = tokio::spawn(async move { d.renew_leadership(&l2).await });
    answer(&mut h, 200, lease("me", 1, &now, "5")).await;
    let put = answer(&mut h, 200, lease("me", 1, &now_micro(), "6")).await;
    assert_eq!(put.method, "PUT");
    assert_eq!(
        put.body["metadata"]["resourceVersion"], "5",
        "optimistic concurrency on the Lease"
    );
    assert_ne!(put.body["spec"]["renewTime"], json!(now));
    call.await.unwrap().unwrap();

    // Loss: another replica took the expired Lease (a new term).
    let d = ds.clone();
    let l2 = lead.clone();
    let call = tokio::spawn(async move { d.renew_leadership(&l2).await });
    answer(&mut h, 200, lease("other", 2, &now_micro(), "9")).await;
    let e = call.await.unwrap().unwrap_err();
    assert!(matches!(e, DatastoreError::LostLeadership { .. }), "{e}");

    // Loss by a race: our write meets a 409.
    let d = ds.clone();
    let l2 = lead.clone();
    let call = tokio::spawn(async move { d.renew_leadership(&l2).await });
    answer(&mut h, 200, lease("me", 1, &now, "10")).await;
    answer(&mut h, 409, status(409, "Conflict")).await;
    assert!(matches!(
        call.await.unwrap().unwrap_err(),
        DatastoreError::LostLeadership { .. }
    ));

    // A live Lease of someone else: no leadership, no write.
    let d = ds.clone();
    let call = tokio::spawn(async move { d.try_acquire("egress-controller", "me", ttl).await });
    answer(&mut h, 200, lease("other", 2, &now_micro(), "11")).await;
    assert!(call.await.unwrap().unwrap().is_none());

    // An expired one: taken over with the next term.
    let d = ds.clone();
    let call = tokio::spawn(async move { d.try_acquire("egress-controller", "me", ttl).await });
    answer(
        &mut h,
        200,
        lease("other", 2, "2020-01-01T00:00:00.000000Z", "12"),
    )
    .await;
    let put = answer(&mut h, 200, lease("me", 3, &now_micro(), "13")).await;
    assert_eq!(put.body["spec"]["leaseTransitions"], 3);
    assert_eq!(put.body["spec"]["holderIdentity"], "me");
    assert_eq!(call.await.unwrap().unwrap().unwrap().term, 3);
}

#[tokio::test]
async fn heartbeat_is_a_lease_renewal() {
    let (ds, mut h) = mock();
    let ds = std::sync::Arc::new(ds);
    let d = ds.clone();
    let call = tokio::spawn(async move { d.renew_heartbeat("n1", Duration::from_secs(15)).await });
    let first = answer(&mut h, 404, status(404, "NotFound")).await;
    assert_eq!(first.method, "PATCH");
    assert_eq!(first.content_type, "application/merge-patch+json");
    assert!(first.path_and_query.starts_with(
        "/apis/coordination.k8s.io/v1/namespaces/egress-system/leases/egress-node-n1"
    ));
    let mut l = lease("n1", 0, &now_micro(), "30");
    l["metadata"]["name"] = json!("egress-node-n1");
    let create = answer(&mut h, 201, l).await;
    assert_eq!(create.method, "POST");
    assert_eq!(create.body["metadata"]["labels"][HEARTBEAT_LABEL], "true");
    assert_eq!(call.await.unwrap().unwrap().counter, 30);
}

#[tokio::test]
async fn core_objects_become_records() {
    let (ds, mut h) = mock();
    let call = tokio::spawn(async move { ds.list(Kind::Pod).await });
    answer(
        &mut h,
        200,
        json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "3"}, "items": [
            {"apiVersion": "v1", "kind": "Pod",
             "metadata": {"name": "web", "namespace": "default", "labels": {"app": "web"}, "resourceVersion": "2"},
             "spec": {"nodeName": "w1", "containers": []},
             "status": {"podIPs": [{"ip": "10.244.1.5"}, {"ip": "fd00::5"}]}},
            {"apiVersion": "v1", "kind": "Pod",
             "metadata": {"name": "host", "namespace": "kube-system", "resourceVersion": "2"},
             "spec": {"nodeName": "w1", "hostNetwork": true, "containers": []},
             "status": {"podIPs": [{"ip": "172.18.0.2"}]}}
        ]}),
    )
    .await;
    let (items, _) = call.await.unwrap().unwrap();
    let p = typed::pod_record(&items[0].value);
    assert_eq!(
        (p.node.as_str(), p.ips.clone()),
        ("w1", vec!["10.244.1.5".to_string(), "fd00::5".into()])
    );
    assert_eq!(p.labels["app"], "web");
    assert!(
        typed::pod_record(&items[1].value).ips.is_empty(),
        "host-network pods are not policy sources"
    );
}

#[tokio::test]
async fn a_removed_nodes_heartbeat_lease_is_deleted() {
    let (ds, mut h) = mock();
    let forget = tokio::spawn(async move {
        let first = ds.forget_heartbeat("w1").await;
        // Gone already: fine.
        let again = ds.forget_heartbeat("w1").await;
        (first, again)
    });
    let seen = answer(&mut h, 200, status(200, "Success")).await;
    assert_eq!(seen.method, "DELETE");
    assert_eq!(
        seen.path_and_query,
        "/apis/coordination.k8s.io/v1/namespaces/egress-system/leases/egress-node-w1?"
    );
    answer(&mut h, 404, status(404, "NotFound")).await;
    let (first, again) = forget.await.unwrap();
    first.unwrap();
    again.unwrap();
}

#[tokio::test]
async fn records_are_read_only_on_kubernetes() {
    let (ds, _h) = mock();
    let e = ds
        .create(
            Kind::Pod,
            json!({"metadata": {"name": "p", "namespace": "d"}}),
        )
        .await
        .unwrap_err();
    assert!(e.to_string().contains("come from Kubernetes"), "{e}");
    // So an agent registering itself leaves its Node to the kubelet.
    assert!(!ds.writes_cluster_records());
    let node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "w1"}});
    let e = ds.update(Kind::Node, node, 1).await.unwrap_err();
    assert!(e.to_string().contains("come from Kubernetes"), "{e}");
}

#[tokio::test]
async fn port_block_grants_go_to_the_tunnel_status_under_their_own_manager() {
    use crate::api::{EgressTunnel, EipPortBlocks};
    use crate::controller::{
        write_plan_stored, ClusterView, Plan, TunnelGrants, PORT_BLOCK_MANAGER,
    };
    let (ds, mut h) = mock();
    let tunnel: EgressTunnel = serde_json::from_value(json!({
        "apiVersion": crate::api::API_VERSION, "kind": "EgressTunnel",
        "metadata": {"name": "w1", "resourceVersion": "6"}, "spec": {},
        "status": {"tunnel": {"ipv4": "192.168.0.1"}, "phase": "Ready"}}))
    .unwrap();
    let view = ClusterView {
        tunnels: vec![tunnel.clone()],
        ..Default::default()
    };
    let mut plan = Plan::default();
    plan.tunnels.insert(
        "w1".into(),
        std::sync::Arc::new(TunnelGrants {
            port_block_size: 1024,
            port_blocks: vec![EipPortBlocks {
                gateway: "g".into(),
                eip: "10.0.0.1".into(),
                blocks: vec![1],
                ..Default::default()
            }],
        }),
    );
    let call = tokio::spawn(async move { write_plan_stored(&ds, &view, &plan).await });
    let grants = json!({"portBlocks": [{"gateway": "g", "eip": "10.0.0.1", "blocks": [1]}],
                        "portBlockSize": 1024});
    let mut stored = serde_json::to_value(&tunnel).unwrap();
    stored["metadata"]["resourceVersion"] = json!("7");
    stored["status"]["portBlocks"] = grants["portBlocks"].clone();
    stored["status"]["portBlockSize"] = json!(1024);
    let seen = answer(&mut h, 200, stored).await;
    assert_eq!(seen.method, "PATCH");
    assert!(seen
        .path_and_query
        .starts_with("/apis/egressgateway.egress.dev/v1beta1/egresstunnels/w1/status?"));
    assert!(seen
        .path_and_query
        .contains(&format!("fieldManager={PORT_BLOCK_MANAGER}")));
    assert_ne!(PORT_BLOCK_MANAGER, crate::controller::MANAGER);
    // Only the grants: the phase belongs to the controller's other patches,
    // the tunnel to the agent.
    assert_eq!(seen.body["status"], grants);
    let written = call.await.unwrap().unwrap();
    assert_eq!(written.len(), 1, "the one tunnel whose grants changed");
    assert_eq!(written[0].value["status"]["phase"], "Ready");
}

#[tokio::test]
async fn an_agents_datastore_lists_and_watches_only_its_nodes_pods() {
    let (ds, mut h) = mock();
    let ds = ds.pods_of_node("w1");
    let list = tokio::spawn(async move {
        let (items, rev) = ds.list(Kind::Pod).await.unwrap();
        let _ = ds.list(Kind::EgressGateway).await.unwrap();
        (ds, items.len(), rev)
    });
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
                     "metadata": {"name": "p", "namespace": "d", "resourceVersion": "4"},
                     "spec": {"nodeName": "w1"}, "status": {"podIPs": [{"ip": "10.0.0.1"}]}});
    let seen = answer(
        &mut h,
        200,
        json!({"apiVersion": "v1", "kind": "PodList",
               "metadata": {"resourceVersion": "5"}, "items": [pod]}),
    )
    .await;
    assert_eq!(
        seen.path_and_query,
        "/api/v1/pods?&fieldSelector=spec.nodeName%3Dw1"
    );
    // Other kinds are not filtered.
    let seen = answer(
        &mut h,
        200,
        json!({"apiVersion": "egressgateway.egress.dev/v1beta1", "kind": "EgressGatewayList",
               "metadata": {"resourceVersion": "5"}, "items": []}),
    )
    .await;
    assert!(
        !seen.path_and_query.contains("fieldSelector"),
        "{}",
        seen.path_and_query
    );
    let (ds, n, rev) = list.await.unwrap();
    assert_eq!((n, rev), (1, 5));

    let mut w = ds.watch(Kind::Pod, rev).await.unwrap();
    let reader = tokio::spawn(async move { w.next().await });
    let (req, _send) = h.next_request().await.unwrap();
    let q = req.uri().query().unwrap().to_string();
    assert!(
        q.contains("watch=true") && q.contains("fieldSelector=spec.nodeName%3Dw1"),
        "{q}"
    );
    reader.abort();
}

/// An agent registering on Kubernetes: its Node is the kubelet's (no
/// request for it), its EgressTunnel is the controller's to create (the
/// agent's RBAC has no `create`): the agent reads it and writes its facts
/// to the status subresource under its own field manager.
#[tokio::test]
async fn an_agent_registers_through_the_api_server_without_touching_its_node() {
    use crate::registration::{register, tests::w1};
    let me = w1(Some("fd00:10::1"));
    let tunnel = json!({"apiVersion": "egressgateway.egress.dev/v1beta1", "kind": "EgressTunnel",
                        "metadata": {"name": "w1", "resourceVersion": "3"}, "spec": {}});

    // The controller created the tunnel: one read, one status write.
    let (ds, mut h) = mock();
    let who = me.clone();
    let reg = tokio::spawn(async move { register(&ds, &who).await.map_err(|e| format!("{e:#}")) });
    let seen = answer(&mut h, 200, tunnel.clone()).await;
    assert_eq!(
        (seen.method.as_str(), seen.path_and_query.as_str()),
        (
            "GET",
            "/apis/egressgateway.egress.dev/v1beta1/egresstunnels/w1"
        )
    );
    let seen = answer(&mut h, 200, tunnel.clone()).await;
    assert_eq!(seen.method, "PATCH");
    assert!(
        seen.path_and_query
            .starts_with("/apis/egressgateway.egress.dev/v1beta1/egresstunnels/w1/status?")
            && seen.path_and_query.contains("fieldManager=egress-agent"),
        "{}",
        seen.path_and_query
    );
    assert_eq!(seen.content_type, "application/apply-patch+yaml");
    assert_eq!(seen.body["status"]["tunnel"]["ipv4"], "10.10.0.1");
    assert_eq!(seen.body["status"]["tunnel"]["ipv6"], "fd00:10::1");
    assert!(
        seen.body["status"].get("phase").is_none(),
        "the phase is the controller's"
    );
    reg.await.unwrap().unwrap();

    // Not created yet: no create is asked for (the agent's RBAC has none),
    // and the error says who creates it; the agent tries again later.
    let (ds, mut h) = mock();
    let reg = tokio::spawn(async move { register(&ds, &me).await.map_err(|e| format!("{e:#}")) });
    let seen = answer(&mut h, 404, status(404, "NotFound")).await;
    assert_eq!(seen.method, "GET");
    let e = reg.await.unwrap().unwrap_err();
    assert!(
        e.contains("the controller creates one for every node"),
        "{e}"
    );
    let next = tokio::time::timeout(std::time::Duration::from_millis(100), h.next_request()).await;
    assert!(!matches!(next, Ok(Some(_))), "no request after the 404");
}

/// kube's `rustls-tls` feature brings no crypto provider of its own: without
/// one chosen (`ring` here), building any client panicked, so every
/// `--datastore kubernetes` process died at start.
#[tokio::test]
async fn a_client_builds_from_a_kubeconfig_style_config() {
    let cfg = ::kube::Config::new("https://127.0.0.1:6443".parse().unwrap());
    assert!(Client::try_from(cfg).is_ok());
}

/// The result of a call that must finish without sending a request more
/// (the mock answers none: one sent would leave the call waiting).
async fn unanswered<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(std::time::Duration::from_secs(5), f)
        .await
        .expect("finished without waiting for an answer")
}

/// An object over the etcd limit behind the API server, or over the API
/// server's own request limit, is refused without a request, the same way
/// `check_size` refuses it for a dry run.
#[tokio::test]
async fn an_object_over_a_size_limit_is_refused_before_it_is_sent() {
    let (ds, _h) = mock();
    let mut g = gateway("1");
    for (pad, limit, whose) in [
        (
            2 << 20,
            3 << 19,
            "the request limit of the API server's etcd",
        ),
        (
            4 << 20,
            3 << 20,
            "the Kubernetes API server's request limit",
        ),
    ] {
        g["metadata"]["annotations"] = json!({"pad": "x".repeat(pad)});
        let e = unanswered(ds.create(Kind::EgressGateway, g.clone()))
            .await
            .unwrap_err();
        match &e {
            DatastoreError::TooLarge { size, .. } => {
                assert_eq!(size.limit, limit);
                assert!(size.limit_of.starts_with(whose), "{e}");
            }
            e => panic!("{e}"),
        }
        let dry = ds.check_size(Kind::EgressGateway, &g, None).unwrap_err();
        assert_eq!(dry.to_string(), e.to_string());
        let e = unanswered(ds.update(Kind::EgressGateway, g.clone(), 1))
            .await
            .unwrap_err();
        assert!(matches!(e, DatastoreError::TooLarge { .. }), "{e}");
    }
}

/// `apply` on Kubernetes refuses an unknown field after reading (one list
/// of gateways, one get), and sends no write.
#[tokio::test]
async fn apply_refuses_an_unknown_field_without_writing() {
    let (ds, mut h) = mock();
    let text = "apiVersion: egressgateway.egress.dev/v1beta1\nkind: EgressGateway\n\
                metadata: {name: g}\nspec: {clusterDefualt: true}\n";
    let apply =
        tokio::spawn(async move { crate::manifest::apply(&ds, text, "default", false).await });
    let list = answer(
        &mut h,
        200,
        json!({"apiVersion": "egressgateway.egress.dev/v1beta1", "kind": "EgressGatewayList",
               "metadata": {"resourceVersion": "10"}, "items": []}),
    )
    .await;
    assert_eq!(list.method, "GET");
    let get = answer(&mut h, 404, status(404, "NotFound")).await;
    assert_eq!(get.method, "GET");
    let e = unanswered(apply).await.unwrap().unwrap_err();
    assert_eq!(
        e.to_string(),
        "document 1 (EgressGateway g): spec.clusterDefualt: unknown field"
    );
}
