//! The one task that owns the RIB and the graceful restart state.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use super::msg::{RibMsg, SessionCmd, SessionSetup, TimerKind};
use super::session;
use super::{OutQueue, PeerSpec, PeerStatus, SessionEntry, SessionMap, SpeakerConfig, Status};

use crate::codec::{CodecOptions, GracefulRestartCap, RouteRefresh, RouteRefreshSubtype, Update};
use crate::fsm::{DownReason, FsmConfig, Negotiated, State};
use crate::gr::{self, Helper, HelperAction, RestartAction, Restarter};
use crate::rib::{BestChange, PeerConfig, Rib, RibConfig, SessionOptions};
use crate::types::Family;

mod batches;

use batches::Unwritten;

struct PeerEntry {
    spec: PeerSpec,
    state: State,
    helper: Helper,
    /// Families both sides carry on the current session.
    families: Vec<Family>,
    enhanced_refresh: bool,
    /// The initial table has not been followed by End-of-RIB yet.
    eor_due: bool,
    /// How messages are encoded on the current session.
    codec: CodecOptions,
    /// Batches handed to the session and not yet written, oldest first
    /// (up to `SpeakerConfig::output_ahead` octets); past that, the peer's changes wait
    /// in the RIB, coalesced per prefix, instead of piling up as encoded
    /// messages.
    unwritten: VecDeque<Unwritten>,
    /// Families the peer asked to be sent again (RFC 2918), once it has
    /// written what it was sent before.
    refresh_due: Vec<Family>,
    /// The BGP identifier of the established session.
    bgp_id: Option<Ipv4Addr>,
}

struct RibTask {
    /// The listener, for TCP-MD5 keys of peers added at run time; it lives
    /// as long as the speaker.
    listen_fd: Option<std::os::fd::RawFd>,
    cfg: SpeakerConfig,
    rib: Rib,
    peers: HashMap<IpAddr, PeerEntry>,
    restarter: Restarter,
    restarting: Arc<AtomicBool>,
    sessions: SessionMap,
    subscribers: Vec<mpsc::UnboundedSender<BestChange>>,
    timers: HashMap<(Option<IpAddr>, TimerKind), u64>,
    self_tx: mpsc::Sender<RibMsg>,
    next_batch: u64,
}

/// Messages handled between two flushes at most.
const FLUSH_EVERY: usize = 16;

pub(super) async fn run(
    listen_fd: Option<std::os::fd::RawFd>,
    cfg: SpeakerConfig,
    mut rx: mpsc::Receiver<RibMsg>,
    self_tx: mpsc::Sender<RibMsg>,
    sessions: SessionMap,
    restarting: Arc<AtomicBool>,
) {
    let rib = Rib::new(RibConfig {
        local_asn: cfg.local_asn,
        router_id: cfg.router_id,
        cluster_id: cfg.cluster_id.unwrap_or(cfg.router_id),
    });
    let deferral = cfg
        .graceful_restart
        .as_ref()
        .map(crate::gr::effective_deferral)
        .unwrap_or_default();
    let (restarter, actions) = Restarter::new(
        restarting.load(Ordering::Relaxed),
        cfg.peers.iter().map(|p| p.address),
        deferral,
    );
    let mut t = RibTask {
        listen_fd,
        rib,
        peers: HashMap::new(),
        restarter,
        restarting,
        sessions,
        subscribers: Vec::new(),
        timers: HashMap::new(),
        self_tx,
        cfg,
        next_batch: 0,
    };
    t.rib.set_deferral(t.restarter.deferring());
    t.restart_actions(actions);
    for p in t.cfg.peers.clone() {
        t.add_peer(p);
    }
    while let Some(m) = rx.recv().await {
        if matches!(m, RibMsg::Shutdown) {
            t.shutdown();
            return;
        }
        t.handle(m);
        // Work through what queued up before sending, so that bursts of
        // UPDATEs leave in few, full messages; but not too much at once,
        // which would only hold more pending changes in memory.
        for _ in 0..FLUSH_EVERY {
            let Ok(m) = rx.try_recv() else { break };
            if matches!(m, RibMsg::Shutdown) {
                t.flush();
                t.shutdown();
                return;
            }
            t.handle(m);
        }
        t.flush();
    }
}

impl RibTask {
    fn add_peer(&mut self, mut spec: PeerSpec) {
        let addr = spec.address;
        if self.peers.contains_key(&addr) {
            return;
        }
        if spec.password.is_none() {
            spec.password = self.cfg.default_password.clone();
        }
        if let (Some(fd), Some(key)) = (self.listen_fd, &spec.password) {
            if let Err(e) = super::md5::set_key(fd, addr, key.as_bytes()) {
                tracing::warn!(peer = %addr, error = %e, "TCP-MD5 key not set on the listener");
            }
        }
        let stale_time = self
            .cfg
            .graceful_restart
            .as_ref()
            .map(|g| g.stale_time)
            .unwrap_or_default();
        self.rib.add_peer(PeerConfig {
            addr,
            asn: spec.asn,
            client: spec.client,
            next_hop_self: spec.next_hop_self,
        });
        let (tx, rx) = mpsc::unbounded_channel();
        let setup = SessionSetup {
            fsm: FsmConfig {
                local_asn: self.cfg.local_asn,
                router_id: self.cfg.router_id,
                peer_asn: spec.asn,
                hold_time: self.cfg.hold_time,
                keepalive_time: self.cfg.keepalive_time,
                connect_retry_time: self.cfg.connect_retry,
                idle_hold_time: Duration::from_secs(1),
                passive: spec.passive,
                capabilities: Vec::new(),
                send_hold_time: self.cfg.send_hold_time,
            },
            spec: spec.clone(),
            families: self.cfg.families.clone(),
            graceful_restart: self.cfg.graceful_restart.clone(),
            restarting: self.restarting.clone(),
            source_addr: self.cfg.listen.map(|l| l.ip()),
            socket_buffer: self.cfg.socket_buffer,
            rib: self.self_tx.clone(),
        };
        let task = tokio::spawn(session::run(setup, rx));
        self.sessions.lock().expect("session map").insert(
            addr,
            SessionEntry {
                tx,
                task: task.abort_handle(),
            },
        );
        self.peers.insert(
            addr,
            PeerEntry {
                spec,
                state: State::Idle,
                helper: Helper::new(stale_time),
                families: Vec::new(),
                enhanced_refresh: false,
                eor_due: false,
                codec: CodecOptions::default(),
                unwritten: VecDeque::new(),
                refresh_due: Vec::new(),
                bgp_id: None,
            },
        );
    }

    fn send(&self, peer: IpAddr, cmd: SessionCmd) {
        if let Some(s) = self.sessions.lock().expect("session map").get(&peer) {
            let _ = s.tx.send(cmd);
        }
    }

    fn handle(&mut self, m: RibMsg) {
        match m {
            RibMsg::SessionUp {
                peer,
                negotiated,
                local_addr,
                local_gr,
            } => self.session_up(peer, &negotiated, local_addr, local_gr),
            RibMsg::SessionDown { peer, reason } => self.session_down(peer, reason),
            RibMsg::State { peer, state } => {
                if let Some(p) = self.peers.get_mut(&peer) {
                    p.state = state;
                }
            }
            RibMsg::Update { peer, update } => self.update(peer, update),
            RibMsg::RouteRefresh { peer, rr } => self.route_refresh(peer, rr),
            RibMsg::Announce { prefix, next_hop } => self.rib.announce_local(prefix, next_hop),
            RibMsg::AnnounceWithPref {
                prefix,
                next_hop,
                local_pref,
            } => self
                .rib
                .announce_local_with_pref(prefix, next_hop, local_pref),
            RibMsg::AnnounceMany(routes) => {
                for (prefix, next_hop) in routes {
                    self.rib.announce_local(prefix, next_hop);
                }
            }
            RibMsg::Withdraw { prefix } => {
                self.rib.withdraw_local(prefix);
            }
            RibMsg::Subscribe(tx) => {
                // Changes not yet delivered are in the snapshot below; give
                // them to the older subscribers first so nobody sees one twice.
                self.flush_best_changes();
                let snapshot = self.rib.loc_rib().map(|r| BestChange::Set {
                    prefix: r.prefix,
                    next_hop: r.next_hop,
                    from: match &r.source {
                        crate::rib::RouteSource::Peer(p) => Some(p.addr),
                        crate::rib::RouteSource::Local => None,
                    },
                    local_pref: r.attrs.local_pref,
                });
                if snapshot.into_iter().all(|c| tx.send(c).is_ok()) {
                    self.subscribers.push(tx);
                }
            }
            RibMsg::Status(tx) => {
                let _ = tx.send(self.status());
            }
            RibMsg::OutQueue(peer, tx) => {
                let q = self.peers.get(&peer).map(|p| OutQueue {
                    pending_prefixes: self.rib.pending_len(peer),
                    unwritten_bytes: p.unwritten.iter().map(|u| u.bytes).sum(),
                });
                let _ = tx.send(q);
            }
            RibMsg::Written { peer, batch } => {
                if let Some(p) = self.peers.get_mut(&peer) {
                    p.unwritten.retain(|u| !u.written_by(batch));
                }
            }
            RibMsg::AddPeer(spec) => self.add_peer(spec),
            RibMsg::RemovePeer(addr) => {
                self.send(addr, SessionCmd::StopHard);
                self.sessions.lock().expect("session map").remove(&addr);
                let keyed = self
                    .peers
                    .remove(&addr)
                    .is_some_and(|p| p.spec.password.is_some());
                if let (Some(fd), true) = (self.listen_fd, keyed) {
                    // An empty key removes the peer's entry from the listener.
                    if let Err(e) = super::md5::set_key(fd, addr, b"") {
                        tracing::debug!(peer = %addr, error = %e, "TCP-MD5 key not removed");
                    }
                }
                self.rib.remove_peer(addr);
                let a = self.restarter.peer_gone(addr);
                self.restart_actions(a);
            }
            RibMsg::Timer {
                peer,
                kind,
                generation,
            } => self.timer(peer, kind, generation),
            RibMsg::Shutdown => {}
        }
    }

    fn session_up(
        &mut self,
        peer: IpAddr,
        neg: &Negotiated,
        local_addr: IpAddr,
        local_gr: Option<GracefulRestartCap>,
    ) {
        let Some(p) = self.peers.get_mut(&peer) else {
            return;
        };
        let theirs = neg.peer_open.families();
        p.families = self
            .cfg
            .families
            .iter()
            .copied()
            .filter(|f| theirs.contains(&(*f).into()))
            .collect();
        p.enhanced_refresh = neg.peer_open.enhanced_route_refresh();
        p.eor_due = true;
        p.codec = neg.codec;
        p.unwritten.clear();
        p.refresh_due.clear();
        p.state = State::Established;
        let local_llgr = self
            .cfg
            .graceful_restart
            .as_ref()
            .and_then(|g| gr::llgr_capability(g, &self.cfg.families));
        let llgr = local_llgr.is_some() && neg.peer_open.long_lived_gr().is_some();
        p.helper.set_local_llgr(local_llgr);
        let helper_actions = p.helper.session_up(local_gr.as_ref(), &neg.peer_open);
        p.bgp_id = Some(neg.peer_id);
        tracing::info!(%peer, asn = neg.peer_asn, id = %neg.peer_id, "session established");
        if let Some(others) = self.shared_ids().remove(&peer) {
            tracing::warn!(
                %peer,
                id = %neg.peer_id,
                ?others,
                "peers share a BGP identifier: routes reflected between them are dropped as looped; \
                 give each an identifier of its own (agent --bgp-router-id)"
            );
        }
        let opts = SessionOptions {
            llgr,
            add_path: neg.codec.add_path_tx,
            ipv4_via_ipv6: neg.codec.ipv4_via_ipv6.send,
        };
        self.rib.peer_up_with(peer, neg.peer_id, local_addr, opts);
        self.helper_actions(peer, helper_actions);
        let gr_families = gr::eor_to_wait_for(local_gr.as_ref(), &neg.peer_open);
        let a = self.restarter.peer_up(peer, gr_families);
        self.restart_actions(a);
    }

    fn session_down(&mut self, peer: IpAddr, reason: DownReason) {
        let Some(p) = self.peers.get_mut(&peer) else {
            return;
        };
        tracing::info!(%peer, ?reason, "session down");
        p.bgp_id = None;
        p.eor_due = false;
        p.unwritten.clear();
        p.refresh_due.clear();
        let actions = p.helper.session_down(&reason);
        self.helper_actions(peer, actions);
        let a = self.restarter.peer_gone(peer);
        self.restart_actions(a);
    }

    fn update(&mut self, peer: IpAddr, u: Update) {
        if let Some(f) = u.end_of_rib_family() {
            if let Some(p) = self.peers.get_mut(&peer) {
                let a = p.helper.end_of_rib(f);
                self.helper_actions(peer, a);
            }
            let a = self.restarter.end_of_rib(peer, f);
            self.restart_actions(a);
            return;
        }
        for e in &u.errors {
            tracing::warn!(%peer, ?e, "RFC 7606 error in UPDATE");
        }
        self.rib.apply_update(peer, &u);
    }

    fn route_refresh(&mut self, peer: IpAddr, rr: RouteRefresh) {
        let Some(family) = rr.afi_safi.family() else {
            return;
        };
        match rr.subtype {
            RouteRefreshSubtype::Request => {
                // The table waits in the RIB with the peer's other changes;
                // flush sends it when the peer has room.
                self.rib.refresh(peer, family);
                if let Some(p) = self.peers.get_mut(&peer) {
                    if !p.refresh_due.contains(&family) {
                        p.refresh_due.push(family);
                    }
                }
            }
            // RFC 7313 4: routes not re-sent between BoRR and EoRR go away.
            RouteRefreshSubtype::BeginRefresh => {
                self.rib.mark_stale_family(peer, Some(family));
            }
            RouteRefreshSubtype::EndRefresh => {
                self.rib.purge_stale(peer, Some(family));
            }
            RouteRefreshSubtype::Other(_) => {}
        }
    }

    fn helper_actions(&mut self, peer: IpAddr, actions: Vec<HelperAction>) {
        let stale_time = self.cfg.graceful_restart.as_ref().map(|g| g.stale_time);
        for a in actions {
            match a {
                HelperAction::KeepRoutesAsStale => {
                    let n = self.rib.mark_stale(peer);
                    self.rib.peer_down(peer, true);
                    tracing::info!(%peer, routes = n, "peer restarting: routes kept as stale");
                }
                HelperAction::DeleteRoutes => self.rib.peer_down(peer, false),
                HelperAction::PurgeStale(f) => {
                    let n = self.rib.purge_stale(peer, Some(f));
                    if n > 0 {
                        tracing::info!(%peer, family = ?f, routes = n, "stale routes dropped");
                    }
                }
                HelperAction::PurgeAllStale => {
                    let n = self.rib.purge_stale(peer, None);
                    if n > 0 {
                        tracing::info!(%peer, routes = n, "stale routes dropped");
                    }
                }
                HelperAction::StartRestartTimer(d) => {
                    self.start_timer(Some(peer), TimerKind::Restart, d)
                }
                HelperAction::StopRestartTimer => self.stop_timer(Some(peer), TimerKind::Restart),
                HelperAction::StartStaleTimer(d) => {
                    self.start_timer(Some(peer), TimerKind::Stale, stale_time.unwrap_or(d))
                }
                HelperAction::StopStaleTimer => self.stop_timer(Some(peer), TimerKind::Stale),
                HelperAction::EnterLongLivedStale => {
                    let n = self.rib.mark_llgr_stale(peer);
                    tracing::info!(%peer, routes = n, "restart time over: routes kept as long-lived stale");
                }
                HelperAction::StartLlgrTimer(d) => {
                    self.start_timer(Some(peer), TimerKind::LongLived, d)
                }
                HelperAction::StopLlgrTimer => self.stop_timer(Some(peer), TimerKind::LongLived),
            }
        }
    }

    fn restart_actions(&mut self, actions: Vec<RestartAction>) {
        for a in actions {
            match a {
                RestartAction::StartDeferralTimer(d) => {
                    self.start_timer(None, TimerKind::Deferral, d)
                }
                RestartAction::StopDeferralTimer => self.stop_timer(None, TimerKind::Deferral),
                RestartAction::EndDeferral => {
                    tracing::info!("selection deferral over: advertising");
                    self.restarting.store(false, Ordering::Relaxed);
                    self.rib.set_deferral(false);
                }
            }
        }
    }

    fn start_timer(&mut self, peer: Option<IpAddr>, kind: TimerKind, d: Duration) {
        let g = self.timers.entry((peer, kind)).or_default();
        *g += 1;
        let generation = *g;
        let tx = self.self_tx.clone();
        tokio::spawn(async move {
            tokio::time::sleep(d).await;
            let _ = tx
                .send(RibMsg::Timer {
                    peer,
                    kind,
                    generation,
                })
                .await;
        });
    }

    fn stop_timer(&mut self, peer: Option<IpAddr>, kind: TimerKind) {
        *self.timers.entry((peer, kind)).or_default() += 1;
    }

    fn timer(&mut self, peer: Option<IpAddr>, kind: TimerKind, generation: u64) {
        if self.timers.get(&(peer, kind)) != Some(&generation) {
            return; // stopped or restarted since
        }
        match (kind, peer) {
            (TimerKind::Deferral, _) => {
                let a = self.restarter.deferral_timer_expired();
                self.restart_actions(a);
            }
            (TimerKind::Restart, Some(peer)) => {
                if let Some(p) = self.peers.get_mut(&peer) {
                    let a = p.helper.restart_timer_expired();
                    self.helper_actions(peer, a);
                }
            }
            (TimerKind::Stale, Some(peer)) => {
                if let Some(p) = self.peers.get_mut(&peer) {
                    let a = p.helper.stale_timer_expired();
                    self.helper_actions(peer, a);
                }
            }
            (TimerKind::LongLived, Some(peer)) => {
                if let Some(p) = self.peers.get_mut(&peer) {
                    let a = p.helper.llgr_timer_expired();
                    self.helper_actions(peer, a);
                }
            }
            _ => {}
        }
    }

    /// Sends best-route changes to subscribers.
    fn flush_best_changes(&mut self) {
        let changes = self.rib.take_best_changes();
        if !changes.is_empty() {
            self.subscribers
                .retain(|s| changes.iter().all(|c| s.send(c.clone()).is_ok()));
        }
    }

    /// Established peers that share their identifier with another.
    fn shared_ids(&self) -> std::collections::BTreeMap<IpAddr, Vec<IpAddr>> {
        super::shared_ids::sharing(
            self.peers
                .values()
                .filter_map(|p| Some((p.spec.address, p.bgp_id?))),
        )
    }

    fn status(&self) -> Status {
        let mut shared = self.shared_ids();
        let mut peers: Vec<PeerStatus> = self
            .peers
            .values()
            .map(|p| {
                let (received, advertised) = self.rib.prefix_counts(p.spec.address);
                PeerStatus {
                    address: p.spec.address,
                    asn: p.spec.asn,
                    client: p.spec.client,
                    state: p.state,
                    received,
                    advertised,
                    stale: self.rib.stale_count(p.spec.address),
                    graceful_restart: format!("{:?}", p.helper.state()),
                    bgp_id: p.bgp_id,
                    bgp_id_shared_with: shared.remove(&p.spec.address).unwrap_or_default(),
                }
            })
            .collect();
        peers.sort_by_key(|p| p.address);
        Status {
            local_asn: self.cfg.local_asn,
            router_id: self.cfg.router_id,
            cluster_id: self.rib.config().cluster_id,
            deferring: self.rib.deferring(),
            best_routes: self.rib.loc_rib_len(),
            peers,
        }
    }

    fn shutdown(&mut self) {
        let sessions: Vec<_> = self.sessions.lock().expect("session map").drain().collect();
        for (_, s) in sessions {
            let _ = s.tx.send(SessionCmd::Stop);
        }
    }
}
