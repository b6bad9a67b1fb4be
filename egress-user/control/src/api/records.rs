//! Plain records for nodes, pods and namespaces.
//!
//! On etcd they are stored as they are (`kind` and `metadata` like any other
//! object); on Kubernetes the backend converts core/v1 objects into them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A node: labels for gateway selection, addresses and pod CIDRs for the
/// cluster CIDRs, readiness for gateway election.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeRecord {
    pub name: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Node addresses (InternalIP and the like).
    #[serde(default)]
    pub addresses: Vec<String>,
    #[serde(default, rename = "podCIDRs")]
    pub pod_cidrs: Vec<String>,
    #[serde(default = "yes")]
    pub ready: bool,
}

/// A pod: what policies select on and the addresses they match.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodRecord {
    pub name: String,
    pub namespace: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// The node the pod runs on.
    #[serde(default)]
    pub node: String,
    #[serde(default)]
    pub ips: Vec<String>,
}

/// A namespace's labels, for EgressClusterPolicy `namespaceSelector`. A
/// namespace without a record still has `kubernetes.io/metadata.name`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamespaceRecord {
    pub name: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

impl NamespaceRecord {
    /// The labels selectors see, with the automatic name label.
    pub fn effective_labels(name: &str, rec: Option<&NamespaceRecord>) -> BTreeMap<String, String> {
        let mut l = rec.map(|r| r.labels.clone()).unwrap_or_default();
        l.insert("kubernetes.io/metadata.name".into(), name.into());
        l
    }
}

fn yes() -> bool {
    true
}
