//! Running the decision process on a prefix and queueing what changed to
//! the update groups: the best route to most, the multipath set to those
//! sent ADD-PATH in the prefix's family.

use std::net::IpAddr;

use super::exports::Exports;
use super::group::{OutGroup, Pending};
use super::multipath::Selection;
use super::paths_out::{exported_set, PathsPending};
use super::{exports_for, flagged, select_best, BestChange, Rib, Route};
use crate::types::{Family, Prefix, PrefixMap};

/// Queues the change of one prefix for one group, in the form it takes.
fn queue_change(
    g: &mut OutGroup,
    exports: &mut Exports,
    prefix: Prefix,
    old: &Selection,
    new: &Selection,
) {
    if g.key.add_path.has(prefix.family()) {
        g.queue_paths(exports, prefix, old.paths(), new.paths());
    } else {
        g.queue(exports, prefix, old.best.as_ref(), new.best.as_ref());
    }
}

/// Queues a new session's whole table in its (fresh) group.
pub(super) fn queue_table(
    g: &mut OutGroup,
    exports: &mut Exports,
    candidates: &PrefixMap<Vec<Route>>,
) {
    for (prefix, routes) in candidates {
        let Some(best) = flagged(routes) else {
            continue;
        };
        if g.key.add_path.has(prefix.family()) {
            g.queue_paths(exports, *prefix, &[], Selection::of(routes).paths());
        } else {
            g.queue(exports, *prefix, None, Some(best));
        }
    }
}

impl Rib {
    /// Runs the decision process for `prefix`, whose selection was `old`
    /// before the change that calls it.
    pub(super) fn recompute(&mut self, prefix: Prefix, old: Selection) {
        if self.deferring {
            self.dirty.entry(prefix).or_insert(old);
            return;
        }
        let mut new = Selection::default();
        if let Some(routes) = self.candidates.get_mut(&prefix) {
            let chosen = select_best(routes.iter()).map(|r| r as *const Route);
            for r in routes.iter_mut() {
                r.best = chosen == Some(r as *const Route);
            }
            new = Selection::of(routes);
            if routes.is_empty() {
                self.candidates.remove(&prefix);
            }
        }
        match (&old.best, &new.best) {
            (None, Some(_)) => self.loc_len += 1,
            (Some(_), None) => self.loc_len = self.loc_len.saturating_sub(1),
            _ => {}
        }
        if old == new {
            return;
        }
        if old.best != new.best {
            self.note_best_change(prefix, old.best.as_ref(), new.best.as_ref());
        }
        for g in self.groups.values_mut() {
            let exports = exports_for(&mut self.exports, &self.cfg, &g.key);
            queue_change(g, exports, prefix, &old, &new);
        }
    }

    /// Records a Loc-RIB change for the agent.
    fn note_best_change(&mut self, prefix: Prefix, old: Option<&Route>, new: Option<&Route>) {
        let Some(r) = new else {
            self.best_changes.push(BestChange::Removed { prefix });
            return;
        };
        // Only other attribute or staleness changes: the agent's map
        // entry stays the same, so do not bother it.
        let same_for_agent = old.is_some_and(|o| {
            o.next_hop == r.next_hop
                && o.source == r.source
                && o.attrs.local_pref == r.attrs.local_pref
        });
        if !same_for_agent {
            self.best_changes.push(BestChange::Set {
                prefix,
                next_hop: r.next_hop,
                from: r.source.peer_addr(),
                local_pref: r.attrs.local_pref,
            });
        }
    }

    /// RFC 2918: the peer asked for everything again.
    pub fn refresh(&mut self, addr: IpAddr, family: Family) {
        let Some(id) = self.split(addr) else {
            return;
        };
        let g = self.groups.get_mut(&id).expect("split");
        let exports = exports_for(&mut self.exports, &self.cfg, &g.key);
        let add_path = g.key.add_path.has(family);
        for (prefix, routes) in self.candidates.iter().filter(|(k, _)| k.family() == family) {
            let Some(r) = flagged(routes) else {
                continue;
            };
            if add_path {
                if g.paths.contains_key(prefix) {
                    continue; // already current
                }
                let now = exported_set(exports, Selection::of(routes).paths());
                if !now.is_empty() {
                    let p = PathsPending {
                        was: Vec::new(),
                        now,
                    };
                    g.paths.insert(*prefix, p);
                }
                continue;
            }
            if g.pending.contains_key(prefix) {
                continue; // already current
            }
            if let Some(e) = exports.export(Some(r)) {
                g.pending.insert(
                    *prefix,
                    Pending {
                        value: Some(e),
                        from: r.source.peer_addr(),
                        was_exported: false,
                        was_from: None,
                    },
                );
            }
        }
    }
}
