//! The strict pass of `egress apply`: a document may only hold the fields
//! its kind's schema declares, with the declared types, as the Kubernetes
//! API server checks with `fieldValidation=Strict`.
//!
//! The schemas of the custom resources are the CRDs generated from the API
//! types (the ones the chart ships), so a field added to a type is known
//! here at once. Only what a user submits goes through this pass: objects
//! read back from a datastore are decoded leniently, so an older reader
//! ignores the fields a newer writer added.

use std::collections::HashMap;
use std::sync::OnceLock;

use serde_json::{json, Value};

use crate::datastore::Kind;
use crate::validate::FieldError;

/// What the strict pass found in one document.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Findings {
    /// Fields the schema does not declare (the document still decodes).
    pub unknown: Vec<FieldError>,
    /// Values of the wrong type, outside an enum or a range, or missing:
    /// the document does not decode.
    pub invalid: Vec<FieldError>,
}

/// Checks `doc` (a whole object) against the schema of `kind`.
pub fn check(kind: Kind, doc: &Value) -> Findings {
    let mut out = Findings::default();
    walk(schema_of(kind), doc, "", &mut out);
    out
}

fn schema_of(kind: Kind) -> &'static Value {
    static SCHEMAS: OnceLock<HashMap<Kind, Value>> = OnceLock::new();
    let all = SCHEMAS.get_or_init(|| {
        Kind::ALL
            .into_iter()
            .map(|k| (k, document_schema(k)))
            .collect()
    });
    &all[&kind]
}

/// The whole-object schema of `kind`: the CRD's `openAPIV3Schema` (or the
/// record's shape) with `apiVersion`, `kind` and `metadata` added.
fn document_schema(kind: Kind) -> Value {
    let mut schema = if kind.is_custom() {
        crd_schema(kind)
    } else {
        record_schema(kind)
    };
    let props = schema["properties"]
        .as_object_mut()
        .expect("an object schema");
    props.insert("apiVersion".into(), json!({"type": "string"}));
    props.insert("kind".into(), json!({"type": "string"}));
    props.insert("metadata".into(), object_meta());
    schema
}

fn crd_schema(kind: Kind) -> Value {
    let crd = crate::api::crds()
        .into_iter()
        .find(|c| c.spec.names.kind == kind.name())
        .expect("every custom kind has a CRD");
    let schema = crd.spec.versions[0]
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .expect("a generated CRD has a schema");
    serde_json::to_value(schema).expect("a schema serialises")
}

/// The plain records, as [`crate::datastore::typed`] reads them.
fn record_schema(kind: Kind) -> Value {
    let strings = json!({"type": "array", "items": {"type": "string"}});
    let spec = match kind {
        Kind::Node => json!({"type": "object", "properties": {
            "addresses": strings, "podCIDRs": strings, "ready": {"type": "boolean"}}}),
        Kind::Pod => json!({"type": "object", "properties": {
            "nodeName": {"type": "string"}, "ips": strings}}),
        _ => json!({"type": "object", "properties": {}}),
    };
    json!({"type": "object", "properties": {"spec": spec}})
}

/// The fields of a Kubernetes `ObjectMeta` (the API server keeps these;
/// `ownerReferences` and `managedFields` are not looked into).
fn object_meta() -> Value {
    let string = json!({"type": "string"});
    let integer = json!({"type": "integer"});
    let map = json!({"type": "object", "additionalProperties": {"type": "string"}});
    let list = json!({"type": "array", "items": {"type": "object",
                      "x-kubernetes-preserve-unknown-fields": true}});
    json!({"type": "object", "properties": {
        "name": string, "namespace": string, "generateName": string, "uid": string,
        "resourceVersion": string, "selfLink": string, "creationTimestamp": string,
        "deletionTimestamp": string, "generation": integer,
        "deletionGracePeriodSeconds": integer, "labels": map, "annotations": map,
        "finalizers": {"type": "array", "items": string},
        "ownerReferences": list, "managedFields": list}})
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn err(path: &str, reason: impl Into<String>) -> FieldError {
    FieldError {
        field: path.into(),
        reason: reason.into(),
    }
}

fn child(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.into()
    } else {
        format!("{path}.{key}")
    }
}

fn walk(schema: &Value, v: &Value, path: &str, out: &mut Findings) {
    let want = schema["type"].as_str().unwrap_or_default();
    let have = type_name(v);
    if v.is_null() && schema["nullable"] == true {
        return;
    }
    let fits = want.is_empty() || want == have || (want == "number" && have == "integer");
    if !fits {
        out.invalid
            .push(err(path, format!("must be of type {want}, not {have}")));
        return;
    }
    scalar_limits(schema, v, path, out);
    match v {
        Value::Array(items) => {
            if let Some(s) = schema.get("items") {
                for (i, item) in items.iter().enumerate() {
                    walk(s, item, &format!("{path}[{i}]"), out);
                }
            }
        }
        Value::Object(o) => walk_object(schema, o, path, out),
        _ => {}
    }
}

/// Enums and numeric ranges.
fn scalar_limits(schema: &Value, v: &Value, path: &str, out: &mut Findings) {
    if let Some(allowed) = schema["enum"].as_array() {
        if !allowed.contains(v) {
            let list: Vec<String> = allowed.iter().map(Value::to_string).collect();
            out.invalid.push(err(
                path,
                format!("unsupported value {v}; one of {}", list.join(", ")),
            ));
        }
    }
    let Some(n) = v.as_f64() else { return };
    if let Some(min) = schema["minimum"].as_f64().filter(|m| n < *m) {
        out.invalid
            .push(err(path, format!("{v} is less than the minimum {min}")));
    }
    let max = schema["maximum"]
        .as_f64()
        .or_else(|| format_max(schema["format"].as_str()?));
    if let Some(max) = max.filter(|m| n > *m) {
        out.invalid
            .push(err(path, format!("{v} is more than the maximum {max}")));
    }
}

/// The largest value of an unsigned integer format the types use.
fn format_max(format: &str) -> Option<f64> {
    Some(match format {
        "uint8" => u8::MAX.into(),
        "uint16" => u16::MAX.into(),
        "uint32" => u32::MAX.into(),
        _ => return None,
    })
}

fn walk_object(schema: &Value, o: &serde_json::Map<String, Value>, path: &str, out: &mut Findings) {
    let preserve = schema["x-kubernetes-preserve-unknown-fields"] == true;
    let props = schema.get("properties").and_then(Value::as_object);
    let extra = schema.get("additionalProperties").filter(|a| a.is_object());
    for (k, v) in o {
        match props.and_then(|p| p.get(k)).or(extra) {
            Some(s) => walk(s, v, &child(path, k), out),
            None if preserve => {}
            None => out.unknown.push(err(&child(path, k), "unknown field")),
        }
    }
    for r in schema["required"].as_array().into_iter().flatten() {
        if let Some(r) = r.as_str().filter(|r| !o.contains_key(*r)) {
            out.invalid
                .push(err(&child(path, r), "required field is missing"));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use egress_tests::kube_api::schema::{admit, load_crds};
    use egress_tests::kube_api::store::Resource;

    use super::*;
    use crate::api::API_VERSION;

    /// A value with every field `schema` declares, and a field `junk` in
    /// every object that does not take arbitrary keys; the paths of those
    /// go to `junk`.
    fn sample(schema: &Value, path: &str, junk: &mut Vec<String>) -> Value {
        match schema["type"].as_str().unwrap_or_default() {
            "array" => json!([sample(&schema["items"], &format!("{path}[0]"), junk)]),
            "string" => schema["enum"].get(0).cloned().unwrap_or(json!("x")),
            "integer" | "number" => json!(1),
            "boolean" => json!(true),
            _ => {
                let mut o = serde_json::Map::new();
                if let Some(extra) = schema.get("additionalProperties").filter(|a| a.is_object()) {
                    o.insert("k".into(), sample(extra, &child(path, "k"), junk));
                    return Value::Object(o);
                }
                for (k, s) in schema["properties"].as_object().into_iter().flatten() {
                    o.insert(k.clone(), sample(s, &child(path, k), junk));
                }
                if schema["x-kubernetes-preserve-unknown-fields"] != true {
                    o.insert("junk".into(), json!(1));
                    junk.push(child(path, "junk"));
                }
                Value::Object(o)
            }
        }
    }

    /// Paths of `orig` that `pruned` lacks.
    fn removed(orig: &Value, pruned: &Value, path: &str, out: &mut Vec<String>) {
        match (orig, pruned) {
            (Value::Object(a), Value::Object(b)) => {
                for (k, v) in a {
                    match b.get(k) {
                        Some(w) => removed(v, w, &child(path, k), out),
                        None => out.push(child(path, k)),
                    }
                }
            }
            (Value::Array(a), Value::Array(b)) => {
                for (i, (v, w)) in a.iter().zip(b).enumerate() {
                    removed(v, w, &format!("{path}[{i}]"), out);
                }
            }
            _ => {}
        }
    }

    /// Every field the strict pass refuses is one the chart's CRD schema
    /// makes the API server prune (what the in-memory API server of the
    /// tests does, as a real one without strict validation), and no other:
    /// for every object of every custom kind's schema.
    #[test]
    fn refuses_exactly_what_the_charts_crds_prune() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../charts/egress-gateway/crds");
        let crds = load_crds(&dir).unwrap();
        for kind in Kind::ALL.into_iter().filter(|k| k.is_custom()) {
            let schema = &crds[&Resource::new(API_VERSION, kind.plural())];
            let mut junk = Vec::new();
            let mut doc = sample(schema, "", &mut junk);
            doc["apiVersion"] = json!(API_VERSION);
            doc["kind"] = json!(kind.name());
            doc["metadata"] = json!({"name": "x", "namespace": "y"});
            let found = check(kind, &doc);
            assert_eq!(found.invalid, vec![], "{kind}");
            let mut unknown: Vec<String> = found.unknown.into_iter().map(|e| e.field).collect();
            let mut pruned_doc = doc.clone();
            assert_eq!(admit(schema, &mut pruned_doc), Vec::<String>::new());
            let mut pruned = Vec::new();
            removed(&doc, &pruned_doc, "", &mut pruned);
            unknown.sort();
            pruned.sort();
            junk.sort();
            assert!(junk.len() > 5, "{kind}: {junk:?}");
            assert_eq!(unknown, junk, "{kind}: the strict pass");
            assert_eq!(pruned, junk, "{kind}: the API server's pruning");
        }
    }
}
