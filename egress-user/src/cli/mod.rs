//! The `egress` command line: one binary, a subcommand per role and tool.

pub mod agent;
pub mod apply;
pub mod bgp;
pub mod controller;
pub mod crd;
pub mod datastore;
pub mod delete;
pub mod get;
pub mod inspect;
pub mod pod;
pub mod reflector;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "egress",
    version,
    about = "eBPF egress gateway for Kubernetes with an embedded BGP route reflector"
)]
pub struct Cli {
    /// Log as JSON lines instead of text.
    #[arg(long, global = true, env = "EGRESS_LOG_JSON")]
    pub log_json: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the node agent: owns this node's BPF programs and maps.
    Agent(Box<agent::AgentArgs>),
    /// Run the controller: EIP allocation, gateway election, heartbeat monitoring.
    Controller(controller::ControllerArgs),
    /// Print the CRDs generated from the API types.
    Crd(crd::CrdArgs),
    /// Create or update objects from a YAML file (checked in full first).
    Apply(apply::ApplyArgs),
    /// List or show objects.
    Get(get::GetArgs),
    /// Delete an object.
    Delete(delete::DeleteArgs),
    /// Register pods (clusters without Kubernetes).
    #[command(subcommand)]
    Pod(pod::PodCommand),
    /// Run a standalone BGP route reflector.
    Reflector(reflector::ReflectorArgs),
    /// Look at a running BGP speaker.
    #[command(subcommand)]
    Bgp(bgp::BgpCommand),
    /// Decode the pinned maps of this node.
    Inspect(inspect::InspectArgs),
}

/// Sets up tracing; RUST_LOG picks the level (default info).
pub fn init_tracing(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colours only for a person at a terminal: a log file or a collector
    // gets plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}
