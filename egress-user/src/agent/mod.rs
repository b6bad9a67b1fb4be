//! The node agent: keeps this node's programs, maps, tunnel device and
//! announcements in step with the datastore.
//!
//! - [`adapt`]: pure mapping from the control plane's node view to the maps.
//! - [`register`]: the node's own records (node, EgressTunnel).
//! - [`node_ports`]: node-IP port blocks against the node's ephemeral ports.
//! - [`uplink_addr`]: the node addresses read from the uplink.
//! - [`pod_devices`]: pods the worker program cannot see (not behind a veth).
//! - `published`: what the admin endpoint shows of the agent.
//! - [`runtime`]: the loop that ties datastore, fence, netlink and maps together.

pub mod adapt;
pub mod bgp;
pub mod capacity;
mod event_loop;
pub mod metrics;
pub mod node_ports;
mod pass;
pub mod pod_devices;
mod pod_veths;
pub mod port_use;
mod published;
pub mod register;
pub mod routes;
pub mod runtime;
mod settings;
pub mod underlay;
pub mod uplink_addr;

pub use runtime::run;
pub use settings::AgentSettings;
