//! A prefix's change as an ADD-PATH update group sees it: the exported
//! multipath set before the batch and now, each path under its path id.

use std::net::IpAddr;
use std::sync::Arc;

use super::exports::Exports;
use super::multipath::path_id;
use super::out::{Exported, OutNlri};
use super::Route;
use crate::types::Prefix;

/// One path of the set as exported to the group.
#[derive(Clone, Debug)]
pub(super) struct Sent {
    pub(super) id: u32,
    pub(super) value: Arc<Exported>,
    /// The peer the path came from (never sent back to it).
    pub(super) from: Option<IpAddr>,
}

impl Sent {
    fn same(&self, o: &Sent) -> bool {
        self.id == o.id && Arc::ptr_eq(&self.value, &o.value) && self.from == o.from
    }
}

/// The exported set of `paths` (a multipath set, best first): paths the
/// group may not be sent are left out, and of two that would be sent
/// with the same next hop (next-hop-self) only the better one goes.
pub(super) fn exported_set(exports: &mut Exports, paths: &[Route]) -> Vec<Sent> {
    let mut set: Vec<Sent> = Vec::with_capacity(paths.len());
    for r in paths {
        let Some(value) = exports.export(Some(r)) else {
            continue;
        };
        if set.iter().any(|s| s.value.next_hop == value.next_hop) {
            continue;
        }
        set.push(Sent {
            id: path_id(r),
            value,
            from: r.source.peer_addr(),
        });
    }
    set
}

pub(super) fn same_set(a: &[Sent], b: &[Sent]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.same(y))
}

/// What waits for a prefix: the set the group was sent before the first
/// change of the batch, and the set it is to have now.
#[derive(Clone, Debug, Default)]
pub(super) struct PathsPending {
    pub(super) was: Vec<Sent>,
    pub(super) now: Vec<Sent>,
}

impl PathsPending {
    /// The peers the paths come from, before and now.
    pub(super) fn sources(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.was.iter().chain(&self.now).filter_map(|s| s.from)
    }

    /// What `member` (None: one that is the source of none of the paths)
    /// is sent for `prefix`: each path it is to have that it was not
    /// sent as it is, and a withdrawal of each path id it was sent and is
    /// no longer to have. A member never gets its own paths.
    pub(super) fn for_member(
        &self,
        prefix: Prefix,
        member: Option<IpAddr>,
        out: &mut Vec<(OutNlri, Option<Arc<Exported>>)>,
    ) {
        let visible = |s: &&Sent| member.is_none() || s.from != member;
        let now: Vec<&Sent> = self.now.iter().filter(visible).collect();
        for w in self.was.iter().filter(visible) {
            if !now.iter().any(|n| n.id == w.id) {
                out.push(((prefix, Some(w.id)), None));
            }
        }
        for n in now {
            if !self.was.iter().filter(visible).any(|w| w.same(n)) {
                out.push(((prefix, Some(n.id)), Some(n.value.clone())));
            }
        }
    }
}
