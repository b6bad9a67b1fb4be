//! The controller: pure reconcile functions over plain data, and the thin
//! leader-elected loop that runs them against a datastore.

mod cache;
mod capacity;
mod conditions;
mod config;
mod dirty;
mod gateway_grants;
mod gateway_pass;
pub mod grants;
mod heartbeat;
mod plan;
pub mod ports;
mod reconcile;
pub(crate) mod run;
mod spread;
mod stale;
mod unit;
mod workers;

// The view types live outside the controller (agents read them too).
pub use crate::view::{ClusterView, PolicyIndex, PolicyView};
pub use cache::{sizes, Changed, Pending, ViewCache};
pub use config::{
    whole_blocks, ControllerConfig, DEFAULT_MAX_PORTS_PER_NODE, DEFAULT_NODE_IP_PORTS,
    DEFAULT_PORT_BLOCK_SIZE,
};
pub use egress_failover::monitor::{HeartbeatMonitor, PhaseChange};
pub use plan::{EipMove, FailoverReason, Plan, TunnelGrants};
pub use reconcile::{reconcile, reconcile_with, ReconcileMemo};
pub use run::{
    gateway_eligible, run_controller, run_controller_with_stats, tick_cached_report, write_plan,
    write_plan_stored, LoopStats, RunConfig, TickReport, ELECTION, MANAGER, PORT_BLOCK_MANAGER,
};
pub use stale::StaleTunnels;

#[cfg(test)]
mod partial_tests;
#[cfg(test)]
mod spread_tests;
#[cfg(test)]
mod takeover_tests;
#[cfg(test)]
pub(crate) mod tests;
