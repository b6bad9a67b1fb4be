//! Opening a datastore from configuration (what the CLI flags fill in).

use std::sync::Arc;

use super::{etcd::EtcdDatastore, kube::KubeDatastore, memory::MemoryDatastore, Datastore, Result};

/// Which backend, and how to reach it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DatastoreConfig {
    Etcd {
        endpoints: Vec<String>,
        prefix: String,
    },
    /// In-cluster or kubeconfig; Leases and events of cluster objects in `namespace`.
    Kubernetes { namespace: String },
    /// For tests only: nothing is kept.
    Memory,
}

pub async fn open(cfg: &DatastoreConfig) -> Result<Arc<dyn Datastore>> {
    Ok(match cfg {
        DatastoreConfig::Etcd { endpoints, prefix } => {
            Arc::new(EtcdDatastore::connect(endpoints, prefix).await?)
        }
        DatastoreConfig::Kubernetes { namespace } => {
            Arc::new(KubeDatastore::try_default(namespace).await?)
        }
        DatastoreConfig::Memory => Arc::new(MemoryDatastore::new()),
    })
}
