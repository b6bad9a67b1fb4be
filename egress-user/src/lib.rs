//! Userspace of the egress gateway: the agent, controller and reflector
//! roles, and the operator tools, behind the one `egress` binary.

pub mod admin;
pub mod agent;
pub mod bgp_metrics;
pub mod cli;
pub mod controller_metrics;
pub mod controller_port_metrics;
pub mod controller_probes;
pub mod datapath;
pub mod node;
mod prom;
pub mod reflector_clients;
pub mod signals;

/// The eBPF object built by `cargo xtask build-ebpf`, embedded at compile time.
pub static EBPF_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/egress.bpf.o"));
