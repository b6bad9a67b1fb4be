//! `egress apply` as a library: parse a YAML stream, check every document
//! (types with the failing field's path, then the validation rules, then
//! the fields that cannot change), and write only when all are good.

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::api::{EgressClusterPolicy, EgressGateway, EgressPolicy, EgressTunnel};
use crate::datastore::{key_of, typed, Datastore, DatastoreError, Kind, ObjectKey};
use crate::validate::{self, FieldError, PolicyFields};

/// One document of a manifest.
#[derive(Clone, Debug, PartialEq)]
pub struct Document {
    /// 1-based position in the stream, for messages.
    pub index: usize,
    pub kind: Kind,
    pub key: ObjectKey,
    pub value: Value,
}

#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("document {index}: not YAML: {reason}")]
    Yaml { index: usize, reason: String },
    #[error("document {index}: {reason}")]
    Type { index: usize, reason: String },
    #[error("document {index} ({kind} {key}): {}", .errors.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; "))]
    Invalid {
        index: usize,
        kind: Kind,
        key: ObjectKey,
        errors: Vec<FieldError>,
    },
    #[error("{}", .0.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("\n"))]
    Many(Vec<ManifestError>),
    #[error(transparent)]
    Datastore(#[from] DatastoreError),
}

/// What `apply` did (or would do) with one document.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Created,
    Configured,
    Unchanged,
}

/// Splits a YAML stream into typed-checked documents. `default_ns` fills
/// in a missing namespace of namespaced kinds.
pub fn parse(text: &str, default_ns: &str) -> Result<Vec<Document>, ManifestError> {
    let mut docs = Vec::new();
    let mut errors = Vec::new();
    for (i, de) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let index = i + 1;
        let value: Value = match serde::Deserialize::deserialize(de) {
            Ok(Value::Null) => continue,
            Ok(v) => v,
            Err(e) => {
                errors.push(ManifestError::Yaml {
                    index,
                    reason: e.to_string(),
                });
                // The YAML stream cannot be followed past a syntax error.
                break;
            }
        };
        match document(index, value, default_ns) {
            Ok(d) => docs.push(d),
            Err(e) => errors.push(e),
        }
    }
    match errors.len() {
        0 => Ok(docs),
        1 => Err(errors.pop().unwrap()),
        _ => Err(ManifestError::Many(errors)),
    }
}

fn typed_check<T: DeserializeOwned>(index: usize, v: &Value) -> Result<T, ManifestError> {
    serde_path_to_error::deserialize(v.clone()).map_err(|e| {
        let path = e.path().to_string();
        ManifestError::Type {
            index,
            reason: format!("{path}: {}", e.into_inner()),
        }
    })
}

fn document(index: usize, mut value: Value, default_ns: &str) -> Result<Document, ManifestError> {
    let ty = |f: &str| {
        value
            .get(f)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let (api_version, kind_name) = (ty("apiVersion"), ty("kind"));
    let Some(kind) = Kind::from_type(&api_version, &kind_name) else {
        return Err(ManifestError::Type {
            index,
            reason: format!(
                "apiVersion/kind: {api_version:?}/{kind_name:?} is not a kind this datastore holds \
                 (custom resources use {})",
                crate::api::API_VERSION
            ),
        });
    };
    if !value.is_object() {
        return Err(ManifestError::Type {
            index,
            reason: "the document is not a map".into(),
        });
    }
    if kind.namespaced() {
        let meta = value
            .as_object_mut()
            .unwrap()
            .entry("metadata")
            .or_insert_with(|| Value::Object(Default::default()));
        if let Some(m) = meta.as_object_mut() {
            if m.get("namespace")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .is_empty()
            {
                m.insert("namespace".into(), Value::String(default_ns.into()));
            }
        }
    }
    if let Some(o) = value.as_object_mut() {
        o.remove("status");
        if let Some(m) = o.get_mut("metadata").and_then(Value::as_object_mut) {
            for f in [
                "resourceVersion",
                "uid",
                "creationTimestamp",
                "managedFields",
            ] {
                m.remove(f);
            }
        }
    }
    match kind {
        Kind::EgressGateway => drop(typed_check::<EgressGateway>(index, &value)?),
        Kind::EgressPolicy => drop(typed_check::<EgressPolicy>(index, &value)?),
        Kind::EgressClusterPolicy => drop(typed_check::<EgressClusterPolicy>(index, &value)?),
        Kind::EgressTunnel => drop(typed_check::<EgressTunnel>(index, &value)?),
        Kind::Node | Kind::Pod | Kind::Namespace => {}
    }
    let key = key_of(kind, &value).map_err(|e| ManifestError::Type {
        index,
        reason: match e {
            DatastoreError::Invalid(r) => r,
            e => e.to_string(),
        },
    })?;
    Ok(Document {
        index,
        kind,
        key,
        value,
    })
}

/// Runs the validation rules on every document, against the datastore's
/// current objects and the other documents of the same manifest.
pub async fn check(ds: &dyn Datastore, docs: &[Document]) -> Result<(), ManifestError> {
    let mut gateways: BTreeMap<String, EgressGateway> = BTreeMap::new();
    for s in ds.list(Kind::EgressGateway).await?.0 {
        if let Ok(g) = typed::decode::<EgressGateway>(&s) {
            gateways.insert(s.key.name.clone(), g);
        }
    }
    for d in docs.iter().filter(|d| d.kind == Kind::EgressGateway) {
        gateways.insert(
            d.key.name.clone(),
            serde_json::from_value(d.value.clone()).expect("type-checked"),
        );
    }
    let mut errors = Vec::new();
    for d in docs {
        let current = ds.get(d.kind, &d.key).await?;
        let mut errs = Vec::new();
        match d.kind {
            Kind::EgressGateway => {
                let g: EgressGateway =
                    serde_json::from_value(d.value.clone()).expect("type-checked");
                errs.extend(validate::gateway(&g.spec));
                if let Some(cur) = current
                    .as_ref()
                    .and_then(|c| typed::decode::<EgressGateway>(c).ok())
                {
                    errs.extend(validate::gateway_update(&cur.spec, &g.spec));
                }
            }
            Kind::EgressPolicy => {
                let p: EgressPolicy =
                    serde_json::from_value(d.value.clone()).expect("type-checked");
                let f = PolicyFields::from(&p.spec);
                errs.extend(validate::policy(&f, gateway_of(&gateways, f.gateway)));
                if let Some(cur) = current
                    .as_ref()
                    .and_then(|c| typed::decode::<EgressPolicy>(c).ok())
                {
                    errs.extend(validate::policy_update(&PolicyFields::from(&cur.spec), &f));
                }
            }
            Kind::EgressClusterPolicy => {
                let p: EgressClusterPolicy =
                    serde_json::from_value(d.value.clone()).expect("type-checked");
                let f = PolicyFields::from(&p.spec);
                errs.extend(validate::policy(&f, gateway_of(&gateways, f.gateway)));
                if let Some(cur) = current
                    .as_ref()
                    .and_then(|c| typed::decode::<EgressClusterPolicy>(c).ok())
                {
                    errs.extend(validate::policy_update(&PolicyFields::from(&cur.spec), &f));
                }
            }
            Kind::Pod => {
                let p = typed::pod_record(&d.value);
                for (i, ip) in p.ips.iter().enumerate() {
                    if ip.parse::<std::net::IpAddr>().is_err() {
                        errs.push(FieldError {
                            field: format!("spec.ips[{i}]"),
                            reason: format!("{ip:?} is not an IP address"),
                        });
                    }
                }
            }
            _ => {}
        }
        if !errs.is_empty() {
            errors.push(ManifestError::Invalid {
                index: d.index,
                kind: d.kind,
                key: d.key.clone(),
                errors: errs,
            });
        }
    }
    match errors.len() {
        0 => Ok(()),
        1 => Err(errors.pop().unwrap()),
        _ => Err(ManifestError::Many(errors)),
    }
}

fn gateway_of<'a>(
    gws: &'a BTreeMap<String, EgressGateway>,
    name: &str,
) -> Option<&'a EgressGateway> {
    if name.is_empty() {
        gws.values().find(|g| g.spec.cluster_default)
    } else {
        gws.get(name)
    }
}

/// Parses, checks and (unless `dry_run`) writes a manifest. Nothing is
/// written unless every document passes.
pub async fn apply(
    ds: &dyn Datastore,
    text: &str,
    default_ns: &str,
    dry_run: bool,
) -> Result<Vec<(Document, Outcome)>, ManifestError> {
    let docs = parse(text, default_ns)?;
    check(ds, &docs).await?;
    let mut out = Vec::new();
    for d in docs {
        let cur = ds.get(d.kind, &d.key).await?;
        let outcome = match &cur {
            None => Outcome::Created,
            Some(c) if same_content(&c.value, &d.value) => Outcome::Unchanged,
            Some(_) => Outcome::Configured,
        };
        if !dry_run && outcome != Outcome::Unchanged {
            typed::apply(ds, d.kind, d.value.clone()).await?;
        }
        out.push((d, outcome));
    }
    Ok(out)
}

fn same_content(stored: &Value, new: &Value) -> bool {
    let strip = |v: &Value| {
        let mut v = v.clone();
        if let Some(o) = v.as_object_mut() {
            o.remove("status");
            if let Some(m) = o.get_mut("metadata").and_then(Value::as_object_mut) {
                for f in [
                    "resourceVersion",
                    "uid",
                    "creationTimestamp",
                    "managedFields",
                    "generation",
                ] {
                    m.remove(f);
                }
            }
        }
        v
    };
    strip(stored) == strip(new)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datastore::memory::MemoryDatastore;

    const GOOD: &str = r#"
apiVersion: egressgateway.egress.dev/v1beta1
kind: EgressGateway
metadata: {name: egw}
spec:
  ippools: {ipv4: ["10.6.1.21-10.6.1.25"], ipv4DefaultEIP: 10.6.1.21}
  nodeSelector: {selector: {matchLabels: {egress: "true"}}}
---
apiVersion: egressgateway.egress.dev/v1beta1
kind: EgressPolicy
metadata: {name: web}
spec:
  egressGatewayName: egw
  appliedTo: {podSelector: {matchLabels: {app: web}}}
"#;

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
                policy("  egressGatewayName: egw\n  egressIP: {useNodeIP: maybe}\n  appliedTo: {podSubnet: [10.244.0.0/16]}"),
                "spec.egressIP.useNodeIP: invalid type",
            ),
            (
                policy("  egressGatewayName: egw\n  egressIP: {allocatorPolicy: random}\n  appliedTo: {podSubnet: [10.244.0.0/16]}"),
                "spec.egressIP.allocatorPolicy: unknown variant `random`",
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
            let e = apply(&ds, &text, "default", false)
                .await
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "want {want:?} in:\n{e}");
            assert_eq!(count(&ds).await, 0, "{want}: something was written");
        }
    }

    #[tokio::test]
    async fn immutable_fields_and_missing_gateway() {
        let ds = MemoryDatastore::new();
        apply(&ds, GOOD, "default", false).await.unwrap();
        let changed = GOOD.replace("egressGatewayName: egw", "egressGatewayName: other");
        let e = apply(&ds, &changed, "default", false)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("spec.egressGatewayName: cannot change once set (was \"egw\")"),
            "{e}"
        );
        let changed = GOOD.replace("ipv4DefaultEIP: 10.6.1.21", "ipv4DefaultEIP: 10.6.1.22");
        let e = apply(&ds, &changed, "default", false)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("spec.ippools.ipv4DefaultEIP: cannot change once set"),
            "{e}"
        );
        // A policy naming a gateway that does not exist is accepted (the
        // controller gives it a condition).
        let lone = "apiVersion: egressgateway.egress.dev/v1beta1\nkind: EgressPolicy\nmetadata: {name: lone, namespace: x}\nspec:\n  egressGatewayName: nope\n  appliedTo: {podSubnet: [10.0.0.0/8]}\n";
        apply(&ds, lone, "default", false).await.unwrap();
    }
}
