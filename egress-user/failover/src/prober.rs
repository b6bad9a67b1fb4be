//! The I/O edge of the probes: one UDP socket, one [`Session`] per peer, run
//! by a tokio task that reports session changes on a channel.
//!
//! Sessions are active (the peer was added with [`Prober::add_peer`]: we
//! start the handshake and keep probing it until it is removed) or passive
//! (with [`ProberConfig::accept_unknown_peers`], a Down packet from an unknown
//! address opens a session that answers, and that is dropped once it goes
//! down again). Gateway candidates add each other as active peers; the
//! controller probes them actively and the agents answer passively, so
//! agents need not know the controller replicas' addresses. Packets are
//! matched to sessions by our discriminator once the peer knows it, by source
//! address before that.
//!
//! Bound to `[::]`, one socket probes IPv4 and IPv6 peers alike.
//!
//! Not done (yet): RFC 5881's TTL 255 check and binding to a device; the
//! underlay is trusted as it is for VXLAN.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io;
use std::net::SocketAddr;
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::net::UdpSocket;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::probe::{Packet, Session, SessionConfig, SessionEvent, SessionState, PACKET_LEN};

/// Our UDP port: BFD's single-hop port 3784 plus 10000. Not 3784 itself,
/// because the packet is not BFD's and a node may run a real BFD daemon.
pub const DEFAULT_PROBE_PORT: u16 = 13784;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProberConfig {
    /// Address to listen and send on; port [`DEFAULT_PROBE_PORT`] unless the
    /// operator picks another (0 lets the kernel pick, for tests).
    pub bind: SocketAddr,
    /// Intervals and multiplier of every session.
    pub session: SessionConfig,
    /// Answer probes from addresses that were not added as peers.
    pub accept_unknown_peers: bool,
}

impl ProberConfig {
    /// Listens on `ip` at [`DEFAULT_PROBE_PORT`] with default intervals,
    /// probing only the peers it is given.
    pub fn new(ip: std::net::IpAddr) -> Self {
        Self {
            bind: SocketAddr::new(ip, DEFAULT_PROBE_PORT),
            session: SessionConfig::default(),
            accept_unknown_peers: false,
        }
    }
}

/// A session change of one peer, with the instant it was seen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProbeEvent {
    pub peer: SocketAddr,
    pub event: SessionEvent,
    pub at: std::time::Instant,
}

#[derive(Debug)]
enum Command {
    AddPeer(SocketAddr),
    RemovePeer(SocketAddr),
    Shutdown(oneshot::Sender<()>),
}

/// Handle of a running prober task.
#[derive(Debug)]
pub struct Prober {
    commands: mpsc::UnboundedSender<Command>,
    states: watch::Receiver<BTreeMap<SocketAddr, SessionState>>,
    local_addr: SocketAddr,
    task: JoinHandle<()>,
}

/// Errors of [`Prober::start`].
#[derive(Debug, thiserror::Error)]
pub enum ProberError {
    #[error("invalid probe settings: {0}")]
    Config(#[from] crate::probe::ConfigError),
    #[error("cannot bind probe socket {addr}: {source}")]
    Bind { addr: SocketAddr, source: io::Error },
}

impl Prober {
    /// Binds the socket and starts the task. Session changes arrive on the
    /// returned receiver.
    pub async fn start(
        config: ProberConfig,
    ) -> Result<(Self, mpsc::UnboundedReceiver<ProbeEvent>), ProberError> {
        config.session.validate()?;
        let socket = UdpSocket::bind(config.bind)
            .await
            .map_err(|source| ProberError::Bind {
                addr: config.bind,
                source,
            })?;
        let local_addr = socket.local_addr().map_err(|source| ProberError::Bind {
            addr: config.bind,
            source,
        })?;
        let (commands, command_rx) = mpsc::unbounded_channel();
        let (event_tx, events) = mpsc::unbounded_channel();
        let (state_tx, states) = watch::channel(BTreeMap::new());
        let seed = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(1, |d| d.subsec_nanos())
            ^ u32::from(local_addr.port()) << 16;
        let worker = Worker {
            socket,
            config: config.session,
            accept_unknown_peers: config.accept_unknown_peers,
            sessions: HashMap::new(),
            passive: HashSet::new(),
            by_discriminator: HashMap::new(),
            next_discriminator: seed | 1,
            rng: seed | 1,
            events: event_tx,
            states: state_tx,
        };
        let task = tokio::spawn(worker.run(command_rx));
        info!(%local_addr, "probe listener started");
        Ok((
            Self {
                commands,
                states,
                local_addr,
                task,
            },
            events,
        ))
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Starts probing `peer` (no-op if it is already probed).
    pub fn add_peer(&self, peer: SocketAddr) {
        let _ = self.commands.send(Command::AddPeer(peer));
    }

    /// Stops probing `peer`, telling it first (AdminDown), so it does not
    /// count the end of the session as a failure.
    pub fn remove_peer(&self, peer: SocketAddr) {
        let _ = self.commands.send(Command::RemovePeer(peer));
    }

    /// The current state of every session, updated on every change.
    pub fn states(&self) -> watch::Receiver<BTreeMap<SocketAddr, SessionState>> {
        self.states.clone()
    }

    /// Tells every peer we go AdminDown, then stops the task.
    pub async fn shutdown(self) {
        let (done, wait) = oneshot::channel();
        if self.commands.send(Command::Shutdown(done)).is_ok() {
            let _ = wait.await;
        }
        let _ = self.task.await;
    }

    /// Stops at once without telling the peers, as a crash would.
    pub fn abort(self) {
        self.task.abort();
    }
}

struct Worker {
    socket: UdpSocket,
    config: SessionConfig,
    accept_unknown_peers: bool,
    sessions: HashMap<SocketAddr, Session>,
    /// Sessions opened by the peer; dropped when they go down.
    passive: HashSet<SocketAddr>,
    by_discriminator: HashMap<u32, SocketAddr>,
    next_discriminator: u32,
    rng: u32,
    events: mpsc::UnboundedSender<ProbeEvent>,
    states: watch::Sender<BTreeMap<SocketAddr, SessionState>>,
}

impl Worker {
    async fn run(mut self, mut commands: mpsc::UnboundedReceiver<Command>) {
        let mut buf = [0u8; 64];
        loop {
            let deadline = self.sessions.values().map(Session::next_deadline).min();
            tokio::select! {
                received = self.socket.recv_from(&mut buf) => match received {
                    Ok((len, from)) => self.receive(&buf[..len], canonical(from)),
                    // Unconnected UDP reports no ICMP errors; anything here is
                    // transient (e.g. ENOMEM) and the next packet may work.
                    Err(err) => warn!(%err, "probe receive failed"),
                },
                command = commands.recv() => match command {
                    Some(Command::AddPeer(peer)) => {
                        // An added peer is active even if it opened the session.
                        self.passive.remove(&peer);
                        self.add_peer(peer);
                    }
                    Some(Command::RemovePeer(peer)) => self.remove_peer(peer).await,
                    Some(Command::Shutdown(done)) => {
                        let peers: Vec<_> = self.sessions.keys().copied().collect();
                        for peer in peers {
                            self.remove_peer(peer).await;
                        }
                        let _ = done.send(());
                        return;
                    }
                    // The handle is gone: stop quietly, as `abort` would.
                    None => return,
                },
                () = sleep_until_some(deadline) => {}
            }
            self.service().await;
        }
    }

    fn add_peer(&mut self, peer: SocketAddr) {
        if self.sessions.contains_key(&peer) {
            return;
        }
        let discriminator = loop {
            let d = self.next_discriminator;
            self.next_discriminator = self.next_discriminator.wrapping_add(1);
            if d != 0 && !self.by_discriminator.contains_key(&d) {
                break d;
            }
        };
        let now = Instant::now().into_std();
        self.sessions
            .insert(peer, Session::new(self.config, discriminator, now));
        self.by_discriminator.insert(discriminator, peer);
        self.publish_state(peer);
        debug!(%peer, discriminator, "probe session added");
    }

    async fn remove_peer(&mut self, peer: SocketAddr) {
        let Some(mut session) = self.sessions.remove(&peer) else {
            return;
        };
        self.passive.remove(&peer);
        self.by_discriminator.remove(&session.local_discriminator());
        let now = Instant::now().into_std();
        if let Some(event) = session.admin_down(now) {
            self.emit(peer, event, now);
        }
        if let Some(pkt) = session.packet_to_send(now, 0) {
            self.send(peer, &pkt).await;
        }
        self.states.send_modify(|s| {
            s.remove(&peer);
        });
        debug!(%peer, "probe session removed");
    }

    fn receive(&mut self, bytes: &[u8], from: SocketAddr) {
        let pkt = match Packet::decode(bytes) {
            Ok(pkt) => pkt,
            Err(err) => {
                debug!(%from, %err, "dropping malformed probe packet");
                return;
            }
        };
        let peer = if pkt.your_discriminator != 0 {
            self.by_discriminator.get(&pkt.your_discriminator).copied()
        } else {
            self.sessions.contains_key(&from).then_some(from)
        };
        let peer = match peer {
            Some(peer) if peer == from => peer,
            None if self.accept_unknown_peers
                && pkt.your_discriminator == 0
                && pkt.state == SessionState::Down
                && !self.sessions.contains_key(&from) =>
            {
                self.add_peer(from);
                self.passive.insert(from);
                from
            }
            _ => {
                debug!(%from, your_discriminator = pkt.your_discriminator, "probe packet from no configured peer");
                return;
            }
        };
        let now = Instant::now().into_std();
        let Some(session) = self.sessions.get_mut(&peer) else {
            return;
        };
        let before = session.state();
        match session.on_packet(now, &pkt) {
            Ok(event) => {
                if let Some(event) = event {
                    self.emit(peer, event, now);
                }
                if self.sessions[&peer].state() != before {
                    self.publish_state(peer);
                }
            }
            Err(err) => debug!(%peer, %err, "probe packet rejected"),
        }
        self.drop_dead_passive(peer);
    }

    /// A passive session that went down is forgotten: the peer opens a new
    /// one if it is still there, and we stop sending to an address that may
    /// be gone for good.
    fn drop_dead_passive(&mut self, peer: SocketAddr) {
        let down = self
            .sessions
            .get(&peer)
            .is_some_and(|s| s.state() == SessionState::Down);
        if down && self.passive.remove(&peer) {
            if let Some(session) = self.sessions.remove(&peer) {
                self.by_discriminator.remove(&session.local_discriminator());
            }
            self.states.send_modify(|s| {
                s.remove(&peer);
            });
            debug!(%peer, "passive probe session closed");
        }
    }

    /// Fires expired detection timers and sends every packet that is due.
    async fn service(&mut self) {
        let now = Instant::now().into_std();
        let mut changed = Vec::new();
        let mut due = Vec::new();
        for (peer, session) in &mut self.sessions {
            let before = session.state();
            if let Some(event) = session.on_timer(now) {
                changed.push((*peer, Some(event)));
            } else if session.state() != before {
                changed.push((*peer, None));
            }
            self.rng ^= self.rng << 13;
            self.rng ^= self.rng >> 17;
            self.rng ^= self.rng << 5;
            if let Some(pkt) = session.packet_to_send(now, self.rng) {
                due.push((*peer, pkt));
            }
        }
        for (peer, event) in changed {
            if let Some(event) = event {
                self.emit(peer, event, now);
            }
            self.publish_state(peer);
            self.drop_dead_passive(peer);
        }
        for (peer, pkt) in due {
            self.send(peer, &pkt).await;
        }
    }

    async fn send(&self, peer: SocketAddr, pkt: &Packet) {
        let bytes: [u8; PACKET_LEN] = pkt.encode();
        if let Err(err) = self.socket.send_to(&bytes, peer).await {
            // A missing route is what a dead underlay looks like; the
            // detection timer reports it, so this is only worth a debug line.
            debug!(%peer, %err, "probe send failed");
        }
    }

    fn emit(&self, peer: SocketAddr, event: SessionEvent, at: std::time::Instant) {
        match event {
            SessionEvent::SessionUp => info!(%peer, "probe session up"),
            SessionEvent::SessionDown { reason } => {
                warn!(%peer, ?reason, "probe session down")
            }
        }
        let _ = self.events.send(ProbeEvent { peer, event, at });
    }

    fn publish_state(&self, peer: SocketAddr) {
        if let Some(session) = self.sessions.get(&peer) {
            let state = session.state();
            self.states
                .send_if_modified(|s| s.insert(peer, state) != Some(state));
        }
    }
}

/// A dual-stack socket (bound to `[::]`) sees IPv4 peers as IPv4-mapped
/// IPv6 addresses; sessions are keyed by the address they were added
/// with, so those are turned back into IPv4 ones.
fn canonical(from: SocketAddr) -> SocketAddr {
    SocketAddr::new(from.ip().to_canonical(), from.port())
}

async fn sleep_until_some(deadline: Option<std::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(Instant::from_std(d)).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::probe::DownReason;

    fn config(interval_ms: u32) -> ProberConfig {
        ProberConfig {
            bind: "127.0.0.1:0".parse().unwrap(),
            session: SessionConfig {
                desired_min_tx_ms: interval_ms,
                required_min_rx_ms: interval_ms,
                detect_multiplier: 3,
            },
            accept_unknown_peers: false,
        }
    }

    async fn next_event(
        events: &mut mpsc::UnboundedReceiver<ProbeEvent>,
        within: Duration,
    ) -> ProbeEvent {
        tokio::time::timeout(within, events.recv())
            .await
            .expect("no probe event before the deadline")
            .expect("prober stopped")
    }

    /// The next event (within 5 s) is the session with `peer` coming up.
    async fn expect_session_up(
        events: &mut mpsc::UnboundedReceiver<ProbeEvent>,
        peer: std::net::SocketAddr,
    ) {
        let up = next_event(events, Duration::from_secs(5)).await;
        assert_eq!((up.peer, up.event), (peer, SessionEvent::SessionUp));
    }

    async fn up_pair(
        interval_ms: u32,
    ) -> (
        Prober,
        mpsc::UnboundedReceiver<ProbeEvent>,
        Prober,
        mpsc::UnboundedReceiver<ProbeEvent>,
    ) {
        let (a, mut a_events) = Prober::start(config(interval_ms)).await.unwrap();
        let (b, mut b_events) = Prober::start(config(interval_ms)).await.unwrap();
        assert_ne!(a.local_addr().port(), b.local_addr().port());
        a.add_peer(b.local_addr());
        b.add_peer(a.local_addr());
        expect_session_up(&mut a_events, b.local_addr()).await;
        expect_session_up(&mut b_events, a.local_addr()).await;
        assert_eq!(
            a.states().borrow().get(&b.local_addr()),
            Some(&SessionState::Up)
        );
        (a, a_events, b, b_events)
    }

    #[tokio::test]
    async fn a_dead_peer_is_detected_within_the_detection_time() {
        let interval = 100;
        let detection = Duration::from_millis(3 * interval as u64);
        let (a, mut a_events, b, _b_events) = up_pair(interval as u32).await;
        let b_addr = b.local_addr();
        let killed = std::time::Instant::now();
        b.abort();
        // The margin covers scheduling on a busy machine; detection itself
        // cannot be faster than the detection time minus one tx interval.
        let down = next_event(&mut a_events, detection + Duration::from_millis(400)).await;
        let took = down.at - killed;
        assert_eq!(down.peer, b_addr);
        assert_eq!(
            down.event,
            SessionEvent::SessionDown {
                reason: DownReason::DetectTimeExpired
            }
        );
        assert!(
            took >= detection - Duration::from_millis(interval as u64),
            "too early: {took:?}"
        );
        assert_eq!(a.states().borrow().get(&b_addr), Some(&SessionState::Down));
        a.shutdown().await;
    }

    #[tokio::test]
    async fn a_graceful_shutdown_is_not_a_failure() {
        let (a, mut a_events, b, _b_events) = up_pair(1000).await;
        let b_addr = b.local_addr();
        b.shutdown().await;
        // Long before the 3 s detection time: the AdminDown packet says it.
        let down = next_event(&mut a_events, Duration::from_millis(1000)).await;
        assert_eq!(
            (down.peer, down.event),
            (
                b_addr,
                SessionEvent::SessionDown {
                    reason: DownReason::NeighborAdminDown
                }
            )
        );
        a.shutdown().await;
    }

    #[tokio::test]
    async fn a_passive_prober_answers_and_forgets_a_dead_prober() {
        let (active, mut active_events) = Prober::start(config(100)).await.unwrap();
        let passive_config = ProberConfig {
            accept_unknown_peers: true,
            ..config(100)
        };
        let (passive, mut passive_events) = Prober::start(passive_config).await.unwrap();
        // Only the active side knows its peer.
        active.add_peer(passive.local_addr());
        expect_session_up(&mut active_events, passive.local_addr()).await;
        expect_session_up(&mut passive_events, active.local_addr()).await;
        let active_addr = active.local_addr();
        active.abort();
        let down = next_event(&mut passive_events, Duration::from_millis(300 + 400)).await;
        assert_eq!(
            (down.peer, down.event),
            (
                active_addr,
                SessionEvent::SessionDown {
                    reason: DownReason::DetectTimeExpired
                }
            )
        );
        let mut states = passive.states();
        tokio::time::timeout(Duration::from_secs(1), states.wait_for(|s| s.is_empty()))
            .await
            .expect("the dead passive session is dropped")
            .unwrap();
        passive.shutdown().await;
    }

    #[tokio::test]
    async fn packets_from_unknown_peers_and_noise_are_ignored() {
        let (a, mut a_events) = Prober::start(config(50)).await.unwrap();
        let stranger = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let hello = Packet {
            state: SessionState::Down,
            diag: crate::probe::Diagnostic::None,
            detect_multiplier: 3,
            my_discriminator: 9,
            your_discriminator: 0,
            desired_min_tx_ms: 50,
            required_min_rx_ms: 50,
        };
        stranger
            .send_to(&hello.encode(), a.local_addr())
            .await
            .unwrap();
        stranger.send_to(b"garbage", a.local_addr()).await.unwrap();
        // Now make the stranger a peer: it must come up through the normal
        // handshake, which proves the task survived the garbage.
        a.add_peer(stranger.local_addr().unwrap());
        let mut buf = [0u8; 64];
        let (len, _) = stranger.recv_from(&mut buf).await.unwrap();
        let first = Packet::decode(&buf[..len]).unwrap();
        assert_eq!(
            first.state,
            SessionState::Down,
            "the earlier hello was not taken"
        );
        let init = Packet {
            state: SessionState::Init,
            your_discriminator: first.my_discriminator,
            ..hello
        };
        stranger
            .send_to(&init.encode(), a.local_addr())
            .await
            .unwrap();
        let up = next_event(&mut a_events, Duration::from_secs(5)).await;
        assert_eq!(up.event, SessionEvent::SessionUp);
        a.shutdown().await;
    }
}
