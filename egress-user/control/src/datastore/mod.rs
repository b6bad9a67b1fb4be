//! One datastore trait, three backends.
//!
//! The trait is untyped on purpose (objects travel as JSON with a [`Kind`]):
//! that keeps it object-safe (`Arc<dyn Datastore>`) and lets the etcd backend
//! store exactly what a user would give kubectl. [`typed`] adds the typed
//! helpers on top.
//!
//! Semantics every backend keeps:
//! - `revision` is the object's version (Kubernetes resourceVersion, etcd
//!   mod revision). `update` with a stale revision fails with
//!   [`DatastoreError::Conflict`] and changes nothing.
//! - `watch(kind, rev)` delivers every change after `rev`, in order, so
//!   `list` then `watch(list_revision)` misses nothing.
//! - Status writes are server-side-apply-like: a writer names the status
//!   fields it owns; those are set (or removed when absent), others are kept.
//! - Heartbeats carry a counter that grows on every renewal; whoever monitors
//!   them times changes of the counter on its own clock (no clock skew).
//! - Leadership carries a term (fencing token) that grows on every change of
//!   leader.

mod error;
pub mod etcd;
mod kind;
pub mod kube;
pub mod memory;
mod open;
pub mod typed;

use std::time::Duration;

use async_trait::async_trait;
use futures::stream::BoxStream;
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use error::{DatastoreError, SizeLimit};
pub use kind::Kind;
pub use open::{open, DatastoreConfig};

pub type Result<T, E = DatastoreError> = std::result::Result<T, E>;

/// Identifies one object: namespace (empty for cluster objects) and name.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ObjectKey {
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    pub fn cluster(name: impl Into<String>) -> Self {
        Self {
            namespace: String::new(),
            name: name.into(),
        }
    }
    pub fn namespaced(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl std::fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.namespace.is_empty() {
            f.write_str(&self.name)
        } else {
            write!(f, "{}/{}", self.namespace, self.name)
        }
    }
}

/// An object as stored: the full JSON (apiVersion, kind, metadata, spec,
/// status) with `metadata.resourceVersion` set to `revision`.
#[derive(Clone, Debug, PartialEq)]
pub struct Stored {
    pub kind: Kind,
    pub key: ObjectKey,
    pub revision: u64,
    pub value: Value,
}

/// One change seen by a watch.
#[derive(Clone, Debug, PartialEq)]
pub enum WatchEvent {
    Put(Stored),
    Deleted {
        kind: Kind,
        key: ObjectKey,
        revision: u64,
    },
}

impl WatchEvent {
    pub fn revision(&self) -> u64 {
        match self {
            Self::Put(s) => s.revision,
            Self::Deleted { revision, .. } => *revision,
        }
    }
}

/// The status fields each field manager writes, per kind. On Kubernetes a
/// server-side apply removes the fields its manager applied before and
/// leaves out, so a manager that writes different fields of one kind in
/// different places deletes its own writes (it happened twice: the port
/// blocks and the reconfirmation requests). Other backends keep such
/// fields, so only a Kubernetes cluster would show it; in debug builds
/// (every test) a backend refuses the write with this error instead.
#[derive(Debug, Default)]
pub struct ManagerFields(std::sync::Mutex<std::collections::HashMap<(Kind, String), Vec<String>>>);

impl ManagerFields {
    /// A backend's checks before a status write: the kind has a status
    /// subresource, and the manager writes the same fields as before.
    pub fn check_status_write(&self, kind: Kind, patch: &StatusPatch) -> Result<()> {
        if !kind.has_status() {
            return Err(DatastoreError::NoStatus { kind });
        }
        self.check(kind, patch)
    }

    pub fn check(&self, kind: Kind, patch: &StatusPatch) -> Result<()> {
        if !cfg!(debug_assertions) {
            return Ok(());
        }
        let mut owned = patch.owned.clone();
        owned.sort();
        let mut seen = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let first = seen
            .entry((kind, patch.manager.clone()))
            .or_insert_with(|| owned.clone());
        if *first == owned {
            return Ok(());
        }
        Err(DatastoreError::Other(format!(
            "field manager {:?} writes {kind} status fields {owned:?} here and {first:?} elsewhere: \
             on Kubernetes each apply would delete the other's fields; give each set its own manager",
            patch.manager
        )))
    }
}

/// A status write: `manager` owns the top-level `status` keys in `owned`;
/// each is set from `status` or removed when `status` lacks it.
#[derive(Clone, Debug, PartialEq)]
pub struct StatusPatch {
    pub manager: String,
    pub owned: Vec<String>,
    pub status: Value,
}

impl StatusPatch {
    /// A write that owns every key of `status` (and only those).
    pub fn owning_all(manager: &str, status: Value) -> Self {
        let owned = status
            .as_object()
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default();
        Self {
            manager: manager.into(),
            owned,
            status,
        }
    }

    /// Applies the write to an object's JSON in place.
    pub fn apply_to(&self, object: &mut Value) {
        let obj = object.as_object_mut().expect("objects are JSON maps");
        let status = obj
            .entry("status")
            .or_insert_with(|| Value::Object(Default::default()));
        if !status.is_object() {
            *status = Value::Object(Default::default());
        }
        let status = status.as_object_mut().expect("just made a map");
        for k in &self.owned {
            match self.status.get(k) {
                Some(v) if !v.is_null() => {
                    status.insert(k.clone(), v.clone());
                }
                _ => {
                    status.remove(k);
                }
            }
        }
    }
}

/// A node's heartbeat as last written.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Heartbeat {
    pub node: String,
    /// Grows by one on every renewal.
    pub counter: u64,
    /// The writer's clock (RFC 3339), for people; monitors time `counter`.
    pub renew_time: String,
}

/// Who leads an election, and since which term.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaderInfo {
    pub identity: String,
    /// Fencing token: grows with every change of leader.
    pub term: u64,
}

/// Proof of leadership returned by [`Datastore::try_acquire`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leadership {
    pub election: String,
    pub identity: String,
    pub term: u64,
    pub ttl: Duration,
    /// Backend detail (the etcd lease id).
    pub token: i64,
}

/// An event about an object, as `kubectl describe` shows them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    pub kind: Kind,
    pub key: ObjectKey,
    /// "Normal" or "Warning".
    #[serde(rename = "type")]
    pub type_: String,
    pub reason: String,
    pub message: String,
    /// RFC 3339; backends fill it in when empty.
    #[serde(default)]
    pub time: String,
}

impl Event {
    pub fn normal(kind: Kind, key: ObjectKey, reason: &str, message: impl Into<String>) -> Self {
        Self {
            kind,
            key,
            type_: "Normal".into(),
            reason: reason.into(),
            message: message.into(),
            time: String::new(),
        }
    }
    pub fn warning(kind: Kind, key: ObjectKey, reason: &str, message: impl Into<String>) -> Self {
        Self {
            type_: "Warning".into(),
            ..Self::normal(kind, key, reason, message)
        }
    }
}

/// One status write of [`Datastore::write_statuses`].
pub type StatusWrite = (Kind, ObjectKey, StatusPatch);

/// Status writes in flight at once where each is its own request.
pub const STATUS_WRITE_CONCURRENCY: usize = 32;

pub type WatchStream = BoxStream<'static, Result<WatchEvent>>;

/// Everything the controller and the agents need from a datastore.
#[async_trait]
pub trait Datastore: Send + Sync {
    /// Every object of `kind` and the revision to watch from.
    async fn list(&self, kind: Kind) -> Result<(Vec<Stored>, u64)>;
    /// Changes of `kind` after `revision`, in order.
    async fn watch(&self, kind: Kind, revision: u64) -> Result<WatchStream>;
    async fn get(&self, kind: Kind, key: &ObjectKey) -> Result<Option<Stored>>;
    /// Fails with `AlreadyExists` when the object exists. Sets
    /// `metadata.creationTimestamp` and `metadata.uid`.
    async fn create(&self, kind: Kind, object: Value) -> Result<Stored>;
    /// Replaces spec/metadata (never status) when the stored revision is
    /// `revision`; otherwise `Conflict`.
    async fn update(&self, kind: Kind, object: Value, revision: u64) -> Result<Stored>;
    /// Refuses a create (`current` is `None`) or an update of `current`
    /// that the backend would refuse for its size, with
    /// [`DatastoreError::TooLarge`]. The backend's own writes run the same
    /// check before sending anything, so `apply --dry-run` refuses exactly
    /// what the write would. No limit by default (memory).
    fn check_size(&self, kind: Kind, object: &Value, current: Option<&Stored>) -> Result<()> {
        let _ = (kind, object, current);
        Ok(())
    }
    /// Deletes; with `revision`, only when the object still has it.
    async fn delete(&self, kind: Kind, key: &ObjectKey, revision: Option<u64>) -> Result<()>;
    /// Writes the status fields `patch` owns (see [`StatusPatch`]).
    async fn write_status(
        &self,
        kind: Kind,
        key: &ObjectKey,
        patch: &StatusPatch,
    ) -> Result<Stored>;
    /// Makes each of `writes` as [`write_status`](Self::write_status)
    /// would, and gives each one's result, in order. One by one here, at
    /// most [`STATUS_WRITE_CONCURRENCY`] at a time; a backend that can put
    /// several objects in one request does (etcd).
    async fn write_statuses(&self, writes: &[StatusWrite]) -> Vec<Result<Stored>> {
        use futures::stream::{self, StreamExt};
        let each: Vec<_> = writes
            .iter()
            .map(|(kind, key, p)| self.write_status(*kind, key, p))
            .collect();
        stream::iter(each)
            .buffered(STATUS_WRITE_CONCURRENCY)
            .collect()
            .await
    }

    /// Renews `node`'s heartbeat (`ttl`: how long it is meant to hold).
    async fn renew_heartbeat(&self, node: &str, ttl: Duration) -> Result<Heartbeat>;
    async fn heartbeats(&self) -> Result<Vec<Heartbeat>>;
    /// Deletes `node`'s heartbeat (a removed node's): gone already is fine.
    async fn forget_heartbeat(&self, node: &str) -> Result<()>;

    /// Takes the leadership of `election` when nobody holds it (or the
    /// holder's lease ran out); `None` when someone else leads.
    async fn try_acquire(
        &self,
        election: &str,
        identity: &str,
        ttl: Duration,
    ) -> Result<Option<Leadership>>;
    /// Extends the lease; `LostLeadership` when it is no longer ours.
    async fn renew_leadership(&self, lead: &Leadership) -> Result<()>;
    async fn resign(&self, lead: &Leadership) -> Result<()>;
    async fn leader(&self, election: &str) -> Result<Option<LeaderInfo>>;

    async fn record_event(&self, event: Event) -> Result<()>;
    /// Recent events, oldest first.
    async fn events(&self) -> Result<Vec<Event>>;

    /// Fences every later status write of this handle with `lead`: a write
    /// made after another replica took the leadership fails with
    /// `LostLeadership` and changes nothing, atomically where the backend
    /// can (etcd: the write's transaction compares the leader key's term;
    /// memory: under its lock). `None` lifts the fence. The Kubernetes API
    /// has no cross-object compare: there the default (no fence) holds and
    /// the Lease renewal before each pass is the guard.
    async fn fence(&self, lead: Option<&Leadership>) -> Result<()> {
        let _ = lead;
        Ok(())
    }

    /// The longest a consumer of this backend's watches should trust them
    /// before it lists every kind again (a watch on a connection that
    /// stopped delivering without closing loses events silently). The
    /// default is etcd's and memory's; Kubernetes trusts its watches longer.
    fn relist_period(&self) -> Duration {
        Duration::from_secs(300)
    }

    /// Whether nodes, pods and namespaces are written through this
    /// datastore (etcd, memory: the agents and `egress pod` write them) or
    /// come from the cluster itself (Kubernetes: the kubelet and the API
    /// server keep them, and writing them is refused).
    fn writes_cluster_records(&self) -> bool {
        true
    }

    /// Brings the backend's secondary indexes up to date with objects
    /// written before they existed (etcd: pods by node); the leading
    /// controller calls it once. Nothing to do elsewhere.
    async fn complete_indexes(&self) -> Result<()> {
        Ok(())
    }
}

/// Fills the bookkeeping fields of a new object's metadata.
pub(crate) fn stamp_new(value: &mut Value, uid: String) {
    let meta = value
        .as_object_mut()
        .expect("objects are JSON maps")
        .entry("metadata")
        .or_insert_with(|| Value::Object(Default::default()));
    if let Some(m) = meta.as_object_mut() {
        m.entry("creationTimestamp")
            .or_insert_with(|| Value::String(now_rfc3339()));
        m.insert("uid".into(), Value::String(uid));
    }
}

/// Sets `metadata.resourceVersion` to `revision`.
pub(crate) fn set_revision(value: &mut Value, revision: u64) {
    if let Some(m) = value.get_mut("metadata").and_then(Value::as_object_mut) {
        m.insert(
            "resourceVersion".into(),
            Value::String(revision.to_string()),
        );
    }
}

/// The revision a `resourceVersion` names; 0 when there is none or it is
/// not a number.
pub(crate) fn parse_revision(resource_version: Option<&str>) -> u64 {
    resource_version.and_then(|r| r.parse().ok()).unwrap_or(0)
}

/// Key of an object from its JSON, checked against the kind's scope.
pub fn key_of(kind: Kind, value: &Value) -> Result<ObjectKey> {
    let meta = value.get("metadata");
    let name = meta
        .and_then(|m| m.get("name"))
        .and_then(Value::as_str)
        .unwrap_or_default();
    if name.is_empty() {
        return Err(DatastoreError::Invalid("metadata.name: must be set".into()));
    }
    let ns = meta
        .and_then(|m| m.get("namespace"))
        .and_then(Value::as_str)
        .unwrap_or_default();
    if kind.namespaced() && ns.is_empty() {
        return Err(DatastoreError::Invalid(format!(
            "metadata.namespace: {} is namespaced, the namespace must be set",
            kind.name()
        )));
    }
    if !kind.namespaced() && !ns.is_empty() {
        return Err(DatastoreError::Invalid(format!(
            "metadata.namespace: {} is cluster-scoped, remove the namespace",
            kind.name()
        )));
    }
    Ok(ObjectKey::namespaced(ns, name))
}

pub fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_manager_that_writes_two_sets_of_fields_of_one_kind_is_refused() {
        let m = ManagerFields::default();
        let tunnel = StatusPatch::owning_all("egress-agent", json!({"tunnel": {}}));
        let asked = StatusPatch::owning_all("egress-agent", json!({"awaitingReconfirmation": []}));
        m.check(Kind::EgressTunnel, &tunnel).unwrap();
        m.check(Kind::EgressTunnel, &tunnel).unwrap();
        // Another kind, another manager: their own sets.
        m.check(Kind::EgressGateway, &asked).unwrap();
        let other = StatusPatch::owning_all(
            "egress-agent-reconfirmation",
            json!({"awaitingReconfirmation": []}),
        );
        m.check(Kind::EgressTunnel, &other).unwrap();
        let e = m.check(Kind::EgressTunnel, &asked).unwrap_err().to_string();
        assert!(
            e.contains("egress-agent") && e.contains("its own manager"),
            "{e}"
        );
    }
}
