//! etcd backend: the same objects as JSON under a key prefix.
//!
//! Layout under `PREFIX`:
//! - `PREFIX/objects/<plural>/<name>` (cluster kinds) and
//!   `PREFIX/objects/<plural>/<namespace>/<name>`: the object JSON; its
//!   revision is the key's mod revision.
//! - `PREFIX/heartbeats/<node>`: last renewal; the key's version is the counter.
//! - `PREFIX/leaders/<election>`: the leader's identity, attached to its
//!   lease; the key's create revision is the term.
//! - `PREFIX/events/<time>-<n>`: events, attached to a lease of an hour
//!   and a minute that each handle shares among the events of a minute.
//! - `PREFIX/pod-index/<node>/<namespace>/<name>`: pods by node (see
//!   [`pod_index`]).

mod batch;
mod paged;
mod pod_index;
mod size;

pub use size::DEFAULT_MAX_REQUEST_BYTES;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{
    Client, Compare, CompareOp, EventType, GetOptions, KeyValue, PutOptions, Txn, TxnOp,
    WatchOptions,
};
use futures::StreamExt;
use serde_json::Value;

use super::memory::keep_server_fields;
use super::*;

pub struct EtcdDatastore {
    client: Client,
    prefix: String,
    seq: AtomicU64,
    /// (leader key, term, election) every status write is conditioned on.
    fence: std::sync::Mutex<Option<(String, i64, String)>>,
    /// Lists and watches of pods cover this node's only (an agent's handle).
    pod_node: Option<String>,
    /// Whether they come from the pod index (decided by each pod list).
    pod_index_used: std::sync::Mutex<bool>,
    /// Each field manager's status fields (checked in debug builds).
    manager_fields: ManagerFields,
    /// etcd's `--max-request-bytes` (see [`size`]).
    max_request_bytes: usize,
    /// The lease events are attached to, and when it was granted (see
    /// [`EtcdDatastore::event_lease`]).
    event_lease: std::sync::Mutex<Option<(i64, std::time::Instant)>>,
}

/// How long an event is kept at least.
const EVENT_TTL: Duration = Duration::from_secs(3600);
/// How long one lease takes new events: a lease per event was a second
/// write to the cluster for every event (a cold start records thousands).
/// Each event then lives between [`EVENT_TTL`] and this much longer.
const EVENT_LEASE_SHARED: Duration = Duration::from_secs(60);

/// Attempts of a request, in all, while the member the client's balancer
/// picks answers Unavailable.
const ATTEMPTS: u32 = 10;

/// Attempts while a member refuses for want of a leader. The balancer
/// compares two members at random and takes the less busy one, and a
/// member without quorum, refusing at once, is never busy: with one of
/// three cut off, about two attempts in three land on it. Thirty make a
/// run of refusals only (2/3)^30, about 5e-6, where ten (1.7 %) failed a
/// leader renewal in a whole test run now and then.
const NO_LEADER_ATTEMPTS: u32 = 30;

/// gRPC code 14, Unavailable: with `require_leader`, a member cut off from
/// its quorum answers "etcdserver: no leader" at once, and the balancer may
/// pick another member next; a member that is down answers it too.
fn unavailable(e: &DatastoreError) -> bool {
    matches!(e, DatastoreError::Etcd(etcd_client::Error::GRpcStatus(s)) if i32::from(s.code()) == 14)
}

/// The member refused the request before handling it: etcd checks for a
/// leader (`require_leader`) ahead of the request's handler, so nothing of
/// it was applied and sending it again is safe for any write.
fn refused_unapplied(e: &DatastoreError) -> bool {
    matches!(e, DatastoreError::Etcd(etcd_client::Error::GRpcStatus(s))
        if i32::from(s.code()) == 14 && s.message() == "etcdserver: no leader")
}

/// Runs a request again while it fails with an error `retry` accepts, up
/// to [`ATTEMPTS`] in all ([`NO_LEADER_ATTEMPTS`] while members refuse for
/// want of a leader, each after a short wait: 10 ms, 20 ms, ... up to
/// 100 ms, under 2.5 s in all, rather than hammering the members).
async fn retry_while<T, F, Fut>(retry: fn(&DatastoreError) -> bool, op: F) -> Result<T>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let mut attempt = 1;
    loop {
        match op().await {
            Err(e) if refused_unapplied(&e) && retry(&e) && attempt < NO_LEADER_ATTEMPTS => {
                let wait = (10 * u64::from(attempt)).min(100);
                tokio::time::sleep(std::time::Duration::from_millis(wait)).await;
                attempt += 1;
            }
            Err(e) if !refused_unapplied(&e) && attempt < ATTEMPTS && retry(&e) => attempt += 1,
            r => return r,
        }
    }
}

/// For requests that are the same however often they are sent (reads, new
/// watches, renewals): again on any Unavailable. A write that failed on
/// the way back may have been applied, so writes use [`again_unapplied`].
async fn again<T, F, Fut>(op: F) -> Result<T>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    retry_while(unavailable, op).await
}

/// For writes: again only when the member refused the request unapplied
/// (a member without quorum: one in three requests while one of three
/// members is cut off, before this).
async fn again_unapplied<T, F, Fut>(op: F) -> Result<T>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    retry_while(refused_unapplied, op).await
}

impl EtcdDatastore {
    /// Connects to `endpoints` (e.g. `http://127.0.0.1:2379`); every key
    /// lives under `prefix` (e.g. `/egress`).
    pub async fn connect(endpoints: &[String], prefix: &str) -> Result<Self> {
        // `require_leader`: a member cut off from its quorum cancels our
        // watches instead of keeping them open with no events, so the
        // agents and the controller see the error and list again elsewhere.
        let opts = etcd_client::ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(5))
            .with_timeout(Duration::from_secs(10))
            .with_require_leader(true);
        let client = Client::connect(endpoints, Some(opts)).await?;
        Ok(Self {
            client,
            prefix: prefix.trim_end_matches('/').to_string(),
            seq: AtomicU64::new(0),
            fence: std::sync::Mutex::new(None),
            pod_node: None,
            pod_index_used: std::sync::Mutex::new(false),
            manager_fields: ManagerFields::default(),
            max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
            event_lease: std::sync::Mutex::new(None),
        })
    }

    /// The lease for an event written now: the last one while it is young
    /// enough, else a new one. Two writers may both grant one; the spare is
    /// dropped by etcd when it expires.
    async fn event_lease(&self) -> Result<i64> {
        let now = std::time::Instant::now();
        let young = |granted: std::time::Instant| now.duration_since(granted) < EVENT_LEASE_SHARED;
        if let Some((id, granted)) = *self.event_lease.lock().unwrap() {
            if young(granted) {
                return Ok(id);
            }
        }
        let ttl = EVENT_TTL + EVENT_LEASE_SHARED;
        let id = self.lease(ttl.as_secs() as i64).await?;
        *self.event_lease.lock().unwrap() = Some((id, now));
        Ok(id)
    }

    /// A handle whose pod lists and watches cover `node`'s pods only (the
    /// agent's: its maps hold no other), once the pod index is complete.
    pub fn pods_of_node(mut self, node: impl Into<String>) -> Self {
        self.pod_node = Some(node.into());
        self
    }

    /// Where `kind`'s objects are listed (`listing`) and watched from by
    /// this handle.
    async fn read_prefix(&self, kind: Kind, listing: bool) -> Result<String> {
        if kind == Kind::Pod {
            if let Some(node) = self.pods_from_index(listing).await? {
                return Ok(self.pod_index_prefix(node));
            }
        }
        Ok(self.kind_prefix(kind))
    }

    fn kind_prefix(&self, kind: Kind) -> String {
        format!("{}/objects/{}/", self.prefix, kind.plural())
    }

    fn object_key(&self, kind: Kind, key: &ObjectKey) -> String {
        if kind.namespaced() {
            format!("{}{}/{}", self.kind_prefix(kind), key.namespace, key.name)
        } else {
            format!("{}{}", self.kind_prefix(kind), key.name)
        }
    }

    fn stored(&self, kind: Kind, kv: &KeyValue) -> Result<Stored> {
        let mut value: Value = serde_json::from_slice(kv.value())?;
        let revision = kv.mod_revision() as u64;
        set_revision(&mut value, revision);
        let key = key_of(kind, &value)?;
        Ok(Stored {
            kind,
            key,
            revision,
            value,
        })
    }

    fn client(&self) -> Client {
        self.client.clone()
    }

    /// One check that the leader key is still ours, and one keep-alive.
    async fn renew_leadership_once(&self, lead: &Leadership) -> Result<()> {
        let lost = || DatastoreError::LostLeadership {
            election: lead.election.clone(),
        };
        let mut c = self.client();
        let path = format!("{}/leaders/{}", self.prefix, lead.election);
        let resp = c.get(path, None).await?;
        match resp.kvs().first() {
            Some(kv) if kv.create_revision() as u64 == lead.term && kv.lease() == lead.token => {}
            _ => return Err(lost()),
        }
        let (mut keeper, mut stream) = match c.lease_keep_alive(lead.token).await {
            Ok(k) => k,
            Err(e) if e.to_string().contains("not found") => return Err(lost()),
            Err(e) => return Err(e.into()),
        };
        keeper.keep_alive().await?;
        match stream.message().await {
            Ok(Some(r)) if r.ttl() > 0 => Ok(()),
            Ok(_) => Err(lost()),
            Err(e) if e.to_string().contains("not found") => Err(lost()),
            Err(e) => Err(e.into()),
        }
    }

    /// A range read of `key` (a prefix with `prefix`), tried again while
    /// members answer Unavailable (see [`again`]).
    async fn range(&self, key: String, prefix: bool) -> Result<etcd_client::GetResponse> {
        let opts = prefix.then(|| GetOptions::new().with_prefix());
        again(|| {
            let (mut c, key, opts) = (self.client(), key.clone(), opts.clone());
            async move { Ok(c.get(key, opts).await?) }
        })
        .await
    }

    /// A transaction, sent again while a member refuses it unapplied.
    async fn txn(&self, txn: Txn) -> Result<etcd_client::TxnResponse> {
        again_unapplied(|| {
            let (mut c, txn) = (self.client(), txn.clone());
            async move { Ok(c.txn(txn).await?) }
        })
        .await
    }

    /// A lease of `secs` seconds. Granted again on any Unavailable: a lease
    /// granted twice leaves one unused, which etcd drops when it expires.
    async fn lease(&self, secs: i64) -> Result<i64> {
        again(|| {
            let mut c = self.client();
            async move { Ok(c.lease_grant(secs, None).await?.id()) }
        })
        .await
    }

    /// Read, change, compare-and-swap on the mod revision; again on a race.
    async fn modify(
        &self,
        kind: Kind,
        key: &ObjectKey,
        mut f: impl FnMut(&Stored) -> Result<Option<Value>>,
    ) -> Result<Stored> {
        let path = self.object_key(kind, key);
        for _ in 0..16 {
            let Some(cur) = self.get(kind, key).await? else {
                return Err(DatastoreError::NotFound {
                    kind,
                    key: key.clone(),
                });
            };
            let Some(mut new) = f(&cur)? else {
                return Ok(cur);
            };
            if let Some(m) = new.get_mut("metadata").and_then(Value::as_object_mut) {
                m.remove("resourceVersion");
            }
            let mut when = vec![Compare::mod_revision(
                path.clone(),
                CompareOp::Equal,
                cur.revision as i64,
            )];
            let fence = self.fence.lock().unwrap().clone();
            if let Some((key, term, _)) = &fence {
                when.push(Compare::create_revision(
                    key.clone(),
                    CompareOp::Equal,
                    *term,
                ));
            }
            let bytes = serde_json::to_vec(&new)?;
            self.fits(kind, key, bytes.len())?;
            let mut ops = self.pod_index_ops(kind, key, Some(&cur.value), Some((&new, &bytes)));
            ops.push(TxnOp::put(path.clone(), bytes, None));
            let resp = self.txn(Txn::new().when(when).and_then(ops)).await?;
            if !resp.succeeded() {
                if let Some((key, term, election)) = fence {
                    let r = self.range(key, false).await?;
                    if r.kvs().first().map(|kv| kv.create_revision()) != Some(term) {
                        return Err(DatastoreError::LostLeadership { election });
                    }
                }
            }
            if resp.succeeded() {
                let rev = resp.header().map(|h| h.revision()).unwrap_or_default() as u64;
                set_revision(&mut new, rev);
                return Ok(Stored {
                    kind,
                    key: key.clone(),
                    revision: rev,
                    value: new,
                });
            }
        }
        Err(DatastoreError::Other(format!(
            "{kind} {key}: too many concurrent writers"
        )))
    }
}

#[async_trait]
impl Datastore for EtcdDatastore {
    async fn list(&self, kind: Kind) -> Result<(Vec<Stored>, u64)> {
        let resp = self
            .range_prefix(self.read_prefix(kind, true).await?)
            .await?;
        let rev = resp.revision as u64;
        let items = resp
            .kvs()
            .iter()
            .map(|kv| self.stored(kind, kv))
            .collect::<Result<Vec<_>>>()?;
        Ok((items, rev))
    }

    async fn watch(&self, kind: Kind, revision: u64) -> Result<WatchStream> {
        let opts = WatchOptions::new()
            .with_prefix()
            .with_start_revision(revision as i64 + 1);
        let prefix = self.read_prefix(kind, false).await?;
        let stream = again(|| {
            let (mut c, key, opts) = (self.client(), prefix.clone(), opts.clone());
            async move { Ok(c.watch(key, Some(opts)).await?) }
        })
        .await?;
        let me = KeyMapper {
            prefix,
            namespaced: kind.namespaced(),
        };
        Ok(stream
            .flat_map(move |resp| {
                let out: Vec<Result<WatchEvent>> = match resp {
                    Err(e) => vec![Err(e.into())],
                    Ok(r) if r.compact_revision() > 0 => {
                        vec![Err(DatastoreError::Compacted(r.compact_revision() as u64))]
                    }
                    Ok(r) => r
                        .events()
                        .iter()
                        .filter_map(|ev| {
                            let kv = ev.kv()?;
                            let revision = kv.mod_revision() as u64;
                            Some(match ev.event_type() {
                                EventType::Put => (|| {
                                    let mut value: Value = serde_json::from_slice(kv.value())?;
                                    set_revision(&mut value, revision);
                                    Ok(WatchEvent::Put(Stored {
                                        kind,
                                        key: key_of(kind, &value)?,
                                        revision,
                                        value,
                                    }))
                                })(),
                                EventType::Delete => Ok(WatchEvent::Deleted {
                                    kind,
                                    key: me.key(kv.key()),
                                    revision,
                                }),
                            })
                        })
                        .collect(),
                };
                futures::stream::iter(out)
            })
            .boxed())
    }

    async fn get(&self, kind: Kind, key: &ObjectKey) -> Result<Option<Stored>> {
        let resp = self.range(self.object_key(kind, key), false).await?;
        resp.kvs()
            .first()
            .map(|kv| self.stored(kind, kv))
            .transpose()
    }

    async fn create(&self, kind: Kind, mut object: Value) -> Result<Stored> {
        let key = key_of(kind, &object)?;
        let path = self.object_key(kind, &key);
        let uid = format!(
            "etcd-{}-{}",
            chrono::Utc::now().timestamp_nanos_opt().unwrap_or_default(),
            self.seq.fetch_add(1, Ordering::Relaxed)
        );
        stamp_new(&mut object, uid);
        if let Some(m) = object.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("resourceVersion");
        }
        let bytes = serde_json::to_vec(&object)?;
        self.fits(kind, &key, bytes.len())?;
        let mut ops = self.pod_index_ops(kind, &key, None, Some((&object, &bytes)));
        ops.push(TxnOp::put(path.clone(), bytes, None));
        let txn = Txn::new()
            .when([Compare::create_revision(path, CompareOp::Equal, 0)])
            .and_then(ops);
        let resp = self.txn(txn).await?;
        if !resp.succeeded() {
            return Err(DatastoreError::AlreadyExists { kind, key });
        }
        let revision = resp.header().map(|h| h.revision()).unwrap_or_default() as u64;
        set_revision(&mut object, revision);
        Ok(Stored {
            kind,
            key,
            revision,
            value: object,
        })
    }

    async fn update(&self, kind: Kind, object: Value, revision: u64) -> Result<Stored> {
        let key = key_of(kind, &object)?;
        let mut first = true;
        self.modify(kind, &key, |cur| {
            // Only the caller's revision counts: a race after our read is a
            // conflict too, never a silent retry.
            if cur.revision != revision || !first {
                return Err(DatastoreError::Conflict {
                    kind,
                    key: key.clone(),
                    expected: revision,
                    found: cur.revision,
                });
            }
            first = false;
            let mut new = object.clone();
            keep_server_fields(&cur.value, &mut new);
            Ok(Some(new))
        })
        .await
    }

    fn check_size(&self, kind: Kind, object: &Value, current: Option<&Stored>) -> Result<()> {
        self.check_object_size(kind, object, current)
    }

    async fn delete(&self, kind: Kind, key: &ObjectKey, revision: Option<u64>) -> Result<()> {
        let path = self.object_key(kind, key);
        // A pod's index entry goes with it: its node comes from the stored
        // pod, deleted only while still that version.
        let mut attempts = 16;
        let resp = loop {
            let (cmp, index_ops) = if kind == Kind::Pod {
                let Some(cur) = self.get(kind, key).await? else {
                    return Err(DatastoreError::NotFound {
                        kind,
                        key: key.clone(),
                    });
                };
                let at = revision.unwrap_or(cur.revision) as i64;
                let cmp = Compare::mod_revision(path.clone(), CompareOp::Equal, at);
                (cmp, self.pod_index_ops(kind, key, Some(&cur.value), None))
            } else {
                let cmp = match revision {
                    Some(r) => Compare::mod_revision(path.clone(), CompareOp::Equal, r as i64),
                    None => Compare::create_revision(path.clone(), CompareOp::Greater, 0),
                };
                (cmp, Vec::new())
            };
            let mut ops = index_ops;
            ops.push(TxnOp::delete(path.clone(), None));
            let txn = Txn::new()
                .when([cmp])
                .and_then(ops)
                .or_else([TxnOp::get(path.clone(), None)]);
            let resp = self.txn(txn).await?;
            attempts -= 1;
            // A pod changed between the read and the delete: read it again.
            if resp.succeeded() || revision.is_some() || kind != Kind::Pod || attempts == 0 {
                break resp;
            }
        };
        if resp.succeeded() {
            return Ok(());
        }
        let found = resp.op_responses().into_iter().find_map(|r| match r {
            etcd_client::TxnOpResponse::Get(g) => {
                g.kvs().first().map(|kv| kv.mod_revision() as u64)
            }
            _ => None,
        });
        match found {
            None => Err(DatastoreError::NotFound {
                kind,
                key: key.clone(),
            }),
            Some(found) => Err(DatastoreError::Conflict {
                kind,
                key: key.clone(),
                expected: revision.unwrap_or_default(),
                found,
            }),
        }
    }

    async fn write_status(
        &self,
        kind: Kind,
        key: &ObjectKey,
        patch: &StatusPatch,
    ) -> Result<Stored> {
        self.manager_fields.check_status_write(kind, patch)?;
        self.modify(kind, key, |cur| {
            let mut v = cur.value.clone();
            patch.apply_to(&mut v);
            Ok((v != cur.value).then_some(v))
        })
        .await
    }

    async fn write_statuses(&self, writes: &[StatusWrite]) -> Vec<Result<Stored>> {
        self.write_statuses_batched(writes).await
    }

    async fn renew_heartbeat(&self, node: &str, _ttl: Duration) -> Result<Heartbeat> {
        let path = format!("{}/heartbeats/{node}", self.prefix);
        let renew_time = now_rfc3339();
        // A renewal is the same put however often it is sent: tried again,
        // so a member without quorum does not fence a gateway.
        let txn = Txn::new().and_then([
            TxnOp::put(path.clone(), renew_time.clone(), None),
            TxnOp::get(path, None),
        ]);
        let resp = again(|| {
            let (mut c, txn) = (self.client(), txn.clone());
            async move { Ok(c.txn(txn).await?) }
        })
        .await?;
        let counter = resp
            .op_responses()
            .into_iter()
            .find_map(|r| match r {
                etcd_client::TxnOpResponse::Get(g) => g.kvs().first().map(|kv| kv.version() as u64),
                _ => None,
            })
            .unwrap_or(1);
        Ok(Heartbeat {
            node: node.into(),
            counter,
            renew_time,
        })
    }

    async fn forget_heartbeat(&self, node: &str) -> Result<()> {
        let path = format!("{}/heartbeats/{node}", self.prefix);
        self.txn(Txn::new().and_then([TxnOp::delete(path, None)]))
            .await?;
        Ok(())
    }

    async fn heartbeats(&self) -> Result<Vec<Heartbeat>> {
        let p = format!("{}/heartbeats/", self.prefix);
        let resp = self.range_prefix(p.clone()).await?;
        Ok(resp
            .kvs()
            .iter()
            .map(|kv| Heartbeat {
                node: String::from_utf8_lossy(kv.key())
                    .strip_prefix(&p)
                    .unwrap_or_default()
                    .to_string(),
                counter: kv.version() as u64,
                renew_time: String::from_utf8_lossy(kv.value()).into_owned(),
            })
            .collect())
    }

    async fn try_acquire(
        &self,
        election: &str,
        identity: &str,
        ttl: Duration,
    ) -> Result<Option<Leadership>> {
        let path = format!("{}/leaders/{election}", self.prefix);
        let secs = ttl.as_secs_f64().ceil().max(1.0) as i64;
        let mut c = self.client();
        let lease = self.lease(secs).await?;
        let txn = Txn::new()
            .when([Compare::create_revision(path.clone(), CompareOp::Equal, 0)])
            .and_then([
                TxnOp::put(
                    path.clone(),
                    identity,
                    Some(PutOptions::new().with_lease(lease)),
                ),
                TxnOp::get(path.clone(), None),
            ])
            .or_else([TxnOp::get(path, None)]);
        let resp = self.txn(txn).await?;
        let kv = resp.op_responses().into_iter().find_map(|r| match r {
            etcd_client::TxnOpResponse::Get(g) => g.kvs().first().cloned(),
            _ => None,
        });
        let Some(kv) = kv else {
            let _ = c.lease_revoke(lease).await;
            return Ok(None);
        };
        if resp.succeeded() {
            return Ok(Some(Leadership {
                election: election.into(),
                identity: identity.into(),
                term: kv.create_revision() as u64,
                ttl,
                token: lease,
            }));
        }
        let _ = c.lease_revoke(lease).await;
        if kv.value() == identity.as_bytes() {
            // Ours from before (same identity): keep using its lease.
            return Ok(Some(Leadership {
                election: election.into(),
                identity: identity.into(),
                term: kv.create_revision() as u64,
                ttl,
                token: kv.lease(),
            }));
        }
        Ok(None)
    }

    async fn renew_leadership(&self, lead: &Leadership) -> Result<()> {
        // The same however often it is sent: tried again, so a member
        // without quorum does not cost the leader its term.
        again(|| self.renew_leadership_once(lead)).await
    }

    async fn resign(&self, lead: &Leadership) -> Result<()> {
        let path = format!("{}/leaders/{}", self.prefix, lead.election);
        self.txn(
            Txn::new()
                .when([Compare::create_revision(
                    path.clone(),
                    CompareOp::Equal,
                    lead.term as i64,
                )])
                .and_then([TxnOp::delete(path, None)]),
        )
        .await?;
        let _ = self.client().lease_revoke(lead.token).await;
        Ok(())
    }

    async fn leader(&self, election: &str) -> Result<Option<LeaderInfo>> {
        let path = format!("{}/leaders/{election}", self.prefix);
        let resp = self.range(path, false).await?;
        Ok(resp.kvs().first().map(|kv| LeaderInfo {
            identity: String::from_utf8_lossy(kv.value()).into_owned(),
            term: kv.create_revision() as u64,
        }))
    }

    async fn record_event(&self, mut event: Event) -> Result<()> {
        if event.time.is_empty() {
            event.time = now_rfc3339();
        }
        let path = format!(
            "{}/events/{:020}-{:06}",
            self.prefix,
            chrono::Utc::now().timestamp_nanos_opt().unwrap_or_default(),
            self.seq.fetch_add(1, Ordering::Relaxed) % 1_000_000
        );
        let lease = self.event_lease().await?;
        let put = TxnOp::put(
            path,
            serde_json::to_vec(&event)?,
            Some(PutOptions::new().with_lease(lease)),
        );
        if let Err(e) = self.txn(Txn::new().and_then([put])).await {
            // Perhaps the lease is gone (a datastore restored from nothing):
            // the next event grants a new one.
            *self.event_lease.lock().unwrap() = None;
            return Err(e);
        }
        Ok(())
    }

    async fn complete_indexes(&self) -> Result<()> {
        let copied = self.complete_pod_index().await?;
        if copied > 0 {
            tracing::info!(copied, "pods written before the pod index copied into it");
        }
        Ok(())
    }

    async fn fence(&self, lead: Option<&Leadership>) -> Result<()> {
        *self.fence.lock().unwrap() = lead.map(|l| {
            (
                format!("{}/leaders/{}", self.prefix, l.election),
                l.term as i64,
                l.election.clone(),
            )
        });
        Ok(())
    }

    async fn events(&self) -> Result<Vec<Event>> {
        let p = format!("{}/events/", self.prefix);
        let resp = self.range_prefix(p).await?;
        resp.kvs()
            .iter()
            .map(|kv| Ok(serde_json::from_slice(kv.value())?))
            .collect()
    }
}

struct KeyMapper {
    prefix: String,
    namespaced: bool,
}

impl KeyMapper {
    fn key(&self, path: &[u8]) -> ObjectKey {
        let p = String::from_utf8_lossy(path);
        let rest = p.strip_prefix(&self.prefix).unwrap_or(&p);
        match rest.split_once('/') {
            Some((ns, name)) if self.namespaced => ObjectKey::namespaced(ns, name),
            _ => ObjectKey::cluster(rest),
        }
    }
}
