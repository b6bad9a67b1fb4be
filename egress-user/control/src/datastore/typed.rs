//! Typed helpers over the untyped [`Datastore`]: decoding objects and
//! records, loading a [`ClusterView`], conflict retries.

use std::future::Future;

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};

use super::{Datastore, DatastoreError, Kind, ObjectKey, Result, Stored};
use crate::api::{NamespaceRecord, NodeRecord, PodRecord};

/// Decodes a custom resource.
pub fn decode<T: DeserializeOwned>(s: &Stored) -> Result<T> {
    Ok(serde_json::from_value(s.value.clone())?)
}

/// A custom resource as JSON.
pub fn encode<T: Serialize>(obj: &T) -> Result<Value> {
    Ok(serde_json::to_value(obj)?)
}

/// A node record as a stored object.
pub fn node_object(n: &NodeRecord) -> Value {
    json!({
        "apiVersion": Kind::Node.api_version(),
        "kind": "Node",
        "metadata": {"name": n.name, "labels": n.labels},
        "spec": {"addresses": n.addresses, "podCIDRs": n.pod_cidrs, "ready": n.ready},
    })
}

pub fn pod_object(p: &PodRecord) -> Value {
    json!({
        "apiVersion": Kind::Pod.api_version(),
        "kind": "Pod",
        "metadata": {"name": p.name, "namespace": p.namespace, "labels": p.labels},
        "spec": {"nodeName": p.node, "ips": p.ips},
    })
}

pub fn namespace_object(n: &NamespaceRecord) -> Value {
    json!({
        "apiVersion": Kind::Namespace.api_version(),
        "kind": "Namespace",
        "metadata": {"name": n.name, "labels": n.labels},
    })
}

fn meta_str(v: &Value, f: &str) -> String {
    v.pointer(&format!("/metadata/{f}"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

fn labels(v: &Value) -> std::collections::BTreeMap<String, String> {
    v.pointer("/metadata/labels")
        .cloned()
        .and_then(|l| serde_json::from_value(l).ok())
        .unwrap_or_default()
}

fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

pub fn node_record(v: &Value) -> NodeRecord {
    NodeRecord {
        name: meta_str(v, "name"),
        labels: labels(v),
        addresses: strings(v.pointer("/spec/addresses")),
        pod_cidrs: strings(v.pointer("/spec/podCIDRs")),
        ready: v
            .pointer("/spec/ready")
            .and_then(Value::as_bool)
            .unwrap_or(true),
    }
}

pub fn pod_record(v: &Value) -> PodRecord {
    PodRecord {
        name: meta_str(v, "name"),
        namespace: meta_str(v, "namespace"),
        labels: labels(v),
        node: v
            .pointer("/spec/nodeName")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .into(),
        ips: strings(v.pointer("/spec/ips")),
    }
}

pub fn namespace_record(v: &Value) -> NamespaceRecord {
    NamespaceRecord {
        name: meta_str(v, "name"),
        labels: labels(v),
    }
}

/// Creates the object, or replaces it (optimistic concurrency, retried on
/// conflict) when it exists.
pub async fn apply(ds: &dyn Datastore, kind: Kind, object: Value) -> Result<Stored> {
    let key = super::key_of(kind, &object)?;
    retry_on_conflict(5, || async {
        match ds.get(kind, &key).await? {
            None => match ds.create(kind, object.clone()).await {
                Err(DatastoreError::AlreadyExists { .. }) => Err(DatastoreError::Conflict {
                    kind,
                    key: key.clone(),
                    expected: 0,
                    found: 0,
                }),
                r => r,
            },
            Some(cur) => ds.update(kind, object.clone(), cur.revision).await,
        }
    })
    .await
}

/// Runs `f` again while it fails with a conflict, at most `tries` times.
pub async fn retry_on_conflict<T, F, Fut>(tries: u32, mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let mut left = tries.max(1);
    loop {
        match f().await {
            Err(e) if e.is_conflict() && left > 1 => left -= 1,
            r => return r,
        }
    }
}

/// The key a record or resource is stored under.
pub fn key(kind: Kind, namespace: &str, name: &str) -> ObjectKey {
    if kind.namespaced() {
        ObjectKey::namespaced(namespace, name)
    } else {
        ObjectKey::cluster(name)
    }
}
