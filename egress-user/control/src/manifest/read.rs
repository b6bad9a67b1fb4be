//! Reading a manifest: the YAML stream split into documents, each one's
//! kind and namespace filled in, the strict pass over its fields, then a
//! typed decode. Every problem found is kept, not only the first.

use serde::de::DeserializeOwned;
use serde_json::Value;

use super::{strict, Document, Problem};
use crate::api::{EgressClusterPolicy, EgressGateway, EgressPolicy, EgressTunnel};
use crate::datastore::{key_of, DatastoreError, Kind};

/// What reading a stream gave: the documents that decode (some may still
/// have problems, e.g. an unknown field) and every problem.
#[derive(Debug, Default)]
pub(super) struct Read {
    pub docs: Vec<Document>,
    pub problems: Vec<Problem>,
    /// Documents in the stream that are not empty.
    pub seen: usize,
}

pub(super) fn read(text: &str, default_ns: &str) -> Read {
    let mut out = Read::default();
    for (i, de) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let index = i + 1;
        let value: Value = match serde::Deserialize::deserialize(de) {
            Ok(Value::Null) => continue,
            Ok(v) => v,
            Err(e) => {
                out.problems
                    .push(Problem::new(index, "", "", format!("not YAML: {e}")));
                // The YAML stream cannot be followed past a syntax error.
                break;
            }
        };
        out.seen += 1;
        if let Some(d) = document(index, value, default_ns, &mut out.problems) {
            out.docs.push(d);
        }
    }
    out
}

/// `Kind namespace/name`, as far as the document says, for messages.
fn label(kind: Option<Kind>, value: &Value) -> String {
    let meta = |f: &str| {
        value
            .pointer(&format!("/metadata/{f}"))
            .and_then(Value::as_str)
            .unwrap_or_default()
    };
    let Some(kind) = kind else {
        return String::new();
    };
    match (meta("namespace"), meta("name")) {
        (_, "") => kind.name().to_string(),
        ("", name) => format!("{kind} {name}"),
        (ns, name) => format!("{kind} {ns}/{name}"),
    }
}

fn kind_of(value: &Value) -> Result<Kind, String> {
    let ty = |f: &str| value.get(f).and_then(Value::as_str).unwrap_or_default();
    let (api_version, kind) = (ty("apiVersion"), ty("kind"));
    Kind::from_type(api_version, kind).ok_or_else(|| {
        format!(
            "{api_version:?}/{kind:?} is not a kind this datastore holds (custom resources use {})",
            crate::api::API_VERSION
        )
    })
}

/// One document, or `None` when it cannot be checked further; its
/// problems go to `problems`.
fn document(
    index: usize,
    mut value: Value,
    default_ns: &str,
    problems: &mut Vec<Problem>,
) -> Option<Document> {
    if !value.is_object() {
        problems.push(Problem::new(index, "", "", "the document is not a map"));
        return None;
    }
    let kind = match kind_of(&value) {
        Ok(k) => k,
        Err(reason) => {
            problems.push(Problem::new(index, "", "apiVersion/kind", reason));
            return None;
        }
    };
    fill_in(kind, &mut value, default_ns);
    let object = label(Some(kind), &value);
    let found = strict::check(kind, &value);
    let decodes = found.invalid.is_empty();
    for e in found.unknown.into_iter().chain(found.invalid) {
        problems.push(Problem::new(index, &object, &e.field, e.reason));
    }
    if !decodes {
        return None;
    }
    let checked = typed_check(kind, &value).and_then(|()| {
        key_of(kind, &value).map_err(|e| match e {
            DatastoreError::Invalid(r) => ("".into(), r),
            e => ("".into(), e.to_string()),
        })
    });
    match checked {
        Ok(key) => Some(Document {
            index,
            kind,
            key,
            value,
        }),
        Err((field, reason)) => {
            problems.push(Problem::new(index, &object, &field, reason));
            None
        }
    }
}

/// The metadata fields the datastore sets on a write, never a manifest.
pub(super) const DATASTORE_SET_METADATA: &[&str] = &[
    "resourceVersion",
    "uid",
    "creationTimestamp",
    "managedFields",
];

/// The namespace a namespaced kind lacks; no status and none of the
/// fields the datastore sets (apply writes neither).
fn fill_in(kind: Kind, value: &mut Value, default_ns: &str) {
    let o = value.as_object_mut().expect("checked to be a map");
    o.remove("status");
    if kind.namespaced() {
        let meta = o
            .entry("metadata")
            .or_insert_with(|| Value::Object(Default::default()));
        if let Some(m) = meta.as_object_mut() {
            let ns = m.get("namespace").and_then(Value::as_str);
            if ns.unwrap_or_default().is_empty() {
                m.insert("namespace".into(), Value::String(default_ns.into()));
            }
        }
    }
    if let Some(m) = o.get_mut("metadata").and_then(Value::as_object_mut) {
        for f in DATASTORE_SET_METADATA {
            m.remove(*f);
        }
    }
}

/// Decodes into the kind's type; the failing field's path and the reason
/// otherwise (the strict pass catches most of these first).
fn typed_check(kind: Kind, v: &Value) -> Result<(), (String, String)> {
    fn one<T: DeserializeOwned>(v: &Value) -> Result<(), (String, String)> {
        serde_path_to_error::deserialize::<_, T>(v.clone())
            .map(drop)
            .map_err(|e| (e.path().to_string(), e.into_inner().to_string()))
    }
    match kind {
        Kind::EgressGateway => one::<EgressGateway>(v),
        Kind::EgressPolicy => one::<EgressPolicy>(v),
        Kind::EgressClusterPolicy => one::<EgressClusterPolicy>(v),
        Kind::EgressTunnel => one::<EgressTunnel>(v),
        Kind::Node | Kind::Pod | Kind::Namespace => Ok(()),
    }
}
