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
    #[error("invalid object: {0}")]
    Invalid(String),
    #[error("{kind} has no status")]
    NoStatus { kind: Kind },
    #[error("watch fell behind (revision {0} compacted): list again")]
    Compacted(u64),
    #[error("etcd: {0}")]
    Etcd(#[from] etcd_client::Error),
    #[error("kubernetes: {0}")]
    Kube(#[from] kube::Error),
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
    #[error("{0}")]
    Other(String),
}

impl DatastoreError {
    pub fn is_conflict(&self) -> bool {
        matches!(self, Self::Conflict { .. })
    }
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::NotFound { .. })
    }
}
