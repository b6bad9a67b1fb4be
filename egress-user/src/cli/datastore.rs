//! `--datastore` flags shared by every process that talks to the datastore,
//! and the connection every command opens from them.

use std::sync::Arc;

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use egress_control::datastore::etcd::{EtcdDatastore, DEFAULT_MAX_REQUEST_BYTES};
use egress_control::datastore::kube::KubeDatastore;
use egress_control::datastore::Datastore;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    /// The objects as JSON in etcd (standalone clusters, the project's own tests).
    Etcd,
    /// The Kubernetes API server (CRDs, Leases).
    Kubernetes,
}

#[derive(Debug, Clone, Args)]
pub struct DatastoreArgs {
    /// Where the objects live.
    #[arg(long, value_enum, env = "EGRESS_DATASTORE", default_value = "etcd")]
    pub datastore: Backend,
    /// etcd endpoints, comma separated (with --datastore etcd).
    #[arg(
        long,
        env = "EGRESS_ETCD_ENDPOINTS",
        value_delimiter = ',',
        default_value = "http://127.0.0.1:2379"
    )]
    pub etcd_endpoints: Vec<String>,
    /// Key prefix of every object in etcd.
    #[arg(long, env = "EGRESS_ETCD_PREFIX", default_value = "/egress")]
    pub etcd_prefix: String,
    /// etcd's `--max-request-bytes`: writes over it are refused before
    /// they are sent (and by `apply --dry-run`).
    #[arg(
        long,
        env = "EGRESS_ETCD_MAX_REQUEST_BYTES",
        default_value_t = DEFAULT_MAX_REQUEST_BYTES
    )]
    pub etcd_max_request_bytes: usize,
}

impl DatastoreArgs {
    pub async fn connect(&self) -> Result<Arc<dyn Datastore>> {
        self.connect_scoped(None).await
    }

    /// As [`connect`](Self::connect); with `pods_of_node`, pod lists and
    /// watches cover that node's pods only (an agent's handle).
    pub async fn connect_scoped(&self, pods_of_node: Option<&str>) -> Result<Arc<dyn Datastore>> {
        match self.datastore {
            Backend::Etcd => {
                let ds = EtcdDatastore::connect(&self.etcd_endpoints, &self.etcd_prefix)
                    .await
                    .with_context(|| {
                        format!("connecting to etcd at {}", self.etcd_endpoints.join(","))
                    })?
                    .with_max_request_bytes(self.etcd_max_request_bytes);
                Ok(Arc::new(match pods_of_node {
                    Some(node) => ds.pods_of_node(node),
                    None => ds,
                }))
            }
            Backend::Kubernetes => anyhow::bail!(
                "--datastore kubernetes is not wired into the binary yet; use --datastore etcd"
            ),
        }
    }
}

/// Connects to the datastore the flags name; the Kubernetes backend keeps
/// its Leases (and events about cluster-scoped objects) in `lease_namespace`.
pub async fn connect(args: &DatastoreArgs, lease_namespace: &str) -> Result<Arc<dyn Datastore>> {
    connect_scoped(args, lease_namespace, None).await
}

/// As [`connect`], for the agent of `node`: it lists and watches only that
/// node's pods (the only ones its maps hold), so the datastore does not
/// send every agent every pod of the cluster (Kubernetes: a field
/// selector; etcd: the pod index, once a controller completed it).
pub async fn connect_for_node(
    args: &DatastoreArgs,
    lease_namespace: &str,
    node: &str,
) -> Result<Arc<dyn Datastore>> {
    connect_scoped(args, lease_namespace, Some(node)).await
}

async fn connect_scoped(
    args: &DatastoreArgs,
    lease_namespace: &str,
    pods_of_node: Option<&str>,
) -> Result<Arc<dyn Datastore>> {
    match args.datastore {
        Backend::Kubernetes => {
            let ds = KubeDatastore::try_default(lease_namespace)
                .await
                .context("connecting to the Kubernetes API server")?;
            Ok(Arc::new(match pods_of_node {
                Some(node) => ds.pods_of_node(node),
                None => ds,
            }))
        }
        Backend::Etcd => args.connect_scoped(pods_of_node).await,
    }
}
