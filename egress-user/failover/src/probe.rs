//! A BFD-style liveness session: the state machine of RFC 5880 (asynchronous
//! mode, one hop) in a simplified form, and its packet.
//!
//! This is **not wire-compatible BFD**: the packet is this project's own fixed
//! 24-byte format (below), intervals are in milliseconds, and there is no
//! authentication, no poll sequence (a changed interval applies at once), no
//! echo function and no demand mode. It keeps what matters for failover: the
//! three-way handshake (Down -> Init -> Up), discriminators, and a detection
//! time negotiated from both ends. Running it on its own port means it never
//! collides with a real BFD daemon (FRR's bfdd) on the same node.
//!
//! Pure: time is passed in. The caller (see [`crate::prober`]) feeds received
//! packets to [`Session::on_packet`], calls [`Session::on_timer`] and
//! [`Session::packet_to_send`] when [`Session::next_deadline`] passes, and
//! sends what comes out.
//!
//! Packet layout (network byte order):
//!
//! ```text
//!  0      2     3     4     5      6      8          12           16                20               24
//!  | "EG" | ver | sta | diag| mult | zero | my disc  | your disc  | desired min tx ms | required min rx ms |
//! ```

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use thiserror::Error;

pub const PACKET_LEN: usize = 24;
pub const MAGIC: [u8; 2] = *b"EG";
pub const VERSION: u8 = 1;

/// Session state; the numbering is BFD's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum SessionState {
    AdminDown = 0,
    Down = 1,
    Init = 2,
    Up = 3,
}

impl SessionState {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0 => Self::AdminDown,
            1 => Self::Down,
            2 => Self::Init,
            3 => Self::Up,
            _ => return None,
        })
    }
}

/// Why the sender's session last left Up (BFD's diagnostic codes, the subset
/// this session produces).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Diagnostic {
    None = 0,
    DetectTimeExpired = 1,
    NeighborSignaledDown = 3,
    AdminDown = 7,
}

impl Diagnostic {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0 => Self::None,
            1 => Self::DetectTimeExpired,
            3 => Self::NeighborSignaledDown,
            7 => Self::AdminDown,
            _ => return None,
        })
    }
}

/// One probe packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Packet {
    pub state: SessionState,
    pub diag: Diagnostic,
    pub detect_multiplier: u8,
    pub my_discriminator: u32,
    /// The receiver's discriminator as the sender knows it; 0 while unknown.
    pub your_discriminator: u32,
    pub desired_min_tx_ms: u32,
    pub required_min_rx_ms: u32,
}

/// Input that is not a valid probe packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum DecodeError {
    #[error("probe packet must be {PACKET_LEN} bytes, got {0}")]
    WrongLength(usize),
    #[error("bad magic {0:02x?}, not a probe packet")]
    BadMagic([u8; 2]),
    #[error("unsupported probe version {0}")]
    UnsupportedVersion(u8),
    #[error("unknown session state {0}")]
    UnknownState(u8),
    #[error("unknown diagnostic {0}")]
    UnknownDiagnostic(u8),
    #[error("reserved bytes are not zero")]
    NonZeroReserved,
    #[error("detect multiplier is zero")]
    ZeroMultiplier,
    #[error("my discriminator is zero")]
    ZeroMyDiscriminator,
    #[error("{0} is zero")]
    ZeroInterval(&'static str),
}

impl Packet {
    pub fn encode(&self) -> [u8; PACKET_LEN] {
        let mut b = [0u8; PACKET_LEN];
        b[0..2].copy_from_slice(&MAGIC);
        b[2] = VERSION;
        b[3] = self.state as u8;
        b[4] = self.diag as u8;
        b[5] = self.detect_multiplier;
        b[8..12].copy_from_slice(&self.my_discriminator.to_be_bytes());
        b[12..16].copy_from_slice(&self.your_discriminator.to_be_bytes());
        b[16..20].copy_from_slice(&self.desired_min_tx_ms.to_be_bytes());
        b[20..24].copy_from_slice(&self.required_min_rx_ms.to_be_bytes());
        b
    }

    pub fn decode(buf: &[u8]) -> Result<Self, DecodeError> {
        let b: &[u8; PACKET_LEN] = buf
            .try_into()
            .map_err(|_| DecodeError::WrongLength(buf.len()))?;
        if b[0..2] != MAGIC {
            return Err(DecodeError::BadMagic([b[0], b[1]]));
        }
        if b[2] != VERSION {
            return Err(DecodeError::UnsupportedVersion(b[2]));
        }
        let state = SessionState::from_u8(b[3]).ok_or(DecodeError::UnknownState(b[3]))?;
        let diag = Diagnostic::from_u8(b[4]).ok_or(DecodeError::UnknownDiagnostic(b[4]))?;
        if b[6] != 0 || b[7] != 0 {
            return Err(DecodeError::NonZeroReserved);
        }
        let word = |at: usize| u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        let p = Packet {
            state,
            diag,
            detect_multiplier: b[5],
            my_discriminator: word(8),
            your_discriminator: word(12),
            desired_min_tx_ms: word(16),
            required_min_rx_ms: word(20),
        };
        if p.detect_multiplier == 0 {
            return Err(DecodeError::ZeroMultiplier);
        }
        if p.my_discriminator == 0 {
            return Err(DecodeError::ZeroMyDiscriminator);
        }
        if p.desired_min_tx_ms == 0 {
            return Err(DecodeError::ZeroInterval("desired min tx interval"));
        }
        if p.required_min_rx_ms == 0 {
            return Err(DecodeError::ZeroInterval("required min rx interval"));
        }
        Ok(p)
    }
}

/// Local parameters of a session.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionConfig {
    /// How often we would like to send, in milliseconds.
    pub desired_min_tx_ms: u32,
    /// The fastest rate at which we accept packets, in milliseconds.
    pub required_min_rx_ms: u32,
    /// Packets the peer may miss before we declare it down.
    pub detect_multiplier: u8,
}

/// The default probe interval: with [`DEFAULT_DETECT_MULTIPLIER`], a dead
/// peer is seen within 200 ms, which keeps the default failover gap under
/// 300 ms. The failover benchmark's `gateway-under-load` runs (every CPU
/// busy, a saturating flow through the gateway) found no false failover at
/// this setting; docs/failover.md has the trade-off.
pub const DEFAULT_PROBE_INTERVAL_MS: u32 = 50;
/// Probes missed in a row before a peer is down, by default: four rather
/// than BFD's usual three, so one late answer and two lost ones are not a
/// failure.
pub const DEFAULT_DETECT_MULTIPLIER: u8 = 4;

impl Default for SessionConfig {
    fn default() -> Self {
        Self {
            desired_min_tx_ms: DEFAULT_PROBE_INTERVAL_MS,
            required_min_rx_ms: DEFAULT_PROBE_INTERVAL_MS,
            detect_multiplier: DEFAULT_DETECT_MULTIPLIER,
        }
    }
}

/// A session configuration that cannot work.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum ConfigError {
    #[error("probe {0} must be at least 1 ms")]
    ZeroInterval(&'static str),
    #[error("probe detect multiplier must be at least 1")]
    ZeroMultiplier,
}

impl SessionConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.desired_min_tx_ms == 0 {
            return Err(ConfigError::ZeroInterval("tx interval"));
        }
        if self.required_min_rx_ms == 0 {
            return Err(ConfigError::ZeroInterval("rx interval"));
        }
        if self.detect_multiplier == 0 {
            return Err(ConfigError::ZeroMultiplier);
        }
        Ok(())
    }
}

/// Why a session left Up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DownReason {
    /// No packet from the peer within the detection time: the peer or the
    /// path is dead.
    DetectTimeExpired,
    /// The peer says its session is Down: it stopped hearing us.
    NeighborSignaledDown,
    /// The peer took its session down on purpose (shutdown, maintenance).
    NeighborAdminDown,
    /// We took the session down on purpose.
    AdminDown,
}

/// What a session reports to its owner.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SessionEvent {
    SessionUp,
    SessionDown { reason: DownReason },
}

/// A received packet the session did not accept.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum PacketRejected {
    #[error("session is administratively down")]
    LocalAdminDown,
    #[error("your discriminator {got} is not ours ({ours})")]
    WrongDiscriminator { ours: u32, got: u32 },
    #[error("peer claims state {0:?} without knowing our discriminator")]
    MissingDiscriminator(SessionState),
}

/// One probe session with one peer.
#[derive(Clone, Debug)]
pub struct Session {
    config: SessionConfig,
    state: SessionState,
    diag: Diagnostic,
    local_discriminator: u32,
    remote_discriminator: u32,
    /// The peer's last advertised parameters (None before its first packet).
    remote: Option<RemoteParams>,
    detect_deadline: Option<Instant>,
    next_tx: Instant,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct RemoteParams {
    desired_min_tx_ms: u32,
    required_min_rx_ms: u32,
    detect_multiplier: u8,
}

impl Session {
    /// A new session in state Down that sends its first packet at `now`.
    /// `local_discriminator` must be non-zero and unique among the caller's
    /// sessions.
    pub fn new(config: SessionConfig, local_discriminator: u32, now: Instant) -> Self {
        debug_assert!(local_discriminator != 0);
        Self {
            config,
            state: SessionState::Down,
            diag: Diagnostic::None,
            local_discriminator,
            remote_discriminator: 0,
            remote: None,
            detect_deadline: None,
            next_tx: now,
        }
    }

    pub fn state(&self) -> SessionState {
        self.state
    }

    pub fn local_discriminator(&self) -> u32 {
        self.local_discriminator
    }

    /// 0 until the peer's first accepted packet, and again after a detection
    /// timeout.
    pub fn remote_discriminator(&self) -> u32 {
        self.remote_discriminator
    }

    pub fn config(&self) -> SessionConfig {
        self.config
    }

    /// How long the peer may stay silent: the peer's multiplier times the
    /// slower of its tx interval and our rx interval (RFC 5880 6.8.4).
    pub fn detection_time(&self) -> Option<Duration> {
        let r = self.remote?;
        let interval = r.desired_min_tx_ms.max(self.config.required_min_rx_ms);
        Some(Duration::from_millis(
            u64::from(interval) * u64::from(r.detect_multiplier),
        ))
    }

    /// Our interval between packets before jitter: the slower of what we want
    /// and what the peer accepts.
    pub fn tx_interval(&self) -> Duration {
        let peer_rx = self.remote.map_or(0, |r| r.required_min_rx_ms);
        Duration::from_millis(u64::from(self.config.desired_min_tx_ms.max(peer_rx)))
    }

    /// The earliest instant at which [`Session::on_timer`] or
    /// [`Session::packet_to_send`] has something to do.
    pub fn next_deadline(&self) -> Instant {
        match self.detect_deadline {
            Some(d) => d.min(self.next_tx),
            None => self.next_tx,
        }
    }

    /// Applies a received packet (RFC 5880 6.8.6, simplified).
    pub fn on_packet(
        &mut self,
        now: Instant,
        pkt: &Packet,
    ) -> Result<Option<SessionEvent>, PacketRejected> {
        if pkt.your_discriminator != 0 && pkt.your_discriminator != self.local_discriminator {
            return Err(PacketRejected::WrongDiscriminator {
                ours: self.local_discriminator,
                got: pkt.your_discriminator,
            });
        }
        if pkt.your_discriminator == 0
            && !matches!(pkt.state, SessionState::Down | SessionState::AdminDown)
        {
            return Err(PacketRejected::MissingDiscriminator(pkt.state));
        }
        if self.state == SessionState::AdminDown {
            return Err(PacketRejected::LocalAdminDown);
        }
        self.remote_discriminator = pkt.my_discriminator;
        // Without a poll sequence, changed parameters apply from the next
        // packet on.
        self.remote = Some(RemoteParams {
            desired_min_tx_ms: pkt.desired_min_tx_ms,
            required_min_rx_ms: pkt.required_min_rx_ms,
            detect_multiplier: pkt.detect_multiplier,
        });

        let before = self.state;
        let event = match (self.state, pkt.state) {
            (
                SessionState::Down | SessionState::Init | SessionState::Up,
                SessionState::AdminDown,
            ) => {
                self.go_down(now, Diagnostic::NeighborSignaledDown);
                (before == SessionState::Up).then_some(SessionEvent::SessionDown {
                    reason: DownReason::NeighborAdminDown,
                })
            }
            (SessionState::Down, SessionState::Down) => {
                self.state = SessionState::Init;
                None
            }
            (SessionState::Down | SessionState::Init, SessionState::Init | SessionState::Up) => {
                if before == SessionState::Down && pkt.state == SessionState::Up {
                    // A peer that is Up while we are Down has not noticed our
                    // restart yet; it will go Down on our next packet.
                    None
                } else {
                    self.state = SessionState::Up;
                    self.diag = Diagnostic::None;
                    Some(SessionEvent::SessionUp)
                }
            }
            (SessionState::Up, SessionState::Down) => {
                self.go_down(now, Diagnostic::NeighborSignaledDown);
                Some(SessionEvent::SessionDown {
                    reason: DownReason::NeighborSignaledDown,
                })
            }
            _ => None,
        };
        if self.state != before {
            // Tell the peer about our new state at once: it speeds up the
            // handshake and the peer's view of a failure.
            self.next_tx = now;
        }
        if matches!(self.state, SessionState::Init | SessionState::Up) {
            self.detect_deadline = self.detection_time().map(|d| now + d);
        }
        Ok(event)
    }

    /// Fires the detection timer if it has expired.
    pub fn on_timer(&mut self, now: Instant) -> Option<SessionEvent> {
        let deadline = self.detect_deadline?;
        if now < deadline {
            return None;
        }
        let before = self.state;
        self.go_down(now, Diagnostic::DetectTimeExpired);
        self.remote_discriminator = 0;
        (before == SessionState::Up).then_some(SessionEvent::SessionDown {
            reason: DownReason::DetectTimeExpired,
        })
    }

    /// The packet to send now, if one is due, and schedules the next one.
    /// `random` is any random number: it picks the jitter, which keeps peers
    /// from sending in lockstep (the interval shrinks by 0-25 %, or by 10-25 %
    /// with a multiplier of 1, as RFC 5880 6.8.7 asks).
    pub fn packet_to_send(&mut self, now: Instant, random: u32) -> Option<Packet> {
        if now < self.next_tx {
            return None;
        }
        let permille = if self.config.detect_multiplier == 1 {
            100 + random % 151
        } else {
            random % 251
        };
        let interval = self.tx_interval();
        self.next_tx = now + interval - interval * permille / 1000;
        Some(self.packet())
    }

    /// Takes the session down on purpose; the peer learns it from our next
    /// packet (sent at once) and does not count it as a failure.
    pub fn admin_down(&mut self, now: Instant) -> Option<SessionEvent> {
        let before = self.state;
        self.state = SessionState::AdminDown;
        self.diag = Diagnostic::AdminDown;
        self.detect_deadline = None;
        self.next_tx = now;
        (before == SessionState::Up).then_some(SessionEvent::SessionDown {
            reason: DownReason::AdminDown,
        })
    }

    /// Leaves AdminDown; the handshake starts again from Down.
    pub fn admin_up(&mut self, now: Instant) {
        if self.state == SessionState::AdminDown {
            self.state = SessionState::Down;
            self.remote_discriminator = 0;
            self.next_tx = now;
        }
    }

    fn go_down(&mut self, now: Instant, diag: Diagnostic) {
        self.state = SessionState::Down;
        self.diag = diag;
        self.detect_deadline = None;
        self.next_tx = now;
    }

    fn packet(&self) -> Packet {
        Packet {
            state: self.state,
            diag: self.diag,
            detect_multiplier: self.config.detect_multiplier,
            my_discriminator: self.local_discriminator,
            your_discriminator: self.remote_discriminator,
            desired_min_tx_ms: self.config.desired_min_tx_ms,
            required_min_rx_ms: self.config.required_min_rx_ms,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    fn cfg(tx: u32, rx: u32, mult: u8) -> SessionConfig {
        SessionConfig {
            desired_min_tx_ms: tx,
            required_min_rx_ms: rx,
            detect_multiplier: mult,
        }
    }

    /// Sends A's due packet to B and returns B's result.
    fn deliver(
        now: Instant,
        from: &mut Session,
        to: &mut Session,
    ) -> Result<Option<SessionEvent>, PacketRejected> {
        let pkt = from.packet_to_send(now, 0).expect("a packet is due");
        let wire = pkt.encode();
        to.on_packet(now, &Packet::decode(&wire).unwrap())
    }

    fn up_pair(t0: Instant) -> (Session, Session) {
        let mut a = Session::new(cfg(100, 100, 3), 11, t0);
        let mut b = Session::new(cfg(100, 100, 3), 22, t0);
        assert_eq!(deliver(t0, &mut a, &mut b), Ok(None)); // B: Down -> Init
        assert_eq!(b.state(), SessionState::Init);
        assert_eq!(
            deliver(t0, &mut b, &mut a),
            Ok(Some(SessionEvent::SessionUp))
        ); // A: Down -> Up on Init
        assert_eq!(
            deliver(t0, &mut a, &mut b),
            Ok(Some(SessionEvent::SessionUp))
        ); // B: Init -> Up on Up
        assert_eq!((a.state(), b.state()), (SessionState::Up, SessionState::Up));
        (a, b)
    }

    fn sample() -> Packet {
        Packet {
            state: SessionState::Up,
            diag: Diagnostic::None,
            detect_multiplier: 3,
            my_discriminator: 0x0102_0304,
            your_discriminator: 0x0a0b_0c0d,
            desired_min_tx_ms: 100,
            required_min_rx_ms: 250,
        }
    }

    #[test]
    fn codec_round_trip_and_layout() {
        let p = sample();
        let b = p.encode();
        assert_eq!(b.len(), PACKET_LEN);
        assert_eq!(&b[0..8], &[b'E', b'G', 1, 3, 0, 3, 0, 0]);
        assert_eq!(&b[8..12], &[1, 2, 3, 4]);
        assert_eq!(&b[20..24], &250u32.to_be_bytes());
        assert_eq!(Packet::decode(&b), Ok(p));
    }

    #[test]
    fn codec_rejects_malformed_input() {
        let good = sample().encode();
        let with = |at: usize, v: u8| {
            let mut b = good;
            b[at] = v;
            Packet::decode(&b)
        };
        assert_eq!(
            Packet::decode(&good[..23]),
            Err(DecodeError::WrongLength(23))
        );
        assert_eq!(Packet::decode(&[]), Err(DecodeError::WrongLength(0)));
        let mut long = good.to_vec();
        long.push(0);
        assert_eq!(Packet::decode(&long), Err(DecodeError::WrongLength(25)));
        assert_eq!(with(0, b'X'), Err(DecodeError::BadMagic([b'X', b'G'])));
        assert_eq!(with(2, 2), Err(DecodeError::UnsupportedVersion(2)));
        assert_eq!(with(3, 4), Err(DecodeError::UnknownState(4)));
        assert_eq!(with(4, 2), Err(DecodeError::UnknownDiagnostic(2)));
        assert_eq!(with(5, 0), Err(DecodeError::ZeroMultiplier));
        assert_eq!(with(7, 1), Err(DecodeError::NonZeroReserved));
        let mut b = good;
        b[8..12].fill(0);
        assert_eq!(Packet::decode(&b), Err(DecodeError::ZeroMyDiscriminator));
        let mut b = good;
        b[16..20].fill(0);
        assert!(matches!(
            Packet::decode(&b),
            Err(DecodeError::ZeroInterval(_))
        ));
        let mut b = good;
        b[20..24].fill(0);
        assert!(matches!(
            Packet::decode(&b),
            Err(DecodeError::ZeroInterval(_))
        ));
    }

    #[test]
    fn codec_never_panics_on_noise() {
        // A small deterministic generator covers every length up to 40 bytes
        // and, at length 24, inputs that pass the magic and version checks.
        let mut x: u32 = 0x9e37_79b9;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x
        };
        let mut accepted = 0;
        for i in 0..20_000 {
            let len = if i % 2 == 0 {
                PACKET_LEN
            } else {
                (next() % 41) as usize
            };
            let mut buf: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            if len == PACKET_LEN && i % 4 == 0 {
                buf[0..3].copy_from_slice(&[b'E', b'G', 1]);
                buf[3] %= 4;
                buf[4] = [0, 1, 3, 7][(buf[4] % 4) as usize];
                buf[6] = 0;
                buf[7] = 0;
            }
            if let Ok(p) = Packet::decode(&buf) {
                accepted += 1;
                assert_eq!(p.encode().as_slice(), buf.as_slice());
            }
        }
        assert!(accepted > 0, "the generator never produced a valid packet");
    }

    #[test]
    fn three_way_handshake() {
        let t0 = Instant::now();
        let (a, b) = up_pair(t0);
        assert_eq!(a.remote_discriminator(), 22);
        assert_eq!(b.remote_discriminator(), 11);
    }

    #[test]
    fn down_does_not_jump_to_up_on_a_stale_up() {
        // A restarted peer (Down) hears the old session's Up: it must not
        // come Up without a handshake.
        let t0 = Instant::now();
        let mut s = Session::new(cfg(100, 100, 3), 1, t0);
        let stale = Packet {
            your_discriminator: 1,
            ..sample()
        };
        assert_eq!(s.on_packet(t0, &stale), Ok(None));
        assert_eq!(s.state(), SessionState::Down);
    }

    #[test]
    fn detection_time_uses_remote_multiplier_and_slower_interval() {
        let t0 = Instant::now();
        let mut a = Session::new(cfg(100, 100, 3), 1, t0);
        assert_eq!(a.detection_time(), None);
        let from_b = |tx, mult| Packet {
            state: SessionState::Down,
            diag: Diagnostic::None,
            detect_multiplier: mult,
            my_discriminator: 2,
            your_discriminator: 0,
            desired_min_tx_ms: tx,
            required_min_rx_ms: 100,
        };
        a.on_packet(t0, &from_b(300, 5)).unwrap();
        assert_eq!(a.detection_time(), Some(ms(1500))); // remote tx 300 > our rx 100
        a.on_packet(t0, &from_b(50, 4)).unwrap();
        assert_eq!(a.detection_time(), Some(ms(400))); // our rx 100 > remote tx 50
    }

    #[test]
    fn detect_timer_expiry_takes_session_down() {
        let t0 = Instant::now();
        let (mut a, _b) = up_pair(t0);
        let deadline = t0 + ms(300);
        assert_eq!(a.next_deadline().min(deadline), a.next_deadline());
        assert_eq!(a.on_timer(deadline - ms(1)), None);
        assert_eq!(a.state(), SessionState::Up);
        assert_eq!(
            a.on_timer(deadline),
            Some(SessionEvent::SessionDown {
                reason: DownReason::DetectTimeExpired
            })
        );
        assert_eq!(a.state(), SessionState::Down);
        assert_eq!(a.remote_discriminator(), 0);
        let sent = a.packet_to_send(deadline, 0).unwrap();
        assert_eq!(
            (sent.state, sent.diag),
            (SessionState::Down, Diagnostic::DetectTimeExpired)
        );
        // Only once.
        assert_eq!(a.on_timer(deadline + ms(1000)), None);
    }

    #[test]
    fn packets_restart_the_detect_timer() {
        let t0 = Instant::now();
        let (mut a, mut b) = up_pair(t0);
        let t1 = t0 + ms(250);
        deliver(t1, &mut b, &mut a).unwrap();
        assert_eq!(a.on_timer(t0 + ms(300)), None);
        assert_eq!(a.on_timer(t1 + ms(299)), None);
        assert!(a.on_timer(t1 + ms(300)).is_some());
    }

    #[test]
    fn init_that_times_out_goes_down_without_an_event() {
        let t0 = Instant::now();
        let mut a = Session::new(cfg(100, 100, 3), 1, t0);
        let mut b = Session::new(cfg(100, 100, 3), 2, t0);
        deliver(t0, &mut a, &mut b).unwrap();
        assert_eq!(b.state(), SessionState::Init);
        assert_eq!(b.on_timer(t0 + ms(300)), None);
        assert_eq!(b.state(), SessionState::Down);
    }

    #[test]
    fn neighbor_signaled_down() {
        let t0 = Instant::now();
        let (mut a, mut b) = up_pair(t0);
        // B lost A (detect timeout on B's side); B's Down reaches A.
        b.on_timer(t0 + ms(300));
        assert_eq!(
            deliver(t0 + ms(300), &mut b, &mut a),
            Ok(Some(SessionEvent::SessionDown {
                reason: DownReason::NeighborSignaledDown
            }))
        );
        assert_eq!(a.state(), SessionState::Down);
    }

    #[test]
    fn neighbor_admin_down_is_reported_as_such() {
        let t0 = Instant::now();
        let (mut a, mut b) = up_pair(t0);
        assert_eq!(
            b.admin_down(t0),
            Some(SessionEvent::SessionDown {
                reason: DownReason::AdminDown
            })
        );
        assert_eq!(
            deliver(t0, &mut b, &mut a),
            Ok(Some(SessionEvent::SessionDown {
                reason: DownReason::NeighborAdminDown
            }))
        );
        assert_eq!(a.state(), SessionState::Down);
        assert_eq!(a.next_deadline(), t0, "A reports its new state at once");
    }

    #[test]
    fn admin_down_rejects_packets_and_admin_up_restarts_handshake() {
        let t0 = Instant::now();
        let (mut a, mut b) = up_pair(t0);
        a.admin_down(t0);
        let pkt = b.packet_to_send(t0, 0).unwrap();
        assert_eq!(a.on_packet(t0, &pkt), Err(PacketRejected::LocalAdminDown));
        assert_eq!(
            a.packet_to_send(t0, 0).unwrap().state,
            SessionState::AdminDown
        );
        a.admin_up(t0);
        assert_eq!(a.state(), SessionState::Down);
        assert_eq!(a.remote_discriminator(), 0);
    }

    #[test]
    fn discriminator_checks() {
        let t0 = Instant::now();
        let mut a = Session::new(cfg(100, 100, 3), 7, t0);
        let wrong = Packet {
            your_discriminator: 8,
            ..sample()
        };
        assert_eq!(
            a.on_packet(t0, &wrong),
            Err(PacketRejected::WrongDiscriminator { ours: 7, got: 8 })
        );
        let anonymous_up = Packet {
            your_discriminator: 0,
            ..sample()
        };
        assert_eq!(
            a.on_packet(t0, &anonymous_up),
            Err(PacketRejected::MissingDiscriminator(SessionState::Up))
        );
        assert_eq!(a.state(), SessionState::Down);
        assert_eq!(
            a.remote_discriminator(),
            0,
            "a rejected packet changes nothing"
        );
    }

    #[test]
    fn tx_interval_is_the_slower_of_ours_and_peer_rx() {
        let t0 = Instant::now();
        let mut a = Session::new(cfg(100, 100, 3), 1, t0);
        assert_eq!(a.tx_interval(), ms(100));
        let slow_rx = Packet {
            state: SessionState::Down,
            your_discriminator: 0,
            required_min_rx_ms: 400,
            ..sample()
        };
        a.on_packet(t0, &slow_rx).unwrap();
        assert_eq!(a.tx_interval(), ms(400));
    }

    #[test]
    fn jitter_stays_within_rfc_bounds() {
        let t0 = Instant::now();
        for (mult, lo, hi) in [(3u8, 75, 100), (1u8, 75, 90)] {
            let mut s = Session::new(cfg(1000, 1000, mult), 1, t0);
            let mut seen = (u64::MAX, 0);
            let mut now = t0;
            for random in [0u32, 1, 50, 100, 150, 250, 251, 999, u32::MAX] {
                s.packet_to_send(now, random).unwrap();
                let gap = (s.next_deadline() - now).as_millis() as u64;
                assert!(
                    (lo * 10..=hi * 10).contains(&gap),
                    "mult {mult}: gap {gap} ms"
                );
                seen = (seen.0.min(gap), seen.1.max(gap));
                assert_eq!(
                    s.packet_to_send(now + ms(gap - 1), random),
                    None,
                    "not due yet"
                );
                now += ms(gap);
            }
            assert_eq!(
                seen,
                (lo * 10, hi * 10),
                "mult {mult}: both bounds reachable"
            );
        }
    }

    #[test]
    fn next_deadline_is_the_earlier_timer() {
        let t0 = Instant::now();
        let mut a = Session::new(cfg(1000, 100, 3), 1, t0);
        let mut b = Session::new(cfg(50, 50, 2), 2, t0);
        deliver(t0, &mut b, &mut a).unwrap(); // A: Init, detect = 2 x max(100, 50) = 200 ms
        a.packet_to_send(t0, 0).unwrap(); // next tx in 1000 ms
        assert_eq!(a.next_deadline(), t0 + ms(200));
    }
}
