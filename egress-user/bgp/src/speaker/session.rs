//! One task per peer: owns the TCP connection and drives the pure FSM.

use std::collections::{HashMap, VecDeque};
use std::future::pending;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::Ordering;

use bytes::{Bytes, BytesMut};
use tokio::io::AsyncReadExt;
use tokio::net::tcp::OwnedReadHalf;
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::msg::{RibMsg, SessionCmd, SessionSetup};
use super::output::Output;
use crate::codec::{
    notif, split_frame, AddPathFamily, Capability, CodecOptions, Message, NextHopTuple,
    Notification, Open, RouteRefreshSubtype,
};
use crate::fsm::{resolve_collision, Action, CollisionWinner, Event, Fsm, State, Timer};
use crate::gr;
use crate::types::Family;

/// The reading side of a connection; its writing side is an [`Output`].
struct Conn {
    rd: OwnedReadHalf,
    buf: BytesMut,
    /// Room made for the next reads: small at first, doubled while reads
    /// fill it (a peer sending its table), so that a thousand quiet
    /// sessions do not hold 64 KiB each.
    read_size: usize,
    local: SocketAddr,
    outbound: bool,
}

impl Conn {
    fn new(stream: TcpStream, outbound: bool) -> io::Result<(Conn, Output)> {
        stream.set_nodelay(true)?;
        let local = stream.local_addr()?;
        let (rd, wr) = stream.into_split();
        let conn = Conn {
            rd,
            buf: BytesMut::with_capacity(READ_MIN),
            read_size: READ_MIN,
            local,
            outbound,
        };
        Ok((conn, Output::new(wr)))
    }
}

/// The smallest and largest room made for reads: one message of the
/// usual size, and enough for a peer sending its table at speed.
const READ_MIN: usize = 4096;
const READ_MAX: usize = 65536;

type Connecting = Pin<Box<dyn std::future::Future<Output = io::Result<TcpStream>> + Send>>;

struct Session {
    setup: SessionSetup,
    fsm: Fsm,
    conn: Option<Conn>,
    out: Option<Output>,
    connecting: Option<Connecting>,
    /// A second connection waiting for its OPEN to settle a collision.
    contender: Option<(Conn, Output)>,
    timers: HashMap<Timer, Instant>,
    codec: CodecOptions,
    events: VecDeque<Event>,
    last_state: State,
}

pub(crate) async fn run(setup: SessionSetup, mut cmds: mpsc::UnboundedReceiver<SessionCmd>) {
    let fsm = Fsm::new(setup.fsm.clone());
    let mut s = Session {
        setup,
        fsm,
        conn: None,
        out: None,
        connecting: None,
        contender: None,
        timers: HashMap::new(),
        codec: CodecOptions::default(),
        events: VecDeque::new(),
        last_state: State::Idle,
    };
    s.refresh_capabilities();
    let start = if s.setup.spec.passive {
        Event::ManualStartPassive
    } else {
        Event::ManualStart
    };
    s.run_events(start).await;
    loop {
        let deadline = s.timers.values().min().copied();
        tokio::select! {
            cmd = cmds.recv() => match cmd {
                None | Some(SessionCmd::Stop) => {
                    s.run_events(Event::ManualStop).await;
                    return;
                }
                Some(SessionCmd::StopHard) => {
                    s.run_events(Event::ManualStopHardReset).await;
                    return;
                }
                Some(SessionCmd::SendEncoded { codec, chunks, batch }) => {
                    s.send_encoded(codec, chunks, batch).await
                }
                Some(SessionCmd::Inbound(stream)) => s.inbound(stream).await,
            },
            res = read_more(s.conn.as_mut()) => match res {
                Ok(0) | Err(_) => s.run_events(Event::TcpConnectionFails).await,
                Ok(_) => s.drain_frames().await,
            },
            res = write_some(s.out.as_mut()) => match res {
                Err(_) => s.run_events(Event::TcpConnectionFails).await,
                Ok(()) => s.written().await,
            },
            res = wait_connect(&mut s.connecting) => {
                s.connecting = None;
                let ev = match res.and_then(|st| Conn::new(st, true)) {
                    Ok((c, o)) => {
                        s.conn = Some(c);
                        s.out = Some(o);
                        Event::TcpCrAcked
                    }
                    Err(e) => {
                        tracing::debug!(peer = %s.setup.spec.address, error = %e, "connect failed");
                        Event::TcpConnectionFails
                    }
                };
                s.run_events(ev).await;
            }
            res = read_more(s.contender.as_mut().map(|(c, _)| c)) => match res {
                Ok(n) if n > 0 => s.contender_data().await,
                _ => s.contender = None,
            },
            _ = sleep_until(deadline) => s.fire_timers().await,
        }
    }
}

async fn read_more(conn: Option<&mut Conn>) -> io::Result<usize> {
    match conn {
        Some(c) => {
            // Keep reads large: an exhausted BytesMut would otherwise grow
            // by a few bytes per read.
            if c.buf.capacity() - c.buf.len() < c.read_size / 4 {
                c.buf.reserve(c.read_size);
            }
            let room = c.buf.capacity() - c.buf.len();
            let n = c.rd.read_buf(&mut c.buf).await?;
            if n == room {
                c.read_size = (c.read_size * 2).min(READ_MAX);
            }
            Ok(n)
        }
        None => pending().await,
    }
}

async fn write_some(out: Option<&mut Output>) -> io::Result<()> {
    match out {
        Some(o) => o.write_some().await,
        None => pending().await,
    }
}

async fn wait_connect(c: &mut Option<Connecting>) -> io::Result<TcpStream> {
    match c {
        Some(f) => f.await,
        None => pending().await,
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => pending().await,
    }
}

impl Session {
    fn peer(&self) -> IpAddr {
        self.setup.spec.address
    }

    /// Our OPEN's capabilities; the R bit follows the restart state.
    fn refresh_capabilities(&mut self) {
        let mut caps: Vec<Capability> = self
            .setup
            .families
            .iter()
            .map(|f| Capability::Multiprotocol((*f).into()))
            .collect();
        caps.push(Capability::RouteRefresh);
        caps.push(Capability::EnhancedRouteRefresh);
        if self.setup.families.contains(&Family::Ipv4Unicast) {
            // On an IPv6 underlay the nodes have no IPv4 address to put as
            // the next hop of IPv4 routes (RFC 8950). Offered on IPv4
            // sessions too: a dual-stack node peers over IPv4 but tunnels
            // over IPv6. A peer that does not offer it is sent none.
            caps.push(Capability::ExtendedNextHop(vec![
                NextHopTuple::IPV4_UNICAST_VIA_IPV6,
            ]));
        }
        if self.setup.spec.add_path_send {
            // Send only: we keep one path per (prefix, peer) on receipt.
            let tuples = self.setup.families.iter();
            caps.push(Capability::AddPath(
                tuples
                    .map(|f| AddPathFamily::new(*f, true, false))
                    .collect(),
            ));
        }
        if let Some(g) = &self.setup.graceful_restart {
            let restarting = self.setup.restarting.load(Ordering::Relaxed);
            caps.push(Capability::GracefulRestart(gr::capability(
                g,
                restarting,
                &self.setup.families,
            )));
            if let Some(llgr) = gr::llgr_capability(g, &self.setup.families) {
                caps.push(Capability::LongLivedGr(llgr));
            }
        }
        self.fsm.set_capabilities(caps);
    }

    async fn run_events(&mut self, first: Event) {
        self.events.push_back(first);
        while let Some(ev) = self.events.pop_front() {
            if matches!(ev, Event::TcpCrAcked | Event::TcpConnectionConfirmed) {
                self.refresh_capabilities();
            }
            let actions = self.fsm.handle(ev);
            for a in actions {
                self.act(a).await;
            }
            let state = self.fsm.state();
            if state != self.last_state {
                self.last_state = state;
                self.tell_rib(RibMsg::State {
                    peer: self.peer(),
                    state,
                })
                .await;
            }
        }
    }

    async fn tell_rib(&mut self, m: RibMsg) {
        let _ = self.setup.rib.send(m).await;
    }

    async fn act(&mut self, a: Action) {
        match a {
            Action::Connect => {
                if self.conn.is_none() {
                    self.connecting = Some(Box::pin(connect(
                        self.setup.spec.password.clone(),
                        self.setup.source_addr,
                        SocketAddr::new(self.peer(), self.setup.spec.port),
                        self.setup.socket_buffer,
                    )));
                }
            }
            Action::DropConnection => {
                // A NOTIFICATION just queued goes out if the socket takes
                // it now; a peer that does not read gets nothing more.
                if let Some(o) = &mut self.out {
                    o.flush_now();
                }
                self.conn = None;
                self.out = None;
                self.connecting = None;
                self.codec = CodecOptions::default();
            }
            Action::Send(m) => self.write(&[m]),
            Action::StartTimer(t, d) => {
                self.timers.insert(t, Instant::now() + d);
            }
            Action::StopTimer(t) => {
                self.timers.remove(&t);
            }
            Action::SessionUp(neg) => {
                self.codec = neg.codec;
                let local_addr = self.conn.as_ref().map(|c| c.local.ip());
                let local_gr = self.fsm.local_open().graceful_restart().cloned();
                self.tell_rib(RibMsg::SessionUp {
                    peer: self.peer(),
                    negotiated: neg,
                    local_addr: local_addr.unwrap_or(self.peer()),
                    local_gr,
                })
                .await;
            }
            Action::SessionDown(reason) => {
                self.tell_rib(RibMsg::SessionDown {
                    peer: self.peer(),
                    reason,
                })
                .await
            }
            Action::DeliverUpdate(update) => {
                self.tell_rib(RibMsg::Update {
                    peer: self.peer(),
                    update,
                })
                .await
            }
            Action::DeliverRouteRefresh(rr) => {
                self.tell_rib(RibMsg::RouteRefresh {
                    peer: self.peer(),
                    rr,
                })
                .await
            }
        }
    }

    /// Queues messages; the loop writes them as the socket takes them.
    fn write(&mut self, msgs: &[Message]) {
        let mut buf = BytesMut::new();
        for m in msgs {
            if let Err(e) = m.encode(self.codec, &mut buf) {
                tracing::warn!(peer = %self.setup.spec.address, error = %e, "message not sent");
            }
        }
        self.queue(std::iter::once(buf.freeze()));
    }

    fn queue(&mut self, chunks: impl IntoIterator<Item = Bytes>) {
        let Some(o) = &mut self.out else { return };
        for b in chunks {
            o.push(b);
        }
        if !o.is_empty() {
            self.events.push_back(Event::OutputWaiting);
        }
    }

    async fn run_queued_events(&mut self) {
        if let Some(ev) = self.events.pop_front() {
            self.run_events(ev).await;
        }
    }

    async fn send_encoded(&mut self, codec: CodecOptions, chunks: Vec<Bytes>, batch: u64) {
        let usable = self.fsm.state() == State::Established && codec == self.codec;
        if !usable || self.out.is_none() {
            // The RIB re-sends the table when the session is back; it
            // only needs to know that this batch is not waiting.
            self.tell_rib(self.written_msg(batch)).await;
            return;
        }
        self.queue(chunks);
        if let Some(o) = &mut self.out {
            o.end_batch(batch);
        }
        // An empty batch is written already.
        self.written_batch().await;
        self.run_queued_events().await;
    }

    fn written_msg(&self, batch: u64) -> RibMsg {
        RibMsg::Written {
            peer: self.peer(),
            batch,
        }
    }

    /// Some output went out.
    async fn written(&mut self) {
        let all = self.out.as_ref().is_none_or(|o| o.is_empty());
        self.written_batch().await;
        self.run_events(Event::OutputWritten { all }).await;
    }

    /// Tells the RIB once its batch is all written.
    async fn written_batch(&mut self) {
        if let Some(b) = self.out.as_mut().and_then(|o| o.take_done_batch()) {
            self.tell_rib(self.written_msg(b)).await;
        }
    }

    async fn drain_frames(&mut self) {
        loop {
            let Some(c) = &mut self.conn else { return };
            let ev = match split_frame(&mut c.buf) {
                Ok(None) => return,
                Err(e) => Event::MessageError(e),
                Ok(Some(frame)) => match Message::decode(&frame, self.codec) {
                    Err(e) => Event::MessageError(e),
                    Ok(Message::Open(o)) => Event::BgpOpen(o),
                    Ok(Message::Update(u)) => Event::UpdateMsg(u),
                    Ok(Message::Keepalive) => Event::KeepAliveMsg,
                    Ok(Message::Notification(n)) => {
                        tracing::info!(peer = %self.setup.spec.address, code = n.code, subcode = n.subcode, "NOTIFICATION received");
                        Event::NotifMsg(n)
                    }
                    // RFC 7313: unknown subtypes are ignored.
                    Ok(Message::RouteRefresh(r))
                        if matches!(r.subtype, RouteRefreshSubtype::Other(_)) =>
                    {
                        continue
                    }
                    Ok(Message::RouteRefresh(r)) => Event::RouteRefreshMsg(r),
                },
            };
            if let Event::MessageError(e) = &ev {
                tracing::warn!(peer = %self.setup.spec.address, error = %e, "malformed message");
            }
            self.run_events(ev).await;
        }
    }

    async fn fire_timers(&mut self) {
        let now = Instant::now();
        let due: Vec<Timer> = self
            .timers
            .iter()
            .filter(|(_, d)| **d <= now)
            .map(|(t, _)| *t)
            .collect();
        for t in due {
            self.timers.remove(&t);
            let ev = match t {
                Timer::ConnectRetry => Event::ConnectRetryTimerExpires,
                Timer::Hold => Event::HoldTimerExpires,
                Timer::Keepalive => Event::KeepaliveTimerExpires,
                Timer::IdleHold => Event::IdleHoldTimerExpires,
                Timer::SendHold => Event::SendHoldTimerExpires,
            };
            self.run_events(ev).await;
        }
    }

    /// RFC 4271 6.8: a connection from the peer while we have our own.
    async fn inbound(&mut self, stream: TcpStream) {
        let Ok(conn) = Conn::new(stream, false) else {
            return;
        };
        match self.fsm.state() {
            State::Idle => {
                // Restart at once rather than refuse: the peer is ready.
                self.run_events(Event::IdleHoldTimerExpires).await;
                if matches!(self.fsm.state(), State::Connect | State::Active) {
                    self.adopt(conn, None).await;
                }
            }
            State::Connect | State::Active => self.adopt(conn, None).await,
            State::OpenSent | State::OpenConfirm => self.contender = Some(conn),
            State::Established => refuse(conn),
        }
    }

    /// Uses `conn` as the session's connection; `open` is its OPEN if
    /// already read.
    async fn adopt(&mut self, (conn, out): (Conn, Output), open: Option<Open>) {
        self.connecting = None;
        self.conn = Some(conn);
        self.out = Some(out);
        self.run_events(Event::TcpConnectionConfirmed).await;
        if let Some(o) = open {
            self.run_events(Event::BgpOpen(o)).await;
        }
        // Anything that followed the OPEN in the same read.
        self.drain_frames().await;
    }

    /// Data on the contending connection: wait for its OPEN, then keep
    /// the connection opened by the side with the higher identifier.
    async fn contender_data(&mut self) {
        let Some((c, _)) = &mut self.contender else {
            return;
        };
        let open = match split_frame(&mut c.buf) {
            Ok(None) => return,
            Ok(Some(f)) => match Message::decode(&f, CodecOptions::default()) {
                Ok(Message::Open(o)) => o,
                _ => {
                    self.contender = None;
                    return;
                }
            },
            Err(_) => {
                self.contender = None;
                return;
            }
        };
        let contender = self.contender.take().expect("checked above");
        let ours_outbound = self.conn.as_ref().is_some_and(|c| c.outbound);
        let winner = resolve_collision(self.setup.fsm.router_id, open.bgp_id);
        if self.fsm.state() == State::Established
            || (ours_outbound && winner == CollisionWinner::LocallyInitiated)
        {
            refuse(contender);
            return;
        }
        // The peer's connection wins: close ours with a Cease and start
        // over on theirs, whose OPEN we already have.
        self.run_events(Event::OpenCollisionDump).await;
        self.run_events(Event::IdleHoldTimerExpires).await;
        self.adopt(contender, Some(open)).await;
    }
}

/// Closes a losing connection with Cease / connection collision.
fn refuse((_, mut out): (Conn, Output)) {
    let n = Message::Notification(Notification::cease(notif::CEASE_COLLISION));
    if let Ok(b) = n.to_bytes(CodecOptions::default()) {
        out.push(b);
        out.flush_now();
    }
}

async fn connect(
    password: Option<String>,
    source: Option<IpAddr>,
    to: SocketAddr,
    buffer: u32,
) -> io::Result<TcpStream> {
    let socket = if to.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    if let Some(key) = password {
        use std::os::fd::AsRawFd;
        super::md5::set_key(socket.as_raw_fd(), to.ip(), key.as_bytes())?;
    }
    socket.set_recv_buffer_size(buffer)?;
    socket.set_send_buffer_size(buffer)?;
    if let Some(src) = source.filter(|s| s.is_ipv4() == to.is_ipv4() && !s.is_unspecified()) {
        socket.bind(SocketAddr::new(src, 0))?;
    }
    socket.connect(to).await
}
