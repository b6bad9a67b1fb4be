//! The controller: pure reconcile functions over plain data, and the thin
//! leader-elected loop that runs them against a datastore.

mod cache;
mod capacity;
pub mod grants;
mod heartbeat;
pub mod ports;
mod reconcile;
pub(crate) mod run;
mod stale;
mod view;

pub(crate) use cache::put_listed;
pub use cache::{sizes, Changed, Pending, ViewCache};
pub use heartbeat::{HeartbeatMonitor, TimerConfig, TimerConfigError, TunnelChange};
pub use reconcile::{
    reconcile, whole_blocks, ControllerConfig, EipMove, FailoverReason, Plan, TunnelGrants,
    DEFAULT_MAX_PORTS_PER_NODE, DEFAULT_NODE_IP_PORTS, DEFAULT_PORT_BLOCK_SIZE,
};
pub use run::{
    gateway_eligible, run_controller, run_controller_with_stats, tick, tick_cached,
    tick_cached_report, write_plan, write_plan_stored, LoopStats, RunConfig, TickReport, ELECTION,
    MANAGER, PORT_BLOCK_MANAGER,
};
pub use stale::StaleTunnels;
pub use view::{ClusterView, PolicyIndex, PolicyView};

#[cfg(test)]
pub(crate) mod tests;
