//! Kubernetes backend: the custom resources through the API server,
//! nodes/pods/namespaces read from core/v1, status by server-side apply,
//! coordination.k8s.io Leases for leader election and heartbeats, core/v1
//! Events.
//!
//! Objects travel as JSON (`DynamicObject`), so this backend and the others
//! share one code path above the trait. Revisions are resourceVersions (the
//! API server's etcd revisions, hence numbers).

use std::time::Duration;

use ::kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
    Preconditions, WatchParams,
};
use ::kube::core::{GroupVersionKind, WatchEvent as KubeWatchEvent};
use ::kube::Client;
use async_trait::async_trait;
use futures::{StreamExt, TryStreamExt};
use serde_json::{json, Value};

use super::*;
use crate::api::{GROUP, VERSION};

mod size;

/// Label on heartbeat Leases.
pub const HEARTBEAT_LABEL: &str = "egress.dev/heartbeat";
/// Field manager / reporting component.
pub const COMPONENT: &str = "egress-controller";

pub struct KubeDatastore {
    client: Client,
    /// Namespace of the Leases and of events about cluster-scoped objects.
    namespace: String,
    /// Retries of a status write that the API server answered with 409.
    pub status_retries: u32,
    /// Pods of this node only (an agent's view): lists and watches of pods
    /// carry `fieldSelector=spec.nodeName=NODE`, so the API server sends
    /// each agent its own node's pods rather than the cluster's.
    pod_node: Option<String>,
}

fn api_resource(kind: Kind) -> ApiResource {
    if kind.is_custom() {
        ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(GROUP, VERSION, kind.name()),
            kind.plural(),
        )
    } else {
        ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("", "v1", kind.name()),
            kind.plural(),
        )
    }
}

fn status_code(e: &::kube::Error) -> Option<u16> {
    match e {
        ::kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

fn parse_rv(v: &Value) -> u64 {
    parse_revision(
        v.pointer("/metadata/resourceVersion")
            .and_then(Value::as_str),
    )
}

/// A core/v1 object as the record the other backends store.
fn to_record(kind: Kind, v: Value) -> Value {
    let meta = json!({
        "name": v.pointer("/metadata/name"),
        "namespace": v.pointer("/metadata/namespace"),
        "labels": v.pointer("/metadata/labels").cloned().unwrap_or(json!({})),
        "resourceVersion": v.pointer("/metadata/resourceVersion"),
        "creationTimestamp": v.pointer("/metadata/creationTimestamp"),
        "uid": v.pointer("/metadata/uid"),
    });
    let strs = |p: &str, f: &str| -> Vec<Value> {
        v.pointer(p)
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(|x| x.get(f).cloned()).collect())
            .unwrap_or_default()
    };
    match kind {
        Kind::Node => {
            let mut cidrs: Vec<Value> = v
                .pointer("/spec/podCIDRs")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            if cidrs.is_empty() {
                if let Some(c) = v.pointer("/spec/podCIDR") {
                    cidrs.push(c.clone());
                }
            }
            let ready = v
                .pointer("/status/conditions")
                .and_then(Value::as_array)
                .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
                .map(|c| c["status"] == "True")
                .unwrap_or(false);
            json!({"apiVersion": kind.api_version(), "kind": "Node", "metadata": meta,
                   "spec": {"addresses": strs("/status/addresses", "address"), "podCIDRs": cidrs, "ready": ready}})
        }
        Kind::Pod => {
            let host = v
                .pointer("/spec/hostNetwork")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            let mut ips = strs("/status/podIPs", "ip");
            if ips.is_empty() {
                if let Some(ip) = v.pointer("/status/podIP") {
                    ips.push(ip.clone());
                }
            }
            if host {
                ips.clear();
            }
            json!({"apiVersion": kind.api_version(), "kind": "Pod", "metadata": meta,
                   "spec": {"nodeName": v.pointer("/spec/nodeName"), "ips": ips}})
        }
        _ => json!({"apiVersion": kind.api_version(), "kind": kind.name(), "metadata": meta}),
    }
}

impl KubeDatastore {
    pub fn new(client: Client, namespace: impl Into<String>) -> Self {
        Self {
            client,
            namespace: namespace.into(),
            status_retries: 5,
            pod_node: None,
        }
    }

    /// Lists and watches only `node`'s pods from now on (see `pod_node`).
    pub fn pods_of_node(mut self, node: impl Into<String>) -> Self {
        self.pod_node = Some(node.into());
        self
    }

    /// The field selector of lists and watches of `kind`, if any.
    fn field_selector(&self, kind: Kind) -> Option<String> {
        match (&self.pod_node, kind) {
            (Some(node), Kind::Pod) => Some(format!("spec.nodeName={node}")),
            _ => None,
        }
    }

    /// From the environment (in-cluster or kubeconfig).
    pub async fn try_default(namespace: &str) -> Result<Self> {
        Ok(Self::new(Client::try_default().await?, namespace))
    }

    fn api(&self, kind: Kind, namespace: Option<&str>) -> Api<DynamicObject> {
        let ar = api_resource(kind);
        match namespace {
            Some(ns) if kind.namespaced() => Api::namespaced_with(self.client.clone(), ns, &ar),
            _ => Api::all_with(self.client.clone(), &ar),
        }
    }

    fn leases(&self) -> Api<DynamicObject> {
        let ar = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("coordination.k8s.io", "v1", "Lease"),
            "leases",
        );
        Api::namespaced_with(self.client.clone(), &self.namespace, &ar)
    }

    fn stored(&self, kind: Kind, obj: DynamicObject) -> Result<Stored> {
        let mut value = serde_json::to_value(&obj)?;
        if !kind.is_custom() {
            value = to_record(kind, value);
        } else {
            let o = value.as_object_mut().expect("a map");
            o.insert("apiVersion".into(), json!(kind.api_version()));
            o.insert("kind".into(), json!(kind.name()));
        }
        let revision = parse_rv(&value);
        Ok(Stored {
            kind,
            key: key_of(kind, &value)?,
            revision,
            value,
        })
    }

    fn map_err(kind: Kind, key: &ObjectKey, e: ::kube::Error, expected: u64) -> DatastoreError {
        match status_code(&e) {
            Some(404) => DatastoreError::NotFound {
                kind,
                key: key.clone(),
            },
            Some(409) => DatastoreError::Conflict {
                kind,
                key: key.clone(),
                expected,
                found: 0,
            },
            _ => e.into(),
        }
    }

    fn read_only(kind: Kind) -> Result<()> {
        if kind.is_custom() {
            Ok(())
        } else {
            Err(DatastoreError::Other(format!(
                "{kind} objects come from Kubernetes itself; change them with kubectl"
            )))
        }
    }

    async fn lease(&self, name: &str) -> Result<Option<Value>> {
        Ok(self
            .leases()
            .get_opt(name)
            .await?
            .map(|o| serde_json::to_value(o).expect("serialisable")))
    }

    /// Writes back a Lease read with [`Self::lease`] and changed.
    /// `Ok(false)`: someone changed it between our read and write (409).
    async fn replace_lease(&self, name: &str, lease: Value) -> Result<bool> {
        let obj: DynamicObject = serde_json::from_value(lease)?;
        match self
            .leases()
            .replace(name, &PostParams::default(), &obj)
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if status_code(&e) == Some(409) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }
}

fn now_micro() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

/// Each listed object as JSON, read by `read`; one that does not convert
/// or that `read` refuses is passed over.
fn read_each<T: serde::Serialize, R>(items: Vec<T>, read: impl Fn(&Value) -> Option<R>) -> Vec<R> {
    items
        .into_iter()
        .filter_map(|o| read(&serde_json::to_value(o).ok()?))
        .collect()
}

fn lease_expired(l: &Value) -> bool {
    let holder = l
        .pointer("/spec/holderIdentity")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if holder.is_empty() {
        return true;
    }
    let dur = l
        .pointer("/spec/leaseDurationSeconds")
        .and_then(Value::as_i64)
        .unwrap_or(0);
    let renew = l
        .pointer("/spec/renewTime")
        .and_then(Value::as_str)
        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok());
    match renew {
        Some(t) => t + chrono::Duration::seconds(dur) < chrono::Utc::now(),
        None => true,
    }
}

fn lease_object(name: &str, spec: Value, labels: Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": name, "labels": labels},
        "spec": spec,
    }))
    .expect("a valid Lease")
}

#[async_trait]
impl Datastore for KubeDatastore {
    async fn list(&self, kind: Kind) -> Result<(Vec<Stored>, u64)> {
        let mut params = ListParams::default();
        if let Some(f) = self.field_selector(kind) {
            params = params.fields(&f);
        }
        let list = self.api(kind, None).list(&params).await?;
        let rev = parse_revision(list.metadata.resource_version.as_deref());
        let items = list
            .items
            .into_iter()
            .map(|o| self.stored(kind, o))
            .collect::<Result<_>>()?;
        Ok((items, rev))
    }

    async fn watch(&self, kind: Kind, revision: u64) -> Result<WatchStream> {
        let api = self.api(kind, None);
        let me = KubeDatastore::new(self.client.clone(), self.namespace.clone());
        let mut params = WatchParams::default().timeout(290);
        if let Some(f) = self.field_selector(kind) {
            params = params.fields(&f);
        }
        // One long poll after another, each from the last revision seen.
        let s = futures::stream::unfold(
            (
                api,
                revision,
                None::<
                    futures::stream::BoxStream<
                        'static,
                        ::kube::Result<KubeWatchEvent<DynamicObject>>,
                    >,
                >,
                me,
            ),
            move |(api, mut rev, mut cur, me)| {
                let params = params.clone();
                async move {
                    loop {
                        if cur.is_none() {
                            match api.watch(&params, &rev.to_string()).await {
                                Ok(s) => cur = Some(s.boxed()),
                                Err(e) => return Some((Err(e.into()), (api, rev, None, me))),
                            }
                        }
                        match cur.as_mut().unwrap().try_next().await {
                            Ok(None) => cur = None,
                            Err(e) => return Some((Err(e.into()), (api, rev, None, me))),
                            Ok(Some(ev)) => {
                                let out = match ev {
                                    KubeWatchEvent::Added(o) | KubeWatchEvent::Modified(o) => {
                                        me.stored(kind, o).map(WatchEvent::Put)
                                    }
                                    KubeWatchEvent::Deleted(o) => {
                                        me.stored(kind, o).map(|s| WatchEvent::Deleted {
                                            kind,
                                            key: s.key,
                                            revision: s.revision,
                                        })
                                    }
                                    KubeWatchEvent::Bookmark(b) => {
                                        rev = b.metadata.resource_version.parse().unwrap_or(rev);
                                        continue;
                                    }
                                    KubeWatchEvent::Error(s) if s.code == 410 => {
                                        Err(DatastoreError::Compacted(rev))
                                    }
                                    KubeWatchEvent::Error(s) => Err(::kube::Error::Api(s).into()),
                                };
                                if let Ok(e) = &out {
                                    rev = e.revision();
                                }
                                return Some((out, (api, rev, cur, me)));
                            }
                        }
                    }
                }
            },
        );
        Ok(s.boxed())
    }

    async fn get(&self, kind: Kind, key: &ObjectKey) -> Result<Option<Stored>> {
        let api = self.api(kind, Some(&key.namespace));
        api.get_opt(&key.name)
            .await?
            .map(|o| self.stored(kind, o))
            .transpose()
    }

    async fn create(&self, kind: Kind, object: Value) -> Result<Stored> {
        Self::read_only(kind)?;
        let key = key_of(kind, &object)?;
        size::check(kind, &object, None)?;
        let obj: DynamicObject = serde_json::from_value(object)?;
        match self
            .api(kind, Some(&key.namespace))
            .create(&PostParams::default(), &obj)
            .await
        {
            Ok(o) => self.stored(kind, o),
            Err(e) if status_code(&e) == Some(409) => {
                Err(DatastoreError::AlreadyExists { kind, key })
            }
            Err(e) => Err(Self::map_err(kind, &key, e, 0)),
        }
    }

    async fn update(&self, kind: Kind, mut object: Value, revision: u64) -> Result<Stored> {
        Self::read_only(kind)?;
        let key = key_of(kind, &object)?;
        set_revision(&mut object, revision);
        object.as_object_mut().expect("a map").remove("status");
        // The stored status is not known here; `check_size` (dry runs)
        // counts it too.
        size::check(kind, &object, None)?;
        let obj: DynamicObject = serde_json::from_value(object)?;
        self.api(kind, Some(&key.namespace))
            .replace(&key.name, &PostParams::default(), &obj)
            .await
            .map_err(|e| Self::map_err(kind, &key, e, revision))
            .and_then(|o| self.stored(kind, o))
    }

    fn check_size(&self, kind: Kind, object: &Value, current: Option<&Stored>) -> Result<()> {
        Self::read_only(kind)?;
        size::check(kind, object, current)
    }

    async fn delete(&self, kind: Kind, key: &ObjectKey, revision: Option<u64>) -> Result<()> {
        Self::read_only(kind)?;
        let dp = DeleteParams {
            preconditions: revision.map(|r| Preconditions {
                resource_version: Some(r.to_string()),
                uid: None,
            }),
            ..Default::default()
        };
        self.api(kind, Some(&key.namespace))
            .delete(&key.name, &dp)
            .await
            .map(|_| ())
            .map_err(|e| Self::map_err(kind, key, e, revision.unwrap_or(0)))
    }

    /// Server-side apply on the status subresource, forced, as `patch.manager`.
    /// Fields the manager owned before and now leaves out are removed by the
    /// API server: the same rule [`StatusPatch`] states. A 409 is retried.
    async fn write_status(
        &self,
        kind: Kind,
        key: &ObjectKey,
        patch: &StatusPatch,
    ) -> Result<Stored> {
        if !kind.has_status() {
            return Err(DatastoreError::NoStatus { kind });
        }
        let mut status = serde_json::Map::new();
        for k in &patch.owned {
            if let Some(v) = patch.status.get(k).filter(|v| !v.is_null()) {
                status.insert(k.clone(), v.clone());
            }
        }
        let body = json!({"apiVersion": kind.api_version(), "kind": kind.name(), "status": status});
        let pp = PatchParams::apply(&patch.manager).force();
        let api = self.api(kind, Some(&key.namespace));
        let mut left = self.status_retries.max(1);
        loop {
            match api.patch_status(&key.name, &pp, &Patch::Apply(&body)).await {
                Ok(o) => return self.stored(kind, o),
                Err(e) if status_code(&e) == Some(409) && left > 1 => left -= 1,
                Err(e) => return Err(Self::map_err(kind, key, e, 0)),
            }
        }
    }

    async fn renew_heartbeat(&self, node: &str, ttl: Duration) -> Result<Heartbeat> {
        let name = format!("egress-node-{node}");
        let now = now_micro();
        let patch = json!({"spec": {"renewTime": now, "holderIdentity": node,
                                     "leaseDurationSeconds": ttl.as_secs().max(1)}});
        let leases = self.leases();
        let o = match leases
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(o) => o,
            Err(e) if status_code(&e) == Some(404) => {
                let l = lease_object(
                    &name,
                    patch["spec"].clone(),
                    json!({HEARTBEAT_LABEL: "true", "egress.dev/node": node}),
                );
                leases.create(&PostParams::default(), &l).await?
            }
            Err(e) => return Err(e.into()),
        };
        let v = serde_json::to_value(o)?;
        Ok(Heartbeat {
            node: node.into(),
            counter: parse_rv(&v),
            renew_time: now,
        })
    }

    async fn forget_heartbeat(&self, node: &str) -> Result<()> {
        match self
            .leases()
            .delete(&format!("egress-node-{node}"), &DeleteParams::default())
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if status_code(&e) == Some(404) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    async fn heartbeats(&self) -> Result<Vec<Heartbeat>> {
        let list = self
            .leases()
            .list(&ListParams::default().labels(&format!("{HEARTBEAT_LABEL}=true")))
            .await?;
        Ok(read_each(list.items, |v| {
            Some(Heartbeat {
                node: v.pointer("/spec/holderIdentity")?.as_str()?.to_string(),
                counter: parse_rv(v),
                renew_time: v.pointer("/spec/renewTime")?.as_str()?.to_string(),
            })
        }))
    }

    async fn try_acquire(
        &self,
        election: &str,
        identity: &str,
        ttl: Duration,
    ) -> Result<Option<Leadership>> {
        let now = now_micro();
        let secs = ttl.as_secs().max(1);
        let lead = |term: u64| Leadership {
            election: election.into(),
            identity: identity.into(),
            term,
            ttl,
            token: 0,
        };
        match self.lease(election).await? {
            None => {
                let spec = json!({"holderIdentity": identity, "leaseDurationSeconds": secs,
                                  "acquireTime": now, "renewTime": now, "leaseTransitions": 1});
                match self
                    .leases()
                    .create(
                        &PostParams::default(),
                        &lease_object(election, spec, json!({})),
                    )
                    .await
                {
                    Ok(_) => Ok(Some(lead(1))),
                    Err(e) if status_code(&e) == Some(409) => Ok(None),
                    Err(e) => Err(e.into()),
                }
            }
            Some(mut l) => {
                let holder = l
                    .pointer("/spec/holderIdentity")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string();
                let transitions = l
                    .pointer("/spec/leaseTransitions")
                    .and_then(Value::as_u64)
                    .unwrap_or(0);
                if holder != identity && !lease_expired(&l) {
                    return Ok(None);
                }
                let term = if holder == identity && !lease_expired(&l) {
                    transitions
                } else {
                    transitions + 1
                };
                let spec = l
                    .pointer_mut("/spec")
                    .and_then(Value::as_object_mut)
                    .expect("a Lease has a spec");
                spec.insert("holderIdentity".into(), json!(identity));
                spec.insert("leaseDurationSeconds".into(), json!(secs));
                spec.insert("renewTime".into(), json!(now));
                if term != transitions {
                    spec.insert("acquireTime".into(), json!(now));
                    spec.insert("leaseTransitions".into(), json!(term));
                }
                Ok(self.replace_lease(election, l).await?.then(|| lead(term)))
            }
        }
    }

    async fn renew_leadership(&self, lead: &Leadership) -> Result<()> {
        let lost = || DatastoreError::LostLeadership {
            election: lead.election.clone(),
        };
        let Some(mut l) = self.lease(&lead.election).await? else {
            return Err(lost());
        };
        let holder = l
            .pointer("/spec/holderIdentity")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let term = l
            .pointer("/spec/leaseTransitions")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        if holder != lead.identity || term != lead.term {
            return Err(lost());
        }
        l["spec"]["renewTime"] = json!(now_micro());
        // Someone changed the Lease between our read and write: only a
        // new holder does that.
        if self.replace_lease(&lead.election, l).await? {
            Ok(())
        } else {
            Err(lost())
        }
    }

    async fn resign(&self, lead: &Leadership) -> Result<()> {
        let Some(mut l) = self.lease(&lead.election).await? else {
            return Ok(());
        };
        if l.pointer("/spec/holderIdentity").and_then(Value::as_str) != Some(lead.identity.as_str())
        {
            return Ok(());
        }
        l["spec"]["holderIdentity"] = Value::Null;
        // A conflict: someone else holds it now, so there is nothing to resign.
        self.replace_lease(&lead.election, l).await?;
        Ok(())
    }

    async fn leader(&self, election: &str) -> Result<Option<LeaderInfo>> {
        Ok(self
            .lease(election)
            .await?
            .filter(|l| !lease_expired(l))
            .map(|l| LeaderInfo {
                identity: l
                    .pointer("/spec/holderIdentity")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .into(),
                term: l
                    .pointer("/spec/leaseTransitions")
                    .and_then(Value::as_u64)
                    .unwrap_or(0),
            }))
    }

    async fn record_event(&self, event: Event) -> Result<()> {
        let ns = if event.key.namespace.is_empty() {
            self.namespace.clone()
        } else {
            event.key.namespace.clone()
        };
        let now = now_micro();
        let ar =
            ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("", "v1", "Event"), "events");
        let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), &ns, &ar);
        let ev: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": format!("{}.", event.key.name), "namespace": ns,
                         "labels": {"egress.dev/event": "true"}},
            "involvedObject": {"apiVersion": event.kind.api_version(), "kind": event.kind.name(),
                               "name": event.key.name,
                               "namespace": if event.key.namespace.is_empty() { Value::Null } else { json!(event.key.namespace) }},
            "type": event.type_, "reason": event.reason, "message": event.message,
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
            "source": {"component": COMPONENT}, "reportingComponent": COMPONENT,
        }))?;
        api.create(&PostParams::default(), &ev).await?;
        Ok(())
    }

    async fn events(&self) -> Result<Vec<Event>> {
        let ar =
            ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("", "v1", "Event"), "events");
        let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &ar);
        let list = api
            .list(&ListParams::default().labels("egress.dev/event=true"))
            .await?;
        Ok(read_each(list.items, |v| {
            let kind = Kind::ALL.into_iter().find(|k| {
                v.pointer("/involvedObject/kind").and_then(Value::as_str) == Some(k.name())
            })?;
            let s = |p: &str| {
                v.pointer(p)
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string()
            };
            Some(Event {
                kind,
                key: ObjectKey::namespaced(
                    s("/involvedObject/namespace"),
                    s("/involvedObject/name"),
                ),
                type_: s("/type"),
                reason: s("/reason"),
                message: s("/message"),
                time: s("/lastTimestamp"),
            })
        }))
    }

    fn writes_cluster_records(&self) -> bool {
        false
    }

    /// Watches resume from the last resourceVersion (bookmarks keep it
    /// fresh) and the API server ends one it can no longer serve with 410,
    /// which makes the consumer list: as informers, the consumer need not
    /// list on a timer. The long period only bounds a connection that
    /// stopped delivering without closing; at 1,000 agents a 5-minute one
    /// was about 23 lists a second at the API server.
    fn relist_period(&self) -> Duration {
        Duration::from_secs(30 * 60)
    }
}

#[cfg(test)]
mod tests;
