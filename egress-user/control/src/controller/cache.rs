//! A [`ClusterView`] kept current from watch events: list every kind once,
//! then apply each change in place (no relist, no full decode).

use std::collections::{BTreeMap, VecDeque};

use futures::stream::{SelectAll, StreamExt};

use crate::api::EgressTunnel;
use crate::datastore::typed::pod_record;
use crate::datastore::{Datastore, Kind, Result, Stored, WatchEvent, WatchStream};
use crate::view::{meta_is, put, ClusterView, Put};

use super::dirty::Dirty;
use super::ports::HolderIndex;

/// What changed in one batch of events, so callers recompute only that.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Changed {
    /// Nodes whose pods changed (only pods changed for them).
    pub pod_nodes: Vec<String>,
    /// Nodes whose port-block grants changed, and nothing else of their
    /// EgressTunnel: that node's own port blocks and the reply steering of
    /// every gateway-eligible node may be affected, nothing else.
    pub grant_nodes: Vec<String>,
    /// Nodes whose EgressTunnel changed only in what their own agent
    /// reports (port use, policies over capacity, EIPs awaiting
    /// reconfirmation): the controller and that node's agent read those,
    /// no other agent.
    pub report_nodes: Vec<String>,
    /// Something other than pods and grants changed: everything may be
    /// affected.
    pub global: bool,
}

/// How two versions of a tunnel differ.
#[derive(Debug, PartialEq, Eq)]
enum TunnelChange {
    /// In the fields its agent reports only.
    Reports,
    /// In its port-block grants (and perhaps reports) only.
    Grants,
    Other,
}

fn tunnel_change(old: &EgressTunnel, new: &EgressTunnel) -> TunnelChange {
    let without = |t: &EgressTunnel, grants: bool| {
        let mut t = t.clone();
        if let Some(s) = &mut t.status {
            s.port_use.clear();
            s.over_capacity.clear();
            s.awaiting_reconfirmation.clear();
            if grants {
                s.port_blocks.clear();
                s.port_block_size = 0;
            }
        }
        t.metadata.resource_version = None;
        t.metadata.managed_fields = None;
        t
    };
    if without(old, false) == without(new, false) {
        TunnelChange::Reports
    } else if without(old, true) == without(new, true) {
        TunnelChange::Grants
    } else {
        TunnelChange::Other
    }
}

/// The view plus the watches that keep it current, and what the
/// controller's passes over it keep for one another.
pub struct ViewCache {
    pub view: ClusterView,
    /// Reset with the view: a new list starts from nothing kept.
    pub memo: super::ReconcileMemo,
    watches: SelectAll<WatchStream>,
    /// Events a [`Pending`] probe took, applied first by the next batch
    /// (`None`: the watches ended).
    stash: VecDeque<Option<Result<WatchEvent>>>,
}

/// Says whether a change is waiting while the view is borrowed (from
/// [`ViewCache::split`]), so long work on one view can stop early.
pub struct Pending<'a> {
    watches: &'a mut SelectAll<WatchStream>,
    stash: &'a mut VecDeque<Option<Result<WatchEvent>>>,
}

impl Pending<'_> {
    /// True when an event is waiting (it is kept for the next batch).
    pub fn any(&mut self) -> bool {
        if !self.stash.is_empty() {
            return true;
        }
        match futures::FutureExt::now_or_never(self.watches.next()) {
            Some(ev) => {
                self.stash.push_back(ev);
                true
            }
            None => false,
        }
    }
}

impl ViewCache {
    /// Lists every kind and opens a watch from each list's revision.
    pub async fn start(ds: &dyn Datastore) -> Result<Self> {
        let mut view = ClusterView::default();
        let mut watches = SelectAll::new();
        // One kind at a time: listing all at once was no faster and held
        // every kind's raw objects at once (the agent's peak memory at
        // 1,000 nodes went from 87 to 124 MB).
        for k in Kind::ALL {
            let (items, rev) = ds.list(k).await?;
            for s in &items {
                put(&mut view, s, Put::Append);
            }
            watches.push(ds.watch(k, rev).await?);
        }
        // Kinds with no object were never put: mark them too.
        view.generations.touch_all();
        Ok(Self {
            view,
            memo: Default::default(),
            watches,
            stash: VecDeque::new(),
        })
    }

    /// [`ViewCache::start`], also recording what changes between the
    /// controller's passes, so a pass redoes only what changed (see
    /// `dirty.rs`). Agents have no use for it.
    pub async fn start_for_controller(ds: &dyn Datastore) -> Result<Self> {
        let mut cache = Self::start(ds).await?;
        cache.memo.dirty = Some(Dirty::everything());
        cache.memo.grants.holders = Some(HolderIndex::of(&cache.view));
        Ok(cache)
    }

    /// The view, and a probe that says whether a change is waiting.
    pub fn split(&mut self) -> (&ClusterView, Pending<'_>) {
        (
            &self.view,
            Pending {
                watches: &mut self.watches,
                stash: &mut self.stash,
            },
        )
    }

    /// Puts an object as written by this process (before its watch event).
    pub fn put_stored(&mut self, s: &Stored) {
        self.apply(&WatchEvent::Put(s.clone()), &mut Changed::default());
    }

    /// Applies one event, and says what it changed in `changed` and for
    /// the controller's next pass.
    pub fn apply(&mut self, ev: &WatchEvent, changed: &mut Changed) {
        let mut local = Changed::default();
        self.apply_to_view(ev, &mut local);
        if let Some(d) = &mut self.memo.dirty {
            d.global |= local.global;
            d.pod_nodes.extend(local.pod_nodes.iter().cloned());
        }
        changed.pod_nodes.append(&mut local.pod_nodes);
        changed.grant_nodes.append(&mut local.grant_nodes);
        changed.report_nodes.append(&mut local.report_nodes);
        changed.global |= local.global;
    }

    fn apply_to_view(&mut self, ev: &WatchEvent, changed: &mut Changed) {
        let v = &mut self.view;
        match ev {
            WatchEvent::Put(s) => {
                if s.kind == Kind::EgressTunnel {
                    let old = v
                        .tunnels
                        .iter()
                        .find(|t| meta_is(&t.metadata, &s.key))
                        .cloned();
                    let marks = v.generations;
                    put(v, s, Put::Replace);
                    let new = v.tunnels.iter().find(|t| meta_is(&t.metadata, &s.key));
                    if let (Some(d), Some(o), Some(n)) = (&mut self.memo.dirty, &old, new) {
                        d.tunnel_change(o, n);
                    }
                    if let Some(ix) = &mut self.memo.grants.holders {
                        old.iter().for_each(|o| ix.remove(o));
                        new.into_iter().for_each(|n| ix.add(n));
                    }
                    let node = s.key.name.clone();
                    match old.zip(new).map(|(o, n)| tunnel_change(&o, n)) {
                        Some(TunnelChange::Reports) => {
                            // Nothing derived from tunnels reads the agents'
                            // reports (its own is read from the view): keep
                            // the mark, or every agent's report would throw
                            // away every other agent's prepared parts.
                            v.generations = marks;
                            changed.report_nodes.push(node);
                        }
                        Some(TunnelChange::Grants) => {
                            // Only what derives from grants is redone.
                            v.generations = marks;
                            v.generations.touch_grants();
                            changed.grant_nodes.push(node);
                        }
                        _ => changed.global = true,
                    }
                    return;
                }
                if s.kind == Kind::Pod {
                    let r = pod_record(&s.value);
                    if let Some(old) = v.pod(&r.namespace, &r.name) {
                        changed.pod_nodes.push(old.node.clone());
                    }
                    changed.pod_nodes.push(r.node.clone());
                } else {
                    changed.global = true;
                }
                put(v, s, Put::Replace);
            }
            WatchEvent::Deleted { kind, key, .. } => {
                v.generations.touch(*kind);
                let m = |meta: &kube::core::ObjectMeta| !meta_is(meta, key);
                match kind {
                    Kind::EgressGateway => v.gateways.retain(|o| m(&o.metadata)),
                    Kind::EgressPolicy => v.policies.retain(|o| m(&o.metadata)),
                    Kind::EgressClusterPolicy => v.cluster_policies.retain(|o| m(&o.metadata)),
                    Kind::EgressTunnel => {
                        if let Some(ix) = &mut self.memo.grants.holders {
                            v.tunnels
                                .iter()
                                .filter(|o| !m(&o.metadata))
                                .for_each(|o| ix.remove(o));
                        }
                        v.tunnels.retain(|o| m(&o.metadata));
                    }
                    Kind::Node => v.nodes.retain(|n| n.name != key.name),
                    Kind::Namespace => v.namespaces.retain(|n| n.name != key.name),
                    Kind::Pod => {
                        if let Some(p) = v.pods_mut().remove(&key.namespace, &key.name) {
                            changed.pod_nodes.push(p.node);
                        }
                    }
                }
                if *kind != Kind::Pod {
                    changed.global = true;
                }
            }
        }
    }

    /// Waits for the next change, then takes every change already queued.
    /// `None` when the watches ended; an error when one failed (start over).
    pub async fn next_batch(&mut self) -> Option<Result<Changed>> {
        let mut changed = Changed::default();
        let first = match self.stash.pop_front() {
            Some(ev) => ev?,
            None => self.watches.next().await?,
        };
        match first {
            Ok(ev) => self.apply(&ev, &mut changed),
            Err(e) => return Some(Err(e)),
        }
        while let Some(ev) = self.stash.pop_front() {
            match ev? {
                Ok(ev) => self.apply(&ev, &mut changed),
                Err(e) => return Some(Err(e)),
            }
        }
        while let Some(Some(ev)) = futures::FutureExt::now_or_never(self.watches.next()) {
            match ev {
                Ok(ev) => self.apply(&ev, &mut changed),
                Err(e) => return Some(Err(e)),
            }
        }
        changed.pod_nodes.sort();
        changed.pod_nodes.dedup();
        changed.grant_nodes.sort();
        changed.grant_nodes.dedup();
        changed.report_nodes.sort();
        changed.report_nodes.dedup();
        Some(Ok(changed))
    }
}

/// Counts of objects per kind, for logs.
pub fn sizes(v: &ClusterView) -> BTreeMap<&'static str, usize> {
    BTreeMap::from([
        ("gateways", v.gateways.len()),
        ("policies", v.policies.len() + v.cluster_policies.len()),
        ("tunnels", v.tunnels.len()),
        ("nodes", v.nodes.len()),
        ("pods", v.pods.len()),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::PodRecord;
    use crate::datastore::memory::MemoryDatastore;
    use crate::datastore::typed::pod_object;
    use crate::datastore::ObjectKey;

    #[tokio::test]
    async fn follows_changes_in_place() {
        let ds = MemoryDatastore::new();
        let pod = |name: &str, node: &str| PodRecord {
            name: name.into(),
            namespace: "d".into(),
            node: node.into(),
            ips: vec!["10.0.0.1".into()],
            ..Default::default()
        };
        ds.create(Kind::Pod, pod_object(&pod("a", "n1")))
            .await
            .unwrap();
        let mut c = ViewCache::start(&ds).await.unwrap();
        assert_eq!(c.view.pods.len(), 1);
        let cur = ds
            .get(Kind::Pod, &ObjectKey::namespaced("d", "a"))
            .await
            .unwrap()
            .unwrap();
        ds.update(Kind::Pod, pod_object(&pod("a", "n2")), cur.revision)
            .await
            .unwrap();
        ds.create(Kind::Pod, pod_object(&pod("b", "n3")))
            .await
            .unwrap();
        let ch = c.next_batch().await.unwrap().unwrap();
        let mut all = ch.pod_nodes.clone();
        if all.len() < 3 {
            all.extend(c.next_batch().await.unwrap().unwrap().pod_nodes);
        }
        all.sort();
        all.dedup();
        assert_eq!(all, ["n1", "n2", "n3"]);
        assert_eq!(
            c.view.pods.iter().find(|p| p.name == "a").unwrap().node,
            "n2"
        );
        ds.delete(Kind::Pod, &ObjectKey::namespaced("d", "a"), None)
            .await
            .unwrap();
        let ch = c.next_batch().await.unwrap().unwrap();
        assert_eq!(ch.pod_nodes, ["n2"]);
        assert!(!ch.global);
        assert_eq!(c.view.pods.len(), 1);
    }

    /// The blocks of w1's first grant in `view`.
    fn first_blocks_of_w1(view: &ClusterView) -> Vec<u16> {
        view.tunnel("w1")
            .unwrap()
            .status
            .clone()
            .unwrap()
            .port_blocks[0]
            .blocks
            .clone()
    }

    #[tokio::test]
    async fn a_change_of_grants_alone_is_not_global() {
        use crate::datastore::StatusPatch;
        use serde_json::json;
        let ds = MemoryDatastore::new();
        let t = json!({"apiVersion": crate::api::API_VERSION, "kind": "EgressTunnel",
                       "metadata": {"name": "w1"}, "spec": {}});
        ds.create(Kind::EgressTunnel, t).await.unwrap();
        let key = ObjectKey::cluster("w1");
        let write = |owned: &[&str], status: serde_json::Value| {
            let ds = &ds;
            let key = &key;
            // One manager per set of fields, as server-side apply needs.
            let p = StatusPatch {
                manager: format!("test-{}", owned.join("-")),
                owned: owned.iter().map(|s| s.to_string()).collect(),
                status,
            };
            async move { ds.write_status(Kind::EgressTunnel, key, &p).await.unwrap() }
        };
        write(
            &["tunnel", "phase"],
            json!({"tunnel": {"ipv4": "192.168.0.1"}, "phase": "Ready"}),
        )
        .await;
        let mut c = ViewCache::start(&ds).await.unwrap();

        let grants = ["portBlocks", "portBlockSize"];
        write(
            &grants,
            json!({"portBlocks": [{"gateway": "g", "eip": "10.0.0.1", "blocks": [1]}],
                              "portBlockSize": 1024}),
        )
        .await;
        let ch = c.next_batch().await.unwrap().unwrap();
        assert_eq!(
            (ch.grant_nodes.as_slice(), ch.global),
            (&["w1".to_string()][..], false)
        );
        let st = c.view.tunnel("w1").unwrap().status.clone().unwrap();
        assert_eq!(st.port_blocks[0].blocks, [1]);

        // A probe sees a waiting change while the view is borrowed; the
        // next batch applies it.
        write(
            &grants,
            json!({"portBlocks": [{"gateway": "g", "eip": "10.0.0.1", "blocks": [2]}],
                   "portBlockSize": 1024}),
        )
        .await;
        {
            let (view, mut pending) = c.split();
            assert_eq!(first_blocks_of_w1(view), [1]);
            assert!(pending.any());
            assert!(pending.any(), "still waiting until a batch takes it");
        }
        let marks = c.view.generations;
        let ch = c.next_batch().await.unwrap().unwrap();
        assert_eq!(ch.grant_nodes, ["w1"]);
        assert_eq!(first_blocks_of_w1(&c.view), [2]);
        assert!(!c.split().1.any());
        assert_ne!(c.view.generations, marks, "grants are derived from");
        assert!(
            c.view.generations.same_but_grants(&marks),
            "only what derives from grants"
        );

        // What the agent reports concerns only the controller and itself.
        write(
            &["portUse"],
            json!({"portUse": [{"gateway": "g", "eip": "10.0.0.1", "inUse": 3}]}),
        )
        .await;
        let marks = c.view.generations;
        let ch = c.next_batch().await.unwrap().unwrap();
        assert_eq!(
            (ch.report_nodes.as_slice(), ch.grant_nodes.len(), ch.global),
            (&["w1".to_string()][..], 0, false)
        );
        assert_eq!(c.view.generations, marks, "reports keep the prepared parts");
        let reported = &c
            .view
            .tunnel("w1")
            .unwrap()
            .status
            .as_ref()
            .unwrap()
            .port_use;
        assert_eq!(
            reported[0].in_use, 3,
            "the view holds the report all the same"
        );

        // The phase (or the endpoint) matters to every node.
        write(
            &["tunnel", "phase"],
            json!({"tunnel": {"ipv4": "192.168.0.1"}, "phase": "Failed"}),
        )
        .await;
        let ch = c.next_batch().await.unwrap().unwrap();
        assert!(ch.global && ch.grant_nodes.is_empty(), "{ch:?}");
    }
}
