//! The fake API server's objects and their rules, with no I/O: one
//! resourceVersion counter for everything (the API server's etcd revision),
//! every change kept as a watch event, optimistic concurrency on
//! resourceVersion, status subresources that create and replace leave
//! alone, and server-side apply of status by field manager at the
//! granularity of `status`'s top-level fields.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde_json::{json, Map, Value};

/// A resource: its group/version ("v1" for core) and plural.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Resource {
    pub group_version: String,
    pub plural: String,
}

impl Resource {
    pub fn new(group_version: &str, plural: &str) -> Self {
        Self {
            group_version: group_version.into(),
            plural: plural.into(),
        }
    }
}

/// What the server knows of a resource it serves.
#[derive(Clone, Copy, Debug)]
pub struct ResourceInfo {
    pub kind: &'static str,
    pub namespaced: bool,
    /// Has a status subresource: create and replace keep the stored status.
    pub status: bool,
}

/// The resources the egress gateway uses, as a cluster with its CRDs installed serves them.
pub fn info(r: &Resource) -> Option<ResourceInfo> {
    let i = |kind, namespaced, status| {
        Some(ResourceInfo {
            kind,
            namespaced,
            status,
        })
    };
    match (r.group_version.as_str(), r.plural.as_str()) {
        ("v1", "nodes") => i("Node", false, true),
        ("v1", "pods") => i("Pod", true, true),
        ("v1", "namespaces") => i("Namespace", false, true),
        ("v1", "events") => i("Event", true, false),
        ("coordination.k8s.io/v1", "leases") => i("Lease", true, false),
        ("egressgateway.egress.dev/v1beta1", "egressgateways") => i("EgressGateway", false, true),
        ("egressgateway.egress.dev/v1beta1", "egresspolicies") => i("EgressPolicy", true, true),
        ("egressgateway.egress.dev/v1beta1", "egressclusterpolicies") => {
            i("EgressClusterPolicy", false, true)
        }
        ("egressgateway.egress.dev/v1beta1", "egresstunnels") => i("EgressTunnel", false, true),
        _ => None,
    }
}

/// Why a request failed: HTTP code, Kubernetes reason, message.
#[derive(Debug, PartialEq)]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
        }
    }

    /// The `Status` object the API server answers with.
    pub fn status(&self) -> Value {
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": self.message, "reason": self.reason, "code": self.code})
    }
}

pub type ApiResult<T> = Result<T, ApiError>;

/// One change, as a watch reports it.
#[derive(Clone, Debug)]
pub struct Change {
    pub revision: u64,
    pub resource: Resource,
    /// The object before (None for a create).
    pub old: Option<Value>,
    /// The object after (for a delete: as it was, with the delete's revision).
    pub new: Value,
    pub deleted: bool,
}

/// Label (`k=v,k2=v2`) and field (`spec.nodeName=X`) selectors of a list or watch.
#[derive(Clone, Debug, Default)]
pub struct Selector {
    pub labels: Vec<(String, String)>,
    pub fields: Vec<(String, String)>,
}

fn pairs(s: &str) -> ApiResult<Vec<(String, String)>> {
    s.split(',')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').ok_or_else(|| {
                ApiError::new(
                    400,
                    "BadRequest",
                    format!("selector {p:?}: only k=v is served"),
                )
            })?;
            Ok((k.trim_end_matches('=').into(), v.into()))
        })
        .collect()
}

impl Selector {
    pub fn parse(labels: Option<&str>, fields: Option<&str>) -> ApiResult<Self> {
        Ok(Self {
            labels: pairs(labels.unwrap_or_default())?,
            fields: pairs(fields.unwrap_or_default())?,
        })
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.labels.iter().all(|(k, v)| {
            obj.pointer("/metadata/labels")
                .and_then(|l| l.get(k))
                .and_then(Value::as_str)
                == Some(v.as_str())
        }) && self.fields.iter().all(|(k, v)| {
            let path = format!("/{}", k.replace('.', "/"));
            obj.pointer(&path)
                .and_then(Value::as_str)
                .unwrap_or_default()
                == v
        })
    }
}

type Key = (Resource, String, String);

#[derive(Default)]
pub struct Store {
    revision: u64,
    objects: BTreeMap<Key, Value>,
    history: Vec<Change>,
    /// Changes up to this revision are no longer kept (see [`Store::compact`]).
    compacted: u64,
    /// Installed CRDs' schemas: their objects are pruned, defaulted and
    /// validated on every write (see [`super::schema`]).
    schemas: HashMap<Resource, Value>,
    /// Top-level status fields each manager applied last, per object.
    status_owners: HashMap<Key, HashMap<String, BTreeSet<String>>>,
    uids: u64,
}

fn meta(obj: &Value, field: &str) -> Option<String> {
    obj.pointer(&format!("/metadata/{field}"))
        .and_then(Value::as_str)
        .map(str::to_string)
}

fn rv_of(obj: &Value) -> Option<u64> {
    meta(obj, "resourceVersion").and_then(|s| s.parse().ok())
}

fn not_found(r: &Resource, name: &str) -> ApiError {
    ApiError::new(
        404,
        "NotFound",
        format!("{} \"{name}\" not found", r.plural),
    )
}

fn conflict(r: &Resource, name: &str) -> ApiError {
    ApiError::new(
        409,
        "Conflict",
        format!(
            "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
            r.plural
        ),
    )
}

fn set_meta(obj: &mut Value, field: &str, v: Value) {
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = json!({});
    }
    obj["metadata"][field] = v;
}

/// RFC 7386 JSON merge patch.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Some(p) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let t = target.as_object_mut().expect("made an object");
    for (k, v) in p {
        if v.is_null() {
            t.remove(k);
        } else {
            merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

impl Store {
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// As `kubectl apply -f crds/`: writes of these resources follow their schemas.
    pub fn install_crds(&mut self, schemas: HashMap<Resource, Value>) {
        self.schemas.extend(schemas);
    }

    /// The schema's pruning, defaults and validation; 422 when invalid.
    fn admit(&self, r: &Resource, name: &str, obj: &mut Value) -> ApiResult<()> {
        let Some(schema) = self.schemas.get(r) else {
            return Ok(());
        };
        let errors = super::schema::admit(schema, obj);
        if errors.is_empty() {
            return Ok(());
        }
        let kind = info(r).map(|i| i.kind).unwrap_or_default();
        let group = r.group_version.split('/').next().unwrap_or_default();
        Err(ApiError::new(
            422,
            "Invalid",
            format!(
                "{kind}.{group} \"{name}\" is invalid: [{}]",
                errors.join(", ")
            ),
        ))
    }

    fn info(r: &Resource) -> ApiResult<ResourceInfo> {
        info(r).ok_or_else(|| {
            ApiError::new(
                404,
                "NotFound",
                format!("the server could not find the requested resource {r:?}"),
            )
        })
    }

    fn key(r: &Resource, ns: &str, name: &str) -> ApiResult<Key> {
        let i = Self::info(r)?;
        let ns = if i.namespaced { ns } else { "" };
        if i.namespaced && ns.is_empty() {
            return Err(ApiError::new(400, "BadRequest", "a namespace is required"));
        }
        Ok((r.clone(), ns.to_string(), name.to_string()))
    }

    /// The stored object at `key`, or 404.
    fn current(&self, r: &Resource, key: &Key) -> ApiResult<Value> {
        self.objects
            .get(key)
            .cloned()
            .ok_or_else(|| not_found(r, &key.2))
    }

    fn record(&mut self, r: &Resource, old: Option<Value>, new: Value, deleted: bool) {
        self.history.push(Change {
            revision: self.revision,
            resource: r.clone(),
            old,
            new,
            deleted,
        });
    }

    pub fn get(&self, r: &Resource, ns: &str, name: &str) -> ApiResult<Value> {
        self.current(r, &Self::key(r, ns, name)?)
    }

    /// The objects of `r` (in namespace `ns`, or all with ""), and the revision of the list.
    pub fn list(&self, r: &Resource, ns: &str, sel: &Selector) -> ApiResult<(Vec<Value>, u64)> {
        Self::info(r)?;
        let items = self
            .objects
            .iter()
            .filter(|((res, ons, _), o)| res == r && (ns.is_empty() || ons == ns) && sel.matches(o))
            .map(|(_, o)| o.clone())
            .collect();
        Ok((items, self.revision))
    }

    pub fn create(&mut self, r: &Resource, ns: &str, mut obj: Value) -> ApiResult<Value> {
        let info = Self::info(r)?;
        if !obj.is_object() {
            return Err(ApiError::new(
                400,
                "BadRequest",
                "the body is not an object",
            ));
        }
        let name = match (meta(&obj, "name"), meta(&obj, "generateName")) {
            (Some(n), _) if !n.is_empty() => n,
            (_, Some(g)) => {
                self.uids += 1;
                format!("{g}{:05x}", self.uids)
            }
            _ => {
                return Err(ApiError::new(
                    422,
                    "Invalid",
                    "metadata.name: Required value: name or generateName is required",
                ))
            }
        };
        let key = Self::key(r, ns, &name)?;
        if self.objects.contains_key(&key) {
            return Err(ApiError::new(
                409,
                "AlreadyExists",
                format!("{} \"{name}\" already exists", r.plural),
            ));
        }
        self.revision += 1;
        self.uids += 1;
        if info.status && r.group_version != "v1" {
            // A custom resource's status is written through its subresource only.
            obj.as_object_mut().expect("an object").remove("status");
        }
        set_meta(&mut obj, "name", json!(name));
        if info.namespaced {
            set_meta(&mut obj, "namespace", json!(key.1));
        }
        set_meta(&mut obj, "uid", json!(format!("uid-{}", self.uids)));
        set_meta(
            &mut obj,
            "resourceVersion",
            json!(self.revision.to_string()),
        );
        set_meta(&mut obj, "creationTimestamp", json!(now()));
        obj["apiVersion"] = json!(r.group_version);
        obj["kind"] = json!(info.kind);
        if let Err(e) = self.admit(r, &name, &mut obj) {
            self.revision -= 1;
            return Err(e);
        }
        self.objects.insert(key, obj.clone());
        self.record(r, None, obj.clone(), false);
        Ok(obj)
    }

    /// PUT: the whole object, if its resourceVersion (when given) is the stored one.
    pub fn replace(
        &mut self,
        r: &Resource,
        ns: &str,
        name: &str,
        mut obj: Value,
    ) -> ApiResult<Value> {
        let info = Self::info(r)?;
        let key = Self::key(r, ns, name)?;
        let old = self.current(r, &key)?;
        if let Some(rv) = rv_of(&obj) {
            if Some(rv) != rv_of(&old) {
                return Err(conflict(r, name));
            }
        }
        if !obj.is_object() {
            return Err(ApiError::new(
                400,
                "BadRequest",
                "the body is not an object",
            ));
        }
        if info.status {
            match old.get("status") {
                Some(s) => obj["status"] = s.clone(),
                None => {
                    obj.as_object_mut().expect("an object").remove("status");
                }
            }
        }
        self.put_back(r, key, old, obj)
    }

    /// Stores `obj` over `old` with a new revision, keeping identity fields.
    fn put_back(&mut self, r: &Resource, key: Key, old: Value, mut obj: Value) -> ApiResult<Value> {
        self.admit(r, &key.2, &mut obj)?;
        self.revision += 1;
        for f in ["name", "namespace", "uid", "creationTimestamp"] {
            if let Some(v) = old.pointer(&format!("/metadata/{f}")) {
                set_meta(&mut obj, f, v.clone());
            }
        }
        set_meta(
            &mut obj,
            "resourceVersion",
            json!(self.revision.to_string()),
        );
        obj["apiVersion"] = old["apiVersion"].clone();
        obj["kind"] = old["kind"].clone();
        self.objects.insert(key, obj.clone());
        self.record(r, Some(old), obj.clone(), false);
        Ok(obj)
    }

    /// PATCH with `application/merge-patch+json`.
    pub fn merge(&mut self, r: &Resource, ns: &str, name: &str, patch: &Value) -> ApiResult<Value> {
        let key = Self::key(r, ns, name)?;
        let old = self.current(r, &key)?;
        let mut obj = old.clone();
        merge_patch(&mut obj, patch);
        if let Some(rv) = patch
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
        {
            if Some(rv) != meta(&old, "resourceVersion").as_deref() {
                return Err(conflict(r, name));
            }
        }
        self.put_back(r, key, old, obj)
    }

    /// Server-side apply to the status subresource as `manager`: each
    /// top-level field of the applied status is set; fields the manager
    /// applied last time and leaves out now are removed unless another
    /// manager applied them too. With `force` false, a field another
    /// manager owns is a conflict.
    pub fn apply_status(
        &mut self,
        r: &Resource,
        ns: &str,
        name: &str,
        manager: &str,
        force: bool,
        body: &Value,
    ) -> ApiResult<Value> {
        let info = Self::info(r)?;
        if !info.status {
            return Err(not_found(r, &format!("{name}/status")));
        }
        if manager.is_empty() {
            return Err(ApiError::new(
                400,
                "BadRequest",
                "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch",
            ));
        }
        let key = Self::key(r, ns, name)?;
        let old = self.current(r, &key)?;
        let applied: Map<String, Value> = match body.get("status") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(m)) => m.clone(),
            Some(_) => return Err(ApiError::new(400, "BadRequest", "status is not an object")),
        };
        let owners = self.status_owners.entry(key.clone()).or_default();
        if !force {
            for f in applied.keys() {
                if let Some(other) = owners
                    .iter()
                    .find(|(m, fs)| m.as_str() != manager && fs.contains(f))
                {
                    return Err(ApiError::new(
                        409,
                        "Conflict",
                        format!(
                            "Apply failed with 1 conflict: conflict with \"{}\": .status.{f}",
                            other.0
                        ),
                    ));
                }
            }
        }
        let before = owners.remove(manager).unwrap_or_default();
        if force {
            for fs in owners.values_mut() {
                fs.retain(|f| !applied.contains_key(f));
            }
        }
        let held_by_others: BTreeSet<String> = owners.values().flatten().cloned().collect();
        owners.insert(manager.into(), applied.keys().cloned().collect());
        let mut status = old
            .get("status")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        for f in before {
            if !applied.contains_key(&f) && !held_by_others.contains(&f) {
                status.remove(&f);
            }
        }
        for (k, v) in applied {
            status.insert(k, v);
        }
        let mut obj = old.clone();
        obj["status"] = Value::Object(status);
        self.put_back(r, key, old, obj)
    }

    /// DELETE, if `precondition_rv` (when given) is the stored resourceVersion.
    pub fn delete(
        &mut self,
        r: &Resource,
        ns: &str,
        name: &str,
        precondition_rv: Option<&str>,
    ) -> ApiResult<Value> {
        let key = Self::key(r, ns, name)?;
        let old = self.current(r, &key)?;
        if let Some(rv) = precondition_rv {
            if Some(rv) != meta(&old, "resourceVersion").as_deref() {
                return Err(ApiError::new(
                    409,
                    "Conflict",
                    format!(
                        "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                        meta(&old, "resourceVersion").unwrap_or_default()
                    ),
                ));
            }
        }
        self.objects.remove(&key);
        self.status_owners.remove(&key);
        self.revision += 1;
        let mut gone = old.clone();
        set_meta(
            &mut gone,
            "resourceVersion",
            json!(self.revision.to_string()),
        );
        self.record(r, Some(old), gone.clone(), true);
        Ok(gone)
    }

    /// Forgets the changes made so far, as etcd's compaction does: a watch
    /// from an older resourceVersion is then answered 410 Gone.
    pub fn compact(&mut self) {
        self.compacted = self.revision;
        self.history.clear();
    }

    /// The watch events of `r` after `since` that `sel` lets through, as
    /// (type, object): an object that stops matching the selector is
    /// reported DELETED and one that starts matching ADDED, as the API
    /// server's watch cache does. 410 if those changes were compacted.
    pub fn events_after(
        &self,
        r: &Resource,
        ns: &str,
        sel: &Selector,
        since: u64,
    ) -> ApiResult<Vec<(&'static str, Value)>> {
        if since < self.compacted {
            return Err(ApiError::new(
                410,
                "Expired",
                format!("too old resource version: {since} ({})", self.compacted),
            ));
        }
        let start = self.history.partition_point(|c| c.revision <= since);
        Ok(self.history[start..]
            .iter()
            .filter(|c| &c.resource == r)
            .filter(|c| ns.is_empty() || meta(&c.new, "namespace").as_deref() == Some(ns))
            .filter_map(|c| {
                let was = c.old.as_ref().is_some_and(|o| sel.matches(o));
                let is = sel.matches(&c.new);
                let t = match (c.deleted, was, is) {
                    (true, _, true) => "DELETED",
                    (true, _, false) => return None,
                    (false, false, true) => "ADDED",
                    (false, true, true) => "MODIFIED",
                    (false, true, false) => "DELETED",
                    (false, false, false) => return None,
                };
                Some((t, c.new.clone()))
            })
            .collect())
    }
}

fn now() -> String {
    // RFC 3339 to the second, as the API server writes timestamps.
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let days = secs / 86_400;
    let (h, m, s) = ((secs / 3600) % 24, (secs / 60) % 60, secs % 60);
    let (y, mo, d) = civil_from_days(days as i64);
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{m:02}:{s:02}Z")
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests;
