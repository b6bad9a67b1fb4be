//! One client's view of the fleet's routes: which it holds, with which
//! generation (the MED its owner announced it with), which are stale
//! after a lost session, and whether it holds every other client's routes
//! at their current generation.

use std::sync::atomic::Ordering;

use super::Shared;

pub(super) struct Table {
    me: usize,
    /// Per route: 0 absent, else the generation held plus one.
    held: Vec<u32>,
    stale: Vec<bool>,
    /// Routes of other clients held at their current generation.
    good: usize,
    /// How many routes other clients own.
    need: usize,
    /// The fleet's epoch `good` was counted for.
    epoch: u32,
    owners: Vec<usize>,
}

impl Table {
    pub(super) fn new(me: usize, shared: &Shared) -> Table {
        let n = shared.owner.len();
        Table {
            me,
            held: vec![0; n],
            stale: vec![false; n],
            good: 0,
            need: shared.owner.iter().filter(|o| **o != me).count(),
            epoch: shared.epoch.load(Ordering::SeqCst),
            owners: shared.owner.clone(),
        }
    }

    fn wanted(&self, shared: &Shared, r: usize) -> Option<u32> {
        let o = shared.owner[r];
        (o != self.me).then(|| shared.gens[o].load(Ordering::SeqCst) + 1)
    }

    fn set(&mut self, shared: &Shared, r: usize, v: u32) {
        if let Some(w) = self.wanted(shared, r) {
            if self.held[r] == w {
                self.good -= 1;
            }
            if v == w {
                self.good += 1;
            }
        }
        self.held[r] = v;
        self.stale[r] = false;
    }

    pub(super) fn announce(&mut self, shared: &Shared, r: usize, generation: u32) {
        self.set(shared, r, generation + 1);
    }

    /// Returns whether the route was held (a withdrawal that removed it).
    pub(super) fn withdraw(&mut self, shared: &Shared, r: usize) -> bool {
        let had = self.held[r] != 0;
        self.set(shared, r, 0);
        had
    }

    /// Session lost, its routes kept as stale (graceful restart helper).
    pub(super) fn mark_stale(&mut self) {
        for (s, h) in self.stale.iter_mut().zip(&self.held) {
            *s = *h != 0;
        }
    }

    /// End-of-RIB: stale routes not sent again go; returns how many.
    pub(super) fn purge_stale(&mut self, shared: &Shared) -> usize {
        let gone: Vec<usize> = (0..self.stale.len()).filter(|r| self.stale[*r]).collect();
        for r in &gone {
            self.set(shared, *r, 0);
        }
        gone.len()
    }

    /// Session lost without graceful restart: everything goes; returns
    /// how many other clients' routes were held.
    pub(super) fn clear(&mut self) -> usize {
        let me = self.me;
        let had = self
            .held
            .iter()
            .enumerate()
            .filter(|(r, h)| **h != 0 && self.owner_of(*r) != me)
            .count();
        self.held.fill(0);
        self.stale.fill(false);
        self.good = 0;
        had
    }

    fn owner_of(&self, r: usize) -> usize {
        self.owners[r]
    }

    /// Whether every other client's route is held at its generation, and
    /// the epoch that holds for (counted again when the fleet's changed).
    pub(super) fn consistent(&mut self, shared: &Shared) -> (bool, u32) {
        let epoch = shared.epoch.load(Ordering::SeqCst);
        if epoch != self.epoch {
            self.epoch = epoch;
            self.good = (0..self.held.len())
                .filter(|r| self.wanted(shared, *r) == Some(self.held[*r]))
                .count();
        }
        (self.good == self.need, epoch)
    }
}
