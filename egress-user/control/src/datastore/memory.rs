//! In-memory datastore for unit tests: the same semantics as etcd
//! (revisions, conflicts, ordered watches, expiring leases), on one mutex.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use serde_json::Value;
use tokio::sync::broadcast;
use tokio::time::Instant;

use super::*;

#[derive(Default)]
struct State {
    revision: u64,
    objects: BTreeMap<(Kind, ObjectKey), Stored>,
    history: Vec<WatchEvent>,
    heartbeats: BTreeMap<String, Heartbeat>,
    leaders: BTreeMap<String, (LeaderInfo, Instant)>,
    terms: BTreeMap<String, u64>,
    events: Vec<Event>,
    uid: u64,
    /// Test hook: the next N updates/status writes fail with a conflict.
    inject_conflicts: u32,
    /// Test hook: how many more updates/status writes succeed before every
    /// one fails, as if the writer had died (`None`: no limit).
    writes_left: Option<u32>,
}

/// A fence per handle: [`MemoryDatastore::handle`] gives another handle on
/// the same data with its own fence, as a second replica would have.
type Fence = Arc<Mutex<Option<(String, u64)>>>;

/// A datastore in memory. Clones share the same state.
#[derive(Clone)]
pub struct MemoryDatastore {
    state: Arc<Mutex<State>>,
    tx: broadcast::Sender<WatchEvent>,
    fence: Fence,
    /// Nodes, pods and namespaces come from outside, as on Kubernetes:
    /// writing them is refused.
    external_records: bool,
    /// Each field manager's status fields (checked in debug builds).
    manager_fields: Arc<ManagerFields>,
}

impl Default for MemoryDatastore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryDatastore {
    pub fn new() -> Self {
        let (tx, _) = broadcast::channel(4096);
        Self {
            state: Arc::default(),
            tx,
            fence: Arc::default(),
            external_records: false,
            manager_fields: Arc::default(),
        }
    }

    /// A store whose nodes, pods and namespaces come from outside, as on
    /// Kubernetes (see [`Datastore::writes_cluster_records`]).
    pub fn with_external_records() -> Self {
        Self {
            external_records: true,
            ..Self::new()
        }
    }

    fn refuse_external(&self, kind: Kind) -> Result<()> {
        if self.external_records && !kind.is_custom() {
            return Err(DatastoreError::Other(format!(
                "{kind} objects come from the cluster itself"
            )));
        }
        Ok(())
    }

    /// Another handle on the same data with its own fence (a second replica).
    pub fn handle(&self) -> Self {
        Self {
            state: self.state.clone(),
            tx: self.tx.clone(),
            fence: Arc::default(),
            external_records: self.external_records,
            manager_fields: self.manager_fields.clone(),
        }
    }

    /// Makes the next `n` updates or status writes fail with a conflict, as
    /// if another writer had got there first (test hook).
    pub fn inject_conflicts(&self, n: u32) {
        self.state.lock().unwrap().inject_conflicts = n;
    }

    /// Lets `n` more updates or status writes through, then fails every
    /// one as a writer that died part-way would leave them (test hook);
    /// `None` lifts the limit.
    pub fn stop_writes_after(&self, n: Option<u32>) {
        self.state.lock().unwrap().writes_left = n;
    }

    fn commit(&self, st: &mut State, ev: WatchEvent) {
        st.history.push(ev.clone());
        let _ = self.tx.send(ev);
    }

    /// The failures the test hooks ask for, before a write.
    fn injected_failure(st: &mut State, kind: Kind, key: &ObjectKey, rev: u64) -> Result<()> {
        match &mut st.writes_left {
            Some(0) => {
                return Err(DatastoreError::Other(format!(
                    "{kind} {key}: the writer stopped (test hook)"
                )))
            }
            Some(n) => *n -= 1,
            None => {}
        }
        if st.inject_conflicts > 0 {
            st.inject_conflicts -= 1;
            return Err(DatastoreError::Conflict {
                kind,
                key: key.clone(),
                expected: rev,
                found: rev + 1,
            });
        }
        Ok(())
    }
}

#[async_trait]
impl Datastore for MemoryDatastore {
    fn writes_cluster_records(&self) -> bool {
        !self.external_records
    }

    async fn list(&self, kind: Kind) -> Result<(Vec<Stored>, u64)> {
        let st = self.state.lock().unwrap();
        let items = st
            .objects
            .iter()
            .filter(|((k, _), _)| *k == kind)
            .map(|(_, s)| s.clone())
            .collect();
        Ok((items, st.revision))
    }

    async fn watch(&self, kind: Kind, revision: u64) -> Result<WatchStream> {
        let (backlog, rx) = {
            let st = self.state.lock().unwrap();
            let rx = self.tx.subscribe();
            let backlog: Vec<WatchEvent> = st
                .history
                .iter()
                .filter(|e| e.revision() > revision)
                .cloned()
                .collect();
            (backlog, rx)
        };
        let last = backlog.last().map(|e| e.revision()).unwrap_or(revision);
        let live = tokio_stream_from(rx).filter(move |e| {
            futures::future::ready(e.as_ref().map(|e| e.revision() > last).unwrap_or(true))
        });
        let all = futures::stream::iter(backlog.into_iter().map(Ok)).chain(live);
        Ok(all
            .filter(move |e| {
                let keep = match e {
                    Ok(WatchEvent::Put(s)) => s.kind == kind,
                    Ok(WatchEvent::Deleted { kind: k, .. }) => *k == kind,
                    Err(_) => true,
                };
                futures::future::ready(keep)
            })
            .boxed())
    }

    async fn get(&self, kind: Kind, key: &ObjectKey) -> Result<Option<Stored>> {
        let st = self.state.lock().unwrap();
        Ok(st.objects.get(&(kind, key.clone())).cloned())
    }

    async fn create(&self, kind: Kind, mut object: Value) -> Result<Stored> {
        self.refuse_external(kind)?;
        let key = key_of(kind, &object)?;
        let mut st = self.state.lock().unwrap();
        if st.objects.contains_key(&(kind, key.clone())) {
            return Err(DatastoreError::AlreadyExists { kind, key });
        }
        st.uid += 1;
        stamp_new(&mut object, format!("mem-{}", st.uid));
        st.revision += 1;
        let revision = st.revision;
        set_revision(&mut object, revision);
        let s = Stored {
            kind,
            key: key.clone(),
            revision,
            value: object,
        };
        st.objects.insert((kind, key), s.clone());
        self.commit(&mut st, WatchEvent::Put(s.clone()));
        Ok(s)
    }

    async fn update(&self, kind: Kind, mut object: Value, revision: u64) -> Result<Stored> {
        self.refuse_external(kind)?;
        let key = key_of(kind, &object)?;
        let mut st = self.state.lock().unwrap();
        let Some(cur) = st.objects.get(&(kind, key.clone())).cloned() else {
            return Err(DatastoreError::NotFound { kind, key });
        };
        Self::injected_failure(&mut st, kind, &key, revision)?;
        if cur.revision != revision {
            return Err(DatastoreError::Conflict {
                kind,
                key,
                expected: revision,
                found: cur.revision,
            });
        }
        keep_server_fields(&cur.value, &mut object);
        st.revision += 1;
        let rev = st.revision;
        set_revision(&mut object, rev);
        let s = Stored {
            kind,
            key: key.clone(),
            revision: rev,
            value: object,
        };
        st.objects.insert((kind, key), s.clone());
        self.commit(&mut st, WatchEvent::Put(s.clone()));
        Ok(s)
    }

    async fn delete(&self, kind: Kind, key: &ObjectKey, revision: Option<u64>) -> Result<()> {
        self.refuse_external(kind)?;
        let mut st = self.state.lock().unwrap();
        let Some(cur) = st.objects.get(&(kind, key.clone())) else {
            return Err(DatastoreError::NotFound {
                kind,
                key: key.clone(),
            });
        };
        if let Some(r) = revision {
            if cur.revision != r {
                return Err(DatastoreError::Conflict {
                    kind,
                    key: key.clone(),
                    expected: r,
                    found: cur.revision,
                });
            }
        }
        st.objects.remove(&(kind, key.clone()));
        st.revision += 1;
        let revision = st.revision;
        self.commit(
            &mut st,
            WatchEvent::Deleted {
                kind,
                key: key.clone(),
                revision,
            },
        );
        Ok(())
    }

    async fn write_status(
        &self,
        kind: Kind,
        key: &ObjectKey,
        patch: &StatusPatch,
    ) -> Result<Stored> {
        self.manager_fields.check_status_write(kind, patch)?;
        let mut st = self.state.lock().unwrap();
        let fence = self.fence.lock().unwrap().clone();
        if let Some((election, term)) = fence {
            let now = Instant::now();
            let ok = st
                .leaders
                .get(&election)
                .is_some_and(|(i, until)| i.term == term && *until > now);
            if !ok {
                return Err(DatastoreError::LostLeadership { election });
            }
        }
        let Some(cur) = st.objects.get(&(kind, key.clone())).cloned() else {
            return Err(DatastoreError::NotFound {
                kind,
                key: key.clone(),
            });
        };
        Self::injected_failure(&mut st, kind, key, cur.revision)?;
        let mut value = cur.value.clone();
        patch.apply_to(&mut value);
        if value == cur.value {
            return Ok(cur);
        }
        st.revision += 1;
        let rev = st.revision;
        set_revision(&mut value, rev);
        let s = Stored {
            kind,
            key: key.clone(),
            revision: rev,
            value,
        };
        st.objects.insert((kind, key.clone()), s.clone());
        self.commit(&mut st, WatchEvent::Put(s.clone()));
        Ok(s)
    }

    async fn renew_heartbeat(&self, node: &str, _ttl: Duration) -> Result<Heartbeat> {
        let mut st = self.state.lock().unwrap();
        let counter = st.heartbeats.get(node).map(|h| h.counter + 1).unwrap_or(1);
        let hb = Heartbeat {
            node: node.into(),
            counter,
            renew_time: now_rfc3339(),
        };
        st.heartbeats.insert(node.into(), hb.clone());
        Ok(hb)
    }

    async fn forget_heartbeat(&self, node: &str) -> Result<()> {
        self.state.lock().unwrap().heartbeats.remove(node);
        Ok(())
    }

    async fn heartbeats(&self) -> Result<Vec<Heartbeat>> {
        Ok(self
            .state
            .lock()
            .unwrap()
            .heartbeats
            .values()
            .cloned()
            .collect())
    }

    async fn try_acquire(
        &self,
        election: &str,
        identity: &str,
        ttl: Duration,
    ) -> Result<Option<Leadership>> {
        let mut st = self.state.lock().unwrap();
        let now = Instant::now();
        if let Some((info, until)) = st.leaders.get(election) {
            if *until > now && info.identity != identity {
                return Ok(None);
            }
            if *until > now && info.identity == identity {
                let term = info.term;
                st.leaders.get_mut(election).unwrap().1 = now + ttl;
                return Ok(Some(Leadership {
                    election: election.into(),
                    identity: identity.into(),
                    term,
                    ttl,
                    token: 0,
                }));
            }
        }
        let term = st.terms.get(election).copied().unwrap_or(0) + 1;
        st.terms.insert(election.into(), term);
        st.leaders.insert(
            election.into(),
            (
                LeaderInfo {
                    identity: identity.into(),
                    term,
                },
                now + ttl,
            ),
        );
        Ok(Some(Leadership {
            election: election.into(),
            identity: identity.into(),
            term,
            ttl,
            token: 0,
        }))
    }

    async fn renew_leadership(&self, lead: &Leadership) -> Result<()> {
        let mut st = self.state.lock().unwrap();
        let now = Instant::now();
        match st.leaders.get_mut(&lead.election) {
            Some((info, until)) if info.term == lead.term && *until > now => {
                *until = now + lead.ttl;
                Ok(())
            }
            _ => Err(DatastoreError::LostLeadership {
                election: lead.election.clone(),
            }),
        }
    }

    async fn resign(&self, lead: &Leadership) -> Result<()> {
        let mut st = self.state.lock().unwrap();
        if st
            .leaders
            .get(&lead.election)
            .is_some_and(|(i, _)| i.term == lead.term)
        {
            st.leaders.remove(&lead.election);
        }
        Ok(())
    }

    async fn leader(&self, election: &str) -> Result<Option<LeaderInfo>> {
        let st = self.state.lock().unwrap();
        let now = Instant::now();
        Ok(st
            .leaders
            .get(election)
            .filter(|(_, until)| *until > now)
            .map(|(i, _)| i.clone()))
    }

    async fn record_event(&self, mut event: Event) -> Result<()> {
        if event.time.is_empty() {
            event.time = now_rfc3339();
        }
        self.state.lock().unwrap().events.push(event);
        Ok(())
    }

    async fn events(&self) -> Result<Vec<Event>> {
        Ok(self.state.lock().unwrap().events.clone())
    }

    async fn fence(&self, lead: Option<&Leadership>) -> Result<()> {
        *self.fence.lock().unwrap() = lead.map(|l| (l.election.clone(), l.term));
        Ok(())
    }
}

/// An update never changes status, uid or creation time: they are carried over.
pub(crate) fn keep_server_fields(cur: &Value, new: &mut Value) {
    let obj = new.as_object_mut().expect("objects are JSON maps");
    match cur.get("status") {
        Some(s) => {
            obj.insert("status".into(), s.clone());
        }
        None => {
            obj.remove("status");
        }
    }
    if let (Some(cm), Some(nm)) = (
        cur.get("metadata").and_then(Value::as_object),
        obj.get_mut("metadata").and_then(Value::as_object_mut),
    ) {
        for f in ["uid", "creationTimestamp"] {
            if let Some(v) = cm.get(f) {
                nm.insert(f.into(), v.clone());
            }
        }
    }
}

fn tokio_stream_from(
    rx: broadcast::Receiver<WatchEvent>,
) -> impl futures::Stream<Item = Result<WatchEvent>> {
    futures::stream::unfold(rx, |mut rx| async move {
        match rx.recv().await {
            Ok(e) => Some((Ok(e), rx)),
            Err(broadcast::error::RecvError::Lagged(n)) => {
                Some((Err(DatastoreError::Compacted(n)), rx))
            }
            Err(broadcast::error::RecvError::Closed) => None,
        }
    })
}
