//! Gateway failover building blocks that do not depend on the datapath.
//!
//! Everything here is pure (no I/O, time passed in as [`std::time::Instant`])
//! except [`prober`], the tokio task that runs probe sessions over UDP:
//!
//! - [`timers`]: the three heartbeat timers, their parsing and validation.
//! - [`probe`]: a BFD-style session state machine and its 24-byte packet.
//! - [`prober`]: one UDP socket, one [`probe::Session`] per peer (I/O edge).
//! - [`phase`]: the EgressTunnel phases (the API's `status.phase`).
//! - [`monitor`]: the controller's decision: tunnel phases and their events
//!   (the controller's reconcile then moves the EIPs of nodes not Ready).
//! - [`fence`]: the agent's decision: which EIPs it may announce right now.
//!
//! See `docs/failover.md` for how the pieces fit together.

pub mod fence;
pub mod monitor;
pub mod phase;
pub mod probe;
pub mod prober;
pub mod timers;

pub use fence::{Announcement, Assignment, Fence};
pub use monitor::{HeartbeatMonitor, PhaseChange, ProbeHealth, TunnelFacts};
pub use phase::TunnelPhase;
pub use probe::{Session, SessionConfig, SessionEvent, SessionState};
pub use prober::{ProbeEvent, Prober, ProberConfig, DEFAULT_PROBE_PORT};
pub use timers::FailoverTimers;
