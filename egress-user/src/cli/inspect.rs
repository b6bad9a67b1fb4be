//! `egress inspect`: prints what the pinned maps of this node hold.

use std::path::PathBuf;

use clap::Args;
use egress_common::maps::DEFAULT_PIN_DIR;

use crate::datapath::stats::{datapath_snapshot, read_iface_stats};

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
    let dp = datapath_snapshot(&args.pin_dir)?;
    if args.json {
        let mut v = serde_json::json!({ "iface_stats": { "packets": stats.packets, "bytes": stats.bytes } });
        v["datapath"] = dp;
        println!("{v}");
        return Ok(());
    }
    println!("{:<12} {:>12} {:>14}", "MAP", "PACKETS", "BYTES");
    println!(
        "{:<12} {:>12} {:>14}",
        "iface_stats", stats.packets, stats.bytes
    );
    print_datapath(&dp);
    Ok(())
}

/// The datapath maps as readable tables.
fn print_datapath(dp: &serde_json::Value) {
    let s = |v: &serde_json::Value| match v {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    if let Some(c) = dp.get("config") {
        println!("\nCONFIG");
        if let Some(o) = c.as_object() {
            for (k, v) in o {
                println!("  {k:<16} {}", s(v));
            }
        }
    }
    let table = |title: &str, key: &str, cols: &[&str]| {
        let Some(rows) = dp.get(key).and_then(|v| v.as_array()) else {
            return;
        };
        println!("\n{title} ({})", rows.len());
        println!(
            "  {}",
            cols.iter()
                .map(|c| format!("{:<22}", c.to_uppercase()))
                .collect::<String>()
        );
        for r in rows {
            println!(
                "  {}",
                cols.iter()
                    .map(|c| format!("{:<22}", s(&r[*c])))
                    .collect::<String>()
            );
        }
    };
    table(
        "POLICY TARGETS",
        "policy_targets",
        &["slot", "policy_id", "eip_v4", "eip_v6", "gateway_tunnel_ip"],
    );
    table("POLICY SOURCES", "policy_sources", &["source", "slots"]);
    table("PORT BLOCKS", "port_blocks", &["eip", "blocks"]);
    table(
        "REPLY STEERING",
        "reply_steering",
        &["eip", "block", "worker_tunnel_ip", "flags"],
    );
    table("OWNED EIPS", "owned_eips", &["eip", "flags", "epoch"]);
    match dp.get("announce_lease_ms") {
        Some(serde_json::Value::Null) => println!("  announce lease: no limit"),
        Some(v) if v.as_i64().is_some_and(|ms| ms < 0) => println!(
            "  announce lease: EXPIRED {} ms ago (ARP/NDP for owned EIPs not answered; agent down or fenced?)",
            -v.as_i64().unwrap_or(0)
        ),
        Some(v) => println!("  announce lease: {} ms left", s(v)),
        None => {}
    }
    table("ROUTES (BGP)", "routes", &["eip", "tunnel_ip", "epoch"]);
    table("NAT USE", "nat_use", &["eip", "entries", "ports_in_use"]);
    if let Some(p) = dp.get("policy_stats").and_then(|v| v.as_object()) {
        println!("\nPOLICY COUNTERS");
        println!(
            "  {:<10} {:>12} {:>14} {:>12} {:>14}",
            "POLICY", "EGRESS_PKTS", "EGRESS_BYTES", "REPLY_PKTS", "REPLY_BYTES"
        );
        for (id, c) in p {
            println!(
                "  {:<10} {:>12} {:>14} {:>12} {:>14}",
                id,
                s(&c["egress_packets"]),
                s(&c["egress_bytes"]),
                s(&c["reply_packets"]),
                s(&c["reply_bytes"])
            );
        }
    }
    if let Some(d) = dp.get("drops").and_then(|v| v.as_object()) {
        println!("\nDROPS");
        for (reason, c) in d {
            println!(
                "  {:<16} {:>12} {:>14}",
                reason,
                s(&c["packets"]),
                s(&c["bytes"])
            );
        }
    }
}
