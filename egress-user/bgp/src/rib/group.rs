//! Update groups: peers that see the same export of every route share one
//! queue of changes and one packing of it (see [`OutGroup`]).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use super::exports::{Exports, GroupKey};
use super::paths_out::{exported_set, same_set, PathsPending};
use super::{out, Route};
use crate::codec::Update;
use crate::types::{Prefix, PrefixMap};

/// A prefix's change waiting in a group: the export of its current best
/// route, and enough of the past for each member to decide alone.
#[derive(Clone)]
pub(super) struct Pending {
    /// The export of the current best route; None: nothing to export.
    pub(super) value: Option<Arc<out::Exported>>,
    /// The peer the current best route came from.
    pub(super) from: Option<IpAddr>,
    /// Before the first change of this batch: whether the best route was
    /// exported to the group, and where it came from.
    pub(super) was_exported: bool,
    pub(super) was_from: Option<IpAddr>,
}

impl Pending {
    /// What `member` is sent: an announcement (Some(Some)), a withdrawal
    /// (Some(None)) or nothing. A member never gets its own routes back,
    /// and gets a withdrawal only for a route it was sent.
    pub(super) fn for_member(&self, member: Option<IpAddr>) -> Option<Option<&Arc<out::Exported>>> {
        if self.value.is_some() && (member.is_none() || self.from != member) {
            return Some(self.value.as_ref());
        }
        let had = self.was_exported && (member.is_none() || self.was_from != member);
        had.then_some(None)
    }
}

/// Peers that see the same export of every route (FRR's update groups):
/// one queue of changes, one export per route and one packing for all of
/// them, so the speaker encodes each UPDATE once and sends the same bytes
/// to every member. A peer whose session comes up (or asks for a route
/// refresh) gets a group of its own for its full table, merged back once
/// both are sent out; sessions that come up before that table is packed
/// share it.
pub(super) struct OutGroup {
    pub(super) key: GroupKey,
    pub(super) members: Vec<IpAddr>,
    pub(super) pending: PrefixMap<Pending>,
    /// The changes of prefixes in the families the group is sent ADD-PATH
    /// for (`key.add_path`): whole multipath sets instead of best routes.
    pub(super) paths: PrefixMap<PathsPending>,
    /// Loc-RIB prefixes exported to the group ...
    pub(super) advertised: usize,
    /// ... of which came from each member (so not sent to it).
    pub(super) own: HashMap<IpAddr, usize>,
    /// Made for sessions that came up and nothing sent yet: its pending
    /// changes are the whole table as exported to its key, so a session
    /// that comes up meanwhile can join it instead of packing and encoding
    /// a copy of its own.
    pub(super) fresh: bool,
}

impl OutGroup {
    pub(super) fn new(key: GroupKey, member: IpAddr) -> OutGroup {
        OutGroup {
            key,
            members: vec![member],
            pending: PrefixMap::default(),
            paths: PrefixMap::default(),
            advertised: 0,
            own: HashMap::from([(member, 0)]),
            fresh: false,
        }
    }

    /// Whether changes wait to be packed.
    pub(super) fn has_pending(&self) -> bool {
        !self.pending.is_empty() || !self.paths.is_empty()
    }

    /// How many prefixes have changes waiting.
    pub(super) fn pending_len(&self) -> usize {
        self.pending.len() + self.paths.len()
    }

    /// Queues the change of `prefix`'s multipath set from `old` to `new`
    /// (each best first), for a group sent ADD-PATH in its family.
    pub(super) fn queue_paths(
        &mut self,
        exports: &mut Exports,
        prefix: Prefix,
        old: &[Route],
        new: &[Route],
    ) {
        let before = exported_set(exports, old);
        let after = exported_set(exports, new);
        if same_set(&before, &after) {
            return;
        }
        self.advertised = (self.advertised + after.len()).saturating_sub(before.len());
        for f in before.iter().filter_map(|s| s.from) {
            if let Some(n) = self.own.get_mut(&f) {
                *n = n.saturating_sub(1);
            }
        }
        for f in after.iter().filter_map(|s| s.from) {
            if let Some(n) = self.own.get_mut(&f) {
                *n += 1;
            }
        }
        match self.paths.entry(prefix) {
            std::collections::hash_map::Entry::Occupied(mut e) => e.get_mut().now = after,
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(PathsPending {
                    was: before,
                    now: after,
                });
            }
        }
    }

    /// Queues the change of `prefix` from `old` to `new` best route.
    pub(super) fn queue(
        &mut self,
        exports: &mut Exports,
        prefix: Prefix,
        old: Option<&Route>,
        new: Option<&Route>,
    ) {
        let before = exports.export(old);
        let after = exports.export(new);
        let old_from = old.and_then(|r| r.source.peer_addr());
        let new_from = new.and_then(|r| r.source.peer_addr());
        let same = match (&before, &after) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b) && old_from == new_from,
            (None, None) => true,
            _ => false,
        };
        if same {
            return;
        }
        if before.is_some() {
            self.advertised = self.advertised.saturating_sub(1);
            if let Some(n) = old_from.and_then(|f| self.own.get_mut(&f)) {
                *n = n.saturating_sub(1);
            }
        }
        if after.is_some() {
            self.advertised += 1;
            if let Some(n) = new_from.and_then(|f| self.own.get_mut(&f)) {
                *n += 1;
            }
        }
        match self.pending.entry(prefix) {
            std::collections::hash_map::Entry::Occupied(mut e) => {
                let p = e.get_mut();
                p.value = after;
                p.from = new_from;
            }
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(Pending {
                    value: after,
                    from: new_from,
                    was_exported: before.is_some(),
                    was_from: old_from,
                });
            }
        }
    }

    /// Packs the pending changes: the prefixes no member is the source of
    /// in one list for all members; those some member is the source of
    /// (its own routes, never sent back to it) in one list for the other
    /// members and one for each source. So sessions that come up together
    /// and announce their routes at once share one full table and get a
    /// few prefixes each on their own, not a full table each.
    ///
    /// Each list goes to `send` as soon as it is packed, so that one list
    /// at a time is alive as [`Update`]s (a full table costs some 150
    /// octets a prefix before it is encoded to a few).
    pub(super) fn take(&mut self, send: &mut impl FnMut(Outgoing)) {
        if !self.has_pending() {
            return;
        }
        self.fresh = false;
        let (sourced, common): (Vec<_>, Vec<_>) = self
            .pending
            .iter()
            .partition(|(_, p)| self.sourced_by_member(p));
        let (paths_sourced, paths_common): (Vec<_>, Vec<_>) = self
            .paths
            .iter()
            .partition(|(_, p)| p.sources().any(|f| self.own.contains_key(&f)));
        let common = Changes {
            best: common,
            paths: paths_common,
        };
        self.pack_for(None, self.members.clone(), &common, send);
        let sourced = Changes {
            best: sourced,
            paths: paths_sourced,
        };
        if !sourced.best.is_empty() || !sourced.paths.is_empty() {
            self.take_sourced(&sourced, send);
        }
        let big = self.pending.capacity() > 1 << 16;
        self.pending.clear();
        self.paths.clear();
        if big {
            self.pending.shrink_to(0);
        }
    }

    /// Whether a member is the source of the change's route, or of the
    /// route it replaces.
    fn sourced_by_member(&self, p: &Pending) -> bool {
        [p.from, p.was_from]
            .into_iter()
            .flatten()
            .any(|f| self.own.contains_key(&f))
    }

    /// The lists of the `sourced` changes: one for the members that are
    /// the source of none of them, one for each that is.
    fn take_sourced(&self, sourced: &Changes<'_>, send: &mut impl FnMut(Outgoing)) {
        let mut alone: Vec<IpAddr> = Vec::new();
        let best_sources = sourced
            .best
            .iter()
            .flat_map(|(_, p)| [p.from, p.was_from].into_iter().flatten());
        let path_sources = sourced.paths.iter().flat_map(|(_, p)| p.sources());
        for f in best_sources.chain(path_sources) {
            if !alone.contains(&f) && self.own.contains_key(&f) {
                alone.push(f);
            }
        }
        let alike: Vec<IpAddr> = self
            .members
            .iter()
            .filter(|m| !alone.contains(m))
            .copied()
            .collect();
        if !alike.is_empty() {
            self.pack_for(None, alike, sourced, send);
        }
        for m in alone {
            self.pack_for(Some(m), vec![m], sourced, send);
        }
    }

    /// Packs what `member` (None: a member that sourced none of them) is
    /// sent of `changes` and hands it to `send` for `peers`, unless it is
    /// nothing.
    fn pack_for(
        &self,
        member: Option<IpAddr>,
        peers: Vec<IpAddr>,
        changes: &Changes<'_>,
        send: &mut impl FnMut(Outgoing),
    ) {
        // Lazily: a full table collected first cost a copy of every item.
        let best = changes
            .best
            .iter()
            .filter_map(|(k, p)| p.for_member(member).map(|v| ((**k, None), v.cloned())));
        let paths = changes.paths.iter().flat_map(|(k, p)| {
            let mut v = Vec::new();
            p.for_member(**k, member, &mut v);
            v
        });
        let updates = out::pack(best.chain(paths));
        if !updates.is_empty() {
            send(Outgoing { peers, updates });
        }
    }
}

/// Changes being packed: best routes, and multipath sets (ADD-PATH).
struct Changes<'a> {
    best: Vec<(&'a Prefix, &'a Pending)>,
    paths: Vec<(&'a Prefix, &'a PathsPending)>,
}

/// Whether a peer can be sent more (see [`super::Rib::take_outgoing_where`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Readiness {
    /// Nothing sent to it is waiting to be written.
    Ready,
    /// Still writing, but not far behind: it stays in its group and is
    /// sent the next batch with the others, which goes out once a member
    /// is Ready (so a group is paced by its fastest member, and batches
    /// coalesce the changes made meanwhile).
    Writing,
    /// Far behind: its group goes on without it, and its changes wait,
    /// one per prefix, until it is ready.
    Busy,
}

/// UPDATEs for a set of peers that are all to be sent the same.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outgoing {
    pub peers: Vec<IpAddr>,
    pub updates: Vec<Update>,
}
