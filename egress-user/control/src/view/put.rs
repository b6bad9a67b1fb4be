//! Decoding stored objects into a [`ClusterView`], in place of their last
//! version or (for a fresh list) appended.

use serde::de::DeserializeOwned;

use super::ClusterView;
use crate::datastore::typed::{decode, namespace_record, node_record, pod_record};
use crate::datastore::{Kind, ObjectKey, Stored};

/// Whether `m` is the metadata of the object of `key` (no copy of names:
/// a put compares it with every object of its kind).
pub(crate) fn meta_is(m: &kube::core::ObjectMeta, key: &ObjectKey) -> bool {
    m.name.as_deref().unwrap_or_default() == key.name
        && m.namespace.as_deref().unwrap_or_default() == key.namespace
}

/// Whether a put looks for the object's last version first: not for the
/// items of a fresh list (their keys are unique, and a search per item made
/// the first list quadratic in the number of objects).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Put {
    Replace,
    Append,
}

/// Puts the decoded object in place of its last version. One that does not
/// decode is logged and left out; its last good version, if any, stays.
fn upsert<T: DeserializeOwned>(
    v: &mut Vec<T>,
    s: &Stored,
    how: Put,
    meta: impl Fn(&T) -> &kube::core::ObjectMeta,
) {
    let obj = match decode::<T>(s) {
        Ok(o) => o,
        Err(e) => {
            tracing::warn!(kind = %s.kind, key = %s.key, "an object that does not decode; keeping its last good version, if any: {e}");
            return;
        }
    };
    place(v, obj, how, |o| meta_is(meta(o), &s.key));
}

/// Replaces the element `same` finds, or appends.
fn place<T>(v: &mut Vec<T>, obj: T, how: Put, same: impl Fn(&T) -> bool) {
    let found = match how {
        Put::Replace => v.iter_mut().find(|o| same(o)),
        Put::Append => None,
    };
    match found {
        Some(o) => *o = obj,
        None => v.push(obj),
    }
}

/// Puts one stored object into `view`, decoded (one that does not decode
/// is logged and left out).
pub(crate) fn put(view: &mut ClusterView, s: &Stored, how: Put) {
    view.generations.touch(s.kind);
    match s.kind {
        Kind::EgressGateway => upsert(&mut view.gateways, s, how, |o| &o.metadata),
        Kind::EgressPolicy => upsert(&mut view.policies, s, how, |o| &o.metadata),
        Kind::EgressClusterPolicy => upsert(&mut view.cluster_policies, s, how, |o| &o.metadata),
        Kind::EgressTunnel => upsert(&mut view.tunnels, s, how, |o| &o.metadata),
        Kind::Node => {
            let r = node_record(&s.value);
            let name = r.name.clone();
            place(&mut view.nodes, r, how, |n| n.name == name);
        }
        Kind::Pod => {
            let r = pod_record(&s.value);
            view.pods_mut().put(r, how == Put::Replace);
        }
        Kind::Namespace => {
            let r = namespace_record(&s.value);
            let name = r.name.clone();
            place(&mut view.namespaces, r, how, |n| n.name == name);
        }
    }
}
