//! `egress inspect`: prints what the pinned maps of this node hold.

use std::path::PathBuf;

use clap::Args;
use egress_common::maps::DEFAULT_PIN_DIR;

use crate::datapath::stats::read_iface_stats;

#[derive(Debug, Args)]
pub struct InspectArgs {
    /// bpffs folder where this node's maps are pinned.
    #[arg(long, default_value = DEFAULT_PIN_DIR, env = "EGRESS_PIN_DIR")]
    pub pin_dir: PathBuf,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: InspectArgs) -> anyhow::Result<()> {
    let stats = read_iface_stats(&args.pin_dir)?;
    if args.json {
        println!(
            "{}",
            serde_json::json!({ "iface_stats": { "packets": stats.packets, "bytes": stats.bytes } })
        );
    } else {
        println!("{:<12} {:>12} {:>14}", "MAP", "PACKETS", "BYTES");
        println!(
            "{:<12} {:>12} {:>14}",
            "iface_stats", stats.packets, stats.bytes
        );
    }
    Ok(())
}
