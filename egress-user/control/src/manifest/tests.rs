//! `apply` on the memory datastore: what is accepted, what is refused
//! and how the refusal reads, and that a refusal writes nothing.

use super::*;
use crate::datastore::memory::MemoryDatastore;

/// A gateway and a policy that uses it (shared with tests/tests/control_cli.rs).
const GOOD: &str = include_str!("testdata/gateway_and_policy.yaml");

/// Why `apply` (not a dry run) refuses `text`.
async fn refusal(ds: &MemoryDatastore, text: &str) -> String {
    apply(ds, text, "default", false)
        .await
        .unwrap_err()
        .to_string()
}

async fn count(ds: &MemoryDatastore) -> usize {
    let mut n = 0;
    for k in Kind::ALL {
        n += ds.list(k).await.unwrap().0.len();
    }
    n
}

#[tokio::test]
async fn good_manifest_applies_and_reapplies_unchanged() {
    let ds = MemoryDatastore::new();
    let dry = apply(&ds, GOOD, "default", true).await.unwrap();
    assert_eq!(dry.len(), 2);
    assert_eq!(count(&ds).await, 0, "dry run writes nothing");
    let r = apply(&ds, GOOD, "default", false).await.unwrap();
    assert!(r.iter().all(|(_, o)| *o == Outcome::Created));
    assert_eq!(r[1].0.key, ObjectKey::namespaced("default", "web"));
    let r = apply(&ds, GOOD, "default", false).await.unwrap();
    assert!(r.iter().all(|(_, o)| *o == Outcome::Unchanged), "{r:?}");
}

/// Each malformed input: the message names the field and the reason,
/// and nothing is written (not even the good documents beside it).
#[tokio::test]
async fn malformed_input_names_field_and_reason_and_harms_nothing() {
    let policy = |spec: &str| {
        format!(
            "{GOOD}---\napiVersion: egressgateway.egress.dev/v1beta1\nkind: EgressPolicy\nmetadata: {{name: bad}}\nspec:\n{spec}\n"
        )
    };
    let cases: Vec<(String, &str)> = vec![
        (
            policy("  egressGatewayName: egw\n  egressIP: {ipv4: 10.9.9.9}\n  appliedTo: {podSubnet: [10.244.0.0/16]}"),
            "spec.egressIP.ipv4: 10.9.9.9 is outside the ipv4 pool of gateway egw",
        ),
        (
            policy("  egressGatewayName: egw\n  appliedTo: {podSubnet: [10.244.0.0/16], podSelector: {matchLabels: {a: b}}}"),
            "spec.appliedTo: podSelector and podSubnet are both set",
        ),
        (
            policy("  egressGatewayName: egw\n  appliedTo: {podSubnet: [10.244.0.0/16]}\n  destSubnet: [300.1.1.0/24]"),
            "spec.destSubnet[0]: \"300.1.1.0/24\" is not a valid CIDR",
        ),
        (
            policy("  egressGatewayName: egw\n  appliedTo: {podSubnet: [10.244.0.0/16]}\n  maxPortsPerNode: 0"),
            "spec.maxPortsPerNode: 0 ports would refuse every connection",
        ),
        (
            policy("  egressGatewayName: egw\n  appliedTo: {podSubnet: [10.244.0.0/16]}\n  maxPortsPerNode: 70000"),
            "spec.maxPortsPerNode: 70000 is more ports than an EIP has (65536)",
        ),
        (
            policy("  egressGatewayName: egw\n  appliedTo: {podSubnet: [10.244.0.0/16]}\n  maxPortsPerNode: -5"),
            "spec.maxPortsPerNode",
        ),
        (
            policy("  egressGatewayName: egw\n  egressIP: {useNodeIP: maybe}\n  appliedTo: {podSubnet: [10.244.0.0/16]}"),
            "spec.egressIP.useNodeIP: must be of type boolean, not string",
        ),
        (
            policy("  egressGatewayName: egw\n  egressIP: {allocatorPolicy: random}\n  appliedTo: {podSubnet: [10.244.0.0/16]}"),
            r#"spec.egressIP.allocatorPolicy: unsupported value "random"; one of "default", "rr""#,
        ),
        (
            GOOD.replace("ipv4DefaultEIP: 10.6.1.21", "ipv4DefaultEIP: 10.6.1.99"),
            "spec.ippools.ipv4DefaultEIP: 10.6.1.99 is outside the gateway's ipv4 pool",
        ),
        (
            GOOD.replace("10.6.1.21-10.6.1.25", "10.6.1.25-10.6.1.21"),
            "spec.ippools.ipv4[0]: \"10.6.1.25-10.6.1.21\": the range ends before it starts",
        ),
        (
            GOOD.replace("kind: EgressGateway", "kind: EgressGatway"),
            "apiVersion/kind: \"egressgateway.egress.dev/v1beta1\"/\"EgressGatway\" is not a kind",
        ),
        (GOOD.replace("metadata: {name: egw}", "metadata: {}"), "metadata.name: must be set"),
        (format!("{GOOD}---\n: [unclosed\n"), "not YAML"),
    ];
    for (text, want) in cases {
        let ds = MemoryDatastore::new();
        let e = refusal(&ds, &text).await;
        assert!(e.contains(want), "want {want:?} in:\n{e}");
        assert_eq!(count(&ds).await, 0, "{want}: something was written");
    }
}

#[tokio::test]
async fn immutable_fields_and_missing_gateway() {
    let ds = MemoryDatastore::new();
    apply(&ds, GOOD, "default", false).await.unwrap();
    let changed = GOOD.replace("egressGatewayName: egw", "egressGatewayName: other");
    let e = refusal(&ds, &changed).await;
    assert!(
        e.contains("spec.egressGatewayName: cannot change once set (was \"egw\")"),
        "{e}"
    );
    let changed = GOOD.replace("ipv4DefaultEIP: 10.6.1.21", "ipv4DefaultEIP: 10.6.1.22");
    let e = refusal(&ds, &changed).await;
    assert!(
        e.contains("spec.ippools.ipv4DefaultEIP: cannot change once set"),
        "{e}"
    );
    // A policy naming a gateway that does not exist is accepted (the
    // controller gives it a condition).
    let lone = "apiVersion: egressgateway.egress.dev/v1beta1\nkind: EgressPolicy\nmetadata: {name: lone, namespace: x}\nspec:\n  egressGatewayName: nope\n  appliedTo: {podSubnet: [10.0.0.0/8]}\n";
    apply(&ds, lone, "default", false).await.unwrap();
}

/// A policy of `GOOD`'s gateway with `spec` (YAML lines, indented by two).
fn with_policy(name: &str, spec: &str) -> String {
    format!(
        "{GOOD}---\napiVersion: egressgateway.egress.dev/v1beta1\nkind: EgressPolicy\n\
         metadata: {{name: {name}}}\nspec:\n{spec}\n"
    )
}

fn refused(e: ManifestError) -> Vec<String> {
    match e {
        ManifestError::Refused(p) => p.iter().map(Problem::to_string).collect(),
        e => panic!("not a refusal: {e}"),
    }
}

/// The typo of issue 15 (`destSubnets:` for `destSubnet:`, which left the
/// policy matching every destination) and typos deeper down, in metadata
/// and at the top: each is refused with its path, and nothing is stored.
#[tokio::test]
async fn unknown_fields_are_refused_with_their_path() {
    let text = with_policy(
        "typo",
        "  egressGatewayName: egw\n  appliedTo: {podSelector: {matchLabel: {app: web}}}\n  \
         destSubnets: [10.0.0.0/8]\n  egressIP: {ipv4Address: 10.6.1.22}",
    )
    .replace(
        "metadata: {name: typo}",
        "metadata: {name: typo, lables: {a: b}}",
    )
    .replace("  nodeSelector:", "  ippools2: {}\n  nodeSelector:")
        + "spc: {}\n";
    let ds = MemoryDatastore::new();
    for dry_run in [true, false] {
        let e = apply(&ds, &text, "default", dry_run).await.unwrap_err();
        let lines = refused(e);
        let typo = "(EgressPolicy default/typo)";
        let want = [
            format!("document 3 {typo}: spec.destSubnets: unknown field"),
            format!("document 3 {typo}: spec.appliedTo.podSelector.matchLabel: unknown field"),
            format!("document 3 {typo}: spec.egressIP.ipv4Address: unknown field"),
            format!("document 3 {typo}: metadata.lables: unknown field"),
            format!("document 3 {typo}: spc: unknown field"),
            "document 1 (EgressGateway egw): spec.ippools2: unknown field".to_string(),
        ];
        for w in &want {
            assert!(lines.contains(w), "want {w:?} in {lines:#?}");
        }
        // The unknown fields are all that is wrong here: the policy itself
        // is valid (an empty podSelector counts as set).
        assert_eq!(lines.len(), want.len(), "{lines:#?}");
        assert_eq!(count(&ds).await, 0, "nothing stored");
    }
}

/// Every problem of every document, not only the first: unknown fields
/// with the validation rules of the same document, several type errors,
/// a document of no known kind, each line naming its document.
#[tokio::test]
async fn every_error_of_every_document_is_listed() {
    let text = with_policy(
        "bad",
        "  egressGatewayName: egw\n  appliedTo: {podSubnet: [10.244.0.0/16], podSelector: {}}\n  \
         destSubnet: [300.1.1.0/24, 10.0.0.0/8, nope]\n  excludeSubnet: [10.1.0.0/16]",
    ) + "---\napiVersion: egressgateway.egress.dev/v1beta1\nkind: EgressClusterPolicy\n\
         metadata: {name: types}\nspec:\n  priority: high\n  destSubnet: 10.0.0.0/8\n  \
         egressIP: {useNodeIP: 1}\n---\nkind: Secret\nmetadata: {name: s}\n";
    let ds = MemoryDatastore::new();
    let lines = refused(apply(&ds, &text, "default", true).await.unwrap_err());
    let want = [
        "document 3 (EgressPolicy default/bad): spec.excludeSubnet: unknown field",
        "document 3 (EgressPolicy default/bad): spec.appliedTo: podSelector and podSubnet are both set; set only one",
        "document 3 (EgressPolicy default/bad): spec.destSubnet[0]: \"300.1.1.0/24\" is not a valid CIDR",
        "document 3 (EgressPolicy default/bad): spec.destSubnet[2]: \"nope\" is not a valid CIDR",
        "document 4 (EgressClusterPolicy types): spec.priority: must be of type integer, not string",
        "document 4 (EgressClusterPolicy types): spec.destSubnet: must be of type array, not string",
        "document 4 (EgressClusterPolicy types): spec.egressIP.useNodeIP: must be of type boolean, not integer",
        "document 5: apiVersion/kind: \"\"/\"Secret\" is not a kind this datastore holds",
    ];
    for w in want {
        assert!(
            lines.iter().any(|l| l.starts_with(w)),
            "want {w:?} in {lines:#?}"
        );
    }
    assert_eq!(lines.len(), want.len(), "{lines:#?}");
    assert_eq!(count(&ds).await, 0);
}

/// An empty manifest is a mistake (a wrong file, an empty pipe), not a
/// success that did nothing.
#[tokio::test]
async fn an_empty_manifest_is_refused() {
    let ds = MemoryDatastore::new();
    for text in ["", "\n", "---\n", "# only a comment\n---\n---\n"] {
        for dry_run in [true, false] {
            let e = apply(&ds, text, "default", dry_run).await.unwrap_err();
            assert!(matches!(e, ManifestError::Empty), "{text:?}: {e}");
            assert_eq!(e.to_string(), "the manifest holds no documents");
        }
    }
}

/// Strictness is for what a user submits: an object stored by a newer
/// writer, with a field this version does not know, still decodes.
#[tokio::test]
async fn stored_objects_with_unknown_fields_still_decode() {
    let ds = MemoryDatastore::new();
    apply(&ds, GOOD, "default", false).await.unwrap();
    let key = ObjectKey::namespaced("default", "web");
    let mut v = ds.get(Kind::EgressPolicy, &key).await.unwrap().unwrap();
    v.value["spec"]["addedLater"] = serde_json::json!({"x": 1});
    let s = ds
        .update(Kind::EgressPolicy, v.value, v.revision)
        .await
        .unwrap();
    let p: EgressPolicy = typed::decode(&s).unwrap();
    assert_eq!(p.spec.egress_gateway_name, "egw");
}
