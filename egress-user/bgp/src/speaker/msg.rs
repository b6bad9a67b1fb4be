//! The messages between the RIB task and the session tasks: what a
//! session tells the RIB ([`RibMsg`], also the handle's requests), what
//! the RIB tells a session ([`SessionCmd`]), and what a session starts
//! with ([`SessionSetup`]). Both sides use them; neither owns them.

use std::net::IpAddr;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use bytes::Bytes;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

use super::{OutQueue, PeerSpec, Status};
use crate::codec::{CodecOptions, GracefulRestartCap, RouteRefresh, Update};
use crate::fsm::{DownReason, FsmConfig, Negotiated, State};
use crate::gr::GrConfig;
use crate::rib::BestChange;
use crate::types::{Family, Prefix};

// UPDATEs dominate the traffic; boxing them would cost an allocation each.
#[allow(clippy::large_enum_variant)]
pub(crate) enum RibMsg {
    SessionUp {
        peer: IpAddr,
        negotiated: Box<Negotiated>,
        local_addr: IpAddr,
        local_gr: Option<GracefulRestartCap>,
    },
    SessionDown {
        peer: IpAddr,
        reason: DownReason,
    },
    State {
        peer: IpAddr,
        state: State,
    },
    Update {
        peer: IpAddr,
        update: Update,
    },
    RouteRefresh {
        peer: IpAddr,
        rr: RouteRefresh,
    },
    Announce {
        prefix: Prefix,
        next_hop: IpAddr,
    },
    AnnounceMany(Vec<(Prefix, IpAddr)>),
    AnnounceWithPref {
        prefix: Prefix,
        next_hop: IpAddr,
        local_pref: u32,
    },
    Withdraw {
        prefix: Prefix,
    },
    Subscribe(mpsc::UnboundedSender<BestChange>),
    Status(oneshot::Sender<Status>),
    OutQueue(IpAddr, oneshot::Sender<Option<OutQueue>>),
    /// A session wrote (or dropped) the batch of UPDATEs last sent to it.
    Written {
        peer: IpAddr,
        batch: u64,
    },
    AddPeer(PeerSpec),
    RemovePeer(IpAddr),
    Timer {
        peer: Option<IpAddr>,
        kind: TimerKind,
        generation: u64,
    },
    Shutdown,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum TimerKind {
    /// RFC 4724 restart time of a peer.
    Restart,
    /// Our wait for a returning peer's End-of-RIB.
    Stale,
    /// RFC 9494 long-lived stale time of a peer.
    LongLived,
    /// Our own selection deferral.
    Deferral,
}

pub(crate) enum SessionCmd {
    /// Messages already encoded with these options (the same bytes go to
    /// every peer of an update group); dropped if the session's differ.
    /// The RIB sends the next batch once this one is confirmed written
    /// (or dropped) with [`RibMsg::Written`].
    SendEncoded {
        codec: CodecOptions,
        chunks: Vec<Bytes>,
        batch: u64,
    },
    /// An accepted connection from this peer.
    Inbound(TcpStream),
    /// Cease and end the task.
    Stop,
    /// Hard Reset (RFC 8538) and end the task: the peer drops our routes.
    StopHard,
}

pub(crate) struct SessionSetup {
    pub spec: PeerSpec,
    pub fsm: FsmConfig,
    pub families: Vec<Family>,
    pub graceful_restart: Option<GrConfig>,
    pub restarting: Arc<AtomicBool>,
    pub source_addr: Option<IpAddr>,
    pub socket_buffer: u32,
    pub rib: mpsc::Sender<RibMsg>,
}
