//! Many status writes in few requests.
//!
//! A status write on its own is two round trips (read the object, then
//! put it on the condition that it did not change). A controller's first
//! pass at 1,000 nodes writes about 6,000 statuses: 12,000 requests, most
//! of its cold start. Here up to [`BATCH`] writes share one read (a
//! transaction of gets) and one write (a transaction that puts them all
//! when none of them changed and the leader fence holds). When that write
//! fails, something changed under one of them, or the fence broke: each
//! write of the batch is then made on its own, which tries again on a race
//! and tells a lost leadership apart, exactly as a single write does.

use etcd_client::{Compare, CompareOp, Txn, TxnOp, TxnOpResponse};
use futures::stream::{self, StreamExt};
use serde_json::Value;

use super::super::{set_revision, Datastore, Kind, Result, StatusWrite, Stored};
use super::EtcdDatastore;

/// Writes per batch: well inside etcd's `--max-txn-ops` (128 by default),
/// which bounds the compares (one per object, and the fence) and the puts.
const BATCH: usize = 64;

/// Batches in flight at once.
const BATCHES_IN_FLIGHT: usize = 8;

/// A write of a batch once its object was read: the object as it is and,
/// when the write changes it, as it will be.
struct Prepared {
    current: Stored,
    new: Option<(Value, Vec<u8>)>,
}

impl EtcdDatastore {
    /// [`Datastore::write_statuses`] on etcd: pods one by one (their
    /// index keys make each write a transaction of its own), the rest in
    /// batches.
    pub(super) async fn write_statuses_batched(
        &self,
        writes: &[StatusWrite],
    ) -> Vec<Result<Stored>> {
        let chunks: Vec<Vec<usize>> = batches(writes);
        let done: Vec<Vec<(usize, Result<Stored>)>> = stream::iter(chunks)
            .map(|chunk| self.write_chunk(writes, chunk))
            .buffer_unordered(BATCHES_IN_FLIGHT)
            .collect()
            .await;
        let mut out: Vec<Option<Result<Stored>>> = (0..writes.len()).map(|_| None).collect();
        for (i, r) in done.into_iter().flatten() {
            out[i] = Some(r);
        }
        out.into_iter()
            .map(|r| r.expect("every write is in one batch"))
            .collect()
    }

    /// The writes at `indexes` of `writes`, as one batch where it can.
    async fn write_chunk(
        &self,
        writes: &[StatusWrite],
        indexes: Vec<usize>,
    ) -> Vec<(usize, Result<Stored>)> {
        if indexes.len() == 1 || writes[indexes[0]].0 == Kind::Pod {
            return self.one_by_one(writes, indexes).await;
        }
        let prepared = match self.read_batch(writes, &indexes).await {
            Ok(p) => p,
            // The read itself failed: the single writes report (or ride
            // out) whatever made it fail.
            Err(_) => return self.one_by_one(writes, indexes).await,
        };
        let mut out = Vec::with_capacity(indexes.len());
        let mut to_put = Vec::new();
        for (i, p) in indexes.into_iter().zip(prepared) {
            match p {
                Ok(p) if p.new.is_none() => out.push((i, Ok(p.current))),
                Ok(p) => to_put.push((i, p)),
                Err(e) => out.push((i, Err(e))),
            }
        }
        for group in by_size(to_put, self.max_request_bytes / 2) {
            out.extend(self.put_group(writes, group).await);
        }
        out
    }

    async fn one_by_one(
        &self,
        writes: &[StatusWrite],
        indexes: Vec<usize>,
    ) -> Vec<(usize, Result<Stored>)> {
        let mut out = Vec::with_capacity(indexes.len());
        for i in indexes {
            let (kind, key, patch) = &writes[i];
            out.push((i, self.write_status(*kind, key, patch).await));
        }
        out
    }

    /// Reads every object of the batch in one transaction and applies its
    /// patch: per write, what to put, or why not.
    async fn read_batch(
        &self,
        writes: &[StatusWrite],
        indexes: &[usize],
    ) -> Result<Vec<Result<Prepared>>> {
        let gets: Vec<TxnOp> = indexes
            .iter()
            .map(|&i| TxnOp::get(self.object_key(writes[i].0, &writes[i].1), None))
            .collect();
        let resp = self.txn(Txn::new().and_then(gets)).await?;
        let found = resp.op_responses().into_iter().map(|r| match r {
            TxnOpResponse::Get(g) => g.kvs().first().cloned(),
            _ => None,
        });
        Ok(indexes
            .iter()
            .zip(found)
            .map(|(&i, kv)| self.prepare(&writes[i], kv))
            .collect())
    }

    fn prepare(
        &self,
        (kind, key, patch): &StatusWrite,
        kv: Option<etcd_client::KeyValue>,
    ) -> Result<Prepared> {
        self.manager_fields.check_status_write(*kind, patch)?;
        let Some(kv) = kv else {
            return Err(super::super::DatastoreError::NotFound {
                kind: *kind,
                key: key.clone(),
            });
        };
        let current = self.stored(*kind, &kv)?;
        let mut v = current.value.clone();
        patch.apply_to(&mut v);
        if v == current.value {
            return Ok(Prepared { current, new: None });
        }
        if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("resourceVersion");
        }
        let bytes = serde_json::to_vec(&v)?;
        self.fits(*kind, key, bytes.len())?;
        Ok(Prepared {
            current,
            new: Some((v, bytes)),
        })
    }

    /// Puts `group` in one transaction conditioned on every object's
    /// revision as read and on the fence; each on its own when that fails.
    async fn put_group(
        &self,
        writes: &[StatusWrite],
        group: Vec<(usize, Prepared)>,
    ) -> Vec<(usize, Result<Stored>)> {
        let mut when = Vec::with_capacity(group.len() + 1);
        let mut puts = Vec::with_capacity(group.len());
        for (i, p) in &group {
            let path = self.object_key(writes[*i].0, &writes[*i].1);
            when.push(Compare::mod_revision(
                path.clone(),
                CompareOp::Equal,
                p.current.revision as i64,
            ));
            let (_, bytes) = p.new.as_ref().expect("only changed objects are put");
            puts.push(TxnOp::put(path, bytes.clone(), None));
        }
        if let Some((key, term, _)) = self.fence.lock().unwrap().clone() {
            when.push(Compare::create_revision(key, CompareOp::Equal, term));
        }
        let revision = match self.txn(Txn::new().when(when).and_then(puts)).await {
            Ok(resp) if resp.succeeded() => resp.header().map(|h| h.revision()).unwrap_or_default(),
            _ => {
                return self
                    .one_by_one(writes, group.into_iter().map(|(i, _)| i).collect())
                    .await
            }
        };
        group
            .into_iter()
            .map(|(i, p)| {
                let (mut value, _) = p.new.expect("only changed objects are put");
                set_revision(&mut value, revision as u64);
                let stored = Stored {
                    kind: p.current.kind,
                    key: p.current.key,
                    revision: revision as u64,
                    value,
                };
                (i, Ok(stored))
            })
            .collect()
    }
}

/// The writes' indexes in batches of one kind each (pods, which are
/// written one by one, in batches of one), at most [`BATCH`] long.
fn batches(writes: &[StatusWrite]) -> Vec<Vec<usize>> {
    let mut out: Vec<Vec<usize>> = Vec::new();
    let mut open: std::collections::HashMap<Kind, Vec<usize>> = Default::default();
    for (i, (kind, _, _)) in writes.iter().enumerate() {
        if *kind == Kind::Pod {
            out.push(vec![i]);
            continue;
        }
        let batch = open.entry(*kind).or_default();
        batch.push(i);
        if batch.len() == BATCH {
            out.push(std::mem::take(batch));
        }
    }
    let mut rest: Vec<Vec<usize>> = open.into_values().filter(|b| !b.is_empty()).collect();
    rest.sort();
    out.extend(rest);
    out
}

/// `writes` in groups whose new objects come to at most `limit` bytes
/// (a group holds at least one).
fn by_size(writes: Vec<(usize, Prepared)>, limit: usize) -> Vec<Vec<(usize, Prepared)>> {
    let mut out: Vec<Vec<(usize, Prepared)>> = Vec::new();
    let mut bytes = 0;
    for w in writes {
        let len = w.1.new.as_ref().map_or(0, |(_, b)| b.len());
        match out.last_mut() {
            Some(group) if bytes + len <= limit => group.push(w),
            _ => {
                bytes = 0;
                out.push(vec![w]);
            }
        }
        bytes += len;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datastore::{ObjectKey, StatusPatch};

    fn write(kind: Kind, name: &str) -> StatusWrite {
        (
            kind,
            ObjectKey::cluster(name),
            StatusPatch::owning_all("m", serde_json::json!({})),
        )
    }

    #[test]
    fn batches_hold_one_kind_each_and_pods_alone() {
        let mut writes: Vec<StatusWrite> = (0..70)
            .map(|i| write(Kind::EgressTunnel, &format!("t{i}")))
            .collect();
        writes.push(write(Kind::Pod, "p"));
        writes.push(write(Kind::EgressPolicy, "e"));
        writes.push(write(Kind::EgressTunnel, "last"));
        let b = batches(&writes);
        assert_eq!(b[0], (0..64).collect::<Vec<_>>());
        assert_eq!(b[1], vec![70], "the pod alone");
        let mut rest = b[2..].to_vec();
        rest.sort_by_key(|x| x.len());
        assert_eq!(rest, vec![vec![71], vec![64, 65, 66, 67, 68, 69, 72]]);
        let mut all: Vec<usize> = b.into_iter().flatten().collect();
        all.sort();
        assert_eq!(all, (0..73).collect::<Vec<_>>(), "every write once");
    }
}
