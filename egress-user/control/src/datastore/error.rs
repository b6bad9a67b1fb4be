//! The one error type of every datastore backend.

use super::{Kind, ObjectKey};

#[derive(Debug, thiserror::Error)]
pub enum DatastoreError {
    #[error("{kind} {key} not found")]
    NotFound { kind: Kind, key: ObjectKey },
    #[error("{kind} {key} already exists")]
    AlreadyExists { kind: Kind, key: ObjectKey },
    #[error(
        "{kind} {key} was changed by someone else (expected revision {expected}, found {found})"
    )]
    Conflict {
        kind: Kind,
        key: ObjectKey,
        expected: u64,
        found: u64,
    },
    #[error("leadership of {election} lost")]
    LostLeadership { election: String },
    /// The backend would refuse the write for its size (checked before
    /// anything is sent, by the write and by `apply --dry-run` alike).
    #[error("{kind} {key}: {size}")]
    TooLarge {
        kind: Kind,
        key: ObjectKey,
        size: SizeLimit,
    },
    #[error("invalid object: {0}")]
    Invalid(String),
    #[error("{kind} has no status")]
    NoStatus { kind: Kind },
    #[error("watch fell behind (revision {0} compacted): list again")]
    Compacted(u64),
    /// Shown as one line: a gRPC status as its code and message (not the
    /// status's details and metadata), and not again as a cause.
    #[error("etcd: {}", etcd_line(.0))]
    Etcd(etcd_client::Error),
    #[error("kubernetes: {0}")]
    Kube(#[from] kube::Error),
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
    #[error("{0}")]
    Other(String),
}

impl From<etcd_client::Error> for DatastoreError {
    fn from(e: etcd_client::Error) -> Self {
        Self::Etcd(e)
    }
}

fn etcd_line(e: &etcd_client::Error) -> String {
    match e {
        etcd_client::Error::GRpcStatus(s) => format!("{:?}: {}", s.code(), s.message()),
        e => e.to_string(),
    }
}

/// How far an object is over a backend's size limit.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{} as stored, over {limit_of} of {}", size(*.bytes), size(*.limit))]
pub struct SizeLimit {
    pub bytes: usize,
    pub limit: usize,
    /// Whose limit, e.g. "etcd's request limit (--max-request-bytes)".
    pub limit_of: &'static str,
}

/// A size for messages: bytes below 1 KiB, else KiB or MiB with two decimals.
fn size(bytes: usize) -> String {
    match bytes {
        b if b < 1024 => format!("{b} bytes"),
        b if b < 1024 * 1024 => format!("{:.2} KiB", b as f64 / 1024.0),
        b => format!("{:.2} MiB", b as f64 / (1024.0 * 1024.0)),
    }
}

impl DatastoreError {
    pub fn is_conflict(&self) -> bool {
        matches!(self, Self::Conflict { .. })
    }
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::NotFound { .. })
    }
}
