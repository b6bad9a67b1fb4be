//! `egress apply` against a real etcd started by the test: a refused
//! manifest stores nothing, and a dry run refuses an oversized object
//! exactly as the write does, in one line.

use egress_control::datastore::etcd::EtcdDatastore;
use egress_control::datastore::{Datastore, DatastoreError, Kind};
use egress_control::manifest::{self, ManifestError};
use egress_tests::etcd::EtcdServer;

const GATEWAY: &str = "apiVersion: egressgateway.egress.dev/v1beta1
kind: EgressGateway
metadata: {name: egw}
spec:
  ippools: {ipv4: [10.6.1.21-10.6.1.25]}
  nodeSelector: {selector: {matchLabels: {egress: 'true'}}}
";

async fn connect(e: &EtcdServer, prefix: &str) -> EtcdDatastore {
    EtcdDatastore::connect(&[e.endpoint()], prefix)
        .await
        .unwrap()
}

async fn stored(ds: &EtcdDatastore) -> usize {
    let mut n = 0;
    for k in Kind::ALL {
        n += ds.list(k).await.unwrap().0.len();
    }
    n
}

/// A policy of gateway `egw` whose `destSubnet` lists `n` /32s.
fn policy(name: &str, n: u32) -> String {
    let cidrs: Vec<String> = (0..n)
        .map(|i| format!("\"{}/32\"", std::net::Ipv4Addr::from(0x0b00_0000 + i)))
        .collect();
    format!(
        "apiVersion: egressgateway.egress.dev/v1beta1\nkind: EgressPolicy\n\
         metadata: {{name: {name}}}\nspec:\n  egressGatewayName: egw\n  \
         appliedTo: {{podSubnet: [10.244.0.0/16]}}\n  destSubnet: [{}]\n",
        cidrs.join(", ")
    )
}

fn refusal(r: Result<Vec<(manifest::Document, manifest::Outcome)>, ManifestError>) -> Vec<String> {
    match r {
        Err(ManifestError::Refused(p)) => p.iter().map(|p| p.to_string()).collect(),
        other => panic!("not a refusal: {other:?}"),
    }
}

/// The typo of issue 15: `destSubnets:` is refused, with the good gateway
/// beside it nothing reaches etcd, and the corrected manifest applies.
#[tokio::test]
async fn an_unknown_field_stores_nothing() {
    let etcd = EtcdServer::start().unwrap();
    let ds = connect(&etcd, "/apply1").await;
    let typo = format!("{GATEWAY}---\n{}", policy("web", 2)).replace("destSubnet:", "destSubnets:");
    for dry_run in [true, false] {
        let lines = refusal(manifest::apply(&ds, &typo, "default", dry_run).await);
        assert_eq!(
            lines,
            ["document 2 (EgressPolicy default/web): spec.destSubnets: unknown field"]
        );
        assert_eq!(
            stored(&ds).await,
            0,
            "dry run {dry_run}: something was stored"
        );
    }
    let fixed = typo.replace("destSubnets:", "destSubnet:");
    manifest::apply(&ds, &fixed, "default", false)
        .await
        .unwrap();
    assert_eq!(stored(&ds).await, 2);
}

/// A policy over etcd's default request limit (1.5 MiB): the dry run and
/// the write give the same one-line refusal and store nothing (not the
/// gateway before it either); the backend's own write refuses it the same
/// way; an object just under the limit is stored; and etcd itself refuses
/// what is over its limit (the check is etcd's real limit), in one line.
#[tokio::test]
async fn dry_run_and_write_refuse_an_oversized_object_alike() {
    let etcd = EtcdServer::start().unwrap();
    let ds = connect(&etcd, "/apply2").await;
    // About 20 bytes a CIDR: some 2 MiB.
    let big = format!("{GATEWAY}---\n{}", policy("big", 100_000));
    let dry = refusal(manifest::apply(&ds, &big, "default", true).await);
    let real = refusal(manifest::apply(&ds, &big, "default", false).await);
    assert_eq!(dry, real);
    assert_eq!(dry.len(), 1, "{dry:?}");
    let want_prefix = "document 2 (EgressPolicy default/big): ";
    let want_suffix = " MiB as stored, over etcd's request limit (--max-request-bytes) of 1.50 MiB";
    assert!(
        dry[0].starts_with(want_prefix) && dry[0].ends_with(want_suffix),
        "{dry:?}"
    );
    assert_eq!(stored(&ds).await, 0);

    // The write itself, without apply's checks, refuses it with the same size.
    let doc = manifest::parse(&big, "default").unwrap().pop().unwrap();
    match ds.create(Kind::EgressPolicy, doc.value.clone()).await {
        Err(DatastoreError::TooLarge { size, .. }) => {
            assert_eq!(format!("{want_prefix}{size}"), dry[0])
        }
        other => panic!("{other:?}"),
    }

    // Just under the limit (the check leaves 1 KiB for the request's
    // framing): stored.
    let limit = egress_control::datastore::etcd::DEFAULT_MAX_REQUEST_BYTES;
    let mut under = doc.value.clone();
    under["spec"]["destSubnet"] = serde_json::json!(["11.0.0.0/32"]);
    let base = serde_json::to_vec(&under).unwrap().len();
    let pad = limit - 1024 - 200 - base;
    under["metadata"]["annotations"] = serde_json::json!({"pad": "x".repeat(pad)});
    ds.create(Kind::EgressPolicy, under.clone()).await.unwrap();

    // Past the check, etcd refuses a little more: one line, no gRPC dump.
    let unchecked = connect(&etcd, "/apply2")
        .await
        .with_max_request_bytes(usize::MAX);
    under["metadata"]["name"] = serde_json::json!("over");
    under["metadata"]["annotations"]["pad"] = serde_json::json!("x".repeat(limit));
    let e = unchecked
        .create(Kind::EgressPolicy, under)
        .await
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "etcd: InvalidArgument: etcdserver: request is too large"
    );
}
