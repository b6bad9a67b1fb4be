//! RFC 4271 section 8 session state machine, without I/O.
//!
//! [`Fsm::handle`] takes one [`Event`] and returns the [`Action`]s the owner
//! must carry out (send, start or stop a timer, open or drop the TCP
//! connection, hand routes to the RIB). Timers are named, not run, here.
//! Not implemented (optional in RFC 4271): DelayOpen and peer oscillation
//! damping; collisions between two connections are resolved by the owner
//! with [`resolve_collision`], which then feeds [`Event::OpenCollisionDump`].

use std::net::Ipv4Addr;
use std::time::Duration;

use serde::Serialize;

use crate::codec::{
    negotiate_add_path, negotiate_ext_next_hop, notif, Capability, CodecOptions, DecodeError,
    Message, Notification, Open, RouteRefresh, Update,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum State {
    Idle,
    Connect,
    Active,
    OpenSent,
    OpenConfirm,
    Established,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Timer {
    ConnectRetry,
    Hold,
    Keepalive,
    /// Wait before an automatic restart after an error (RFC 4271 8.1.1,
    /// IdleHoldTimer), so a broken peer is not hammered.
    IdleHold,
    /// RFC 9687: how long output may wait on a peer that takes none of it.
    SendHold,
}

// Events carrying an UPDATE dominate; boxing them would cost an allocation each.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    ManualStart,
    ManualStartPassive,
    ManualStop,
    /// Stop and tell the peer to drop our routes even if it would keep
    /// them across a NOTIFICATION (RFC 8538 Hard Reset), e.g. when the
    /// peer is removed from the configuration.
    ManualStopHardReset,
    ConnectRetryTimerExpires,
    HoldTimerExpires,
    KeepaliveTimerExpires,
    IdleHoldTimerExpires,
    /// Our outbound connection succeeded (RFC event 16, Tcp_CR_Acked).
    TcpCrAcked,
    /// We accepted an inbound connection (RFC event 17).
    TcpConnectionConfirmed,
    TcpConnectionFails,
    BgpOpen(Open),
    /// A message that failed to decode (header, OPEN or UPDATE error).
    MessageError(DecodeError),
    NotifMsg(Notification),
    KeepAliveMsg,
    UpdateMsg(Update),
    RouteRefreshMsg(RouteRefresh),
    /// This connection lost a collision (RFC event 23).
    OpenCollisionDump,
    /// The owner has output the connection has not taken yet.
    OutputWaiting,
    /// Some output went out; `all`: none is left.
    OutputWritten {
        all: bool,
    },
    /// RFC 9687 SendHoldTimer_Expires: output waited a whole send hold
    /// time without any of it going out.
    SendHoldTimerExpires,
}

/// Why an Established session ended; graceful restart depends on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DownReason {
    TcpFailure,
    HoldTimerExpired,
    NotificationSent(Notification),
    NotificationReceived(Notification),
    Stopped,
}

/// What was agreed in the OPEN exchange.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Negotiated {
    pub peer_open: Open,
    pub hold_time: u16,
    pub keepalive_time: u16,
    pub codec: CodecOptions,
    pub peer_asn: u32,
    pub peer_id: Ipv4Addr,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    Connect,
    DropConnection,
    Send(Message),
    StartTimer(Timer, Duration),
    StopTimer(Timer),
    /// The session reached Established.
    SessionUp(Box<Negotiated>),
    /// An Established session ended.
    SessionDown(DownReason),
    DeliverUpdate(Update),
    DeliverRouteRefresh(RouteRefresh),
}

#[derive(Clone, Debug)]
pub struct FsmConfig {
    pub local_asn: u32,
    pub router_id: Ipv4Addr,
    pub peer_asn: u32,
    /// Proposed hold time in seconds: 0 (no keepalives) or at least 3.
    pub hold_time: u16,
    /// Keepalive interval; 0 means a third of the negotiated hold time.
    pub keepalive_time: u16,
    pub connect_retry_time: Duration,
    pub idle_hold_time: Duration,
    pub passive: bool,
    /// Capabilities for our OPEN (4-octet AS is added automatically).
    pub capabilities: Vec<Capability>,
    /// RFC 9687 send hold time; zero turns the send hold timer off.
    pub send_hold_time: Duration,
}

/// RFC 9687's suggested send hold time.
pub const DEFAULT_SEND_HOLD_TIME: Duration = Duration::from_secs(480);

/// Hold time used until the OPEN arrives (RFC 4271 8.2.2 suggests 4 min).
pub const LARGE_HOLD_TIME: Duration = Duration::from_secs(240);

/// RFC 4271 4.2 and 6.2: the smaller of both proposals; zero disables
/// keepalives; one or two seconds are refused.
pub fn negotiate_hold_time(local: u16, peer: u16) -> Result<u16, Notification> {
    if peer == 1 || peer == 2 {
        return Err(DecodeError::UnacceptableHoldTime(peer).notification());
    }
    Ok(local.min(peer))
}

/// Which of two connections to the same peer survives (RFC 4271 6.8).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CollisionWinner {
    LocallyInitiated,
    RemotelyInitiated,
}

/// The connection opened by the side with the higher BGP identifier wins.
pub fn resolve_collision(local_id: Ipv4Addr, remote_id: Ipv4Addr) -> CollisionWinner {
    if u32::from(local_id) > u32::from(remote_id) {
        CollisionWinner::LocallyInitiated
    } else {
        CollisionWinner::RemotelyInitiated
    }
}

pub struct Fsm {
    cfg: FsmConfig,
    state: State,
    connect_retry_counter: u32,
    /// Restart by itself after an error until ManualStop.
    auto_restart: bool,
    negotiated: Option<Negotiated>,
    /// The send hold timer runs (output is waiting).
    send_hold_running: bool,
}

impl Fsm {
    pub fn new(cfg: FsmConfig) -> Fsm {
        Fsm {
            cfg,
            state: State::Idle,
            connect_retry_counter: 0,
            auto_restart: false,
            negotiated: None,
            send_hold_running: false,
        }
    }

    pub fn state(&self) -> State {
        self.state
    }

    pub fn negotiated(&self) -> Option<&Negotiated> {
        self.negotiated.as_ref()
    }

    pub fn connect_retry_counter(&self) -> u32 {
        self.connect_retry_counter
    }

    pub fn config(&self) -> &FsmConfig {
        &self.cfg
    }

    /// Replaces the capabilities of the next OPEN (the R bit of graceful
    /// restart changes once the restart is over).
    pub fn set_capabilities(&mut self, caps: Vec<Capability>) {
        self.cfg.capabilities = caps;
    }

    pub fn local_open(&self) -> Open {
        Open::new(
            self.cfg.local_asn,
            self.cfg.hold_time,
            self.cfg.router_id,
            self.cfg.capabilities.clone(),
        )
    }

    pub fn handle(&mut self, event: Event) -> Vec<Action> {
        let mut out = Vec::new();
        let next = match (self.state, event) {
            (_, e @ (Event::OutputWaiting | Event::OutputWritten { .. })) => {
                self.output(e, &mut out)
            }
            (_, Event::SendHoldTimerExpires) => self.send_hold_expired(&mut out),
            (State::Idle, e) => self.idle(e, &mut out),
            (State::Connect | State::Active, e) => self.connecting(e, &mut out),
            (State::OpenSent, e) => self.open_sent(e, &mut out),
            (State::OpenConfirm, e) => self.open_confirm(e, &mut out),
            (State::Established, e) => self.established(e, &mut out),
        };
        if next == State::Idle {
            self.negotiated = None;
        }
        self.state = next;
        out
    }

    fn start(&mut self, passive: bool, out: &mut Vec<Action>) -> State {
        self.connect_retry_counter = 0;
        out.push(Action::StopTimer(Timer::IdleHold));
        out.push(Action::StartTimer(
            Timer::ConnectRetry,
            self.cfg.connect_retry_time,
        ));
        if passive {
            State::Active
        } else {
            out.push(Action::Connect);
            State::Connect
        }
    }

    fn idle(&mut self, event: Event, out: &mut Vec<Action>) -> State {
        match event {
            Event::ManualStart => {
                self.auto_restart = true;
                self.start(self.cfg.passive, out)
            }
            Event::ManualStartPassive => {
                self.auto_restart = true;
                self.start(true, out)
            }
            Event::IdleHoldTimerExpires if self.auto_restart => self.start(self.cfg.passive, out),
            // Idle refuses connections (RFC 4271 8.2.2).
            Event::TcpConnectionConfirmed | Event::TcpCrAcked => {
                out.push(Action::DropConnection);
                State::Idle
            }
            _ => State::Idle,
        }
    }

    /// RFC 9687: the send hold timer runs from OpenSent on while output
    /// waits, restarts whenever some of it goes out, and stops once all
    /// has. The state does not change.
    fn output(&mut self, event: Event, out: &mut Vec<Action>) -> State {
        let sending = matches!(
            self.state,
            State::OpenSent | State::OpenConfirm | State::Established
        );
        let time = self.cfg.send_hold_time;
        match event {
            Event::OutputWaiting if sending && !self.send_hold_running && !time.is_zero() => {
                self.send_hold_running = true;
                out.push(Action::StartTimer(Timer::SendHold, time));
            }
            Event::OutputWritten { all: false } if self.send_hold_running => {
                out.push(Action::StartTimer(Timer::SendHold, time));
            }
            Event::OutputWritten { all: true } if self.send_hold_running => {
                self.send_hold_running = false;
                out.push(Action::StopTimer(Timer::SendHold));
            }
            _ => {}
        }
        self.state
    }

    /// RFC 9687 4: the peer took nothing for a whole send hold time. Its
    /// NOTIFICATION (8, Send Hold Timer Expired) is tried, but the
    /// connection is closed without waiting for it to go out.
    fn send_hold_expired(&mut self, out: &mut Vec<Action>) -> State {
        if !self.send_hold_running {
            return self.state; // stopped since it was armed
        }
        let n = Notification::new(notif::SEND_HOLD_TIMER_EXPIRED, 0, Default::default());
        if self.state == State::Established {
            out.push(Action::SessionDown(DownReason::NotificationSent(n.clone())));
        }
        self.notify_and_idle(n, out)
    }

    /// Back to Idle after an error, with an automatic restart scheduled.
    fn fail_to_idle(&mut self, out: &mut Vec<Action>) -> State {
        self.connect_retry_counter += 1;
        self.send_hold_running = false;
        for t in [
            Timer::ConnectRetry,
            Timer::Hold,
            Timer::Keepalive,
            Timer::SendHold,
        ] {
            out.push(Action::StopTimer(t));
        }
        out.push(Action::DropConnection);
        if self.auto_restart {
            out.push(Action::StartTimer(Timer::IdleHold, self.cfg.idle_hold_time));
        }
        State::Idle
    }

    fn stop(&mut self, out: &mut Vec<Action>, notification: Option<Notification>) -> State {
        if let Some(n) = notification {
            out.push(Action::Send(Message::Notification(n)));
        }
        self.auto_restart = false;
        self.connect_retry_counter = 0;
        self.send_hold_running = false;
        for t in [
            Timer::ConnectRetry,
            Timer::Hold,
            Timer::Keepalive,
            Timer::IdleHold,
            Timer::SendHold,
        ] {
            out.push(Action::StopTimer(t));
        }
        out.push(Action::DropConnection);
        State::Idle
    }

    fn send_open(&mut self, out: &mut Vec<Action>) -> State {
        out.push(Action::StopTimer(Timer::ConnectRetry));
        out.push(Action::Send(Message::Open(self.local_open())));
        out.push(Action::StartTimer(Timer::Hold, LARGE_HOLD_TIME));
        State::OpenSent
    }

    fn connecting(&mut self, event: Event, out: &mut Vec<Action>) -> State {
        match event {
            Event::ManualStop | Event::ManualStopHardReset => self.stop(out, None),
            Event::ConnectRetryTimerExpires => {
                out.push(Action::DropConnection);
                out.push(Action::StartTimer(
                    Timer::ConnectRetry,
                    self.cfg.connect_retry_time,
                ));
                if self.cfg.passive {
                    State::Active
                } else {
                    out.push(Action::Connect);
                    State::Connect
                }
            }
            Event::TcpCrAcked | Event::TcpConnectionConfirmed => self.send_open(out),
            Event::TcpConnectionFails if self.state == State::Connect => {
                out.push(Action::DropConnection);
                out.push(Action::StartTimer(
                    Timer::ConnectRetry,
                    self.cfg.connect_retry_time,
                ));
                State::Active
            }
            Event::ManualStart | Event::ManualStartPassive => self.state,
            _ => self.fail_to_idle(out),
        }
    }

    fn notify_and_idle(&mut self, n: Notification, out: &mut Vec<Action>) -> State {
        out.push(Action::Send(Message::Notification(n)));
        self.fail_to_idle(out)
    }

    fn open_sent(&mut self, event: Event, out: &mut Vec<Action>) -> State {
        match event {
            Event::ManualStop => {
                self.stop(out, Some(Notification::cease(notif::CEASE_ADMIN_SHUTDOWN)))
            }
            Event::ManualStopHardReset => self.stop(out, Some(hard_reset())),
            Event::ManualStart | Event::ManualStartPassive | Event::IdleHoldTimerExpires => {
                State::OpenSent
            }
            Event::HoldTimerExpires => self.notify_and_idle(
                Notification::new(notif::HOLD_TIMER_EXPIRED, 0, Default::default()),
                out,
            ),
            Event::TcpConnectionFails => {
                out.push(Action::DropConnection);
                out.push(Action::StartTimer(
                    Timer::ConnectRetry,
                    self.cfg.connect_retry_time,
                ));
                State::Active
            }
            Event::BgpOpen(open) => match self.check_open(&open) {
                Err(n) => self.notify_and_idle(n, out),
                Ok(neg) => {
                    out.push(Action::StopTimer(Timer::ConnectRetry));
                    out.push(Action::Send(Message::Keepalive));
                    if neg.hold_time > 0 {
                        out.push(Action::StartTimer(
                            Timer::Keepalive,
                            secs(neg.keepalive_time),
                        ));
                        out.push(Action::StartTimer(Timer::Hold, secs(neg.hold_time)));
                    } else {
                        out.push(Action::StopTimer(Timer::Hold));
                    }
                    self.negotiated = Some(neg);
                    State::OpenConfirm
                }
            },
            Event::MessageError(e) => self.notify_and_idle(e.notification(), out),
            Event::NotifMsg(_) => self.fail_to_idle(out),
            Event::OpenCollisionDump => {
                self.notify_and_idle(Notification::cease(notif::CEASE_COLLISION), out)
            }
            _ => self.notify_and_idle(fsm_error(notif::FSM_UNEXPECTED_IN_OPENSENT), out),
        }
    }

    fn open_confirm(&mut self, event: Event, out: &mut Vec<Action>) -> State {
        match event {
            Event::ManualStop => {
                self.stop(out, Some(Notification::cease(notif::CEASE_ADMIN_SHUTDOWN)))
            }
            Event::ManualStopHardReset => self.stop(out, Some(hard_reset())),
            Event::ManualStart | Event::ManualStartPassive | Event::IdleHoldTimerExpires => {
                State::OpenConfirm
            }
            Event::HoldTimerExpires => self.notify_and_idle(
                Notification::new(notif::HOLD_TIMER_EXPIRED, 0, Default::default()),
                out,
            ),
            Event::KeepaliveTimerExpires => {
                self.keepalive(out);
                State::OpenConfirm
            }
            Event::TcpConnectionFails | Event::NotifMsg(_) => self.fail_to_idle(out),
            Event::KeepAliveMsg => {
                let neg = self
                    .negotiated
                    .clone()
                    .expect("OpenConfirm always has a negotiation");
                self.restart_hold(out);
                out.push(Action::SessionUp(Box::new(neg)));
                State::Established
            }
            Event::MessageError(e) => self.notify_and_idle(e.notification(), out),
            Event::OpenCollisionDump => {
                self.notify_and_idle(Notification::cease(notif::CEASE_COLLISION), out)
            }
            _ => self.notify_and_idle(fsm_error(notif::FSM_UNEXPECTED_IN_OPENCONFIRM), out),
        }
    }

    fn established(&mut self, event: Event, out: &mut Vec<Action>) -> State {
        let down = |out: &mut Vec<Action>, r: DownReason| out.push(Action::SessionDown(r));
        match event {
            Event::ManualStop => {
                down(out, DownReason::Stopped);
                self.stop(out, Some(Notification::cease(notif::CEASE_ADMIN_SHUTDOWN)))
            }
            Event::ManualStopHardReset => {
                down(out, DownReason::Stopped);
                self.stop(out, Some(hard_reset()))
            }
            Event::ManualStart | Event::ManualStartPassive => State::Established,
            Event::HoldTimerExpires => {
                down(out, DownReason::HoldTimerExpired);
                self.notify_and_idle(
                    Notification::new(notif::HOLD_TIMER_EXPIRED, 0, Default::default()),
                    out,
                )
            }
            Event::KeepaliveTimerExpires => {
                self.keepalive(out);
                State::Established
            }
            Event::KeepAliveMsg => {
                self.restart_hold(out);
                State::Established
            }
            Event::UpdateMsg(u) => {
                self.restart_hold(out);
                out.push(Action::DeliverUpdate(u));
                State::Established
            }
            Event::RouteRefreshMsg(r) => {
                self.restart_hold(out);
                out.push(Action::DeliverRouteRefresh(r));
                State::Established
            }
            Event::TcpConnectionFails => {
                down(out, DownReason::TcpFailure);
                self.fail_to_idle(out)
            }
            Event::NotifMsg(n) => {
                down(out, DownReason::NotificationReceived(n));
                self.fail_to_idle(out)
            }
            Event::MessageError(e) => {
                let n = e.notification();
                down(out, DownReason::NotificationSent(n.clone()));
                self.notify_and_idle(n, out)
            }
            Event::OpenCollisionDump => {
                let n = Notification::cease(notif::CEASE_COLLISION);
                down(out, DownReason::NotificationSent(n.clone()));
                self.notify_and_idle(n, out)
            }
            // A second connection while Established is the owner's business
            // (RFC 4271 6.8: the new one is closed); it never reaches here.
            Event::TcpConnectionConfirmed | Event::TcpCrAcked | Event::IdleHoldTimerExpires => {
                State::Established
            }
            _ => {
                let n = fsm_error(notif::FSM_UNEXPECTED_IN_ESTABLISHED);
                down(out, DownReason::NotificationSent(n.clone()));
                self.notify_and_idle(n, out)
            }
        }
    }

    fn keepalive(&self, out: &mut Vec<Action>) {
        out.push(Action::Send(Message::Keepalive));
        if let Some(n) = &self.negotiated {
            if n.keepalive_time > 0 {
                out.push(Action::StartTimer(Timer::Keepalive, secs(n.keepalive_time)));
            }
        }
    }

    fn restart_hold(&self, out: &mut Vec<Action>) {
        if let Some(n) = &self.negotiated {
            if n.hold_time > 0 {
                out.push(Action::StartTimer(Timer::Hold, secs(n.hold_time)));
            }
        }
    }

    /// RFC 4271 6.2 checks on the peer's OPEN, and the negotiation result.
    fn check_open(&self, open: &Open) -> Result<Negotiated, Notification> {
        let peer_asn = open.asn();
        if peer_asn != self.cfg.peer_asn {
            return Err(Notification::new(
                notif::OPEN,
                notif::OPEN_BAD_PEER_AS,
                bytes::Bytes::copy_from_slice(&open.my_as.to_be_bytes()),
            ));
        }
        // Identical identifiers would make collisions unresolvable; RFC 6286
        // only allows it between different ASes.
        let ibgp = peer_asn == self.cfg.local_asn;
        if open.bgp_id.is_unspecified() || (ibgp && open.bgp_id == self.cfg.router_id) {
            return Err(DecodeError::BadBgpIdentifier.notification());
        }
        let hold_time = negotiate_hold_time(self.cfg.hold_time, open.hold_time)?;
        let keepalive_time = if hold_time == 0 {
            0
        } else if self.cfg.keepalive_time == 0 {
            (hold_time / 3).max(1)
        } else {
            self.cfg.keepalive_time.min(hold_time / 3).max(1)
        };
        let we_do_4octet = true;
        let ours = self
            .cfg
            .capabilities
            .iter()
            .find_map(|c| match c {
                Capability::AddPath(t) => Some(t.as_slice()),
                _ => None,
            })
            .unwrap_or(&[]);
        let add_path = negotiate_add_path(ours, open.add_path());
        let our_next_hops = self
            .cfg
            .capabilities
            .iter()
            .find_map(|c| match c {
                Capability::ExtendedNextHop(t) => Some(t.as_slice()),
                _ => None,
            })
            .unwrap_or(&[]);
        Ok(Negotiated {
            peer_open: open.clone(),
            hold_time,
            keepalive_time,
            codec: CodecOptions {
                four_octet_as: we_do_4octet && open.four_octet_as().is_some(),
                add_path_rx: add_path.receive,
                add_path_tx: add_path.send,
                ipv4_via_ipv6: negotiate_ext_next_hop(our_next_hops, open.extended_next_hop()),
            },
            peer_asn,
            peer_id: open.bgp_id,
        })
    }
}

/// RFC 8538 Hard Reset, carrying "peer de-configured" as the inner reason.
fn hard_reset() -> Notification {
    Notification::new(
        notif::CEASE,
        notif::CEASE_HARD_RESET,
        bytes::Bytes::from_static(&[notif::CEASE, notif::CEASE_PEER_DECONFIGURED]),
    )
}

fn fsm_error(subcode: u8) -> Notification {
    Notification::new(notif::FSM, subcode, Default::default())
}

fn secs(s: u16) -> Duration {
    Duration::from_secs(s as u64)
}

#[cfg(test)]
mod tests;
