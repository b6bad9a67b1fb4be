//! Where each pod is in a view's pod list, by key and by node. An agent
//! reads its own node's pods on every pass and a watch event finds the
//! pod it replaces: each was a walk over every pod of the cluster (50,000
//! at the benchmark's large size, most of the agent's CPU per change of
//! its own pods). The index follows the list through the view's put and
//! delete; a list changed around them (a test pushing pods by hand) is
//! noticed by its length and walked instead until the next put.

use std::collections::HashMap;

use crate::api::PodRecord;

#[derive(Clone, Debug, Default)]
pub(crate) struct PodIndex {
    by_key: HashMap<(String, String), usize>,
    /// node -> positions of its pods, in list order.
    by_node: HashMap<String, Vec<usize>>,
    /// How many pods the index holds: the list's length while it is current.
    len: usize,
}

impl PodIndex {
    fn of(pods: &[PodRecord]) -> Self {
        let mut ix = Self::default();
        for (i, p) in pods.iter().enumerate() {
            ix.by_key.insert(key(p), i);
            ix.by_node.entry(p.node.clone()).or_default().push(i);
        }
        ix.len = pods.len();
        ix
    }

    fn current(&self, pods: &[PodRecord]) -> bool {
        self.len == pods.len()
    }
}

fn key(p: &PodRecord) -> (String, String) {
    (p.namespace.clone(), p.name.clone())
}

/// The pods of a view and their index, changed together.
pub(crate) struct Pods<'v> {
    pub list: &'v mut Vec<PodRecord>,
    pub index: &'v mut PodIndex,
}

impl Pods<'_> {
    fn ensure_current(&mut self) {
        if !self.index.current(self.list) {
            *self.index = PodIndex::of(self.list);
        }
    }

    /// Puts `pod` in place of the pod of its key (or appends it, when
    /// `replace` is false or there is none); returns the pod it replaced.
    pub fn put(&mut self, pod: PodRecord, replace: bool) -> Option<PodRecord> {
        self.ensure_current();
        let at = replace
            .then(|| {
                self.index
                    .by_key
                    .get(&(pod.namespace.clone(), pod.name.clone()))
            })
            .flatten()
            .copied();
        let Some(i) = at else {
            let i = self.list.len();
            self.index.by_key.insert(key(&pod), i);
            self.index
                .by_node
                .entry(pod.node.clone())
                .or_default()
                .push(i);
            self.list.push(pod);
            self.index.len += 1;
            return None;
        };
        if self.list[i].node != pod.node {
            self.unplace(&self.list[i].node.clone(), i);
            let at = self.index.by_node.entry(pod.node.clone()).or_default();
            let pos = at.partition_point(|&j| j < i);
            at.insert(pos, i);
        }
        Some(std::mem::replace(&mut self.list[i], pod))
    }

    /// Removes the pod of `namespace`/`name`, keeping the others' order.
    pub fn remove(&mut self, namespace: &str, name: &str) -> Option<PodRecord> {
        self.ensure_current();
        let i = self
            .index
            .by_key
            .remove(&(namespace.to_string(), name.to_string()))?;
        self.unplace(&self.list[i].node.clone(), i);
        let pod = self.list.remove(i);
        // Every later pod moved down by one.
        for j in self.index.by_key.values_mut().filter(|j| **j > i) {
            *j -= 1;
        }
        for at in self.index.by_node.values_mut() {
            let from = at.partition_point(|&j| j < i);
            at[from..].iter_mut().for_each(|j| *j -= 1);
        }
        self.index.len -= 1;
        Some(pod)
    }

    fn unplace(&mut self, node: &str, i: usize) {
        if let Some(at) = self.index.by_node.get_mut(node) {
            at.retain(|&j| j != i);
            if at.is_empty() {
                self.index.by_node.remove(node);
            }
        }
    }
}

/// The pods of `node`, in list order.
pub(crate) fn on_node<'v>(
    list: &'v [PodRecord],
    index: &'v PodIndex,
    node: &str,
) -> Box<dyn Iterator<Item = &'v PodRecord> + 'v> {
    if index.current(list) {
        let at = index.by_node.get(node).map_or(&[][..], Vec::as_slice);
        Box::new(at.iter().map(move |&i| &list[i]))
    } else {
        let node = node.to_string();
        Box::new(list.iter().filter(move |p| p.node == node))
    }
}

/// The pod of `namespace`/`name`.
pub(crate) fn find<'v>(
    list: &'v [PodRecord],
    index: &'v PodIndex,
    namespace: &str,
    name: &str,
) -> Option<&'v PodRecord> {
    if index.current(list) {
        let i = index
            .by_key
            .get(&(namespace.to_string(), name.to_string()))?;
        list.get(*i)
    } else {
        list.iter()
            .find(|p| p.name == name && p.namespace == namespace)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, node: &str) -> PodRecord {
        PodRecord {
            name: name.into(),
            namespace: "default".into(),
            node: node.into(),
            ..Default::default()
        }
    }

    fn names<'a>(it: impl Iterator<Item = &'a PodRecord>) -> Vec<&'a str> {
        it.map(|p| p.name.as_str()).collect()
    }

    #[test]
    fn the_index_follows_puts_moves_and_removals_as_a_walk_would() {
        let (mut list, mut index) = (Vec::new(), PodIndex::default());
        let mut pods = Pods {
            list: &mut list,
            index: &mut index,
        };
        for (n, node) in [("a", "w1"), ("b", "w2"), ("c", "w1"), ("d", "w2")] {
            assert!(pods.put(pod(n, node), true).is_none());
        }
        // b moves to w1; a goes; c is replaced on its node.
        assert_eq!(pods.put(pod("b", "w1"), true).unwrap().node, "w2");
        assert_eq!(pods.remove("default", "a").unwrap().name, "a");
        assert!(pods.remove("default", "a").is_none());
        pods.put(pod("c", "w1"), true);
        assert_eq!(names(on_node(&list, &index, "w1")), ["b", "c"]);
        assert_eq!(names(on_node(&list, &index, "w2")), ["d"]);
        assert!(on_node(&list, &index, "w3").next().is_none());
        assert_eq!(find(&list, &index, "default", "d").unwrap().node, "w2");
        // The same as an index built again from the list.
        let fresh = PodIndex::of(&list);
        assert_eq!(fresh.by_key, index.by_key);
        assert_eq!(fresh.by_node, index.by_node);
        // A list changed by hand is walked, not misread.
        list.push(pod("e", "w2"));
        assert_eq!(names(on_node(&list, &index, "w2")), ["d", "e"]);
        assert_eq!(find(&list, &index, "default", "e").unwrap().node, "w2");
    }
}
