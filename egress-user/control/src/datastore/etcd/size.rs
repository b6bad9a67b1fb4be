//! etcd's request size limit, checked before a write is sent.
//!
//! etcd refuses a request over `--max-request-bytes` (1.5 MiB unless the
//! operator changed it) with a gRPC error, and one far over it already in
//! gRPC with another. Checking here first gives one clear refusal, the
//! same for `egress apply --dry-run` (through
//! [`Datastore::check_size`](super::Datastore::check_size)) and the write.

use serde_json::Value;

use super::super::memory::keep_server_fields;
use super::super::{key_of, stamp_new, DatastoreError, Kind, ObjectKey, Result, SizeLimit, Stored};
use super::EtcdDatastore;

/// etcd's default `--max-request-bytes`.
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 1024 * 1024 * 3 / 2;

/// Room in a request for what is not the object: the compares, the leader
/// fence, protobuf framing.
const REQUEST_OVERHEAD: usize = 1024;

impl EtcdDatastore {
    /// The request limit of the etcd this handle talks to, when its
    /// operator raised (or lowered) `--max-request-bytes`.
    pub fn with_max_request_bytes(mut self, bytes: usize) -> Self {
        self.max_request_bytes = bytes;
        self
    }

    /// Refuses a write whose transaction would carry `stored_len` bytes of
    /// object under `key` (twice for a pod: the pod index holds a copy).
    pub(super) fn fits(&self, kind: Kind, key: &ObjectKey, stored_len: usize) -> Result<()> {
        let copies = if kind == Kind::Pod { 2 } else { 1 };
        let path = self.object_key(kind, key).len();
        let bytes = copies * (stored_len + path) + REQUEST_OVERHEAD;
        if bytes <= self.max_request_bytes {
            return Ok(());
        }
        Err(DatastoreError::TooLarge {
            kind,
            key: key.clone(),
            size: SizeLimit {
                bytes,
                limit: self.max_request_bytes,
                limit_of: "etcd's request limit (--max-request-bytes)",
            },
        })
    }

    /// What [`fits`](Self::fits) sees for a create or an update of
    /// `current`: the object as it would be stored.
    pub(super) fn check_object_size(
        &self,
        kind: Kind,
        object: &Value,
        current: Option<&Stored>,
    ) -> Result<()> {
        let key = key_of(kind, object)?;
        let mut v = object.clone();
        match current {
            Some(cur) => keep_server_fields(&cur.value, &mut v),
            // A uid as long as the ones `create` makes.
            None => stamp_new(&mut v, format!("etcd-{}-{}", i64::MAX, u64::MAX)),
        }
        if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("resourceVersion");
        }
        self.fits(kind, &key, serde_json::to_vec(&v)?.len())
    }
}
