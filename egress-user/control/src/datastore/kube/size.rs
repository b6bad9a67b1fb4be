//! The size limits a write to the Kubernetes API server meets, checked
//! before it is sent: the API server refuses a request body over 3 MiB,
//! and the etcd behind it an object over its `--max-request-bytes` (1.5
//! MiB unless the cluster's operator changed it).

use serde_json::Value;

use super::super::etcd::DEFAULT_MAX_REQUEST_BYTES;
use super::super::{key_of, DatastoreError, Kind, Result, SizeLimit, Stored};

/// The API server's limit on the body of a write.
pub const MAX_REQUEST_BODY_BYTES: usize = 3 * 1024 * 1024;

/// Refuses a create (`current` is `None`) or an update of `current` that
/// either limit refuses. `object` is what is sent (no status: an update
/// keeps the stored one, which the stored size includes).
pub(super) fn check(kind: Kind, object: &Value, current: Option<&Stored>) -> Result<()> {
    let key = key_of(kind, object)?;
    let body = serde_json::to_vec(object)?.len();
    let status = current
        .and_then(|c| c.value.get("status"))
        .map(|s| serde_json::to_vec(s).map(|b| b.len()))
        .transpose()?
        .unwrap_or(0);
    let too_large = |bytes, limit, limit_of| DatastoreError::TooLarge {
        kind,
        key: key.clone(),
        size: SizeLimit {
            bytes,
            limit,
            limit_of,
        },
    };
    if body > MAX_REQUEST_BODY_BYTES {
        return Err(too_large(
            body,
            MAX_REQUEST_BODY_BYTES,
            "the Kubernetes API server's request limit",
        ));
    }
    if body + status > DEFAULT_MAX_REQUEST_BYTES {
        return Err(too_large(
            body + status,
            DEFAULT_MAX_REQUEST_BYTES,
            "the request limit of the API server's etcd (its default --max-request-bytes)",
        ));
    }
    Ok(())
}
