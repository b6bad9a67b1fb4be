//! Which slot of `POLICY_STATS` (a per-CPU array) holds each policy's
//! counters. The programs count by the slot a NAT entry carries, so a
//! policy keeps its slot for as long as it is on the node. New policies
//! take free slots in turn from a cursor that only moves forward
//! (wrapping), so that a slot just freed (whose old flows' replies may
//! still count into it) is the last to be handed out again.

use std::collections::{BTreeMap, BTreeSet};

use egress_common::{maps::POLICY_STATS_SIZE, policy::EgressTarget};

/// A slot no counter has: the programs' lookup misses and counts nothing.
pub const NO_SLOT: u32 = u32::MAX;

/// Policy id -> counter slot, and where the search for a free slot starts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StatsSlots {
    pub by_policy: BTreeMap<u32, u32>,
    pub next: u32,
}

impl StatsSlots {
    /// The slots of `ids`: each keeps its slot here, the others take free
    /// ones. Ids beyond the array's size (never, with the node's caps)
    /// get none.
    pub fn assign(&self, ids: &BTreeSet<u32>) -> StatsSlots {
        let size = POLICY_STATS_SIZE;
        let mut by_policy = BTreeMap::new();
        let mut used = BTreeSet::new();
        for id in ids {
            if let Some(&s) = self.by_policy.get(id) {
                if s < size && used.insert(s) {
                    by_policy.insert(*id, s);
                }
            }
        }
        let mut next = self.next % size;
        for id in ids {
            if by_policy.contains_key(id) || used.len() as u32 >= size {
                continue;
            }
            while used.contains(&next) {
                next = (next + 1) % size;
            }
            used.insert(next);
            by_policy.insert(*id, next);
            next = (next + 1) % size;
        }
        StatsSlots { by_policy, next }
    }

    /// The slots a slot table holds (what the last apply, perhaps of an
    /// agent before this one, assigned); the search goes on after the
    /// highest.
    pub fn from_targets(targets: &[EgressTarget]) -> StatsSlots {
        let by_policy: BTreeMap<u32, u32> = targets
            .iter()
            .filter(|t| t.flags != 0 && t.stats_slot < POLICY_STATS_SIZE)
            .map(|t| (t.policy_id, t.stats_slot))
            .collect();
        let next = by_policy
            .values()
            .max()
            .map_or(0, |s| (s + 1) % POLICY_STATS_SIZE);
        StatsSlots { by_policy, next }
    }

    /// The slot of policy `id`, or [`NO_SLOT`].
    pub fn of(&self, id: u32) -> u32 {
        self.by_policy.get(&id).copied().unwrap_or(NO_SLOT)
    }

    /// The slots this assigns that `prev` did not assign to the same
    /// policy: their counters must start from zero.
    pub fn fresh_since(&self, prev: &StatsSlots) -> BTreeSet<u32> {
        self.by_policy
            .iter()
            .filter(|(id, s)| prev.by_policy.get(id) != Some(s))
            .map(|(_, s)| *s)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: &[u32]) -> BTreeSet<u32> {
        v.iter().copied().collect()
    }

    #[test]
    fn a_policy_keeps_its_slot_while_others_come_and_go() {
        let a = StatsSlots::default().assign(&ids(&[70, 10, 99]));
        assert_eq!((a.of(10), a.of(70), a.of(99)), (0, 1, 2));
        let b = a.assign(&ids(&[10, 99, 5, 6]));
        assert_eq!((b.of(10), b.of(99)), (0, 2));
        // The new ones after the last given out, not in the slot 70 left.
        assert_eq!((b.of(5), b.of(6)), (3, 4));
        assert_eq!(b.of(70), NO_SLOT);
        assert_eq!(b.fresh_since(&a), ids(&[3, 4]));
    }

    #[test]
    fn a_freed_slot_is_the_last_to_be_given_out_again() {
        let size = POLICY_STATS_SIZE;
        let mut s = StatsSlots::default().assign(&ids(&[1, 2]));
        assert_eq!((s.of(1), s.of(2)), (0, 1));
        // Policy 2 leaves and others come and go, round after round: slot 1
        // stays free until the cursor has been round every other slot.
        let mut live = ids(&[1]);
        for id in 3..size + 1 {
            live.insert(id);
            s = s.assign(&live);
            assert_ne!(s.of(id), 1, "policy {id} got the freed slot early");
            live.remove(&id);
            s = s.assign(&live);
        }
        live.insert(size + 1);
        assert_eq!(s.assign(&live).of(size + 1), 1);
    }

    #[test]
    fn slots_past_the_array_or_shared_are_not_kept() {
        let mut prev = StatsSlots::default();
        prev.by_policy.insert(1, POLICY_STATS_SIZE + 3);
        prev.by_policy.insert(2, 7);
        prev.by_policy.insert(3, 7);
        let a = prev.assign(&ids(&[1, 2, 3]));
        assert_eq!(a.of(2), 7);
        let all: BTreeSet<u32> = a.by_policy.values().copied().collect();
        assert_eq!(all.len(), 3, "{a:?}");
        assert!(all.iter().all(|s| *s < POLICY_STATS_SIZE));
    }

    #[test]
    fn more_policies_than_slots_leave_the_rest_uncounted() {
        let many: BTreeSet<u32> = (1..=POLICY_STATS_SIZE + 5).collect();
        let a = StatsSlots::default().assign(&many);
        assert_eq!(a.by_policy.len() as u32, POLICY_STATS_SIZE);
        assert_eq!(a.of(POLICY_STATS_SIZE + 5), NO_SLOT);
    }

    #[test]
    fn the_pinned_table_gives_back_the_slots_in_use() {
        let t = |id, flags, slot| EgressTarget {
            policy_id: id,
            flags,
            stats_slot: slot,
            ..Default::default()
        };
        let got = StatsSlots::from_targets(&[t(5, 1, 9), t(6, 0, 3), t(7, 1, POLICY_STATS_SIZE)]);
        assert_eq!(got.by_policy, [(5, 9)].into_iter().collect());
        assert_eq!(got.next, 10);
    }
}
