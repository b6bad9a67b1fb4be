//! The controller: pure reconcile functions over plain data, and the thin
//! leader-elected loop that runs them against a datastore.

mod heartbeat;
mod reconcile;
pub(crate) mod run;
mod view;

pub use heartbeat::{HeartbeatMonitor, TimerConfig, TimerConfigError, TunnelChange};
pub use reconcile::{reconcile, ControllerConfig, Plan};
pub use run::{run_controller, write_plan, RunConfig};
pub use view::{ClusterView, PolicyView};

#[cfg(test)]
pub(crate) mod tests;
