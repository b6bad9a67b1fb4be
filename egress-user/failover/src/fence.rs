//! The agent's self-fencing: which EIPs it may announce (ARP/NDP answers,
//! gratuitous ARP, BGP) at a given instant.
//!
//! Pure. Rules:
//! - An agent announces only EIPs the datastore assigns to it, each with the
//!   assignment's epoch (fencing token).
//! - It never announces an EIP at an epoch older than one it has seen for that
//!   EIP, in the datastore or from another node's announcement.
//! - Once its last successful heartbeat renewal is `fence_after` old (a little
//!   less than `eipEvictionTimeout`, see [`FailoverTimers::fence_after`]) it
//!   announces nothing: the controller may hand its EIPs to another node from
//!   `eipEvictionTimeout` on, and by then this node is already silent.
//! - An EIP silenced that way is announced again only under a newer epoch
//!   that names this node: a node that comes back does not take its EIPs back
//!   on its own (no flapping), the controller has to say so.
//!
//! Why renewals and not any datastore contact: the controller judges the node
//! by its heartbeat, so reads that work while heartbeat writes fail must not
//! keep the node announcing. Pass the instant the successful renewal was
//! *sent*: the write cannot have reached the datastore earlier, so the
//! controller's clock for this node starts no earlier than that.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::timers::FailoverTimers;

/// One EIP assignment as read from the datastore.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assignment {
    pub eip: IpAddr,
    pub node: String,
    pub epoch: u64,
}

/// An EIP this node may announce, with the epoch to put on the announcement
/// (the owned-EIP map entry, the BGP route).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Announcement {
    pub eip: IpAddr,
    pub epoch: u64,
}

/// Self-fencing state of one agent.
#[derive(Clone, Debug)]
pub struct Fence {
    node: String,
    fence_after: Duration,
    /// Send time of the latest successful heartbeat renewal.
    last_renewal: Option<Instant>,
    /// The `last_renewal` whose fence has been recorded in `fenced_epochs`.
    settled: Option<Instant>,
    /// EIP -> epoch, the assignments naming this node in the latest view.
    owned: BTreeMap<IpAddr, u64>,
    /// EIP -> highest epoch seen anywhere.
    highest_seen: BTreeMap<IpAddr, u64>,
    /// EIP -> epoch at which this node fenced it; only a newer epoch may be
    /// announced again.
    fenced_epochs: BTreeMap<IpAddr, u64>,
}

impl Fence {
    /// A fence for `node` that silences it `timers.fence_after()` after its
    /// last successful renewal. Nothing is announced before the first one.
    pub fn new(node: impl Into<String>, timers: &FailoverTimers) -> Self {
        Self::with_fence_after(node, timers.fence_after())
    }

    pub fn with_fence_after(node: impl Into<String>, fence_after: Duration) -> Self {
        Self {
            node: node.into(),
            fence_after,
            last_renewal: None,
            settled: None,
            owned: BTreeMap::new(),
            highest_seen: BTreeMap::new(),
            fenced_epochs: BTreeMap::new(),
        }
    }

    pub fn node(&self) -> &str {
        &self.node
    }

    /// A heartbeat renewal sent at `sent_at` succeeded.
    pub fn on_heartbeat_renewed(&mut self, sent_at: Instant) {
        self.settle(sent_at);
        self.last_renewal = Some(self.last_renewal.map_or(sent_at, |r| r.max(sent_at)));
    }

    /// Replaces the view of all assignments (of every node: others' epochs
    /// count as seen) with a fresh read or the watch cache, at `now`.
    pub fn apply_assignments(&mut self, now: Instant, view: impl IntoIterator<Item = Assignment>) {
        self.settle(now);
        self.owned.clear();
        for a in view {
            self.see(a.eip, a.epoch);
            if a.node == self.node {
                self.owned.insert(a.eip, a.epoch);
            }
        }
    }

    /// An epoch for `eip` seen outside the datastore (another node's
    /// announcement, e.g. on a BGP route).
    pub fn observe_epoch(&mut self, now: Instant, eip: IpAddr, epoch: u64) {
        self.settle(now);
        self.see(eip, epoch);
    }

    /// True when the node must announce nothing: no renewal yet, or the last
    /// one is `fence_after` old.
    pub fn is_fenced(&self, now: Instant) -> bool {
        self.last_renewal
            .is_none_or(|r| now >= r + self.fence_after)
    }

    /// The EIPs this node may announce at `now`, with their epochs.
    pub fn announcements(&self, now: Instant) -> BTreeSet<Announcement> {
        if self.is_fenced(now) {
            return BTreeSet::new();
        }
        self.owned
            .iter()
            .filter(|(eip, epoch)| {
                let seen = self.highest_seen.get(eip).copied().unwrap_or(0);
                let fenced = self.fenced_epochs.get(eip);
                **epoch >= seen && fenced.is_none_or(|f| **epoch > *f)
            })
            .map(|(eip, epoch)| Announcement {
                eip: *eip,
                epoch: *epoch,
            })
            .collect()
    }

    /// EIPs the datastore still assigns to this node but that it withholds
    /// because it fenced itself while holding them at that epoch. The agent
    /// publishes this list (on its EgressTunnel) and the controller answers by
    /// re-assigning each of them with a new epoch, to this node or another.
    /// Needed because the agent fences a little before the controller's
    /// timeout: a node that was silent for longer than `fence_after` but less
    /// than the controller noticed is never evicted, and without this its
    /// EIPs would stay assigned and unannounced.
    pub fn awaiting_reconfirmation(&self) -> BTreeSet<Announcement> {
        self.owned
            .iter()
            .filter(|(eip, epoch)| {
                let seen = self.highest_seen.get(eip).copied().unwrap_or(0);
                **epoch >= seen && self.fenced_epochs.get(eip).is_some_and(|f| **epoch <= *f)
            })
            .map(|(eip, epoch)| Announcement {
                eip: *eip,
                epoch: *epoch,
            })
            .collect()
    }

    /// When [`Fence::announcements`] changes if nothing else happens: the
    /// fencing deadline, while it is ahead. The agent must re-evaluate (and
    /// withdraw) then, even if its datastore calls are still hanging.
    pub fn next_deadline(&self, now: Instant) -> Option<Instant> {
        let deadline = self.last_renewal? + self.fence_after;
        (now < deadline).then_some(deadline)
    }

    fn see(&mut self, eip: IpAddr, epoch: u64) {
        let e = self.highest_seen.entry(eip).or_insert(epoch);
        *e = (*e).max(epoch);
    }

    /// If the node has been fenced since its last renewal, remembers the
    /// epochs it held then (before the caller changes anything).
    fn settle(&mut self, now: Instant) {
        let Some(renewal) = self.last_renewal else {
            return;
        };
        if now >= renewal + self.fence_after && self.settled != Some(renewal) {
            self.settled = Some(renewal);
            for (eip, epoch) in &self.owned {
                let e = self.fenced_epochs.entry(*eip).or_insert(*epoch);
                *e = (*e).max(*epoch);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    fn eip(last: u8) -> IpAddr {
        IpAddr::from([192, 0, 2, last])
    }

    fn assign(e: u8, node: &str, epoch: u64) -> Assignment {
        Assignment {
            eip: eip(e),
            node: node.into(),
            epoch,
        }
    }

    fn ann(list: &[(u8, u64)]) -> BTreeSet<Announcement> {
        list.iter()
            .map(|(e, epoch)| Announcement {
                eip: eip(*e),
                epoch: *epoch,
            })
            .collect()
    }

    /// One step of a fence scenario, at a time in ms after t0.
    enum Step {
        Renewed { sent_ms: u64 },
        View { at_ms: u64, view: Vec<Assignment> },
        Seen { at_ms: u64, e: u8, epoch: u64 },
        Expect { at_ms: u64, want: Vec<(u8, u64)> },
    }
    use Step::*;

    fn run(name: &str, steps: Vec<Step>) {
        let t0 = Instant::now();
        let t = |v: u64| t0 + ms(v);
        // fence after 900 ms (as with update 100 ms, eviction 1 s).
        let mut f = Fence::with_fence_after("a", ms(900));
        for (i, step) in steps.into_iter().enumerate() {
            match step {
                Renewed { sent_ms } => f.on_heartbeat_renewed(t(sent_ms)),
                View { at_ms, view } => f.apply_assignments(t(at_ms), view),
                Seen { at_ms, e, epoch } => f.observe_epoch(t(at_ms), eip(e), epoch),
                Expect { at_ms, want } => {
                    assert_eq!(f.announcements(t(at_ms)), ann(&want), "{name}: step {i}")
                }
            }
        }
    }

    #[test]
    fn fence_table() {
        run(
            "nothing before the first renewal",
            vec![
                View {
                    at_ms: 0,
                    view: vec![assign(1, "a", 1)],
                },
                Expect {
                    at_ms: 0,
                    want: vec![],
                },
                Renewed { sent_ms: 10 },
                Expect {
                    at_ms: 20,
                    want: vec![(1, 1)],
                },
            ],
        );
        run(
            "only own EIPs, with their epochs",
            vec![
                Renewed { sent_ms: 0 },
                View {
                    at_ms: 0,
                    view: vec![assign(1, "a", 4), assign(2, "b", 9), assign(3, "a", 2)],
                },
                Expect {
                    at_ms: 1,
                    want: vec![(1, 4), (3, 2)],
                },
            ],
        );
        run(
            "silent exactly fence_after after the last renewal",
            vec![
                Renewed { sent_ms: 100 },
                View {
                    at_ms: 100,
                    view: vec![assign(1, "a", 1)],
                },
                Expect {
                    at_ms: 999,
                    want: vec![(1, 1)],
                },
                Expect {
                    at_ms: 1000,
                    want: vec![],
                },
            ],
        );
        run(
            "renewals keep it announcing",
            vec![
                View {
                    at_ms: 0,
                    view: vec![assign(1, "a", 1)],
                },
                Renewed { sent_ms: 0 },
                Renewed { sent_ms: 800 },
                Expect {
                    at_ms: 1600,
                    want: vec![(1, 1)],
                },
            ],
        );
        run(
            "a late answer to a renewal sent in time is no fence",
            vec![
                View {
                    at_ms: 0,
                    view: vec![assign(1, "a", 1)],
                },
                Renewed { sent_ms: 0 },
                // Sent at 850, answered at 950: the view applied at 920 falls in
                // the gap but the node was never fenced at the send time.
                Expect {
                    at_ms: 920,
                    want: vec![],
                },
                Renewed { sent_ms: 850 },
                Expect {
                    at_ms: 950,
                    want: vec![(1, 1)],
                },
            ],
        );
        run(
            "back after a fence: no take-back at the same epoch",
            vec![
                View {
                    at_ms: 0,
                    view: vec![assign(1, "a", 3)],
                },
                Renewed { sent_ms: 0 },
                Expect {
                    at_ms: 1000,
                    want: vec![],
                },
                Renewed { sent_ms: 2000 },
                View {
                    at_ms: 2010,
                    view: vec![assign(1, "a", 3)],
                },
                Expect {
                    at_ms: 2020,
                    want: vec![],
                },
                // The controller confirms with a newer epoch.
                View {
                    at_ms: 2100,
                    view: vec![assign(1, "a", 4)],
                },
                Expect {
                    at_ms: 2110,
                    want: vec![(1, 4)],
                },
            ],
        );
        run(
            "back after a fence, the EIP moved: stays silent",
            vec![
                View {
                    at_ms: 0,
                    view: vec![assign(1, "a", 3)],
                },
                Renewed { sent_ms: 0 },
                Renewed { sent_ms: 5000 },
                View {
                    at_ms: 5010,
                    view: vec![assign(1, "b", 4)],
                },
                Expect {
                    at_ms: 5020,
                    want: vec![],
                },
            ],
        );
        run(
            "fence noticed only by the renewal still counts",
            vec![
                // No call between the deadline and the recovery: the renewal
                // itself records the fence.
                View {
                    at_ms: 0,
                    view: vec![assign(1, "a", 3), assign(2, "a", 5)],
                },
                Renewed { sent_ms: 0 },
                Renewed { sent_ms: 3000 },
                Expect {
                    at_ms: 3001,
                    want: vec![],
                },
            ],
        );
        run(
            "a newer assignment read during the fence is honoured after it",
            vec![
                View {
                    at_ms: 0,
                    view: vec![assign(1, "a", 3)],
                },
                Renewed { sent_ms: 0 },
                View {
                    at_ms: 1500,
                    view: vec![assign(1, "a", 6)],
                },
                Expect {
                    at_ms: 1500,
                    want: vec![],
                },
                Renewed { sent_ms: 1600 },
                Expect {
                    at_ms: 1610,
                    want: vec![(1, 6)],
                },
            ],
        );
        run(
            "a higher epoch seen elsewhere silences ours",
            vec![
                Renewed { sent_ms: 0 },
                View {
                    at_ms: 0,
                    view: vec![assign(1, "a", 2), assign(2, "a", 2)],
                },
                Seen {
                    at_ms: 10,
                    e: 1,
                    epoch: 3,
                },
                Expect {
                    at_ms: 20,
                    want: vec![(2, 2)],
                },
                Seen {
                    at_ms: 30,
                    e: 2,
                    epoch: 1,
                },
                Expect {
                    at_ms: 40,
                    want: vec![(2, 2)],
                },
            ],
        );
        run(
            "a stale view never brings back an older epoch",
            vec![
                Renewed { sent_ms: 0 },
                View {
                    at_ms: 0,
                    view: vec![assign(1, "b", 5)],
                },
                View {
                    at_ms: 10,
                    view: vec![assign(1, "a", 4)],
                },
                Expect {
                    at_ms: 20,
                    want: vec![],
                },
            ],
        );
        run(
            "an EIP deleted from the view is withdrawn",
            vec![
                Renewed { sent_ms: 0 },
                View {
                    at_ms: 0,
                    view: vec![assign(1, "a", 1)],
                },
                View {
                    at_ms: 10,
                    view: vec![],
                },
                Expect {
                    at_ms: 20,
                    want: vec![],
                },
            ],
        );
    }

    #[test]
    fn withheld_eips_await_reconfirmation() {
        let t0 = Instant::now();
        let t = |v: u64| t0 + ms(v);
        let mut f = Fence::with_fence_after("a", ms(900));
        f.apply_assignments(
            t(0),
            [assign(1, "a", 3), assign(2, "a", 5), assign(3, "b", 1)],
        );
        f.on_heartbeat_renewed(t(0));
        assert!(
            f.awaiting_reconfirmation().is_empty(),
            "nothing withheld while healthy"
        );
        // Silent from 900 ms; back at 1000 ms, before any controller timeout.
        f.on_heartbeat_renewed(t(1000));
        f.apply_assignments(
            t(1010),
            [assign(1, "a", 3), assign(2, "a", 5), assign(3, "b", 1)],
        );
        assert!(f.announcements(t(1010)).is_empty());
        assert_eq!(f.awaiting_reconfirmation(), ann(&[(1, 3), (2, 5)]));
        // The controller re-confirms EIP 1 here and moves EIP 2 away.
        f.apply_assignments(
            t(1100),
            [assign(1, "a", 6), assign(2, "b", 7), assign(3, "b", 1)],
        );
        assert_eq!(f.announcements(t(1100)), ann(&[(1, 6)]));
        assert!(f.awaiting_reconfirmation().is_empty());
    }

    #[test]
    fn deadline_tracks_last_renewal() {
        let t0 = Instant::now();
        let mut f = Fence::new("a", &FailoverTimers::default());
        assert_eq!(f.next_deadline(t0), None);
        f.on_heartbeat_renewed(t0);
        assert_eq!(f.next_deadline(t0), Some(t0 + ms(13_500)));
        assert_eq!(f.next_deadline(t0 + ms(13_500)), None);
        f.on_heartbeat_renewed(t0 - ms(1)); // out-of-order answer: no step back
        assert_eq!(f.next_deadline(t0), Some(t0 + ms(13_500)));
    }
}
