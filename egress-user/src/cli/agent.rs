//! `egress agent`: loads the datapath on this node and keeps it running.

use std::path::PathBuf;

use aya::programs::tc::TcAttachType;
use clap::Args;
use egress_common::maps::DEFAULT_PIN_DIR;

use crate::{datapath::Datapath, EBPF_OBJECT};

#[derive(Debug, Args)]
pub struct AgentArgs {
    /// bpffs folder where this node's maps are pinned.
    #[arg(long, default_value = DEFAULT_PIN_DIR, env = "EGRESS_PIN_DIR")]
    pub pin_dir: PathBuf,
    /// Count the packets entering these interfaces (tc_count probe).
    #[arg(long = "count-iface")]
    pub count_ifaces: Vec<String>,
}

pub async fn run(args: AgentArgs) -> anyhow::Result<()> {
    let mut datapath = Datapath::load(EBPF_OBJECT, &args.pin_dir)?;
    for iface in &args.count_ifaces {
        datapath.attach_tc("tc_count", iface, TcAttachType::Ingress)?;
        tracing::info!(iface, "tc_count attached");
    }
    // A line on stdout that supervisors and tests wait for instead of sleeping.
    println!("ready pin_dir={}", args.pin_dir.display());
    shutdown_signal().await;
    tracing::info!("agent stopping; pinned maps stay for the next start");
    Ok(())
}

/// Resolves on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("installing SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
