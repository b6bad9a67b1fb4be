//! Graceful restart (RFC 4724, with the N bit of RFC 8538), without I/O.
//!
//! [`Helper`] runs once per peer and decides what happens to the peer's
//! routes when its session drops and comes back. [`Restarter`] runs once
//! per speaker and holds back route selection after our own restart until
//! the peers have sent their tables (End-of-RIB) or a deadline passes.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::time::Duration;

use crate::codec::{notif, GrFamily, GracefulRestartCap, LlgrFamily, Notification, Open, Update};
use crate::fsm::DownReason;
use crate::types::Family;

#[derive(Clone, Debug)]
pub struct GrConfig {
    /// Seconds we ask peers to keep our routes while we restart (12 bits).
    pub restart_time: u16,
    /// How long a peer that came back may take to send End-of-RIB before
    /// its remaining stale routes are dropped.
    pub stale_time: Duration,
    /// Longest wait for End-of-RIB from peers after our own restart. Must
    /// be shorter than `restart_time`, or peers drop our routes while we
    /// still hold back.
    pub deferral_time: Duration,
    /// F bit. A route reflector is not in the forwarding path of the
    /// routes it reflects, so its restart does not disturb forwarding.
    pub forwarding_preserved: bool,
    /// RFC 9494 long-lived stale time we ask peers for, in seconds (24
    /// bits); 0 leaves long-lived graceful restart off.
    pub llgr_stale_time: u32,
}

/// The deferral actually used: it must end before the restart time we
/// asked peers for, or they drop our routes while we still hold back; a
/// longer setting is cut to half the restart time.
pub fn effective_deferral(cfg: &GrConfig) -> Duration {
    let restart = Duration::from_secs(cfg.restart_time.into());
    if cfg.deferral_time < restart {
        cfg.deferral_time
    } else {
        restart / 2
    }
}

/// RFC 9494 well-known communities.
pub const LLGR_STALE: u32 = 0xffff_0006;
pub const NO_LLGR: u32 = 0xffff_0007;

/// Our long-lived graceful restart capability, if configured.
pub fn llgr_capability(cfg: &GrConfig, families: &[Family]) -> Option<Vec<LlgrFamily>> {
    (cfg.llgr_stale_time > 0).then(|| {
        families
            .iter()
            .map(|f| LlgrFamily {
                afi_safi: (*f).into(),
                forwarding_preserved: cfg.forwarding_preserved,
                stale_time: cfg.llgr_stale_time.min(0x00ff_ffff),
            })
            .collect()
    })
}

impl Default for GrConfig {
    fn default() -> Self {
        GrConfig {
            restart_time: 120,
            stale_time: Duration::from_secs(360),
            deferral_time: Duration::from_secs(60),
            forwarding_preserved: true,
            llgr_stale_time: 0,
        }
    }
}

/// Our graceful restart capability. `restarting` sets the R bit.
pub fn capability(cfg: &GrConfig, restarting: bool, families: &[Family]) -> GracefulRestartCap {
    GracefulRestartCap {
        restarting,
        notification: true,
        restart_time: cfg.restart_time.min(0x0fff),
        families: families
            .iter()
            .map(|f| GrFamily {
                afi_safi: (*f).into(),
                forwarding_preserved: cfg.forwarding_preserved,
            })
            .collect(),
    }
}

/// End-of-RIB for each family, sent after the initial table.
pub fn end_of_rib_markers(families: &[Family]) -> Vec<Update> {
    families.iter().map(|f| Update::end_of_rib(*f)).collect()
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HelperAction {
    /// Keep the peer's routes, marked stale, and keep using them.
    KeepRoutesAsStale,
    /// Remove all of the peer's routes now (no graceful restart).
    DeleteRoutes,
    PurgeStale(Family),
    PurgeAllStale,
    StartRestartTimer(Duration),
    StopRestartTimer,
    StartStaleTimer(Duration),
    StopStaleTimer,
    /// RFC 9494: the stale routes become long-lived stale (least
    /// preferred, LLGR_STALE attached, NO_LLGR ones dropped).
    EnterLongLivedStale,
    StartLlgrTimer(Duration),
    StopLlgrTimer,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HelperState {
    Normal,
    /// Session down, routes stale, waiting for the peer to reconnect.
    PeerRestarting {
        families: Vec<Family>,
    },
    /// Session back, waiting for End-of-RIB in these families.
    AwaitingEor {
        families: HashSet<Family>,
    },
    /// Restart time over, routes kept as long-lived stale (RFC 9494).
    LongLivedStale {
        families: Vec<Family>,
    },
}

/// The helper side for one peer (RFC 4724 4.2).
#[derive(Clone, Debug)]
pub struct Helper {
    state: HelperState,
    stale_time: Duration,
    /// Capabilities exchanged on the last session: ours and the peer's.
    local: Option<GracefulRestartCap>,
    peer: Option<GracefulRestartCap>,
    /// Long-lived GR capabilities of the last session (RFC 9494).
    local_llgr: Option<Vec<LlgrFamily>>,
    peer_llgr: Option<Vec<LlgrFamily>>,
}

fn families_of(cap: &GracefulRestartCap) -> impl Iterator<Item = (Family, bool)> + '_ {
    cap.families
        .iter()
        .filter_map(|f| f.afi_safi.family().map(|fam| (fam, f.forwarding_preserved)))
}

impl Helper {
    pub fn new(stale_time: Duration) -> Helper {
        Helper {
            state: HelperState::Normal,
            stale_time,
            local: None,
            peer: None,
            local_llgr: None,
            peer_llgr: None,
        }
    }

    /// The long-lived GR capability we send; set before `session_up`.
    pub fn set_local_llgr(&mut self, local: Option<Vec<LlgrFamily>>) {
        self.local_llgr = local;
    }

    /// Families both sides keep long-lived, with the peer's stale time.
    fn llgr_families(&self) -> Vec<(Family, u32)> {
        let (Some(local), Some(peer)) = (&self.local_llgr, &self.peer_llgr) else {
            return Vec::new();
        };
        peer.iter()
            .filter_map(|p| {
                let fam = p.afi_safi.family()?;
                let ours = local.iter().any(|l| l.afi_safi == p.afi_safi);
                (ours && p.stale_time > 0).then_some((fam, p.stale_time))
            })
            .collect()
    }

    /// Enters the long-lived phase if negotiated; false otherwise. One
    /// timer for all families: the shortest stale time the peer asked for.
    fn enter_llgr(&mut self, out: &mut Vec<HelperAction>) -> bool {
        let llgr = self.llgr_families();
        let Some(time) = llgr.iter().map(|(_, t)| *t).min() else {
            return false;
        };
        let families: Vec<Family> = llgr.iter().map(|(f, _)| *f).collect();
        for f in Family::ALL {
            if !families.contains(&f) {
                out.push(HelperAction::PurgeStale(f));
            }
        }
        out.push(HelperAction::EnterLongLivedStale);
        out.push(HelperAction::StartLlgrTimer(Duration::from_secs(
            time as u64,
        )));
        self.state = HelperState::LongLivedStale { families };
        true
    }

    pub fn state(&self) -> &HelperState {
        &self.state
    }

    /// The session reached Established; `local` is the capability we sent.
    pub fn session_up(
        &mut self,
        local: Option<&GracefulRestartCap>,
        peer_open: &Open,
    ) -> Vec<HelperAction> {
        let peer = peer_open.graceful_restart().cloned();
        self.local = local.cloned();
        self.peer = peer.clone();
        self.peer_llgr = peer_open.long_lived_gr().map(|f| f.to_vec());
        let mut out = Vec::new();
        let (HelperState::PeerRestarting { families } | HelperState::LongLivedStale { families }) =
            &self.state
        else {
            // Nothing was kept from an earlier session.
            return out;
        };
        out.push(HelperAction::StopRestartTimer);
        out.push(HelperAction::StopLlgrTimer);
        let mut waiting = HashSet::new();
        for f in families {
            // RFC 4724 4.2: drop a family's stale routes at once if the
            // peer no longer lists it or did not keep forwarding state.
            let kept = peer
                .as_ref()
                .is_some_and(|c| families_of(c).any(|(fam, fwd)| fam == *f && fwd));
            if kept {
                waiting.insert(*f);
            } else {
                out.push(HelperAction::PurgeStale(*f));
            }
        }
        if waiting.is_empty() {
            self.state = HelperState::Normal;
        } else {
            out.push(HelperAction::StartStaleTimer(self.stale_time));
            self.state = HelperState::AwaitingEor { families: waiting };
        }
        out
    }

    /// Whether the way the session ended allows keeping routes.
    fn graceful(&self, reason: &DownReason) -> bool {
        let (Some(local), Some(peer)) = (&self.local, &self.peer) else {
            return false;
        };
        let hard =
            |n: &Notification| n.code == notif::CEASE && n.subcode == notif::CEASE_HARD_RESET;
        match reason {
            DownReason::TcpFailure => true,
            DownReason::Stopped => false,
            // RFC 8538: with the N bit on both sides, a NOTIFICATION other
            // than Hard Reset is handled like a TCP failure.
            DownReason::HoldTimerExpired => local.notification && peer.notification,
            DownReason::NotificationSent(n) | DownReason::NotificationReceived(n) => {
                local.notification && peer.notification && !hard(n)
            }
        }
    }

    pub fn session_down(&mut self, reason: &DownReason) -> Vec<HelperAction> {
        let peer_families: Vec<Family> = self
            .peer
            .as_ref()
            .map(|c| families_of(c).map(|(f, _)| f).collect())
            .unwrap_or_default();
        if !self.graceful(reason) || peer_families.is_empty() {
            // RFC 9494 4.2: long-lived GR also works without (or with a
            // zero-time) graceful restart, after a plain TCP failure.
            let mut out = vec![
                HelperAction::StopRestartTimer,
                HelperAction::StopStaleTimer,
                HelperAction::StopLlgrTimer,
            ];
            if *reason == DownReason::TcpFailure && !self.llgr_families().is_empty() {
                out.push(HelperAction::KeepRoutesAsStale);
                self.enter_llgr(&mut out);
                return out;
            }
            self.state = HelperState::Normal;
            out.push(HelperAction::DeleteRoutes);
            return out;
        }
        let restart_time = self.peer.as_ref().map_or(0, |c| c.restart_time);
        let mut out = vec![
            HelperAction::StopStaleTimer,
            HelperAction::StopLlgrTimer,
            HelperAction::KeepRoutesAsStale,
        ];
        for f in Family::ALL {
            if !peer_families.contains(&f) {
                out.push(HelperAction::PurgeStale(f));
            }
        }
        out.push(HelperAction::StartRestartTimer(Duration::from_secs(
            restart_time as u64,
        )));
        self.state = HelperState::PeerRestarting {
            families: peer_families,
        };
        out
    }

    pub fn end_of_rib(&mut self, family: Family) -> Vec<HelperAction> {
        let HelperState::AwaitingEor { families } = &mut self.state else {
            return Vec::new();
        };
        if !families.remove(&family) {
            return Vec::new();
        }
        let mut out = vec![HelperAction::PurgeStale(family)];
        if families.is_empty() {
            out.push(HelperAction::StopStaleTimer);
            self.state = HelperState::Normal;
        }
        out
    }

    /// The peer did not come back within its restart time: long-lived
    /// stale if negotiated (RFC 9494), otherwise the routes go.
    pub fn restart_timer_expired(&mut self) -> Vec<HelperAction> {
        if !matches!(self.state, HelperState::PeerRestarting { .. }) {
            return Vec::new();
        }
        let mut out = Vec::new();
        if self.enter_llgr(&mut out) {
            return out;
        }
        self.state = HelperState::Normal;
        vec![HelperAction::PurgeAllStale]
    }

    /// The long-lived stale time is over.
    pub fn llgr_timer_expired(&mut self) -> Vec<HelperAction> {
        if !matches!(self.state, HelperState::LongLivedStale { .. }) {
            return Vec::new();
        }
        self.state = HelperState::Normal;
        vec![HelperAction::PurgeAllStale]
    }

    /// The peer came back but did not finish its table in time.
    pub fn stale_timer_expired(&mut self) -> Vec<HelperAction> {
        if !matches!(self.state, HelperState::AwaitingEor { .. }) {
            return Vec::new();
        }
        self.state = HelperState::Normal;
        vec![HelperAction::PurgeAllStale]
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RestartAction {
    StartDeferralTimer(Duration),
    StopDeferralTimer,
    /// Run route selection, then send every peer its table and End-of-RIB.
    EndDeferral,
}

/// The restarting side (RFC 4724 4.1): after our restart, route selection
/// waits for End-of-RIB from every configured peer that negotiated
/// graceful restart, or for the deferral timer.
#[derive(Clone, Debug)]
pub struct Restarter {
    deferring: bool,
    /// Configured peers whose session has not come up yet.
    not_up: HashSet<IpAddr>,
    /// Peers that are up with graceful restart and the families still
    /// missing their End-of-RIB.
    waiting: HashMap<IpAddr, HashSet<Family>>,
}

impl Restarter {
    /// `restarted`: this process starts after a restart and should defer.
    pub fn new(
        restarted: bool,
        peers: impl IntoIterator<Item = IpAddr>,
        deferral_time: Duration,
    ) -> (Restarter, Vec<RestartAction>) {
        let r = Restarter {
            deferring: restarted,
            not_up: if restarted {
                peers.into_iter().collect()
            } else {
                HashSet::new()
            },
            waiting: HashMap::new(),
        };
        let actions = if restarted {
            vec![RestartAction::StartDeferralTimer(deferral_time)]
        } else {
            Vec::new()
        };
        (r, actions)
    }

    /// True while route selection is held back; also our R bit.
    pub fn deferring(&self) -> bool {
        self.deferring
    }

    /// A session came up; `gr_families` are the families for which both
    /// sides announced graceful restart (None: not negotiated).
    pub fn peer_up(
        &mut self,
        peer: IpAddr,
        gr_families: Option<Vec<Family>>,
    ) -> Vec<RestartAction> {
        if !self.deferring {
            return Vec::new();
        }
        self.not_up.remove(&peer);
        match gr_families {
            Some(f) if !f.is_empty() => {
                self.waiting.insert(peer, f.into_iter().collect());
            }
            // Without graceful restart the peer promises no End-of-RIB.
            _ => {
                self.waiting.remove(&peer);
            }
        }
        self.check()
    }

    pub fn end_of_rib(&mut self, peer: IpAddr, family: Family) -> Vec<RestartAction> {
        if let Some(f) = self.waiting.get_mut(&peer) {
            f.remove(&family);
            if f.is_empty() {
                self.waiting.remove(&peer);
            }
        }
        self.check()
    }

    /// A peer went down or was removed: do not wait for it any more.
    pub fn peer_gone(&mut self, peer: IpAddr) -> Vec<RestartAction> {
        self.waiting.remove(&peer);
        self.not_up.remove(&peer);
        self.check()
    }

    pub fn deferral_timer_expired(&mut self) -> Vec<RestartAction> {
        if !self.deferring {
            return Vec::new();
        }
        self.deferring = false;
        vec![RestartAction::EndDeferral]
    }

    fn check(&mut self) -> Vec<RestartAction> {
        if self.deferring && self.not_up.is_empty() && self.waiting.is_empty() {
            self.deferring = false;
            return vec![RestartAction::StopDeferralTimer, RestartAction::EndDeferral];
        }
        Vec::new()
    }
}

/// The families whose End-of-RIB a restarting speaker waits for from this
/// peer. None when graceful restart was not negotiated, and also when the
/// peer itself has just restarted (R bit): RFC 4724 3 says not to wait
/// for it then, which is what keeps two restarting speakers from waiting
/// on each other.
pub fn eor_to_wait_for(local: Option<&GracefulRestartCap>, peer: &Open) -> Option<Vec<Family>> {
    if peer.graceful_restart().is_some_and(|c| c.restarting) {
        return None;
    }
    negotiated_families(local, peer)
}

/// Families for which both OPENs carry graceful restart.
pub fn negotiated_families(local: Option<&GracefulRestartCap>, peer: &Open) -> Option<Vec<Family>> {
    let local = local?;
    let peer = peer.graceful_restart()?;
    let ours: Vec<Family> = families_of(local).map(|(f, _)| f).collect();
    Some(
        families_of(peer)
            .map(|(f, _)| f)
            .filter(|f| ours.contains(f))
            .collect(),
    )
}

#[cfg(test)]
mod tests;
