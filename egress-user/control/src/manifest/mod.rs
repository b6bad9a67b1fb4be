//! `egress apply` as a library: read a YAML stream, check every document
//! (the strict pass over its fields, its types, the validation rules, the
//! fields that cannot change, the datastore's size limit), and write only
//! when all are good. Every problem of every document is reported, each
//! naming its document and field.

mod read;
mod strict;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use serde_json::Value;

use crate::api::{EgressClusterPolicy, EgressGateway, EgressPolicy};
use crate::datastore::{typed, Datastore, DatastoreError, Kind, ObjectKey, Stored};
use crate::validate::{self, FieldError, PolicyFields};

/// One document of a manifest.
#[derive(Clone, Debug, PartialEq)]
pub struct Document {
    /// 1-based position in the stream, for messages.
    pub index: usize,
    pub kind: Kind,
    pub key: ObjectKey,
    pub value: Value,
}

/// One problem of one document.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("document {index}{}: {}{reason}",
    if .object.is_empty() { String::new() } else { format!(" ({})", .object) },
    if .field.is_empty() { String::new() } else { format!("{}: ", .field) })]
pub struct Problem {
    /// 1-based position in the stream.
    pub index: usize,
    /// `Kind namespace/name` as far as the document says; may be empty.
    pub object: String,
    /// The field's path (`spec.destSubnet[0]`); empty for the whole document.
    pub field: String,
    pub reason: String,
}

impl Problem {
    fn new(index: usize, object: &str, field: &str, reason: impl Into<String>) -> Self {
        Self {
            index,
            object: object.into(),
            field: field.into(),
            reason: reason.into(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("the manifest holds no documents")]
    Empty,
    /// Every problem found, one per line.
    #[error("{}", .0.iter().map(|p| p.to_string()).collect::<Vec<_>>().join("\n"))]
    Refused(Vec<Problem>),
    #[error(transparent)]
    Datastore(#[from] DatastoreError),
}

/// What `apply` did (or would do) with one document.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Created,
    Configured,
    Unchanged,
}

/// Splits a YAML stream into type-checked documents. `default_ns` fills
/// in a missing namespace of namespaced kinds.
pub fn parse(text: &str, default_ns: &str) -> Result<Vec<Document>, ManifestError> {
    let r = read_some(text, default_ns)?;
    refuse_any(r.problems)?;
    Ok(r.docs)
}

/// Reads a stream; one without a single document is refused.
fn read_some(text: &str, default_ns: &str) -> Result<read::Read, ManifestError> {
    let r = read::read(text, default_ns);
    if r.seen == 0 && r.problems.is_empty() {
        return Err(ManifestError::Empty);
    }
    Ok(r)
}

fn refuse_any(problems: Vec<Problem>) -> Result<(), ManifestError> {
    if problems.is_empty() {
        Ok(())
    } else {
        Err(ManifestError::Refused(problems))
    }
}

/// Runs the validation rules and the datastore's size check on every
/// document, against the datastore's current objects and the other
/// documents of the same manifest.
pub async fn check(ds: &dyn Datastore, docs: &[Document]) -> Result<(), ManifestError> {
    refuse_any(problems(ds, docs).await?)
}

async fn problems(ds: &dyn Datastore, docs: &[Document]) -> Result<Vec<Problem>, DatastoreError> {
    let gateways = gateways(ds, docs).await?;
    let mut out = Vec::new();
    for d in docs {
        let current = ds.get(d.kind, &d.key).await?;
        let object = format!("{} {}", d.kind, d.key);
        for e in rules(d, current.as_ref(), &gateways) {
            out.push(Problem::new(d.index, &object, &e.field, e.reason));
        }
        let size = ds.check_size(d.kind, &d.value, current.as_ref());
        if let Err(e) = size {
            let reason = match e {
                DatastoreError::TooLarge { size, .. } => size.to_string(),
                e => e.to_string(),
            };
            out.push(Problem::new(d.index, &object, "", reason));
        }
    }
    Ok(out)
}

/// The gateways a policy may name: the stored ones, replaced by those of
/// the manifest.
async fn gateways(
    ds: &dyn Datastore,
    docs: &[Document],
) -> Result<BTreeMap<String, EgressGateway>, DatastoreError> {
    let mut gateways = BTreeMap::new();
    for s in ds.list(Kind::EgressGateway).await?.0 {
        if let Ok(g) = typed::decode::<EgressGateway>(&s) {
            gateways.insert(s.key.name.clone(), g);
        }
    }
    for d in docs.iter().filter(|d| d.kind == Kind::EgressGateway) {
        gateways.insert(d.key.name.clone(), decoded(d));
    }
    Ok(gateways)
}

fn decoded<T: serde::de::DeserializeOwned>(d: &Document) -> T {
    serde_json::from_value(d.value.clone()).expect("type-checked")
}

/// The validation rules of one document, and the changes refused against
/// `current`.
fn rules(
    d: &Document,
    current: Option<&Stored>,
    gateways: &BTreeMap<String, EgressGateway>,
) -> Vec<FieldError> {
    let mut errs = Vec::new();
    match d.kind {
        Kind::EgressGateway => {
            let g: EgressGateway = decoded(d);
            errs.extend(validate::gateway(&g.spec));
            if let Some(cur) = current.and_then(|c| typed::decode::<EgressGateway>(c).ok()) {
                errs.extend(validate::gateway_update(&cur.spec, &g.spec));
            }
        }
        Kind::EgressPolicy => {
            let p: EgressPolicy = decoded(d);
            let old = current.and_then(|c| typed::decode::<EgressPolicy>(c).ok());
            let old = old.as_ref().map(|o| PolicyFields::from(&o.spec));
            errs = policy_rules(PolicyFields::from(&p.spec), old, gateways);
        }
        Kind::EgressClusterPolicy => {
            let p: EgressClusterPolicy = decoded(d);
            let old = current.and_then(|c| typed::decode::<EgressClusterPolicy>(c).ok());
            let old = old.as_ref().map(|o| PolicyFields::from(&o.spec));
            errs = policy_rules(PolicyFields::from(&p.spec), old, gateways);
        }
        Kind::Pod => {
            let p = typed::pod_record(&d.value);
            for (i, ip) in p.ips.iter().enumerate() {
                if ip.parse::<std::net::IpAddr>().is_err() {
                    errs.push(FieldError {
                        field: format!("spec.ips[{i}]"),
                        reason: format!("{ip:?} is not an IP address"),
                    });
                }
            }
        }
        _ => {}
    }
    errs
}

fn policy_rules(
    new: PolicyFields<'_>,
    old: Option<PolicyFields<'_>>,
    gateways: &BTreeMap<String, EgressGateway>,
) -> Vec<FieldError> {
    let mut errs = validate::policy(&new, gateway_of(gateways, new.gateway));
    if let Some(old) = old {
        errs.extend(validate::policy_update(&old, &new));
    }
    errs
}

fn gateway_of<'a>(
    gws: &'a BTreeMap<String, EgressGateway>,
    name: &str,
) -> Option<&'a EgressGateway> {
    if name.is_empty() {
        gws.values().find(|g| g.spec.cluster_default)
    } else {
        gws.get(name)
    }
}

/// Reads, checks and (unless `dry_run`) writes a manifest. Nothing is
/// written unless every document passes every check; the dry run runs
/// the same checks.
pub async fn apply(
    ds: &dyn Datastore,
    text: &str,
    default_ns: &str,
    dry_run: bool,
) -> Result<Vec<(Document, Outcome)>, ManifestError> {
    let r = read_some(text, default_ns)?;
    let mut all = r.problems;
    all.extend(problems(ds, &r.docs).await?);
    all.sort_by_key(|p| p.index);
    refuse_any(all)?;
    let mut out = Vec::new();
    for d in r.docs {
        let cur = ds.get(d.kind, &d.key).await?;
        let outcome = match &cur {
            None => Outcome::Created,
            Some(c) if same_content(&c.value, &d.value) => Outcome::Unchanged,
            Some(_) => Outcome::Configured,
        };
        if !dry_run && outcome != Outcome::Unchanged {
            typed::apply(ds, d.kind, d.value.clone()).await?;
        }
        out.push((d, outcome));
    }
    Ok(out)
}

fn same_content(stored: &Value, new: &Value) -> bool {
    let strip = |v: &Value| {
        let mut v = v.clone();
        if let Some(o) = v.as_object_mut() {
            o.remove("status");
            if let Some(m) = o.get_mut("metadata").and_then(Value::as_object_mut) {
                // The generation too: it counts writes, not content.
                for f in read::DATASTORE_SET_METADATA.iter().chain(&["generation"]) {
                    m.remove(*f);
                }
            }
        }
        v
    };
    strip(stored) == strip(new)
}
