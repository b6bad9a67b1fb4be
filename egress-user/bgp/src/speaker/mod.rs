//! The tokio runtime around the pure parts: a TCP listener, one task per
//! peer driving its [`crate::fsm::Fsm`], and one task owning the
//! [`crate::rib::Rib`]; they talk by message passing only.
//!
//! The agent (or controller) uses [`SpeakerHandle`]: announce and withdraw
//! prefixes, follow best-route changes, read the status.

mod md5;
mod msg;
mod output;
mod rib_task;
mod session;
mod shared_ids;

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::fsm::State;
use crate::gr::GrConfig;
use crate::rib::BestChange;
use crate::types::{Family, Prefix};

use msg::RibMsg;

pub const BGP_PORT: u16 = 179;

/// One configured neighbour.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PeerSpec {
    pub address: IpAddr,
    #[serde(default = "default_port")]
    pub port: u16,
    pub asn: u32,
    /// A route reflector client of ours.
    #[serde(default)]
    pub client: bool,
    /// Wait for the peer to connect; never connect out.
    #[serde(default)]
    pub passive: bool,
    /// Advertise our own address as next hop to this peer.
    #[serde(default)]
    pub next_hop_self: bool,
    /// TCP-MD5 (RFC 2385) key shared with the peer, at most 80 octets.
    #[serde(default)]
    pub password: Option<String>,
    /// Offer ADD-PATH Send (RFC 7911) for our families: if the peer can
    /// receive, it gets every path of the multipath set (ECMP upstream),
    /// not just the best. Off by default; the reflector turns it on for
    /// its upstream (non-client) peers. Never for agents, which keep one
    /// route per prefix.
    #[serde(default)]
    pub add_path_send: bool,
}

fn default_port() -> u16 {
    BGP_PORT
}

impl PeerSpec {
    pub fn new(address: IpAddr, asn: u32) -> PeerSpec {
        PeerSpec {
            address,
            port: BGP_PORT,
            asn,
            client: false,
            passive: false,
            next_hop_self: false,
            password: None,
            add_path_send: false,
        }
    }
}

#[derive(Clone, Debug)]
pub struct SpeakerConfig {
    pub local_asn: u32,
    pub router_id: Ipv4Addr,
    /// Shared by all reflectors of a cluster; None: the router id.
    pub cluster_id: Option<Ipv4Addr>,
    /// Where to accept connections; its address is also the source of
    /// outbound connections when it is not a wildcard. None: no listener.
    pub listen: Option<SocketAddr>,
    pub hold_time: u16,
    /// 0: a third of the negotiated hold time.
    pub keepalive_time: u16,
    pub connect_retry: Duration,
    pub families: Vec<Family>,
    /// None turns graceful restart off.
    pub graceful_restart: Option<GrConfig>,
    /// Start as a restarting speaker: R bit set, route selection deferred
    /// until peers sent End-of-RIB (RFC 4724 4.1). Only with GR on.
    pub restarting: bool,
    pub peers: Vec<PeerSpec>,
    /// TCP-MD5 (RFC 2385) key for every peer without one of its own,
    /// configured or added at run time (a reflector's clients found in the
    /// datastore): set on the listener for the peer's address and on the
    /// sockets we connect from.
    pub default_password: Option<String>,
    /// RFC 9687: a session whose peer takes none of our output for this
    /// long is closed. Zero turns the send hold timer off.
    pub send_hold_time: Duration,
    /// SO_SNDBUF / SO_RCVBUF of BGP connections (see [`SOCKET_BUFFER`]).
    pub socket_buffer: u32,
    /// Encoded octets a session may have waiting to be written and still
    /// be sent more with its update group (see [`OUTPUT_AHEAD`]); past
    /// that, its changes wait as Adj-RIB-Out state, one per prefix.
    pub output_ahead: usize,
}

/// The default [`SpeakerConfig::output_ahead`]. The bytes are shared with
/// the other members of the group, so a member that lags keeps at most
/// this much alive; a group of its own costs far more (its own copy of
/// every pending change, ~60 octets a prefix against ~5 encoded, and its
/// own packing and encoding).
pub const OUTPUT_AHEAD: usize = 1 << 20;

impl SpeakerConfig {
    pub fn new(local_asn: u32, router_id: Ipv4Addr) -> SpeakerConfig {
        SpeakerConfig {
            local_asn,
            router_id,
            cluster_id: None,
            listen: None,
            hold_time: 90,
            keepalive_time: 0,
            connect_retry: Duration::from_secs(5),
            families: vec![Family::Ipv4Unicast, Family::Ipv6Unicast],
            graceful_restart: Some(GrConfig::default()),
            restarting: true,
            peers: Vec::new(),
            default_password: None,
            send_hold_time: crate::fsm::DEFAULT_SEND_HOLD_TIME,
            socket_buffer: SOCKET_BUFFER,
            output_ahead: OUTPUT_AHEAD,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SpeakerError {
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("the BGP speaker has stopped")]
    Stopped,
    #[error("invalid configuration: {0}")]
    Config(String),
}

/// One peer in [`Status`].
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct PeerStatus {
    pub address: IpAddr,
    pub asn: u32,
    pub client: bool,
    pub state: State,
    /// Prefixes received and kept (Adj-RIB-In).
    pub received: usize,
    /// Prefixes advertised (Adj-RIB-Out).
    pub advertised: usize,
    /// Received prefixes kept only because the peer restarts gracefully.
    pub stale: usize,
    pub graceful_restart: String,
    /// The BGP identifier of its current session.
    pub bgp_id: Option<Ipv4Addr>,
    /// Other established peers with the same identifier: routes reflected
    /// between them are dropped as looped (see `shared_ids`).
    pub bgp_id_shared_with: Vec<IpAddr>,
}

/// What `egress bgp status` shows.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Status {
    pub local_asn: u32,
    pub router_id: Ipv4Addr,
    pub cluster_id: Ipv4Addr,
    /// Route selection held back after our restart (RFC 4724).
    pub deferring: bool,
    pub best_routes: usize,
    pub peers: Vec<PeerStatus>,
}

/// What waits to be sent to one peer: bounded by its table, not by how
/// much changed (see [`SpeakerHandle::out_queue`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct OutQueue {
    /// Prefixes whose change the peer has not been sent yet (Adj-RIB-Out
    /// state, one entry per prefix however often it changed).
    pub pending_prefixes: usize,
    /// Encoded octets handed to the session and not yet written to the
    /// socket (at most one batch).
    pub unwritten_bytes: usize,
}

/// A running session task.
pub(crate) struct SessionEntry {
    pub tx: mpsc::UnboundedSender<msg::SessionCmd>,
    pub task: tokio::task::AbortHandle,
}

/// The session tasks by peer address; the listener hands sockets over
/// through it.
pub(crate) type SessionMap = Arc<Mutex<HashMap<IpAddr, SessionEntry>>>;

/// Cheap to clone; every method fails with [`SpeakerError::Stopped`] once
/// the speaker is gone.
#[derive(Clone)]
pub struct SpeakerHandle {
    tx: mpsc::Sender<RibMsg>,
    listen_addr: Option<SocketAddr>,
}

impl SpeakerHandle {
    async fn send(&self, m: RibMsg) -> Result<(), SpeakerError> {
        self.tx.send(m).await.map_err(|_| SpeakerError::Stopped)
    }

    /// Announces `prefix` (a pod CIDR or an EIP /32 or /128) via `next_hop`.
    pub async fn announce(&self, prefix: Prefix, next_hop: IpAddr) -> Result<(), SpeakerError> {
        self.send(RibMsg::Announce { prefix, next_hop }).await
    }

    /// Announces many prefixes in one go (a node's pod CIDR and EIPs at
    /// start-up): they leave in as few UPDATEs as possible.
    pub async fn announce_many(&self, routes: Vec<(Prefix, IpAddr)>) -> Result<(), SpeakerError> {
        self.send(RibMsg::AnnounceMany(routes)).await
    }

    /// Announces `prefix` with a chosen LOCAL_PREF: the agent gives an EIP
    /// a preference that grows with its assignment's epoch, so the newest
    /// owner wins everywhere even while an old owner's route is still held.
    pub async fn announce_with_local_pref(
        &self,
        prefix: Prefix,
        next_hop: IpAddr,
        local_pref: u32,
    ) -> Result<(), SpeakerError> {
        self.send(RibMsg::AnnounceWithPref {
            prefix,
            next_hop,
            local_pref,
        })
        .await
    }

    /// Withdraws a prefix announced with [`Self::announce`] at once.
    pub async fn withdraw(&self, prefix: Prefix) -> Result<(), SpeakerError> {
        self.send(RibMsg::Withdraw { prefix }).await
    }

    /// Best-route changes: first the whole current table as `Set`s, then
    /// every change as it happens. Unbounded so the RIB never waits for
    /// the consumer; the consumer should keep reading.
    pub async fn subscribe(&self) -> Result<mpsc::UnboundedReceiver<BestChange>, SpeakerError> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.send(RibMsg::Subscribe(tx)).await?;
        Ok(rx)
    }

    pub async fn status(&self) -> Result<Status, SpeakerError> {
        let (tx, rx) = oneshot::channel();
        self.send(RibMsg::Status(tx)).await?;
        rx.await.map_err(|_| SpeakerError::Stopped)
    }

    /// Adds a neighbour at run time (agents found through the datastore).
    pub async fn add_peer(&self, peer: PeerSpec) -> Result<(), SpeakerError> {
        self.send(RibMsg::AddPeer(peer)).await
    }

    /// Closes the session with a Hard Reset (so the peer drops our routes
    /// at once, RFC 8538) and forgets the peer's routes.
    pub async fn remove_peer(&self, address: IpAddr) -> Result<(), SpeakerError> {
        self.send(RibMsg::RemovePeer(address)).await
    }

    /// What waits to be sent to a peer; None for an unknown peer.
    pub async fn out_queue(&self, peer: IpAddr) -> Result<Option<OutQueue>, SpeakerError> {
        let (tx, rx) = oneshot::channel();
        self.send(RibMsg::OutQueue(peer, tx)).await?;
        rx.await.map_err(|_| SpeakerError::Stopped)
    }

    /// The address the listener is bound to (useful with port 0).
    pub fn listen_addr(&self) -> Option<SocketAddr> {
        self.listen_addr
    }
}

/// A running speaker; dropping it does not stop it, [`Speaker::shutdown`] does.
pub struct Speaker {
    handle: SpeakerHandle,
    rib_task: JoinHandle<()>,
    listener_task: Option<JoinHandle<()>>,
    sessions: SessionMap,
}

impl Speaker {
    pub async fn start(mut cfg: SpeakerConfig) -> Result<Speaker, SpeakerError> {
        for p in cfg.peers.iter_mut().filter(|p| p.password.is_none()) {
            p.password = cfg.default_password.clone();
        }
        if cfg.hold_time == 1 || cfg.hold_time == 2 {
            return Err(SpeakerError::Config(
                "hold time must be 0 or at least 3".into(),
            ));
        }
        if let Some(g) = &cfg.graceful_restart {
            if crate::gr::effective_deferral(g) != g.deferral_time {
                tracing::warn!(
                    restart_time = g.restart_time,
                    deferral = ?g.deferral_time,
                    "selection deferral cut to half the restart time, so peers keep our routes until we send them"
                );
            }
        }
        let sessions: SessionMap = Arc::default();
        let (listener, listen_addr) = match cfg.listen {
            Some(addr) => {
                let l = listen(addr, cfg.socket_buffer)
                    .map_err(|source| SpeakerError::Listen { addr, source })?;
                let bound = l
                    .local_addr()
                    .map_err(|source| SpeakerError::Listen { addr, source })?;
                (Some(l), Some(bound))
            }
            None => (None, None),
        };
        let listen_fd = listener.as_ref().map(|l| {
            use std::os::fd::AsRawFd;
            l.as_raw_fd()
        });
        for p in &cfg.peers {
            if let (Some(fd), Some(key)) = (listen_fd, &p.password) {
                md5::set_key(fd, p.address, key.as_bytes()).map_err(|e| {
                    SpeakerError::Config(format!("TCP-MD5 key for {}: {e}", p.address))
                })?;
            }
        }
        let (tx, rx) = mpsc::channel(1024);
        let restarting = Arc::new(AtomicBool::new(
            cfg.restarting && cfg.graceful_restart.is_some(),
        ));
        let rib_task = tokio::spawn(rib_task::run(
            listen_fd,
            cfg,
            rx,
            tx.clone(),
            sessions.clone(),
            restarting,
        ));
        let listener_task = listener.map(|l| tokio::spawn(accept_loop(l, sessions.clone())));
        Ok(Speaker {
            handle: SpeakerHandle { tx, listen_addr },
            rib_task,
            listener_task,
            sessions,
        })
    }

    pub fn handle(&self) -> SpeakerHandle {
        self.handle.clone()
    }

    /// Sends Cease (administrative shutdown) to every peer and waits for
    /// the tasks to end. Peers that negotiated the RFC 8538 N bit keep our
    /// routes as stale for our restart time; others drop them. For a
    /// restart that no peer may notice, use [`Speaker::abort`].
    pub async fn shutdown(self) {
        if let Some(l) = &self.listener_task {
            l.abort();
        }
        let _ = self.handle.tx.send(RibMsg::Shutdown).await;
        let _ = self.rib_task.await;
    }

    /// Stops at once, closing every connection without a NOTIFICATION, as
    /// a crash would: every graceful restart helper keeps our routes for
    /// our restart time (RFC 4724), even one without the N bit. Use it
    /// when the process is about to be restarted.
    pub fn abort(self) {
        if let Some(l) = &self.listener_task {
            l.abort();
        }
        self.rib_task.abort();
        for (_, s) in self.sessions.lock().expect("session map").drain() {
            s.task.abort();
        }
    }
}

/// Socket buffers for BGP connections. A full table arrives in one burst;
/// with the default (autotuned from 128 KiB) the receive window can close
/// while the RIB catches up, and the sender then falls back to zero-window
/// probes with exponential backoff: seconds of idle link. The kernel caps
/// the value at net.core.rmem_max / wmem_max.
pub(crate) const SOCKET_BUFFER: u32 = 4 << 20;

fn listen(addr: SocketAddr, buffer: u32) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    // Accepted connections inherit these.
    socket.set_recv_buffer_size(buffer)?;
    socket.set_send_buffer_size(buffer)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

async fn accept_loop(listener: TcpListener, sessions: SessionMap) {
    loop {
        let Ok((stream, remote)) = listener.accept().await else {
            continue;
        };
        let tx = sessions
            .lock()
            .expect("session map")
            .get(&remote.ip())
            .map(|s| s.tx.clone());
        match tx {
            Some(tx) => {
                let _ = tx.send(msg::SessionCmd::Inbound(stream));
            }
            None => tracing::debug!(%remote, "connection from an unknown peer refused"),
        }
    }
}

#[cfg(test)]
mod tests;
