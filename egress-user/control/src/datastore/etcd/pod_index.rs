//! Pods by node: `PREFIX/pod-index/<node>/<namespace>/<name>` holds a copy
//! of each pod's JSON next to `PREFIX/objects/pods/<namespace>/<name>`,
//! written in the same transaction, so an agent lists and watches only its
//! own node's pods (on Kubernetes a field selector does the same). Without
//! it, every agent received every pod event of the cluster.
//!
//! Pods written before the index existed are copied in once, by the
//! leading controller ([`EtcdDatastore::complete_pod_index`]), which then
//! writes `PREFIX/pod-index-complete`. Until that key exists an agent's
//! handle reads all pods, as before (each pod list looks again, and the
//! watches that follow it read where it read).

use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use serde_json::Value;

use super::EtcdDatastore;
use crate::datastore::{Kind, ObjectKey, Result};

/// The node a pod object runs on, if any.
pub(super) fn node_of(pod: &Value) -> Option<&str> {
    pod.pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
}

impl EtcdDatastore {
    pub(super) fn pod_index_prefix(&self, node: &str) -> String {
        format!("{}/pod-index/{node}/", self.prefix)
    }

    fn pod_index_key(&self, node: &str, key: &ObjectKey) -> String {
        format!(
            "{}{}/{}",
            self.pod_index_prefix(node),
            key.namespace,
            key.name
        )
    }

    fn pod_index_complete_key(&self) -> String {
        format!("{}/pod-index-complete", self.prefix)
    }

    /// The index writes that go with writing `new` (None: deleting) over
    /// `old` (None: creating), for a pod; nothing for other kinds.
    pub(super) fn pod_index_ops(
        &self,
        kind: Kind,
        key: &ObjectKey,
        old: Option<&Value>,
        new: Option<(&Value, &[u8])>,
    ) -> Vec<TxnOp> {
        if kind != Kind::Pod {
            return Vec::new();
        }
        let old_node = old.and_then(node_of);
        let new_node = new.and_then(|(v, _)| node_of(v));
        let mut ops = Vec::new();
        if let Some(n) = old_node.filter(|n| Some(*n) != new_node) {
            ops.push(TxnOp::delete(self.pod_index_key(n, key), None));
        }
        if let (Some(n), Some((_, bytes))) = (new_node, new) {
            ops.push(TxnOp::put(self.pod_index_key(n, key), bytes.to_vec(), None));
        }
        ops
    }

    /// Where this handle reads pods from: its node's part of the index once
    /// the index is complete, else every pod. A pod list decides (reading
    /// the completion mark); the watches that follow it use its decision,
    /// so a list and its watches agree.
    pub(super) async fn pods_from_index(&self, listing: bool) -> Result<Option<&str>> {
        let Some(node) = self.pod_node.as_deref() else {
            return Ok(None);
        };
        if listing {
            let done = !self
                .range(self.pod_index_complete_key(), false)
                .await?
                .kvs()
                .is_empty();
            *self.pod_index_used.lock().unwrap() = done;
        }
        Ok((*self.pod_index_used.lock().unwrap()).then_some(node))
    }

    /// Copies every pod that has no index entry into the index (and
    /// writes it again, so that both copies carry one revision), then
    /// marks the index complete. Returns how many pods were copied. A pod
    /// changed meanwhile was written by a writer that keeps the index.
    pub async fn complete_pod_index(&self) -> Result<usize> {
        if !self
            .range(self.pod_index_complete_key(), false)
            .await?
            .kvs()
            .is_empty()
        {
            return Ok(0);
        }
        let pods = self.range_prefix(self.kind_prefix(Kind::Pod)).await?;
        // Only whether an entry is there matters, not its copy of the pod.
        let indexed = self
            .range_prefix_keys(format!("{}/pod-index/", self.prefix))
            .await?;
        let have: std::collections::BTreeSet<&[u8]> =
            indexed.kvs().iter().map(|kv| kv.key()).collect();
        let mut copied = 0;
        for kv in pods.kvs() {
            let stored = self.stored(Kind::Pod, kv)?;
            let Some(node) = node_of(&stored.value) else {
                continue;
            };
            let index_key = self.pod_index_key(node, &stored.key);
            if have.contains(index_key.as_bytes()) {
                continue;
            }
            let path = String::from_utf8_lossy(kv.key()).into_owned();
            let txn = Txn::new()
                .when([Compare::mod_revision(
                    path.clone(),
                    CompareOp::Equal,
                    kv.mod_revision(),
                )])
                .and_then([
                    TxnOp::put(path, kv.value().to_vec(), None),
                    TxnOp::put(index_key, kv.value().to_vec(), None),
                ]);
            if self.txn(txn).await?.succeeded() {
                copied += 1;
            }
        }
        self.txn(Txn::new().and_then([TxnOp::put(self.pod_index_complete_key(), "1", None)]))
            .await?;
        Ok(copied)
    }
}
