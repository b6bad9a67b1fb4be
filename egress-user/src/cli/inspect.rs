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
    /// The node agent's admin endpoint, asked for the names of the policy
    /// ids the maps hold (the maps have ids only).
    #[arg(long, env = "EGRESS_ADMIN_ADDR", default_value = "127.0.0.1:9465")]
    pub admin_addr: std::net::SocketAddr,
}

/// Policy id -> `kind/namespace/name`, from the agent's `/state`; None
/// when the agent does not answer.
fn policy_names(addr: std::net::SocketAddr) -> Option<serde_json::Map<String, serde_json::Value>> {
    use std::io::{Read, Write};
    let timeout = std::time::Duration::from_secs(1);
    let mut s = std::net::TcpStream::connect_timeout(&addr, timeout).ok()?;
    s.set_read_timeout(Some(timeout)).ok()?;
    s.write_all(b"GET /state HTTP/1.1\r\nconnection: close\r\n\r\n")
        .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let (_, body) = out.split_once("\r\n\r\n")?;
    let v: serde_json::Value = serde_json::from_str(body).ok()?;
    v.get("policy_names")?.as_object().cloned()
}

pub fn run(args: InspectArgs) -> anyhow::Result<()> {
    let stats = read_iface_stats(&args.pin_dir)?;
    let mut dp = datapath_snapshot(&args.pin_dir)?;
    let names = policy_names(args.admin_addr);
    name_policies(&mut dp, names.as_ref());
    if names.is_none() && !args.json {
        println!(
            "(policy names: the agent at {} did not answer; ids only)",
            args.admin_addr
        );
    }
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

/// Adds each policy's name beside its id (targets and counters).
fn name_policies(
    dp: &mut serde_json::Value,
    names: Option<&serde_json::Map<String, serde_json::Value>>,
) {
    let name_of = |id: &serde_json::Value| -> serde_json::Value {
        let key = match id {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        names
            .and_then(|n| n.get(&key).cloned())
            .unwrap_or_else(|| "?".into())
    };
    if let Some(rows) = dp.get_mut("policy_targets").and_then(|v| v.as_array_mut()) {
        for r in rows {
            let name = name_of(&r["policy_id"]);
            r["policy"] = name;
        }
    }
    if let Some(stats) = dp.get_mut("policy_stats").and_then(|v| v.as_object_mut()) {
        for (id, c) in stats.iter_mut() {
            c["policy"] = name_of(&serde_json::Value::String(id.clone()));
        }
    }
}

/// The datapath maps as readable tables.
fn print_datapath(dp: &serde_json::Value) {
    print_config(dp);
    print_table(
        dp,
        "POLICY TARGETS",
        "policy_targets",
        &[
            "slot",
            "policy",
            "policy_id",
            "eip_v4",
            "eip_v6",
            "gateway_tunnel_ip",
        ],
    );
    print_table(dp, "POLICY SOURCES", "policy_sources", &["source", "slots"]);
    print_table(
        dp,
        "POLICY DESTINATIONS",
        "policy_destinations",
        &["destination", "slots", "excluded", "cluster"],
    );
    print_table(dp, "PORT BLOCKS", "port_blocks", &["eip", "blocks"]);
    print_table(
        dp,
        "REPLY STEERING",
        "reply_steering",
        &["eip", "block", "worker_tunnel_ip", "flags"],
    );
    print_table(dp, "OWNED EIPS", "owned_eips", &["eip", "flags", "epoch"]);
    print_announce_lease(dp);
    print_table(dp, "ROUTES (BGP)", "routes", &["eip", "tunnel_ip", "epoch"]);
    print_table(
        dp,
        "NAT USE",
        "nat_use",
        &["eip", "entries", "ports_in_use"],
    );
    print_policy_counters(dp);
    print_nat_events(dp);
    print_packets_and_bytes(dp, "DROPS", "drops");
    print_packets_and_bytes(dp, "SENT BY XDP", "xdp_tx");
}

/// A JSON value as a table cell: strings without their quotes.
fn cell(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The datapath configuration, one `key value` line each.
fn print_config(dp: &serde_json::Value) {
    let Some(c) = dp.get("config") else {
        return;
    };
    println!("\nCONFIG");
    if let Some(o) = c.as_object() {
        for (k, v) in o {
            println!("  {k:<16} {}", cell(v));
        }
    }
}

/// The rows of `dp[key]` under `title`, one column per field in `cols`
/// (nothing when the map was not pinned).
fn print_table(dp: &serde_json::Value, title: &str, key: &str, cols: &[&str]) {
    let Some(rows) = dp.get(key).and_then(|v| v.as_array()) else {
        return;
    };
    println!("\n{title} ({})", rows.len());
    // Each column as wide as its widest cell, two spaces between.
    let widths: Vec<usize> = cols
        .iter()
        .map(|c| {
            rows.iter()
                .map(|r| cell(&r[*c]).len())
                .chain([c.len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: Vec<String>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        println!("  {}", padded.join("  ").trim_end());
    };
    line(cols.iter().map(|c| c.to_uppercase()).collect());
    for r in rows {
        line(cols.iter().map(|c| cell(&r[*c])).collect());
    }
}

/// How long this node still answers ARP/NDP for its EIPs.
fn print_announce_lease(dp: &serde_json::Value) {
    match dp.get("announce_lease_ms") {
        Some(serde_json::Value::Null) => println!("  announce lease: no limit"),
        Some(v) if v.as_i64().is_some_and(|ms| ms < 0) => println!(
            "  announce lease: EXPIRED {} ms ago (ARP/NDP for owned EIPs not answered; agent down or fenced?)",
            -v.as_i64().unwrap_or(0)
        ),
        Some(v) => println!("  announce lease: {} ms left", cell(v)),
        None => {}
    }
}

/// Packets and bytes per policy and direction.
fn print_policy_counters(dp: &serde_json::Value) {
    let Some(p) = dp.get("policy_stats").and_then(|v| v.as_object()) else {
        return;
    };
    println!("\nPOLICY COUNTERS");
    println!(
        "  {:<40} {:<10} {:>12} {:>14} {:>12} {:>14}",
        "POLICY", "ID", "EGRESS_PKTS", "EGRESS_BYTES", "REPLY_PKTS", "REPLY_BYTES"
    );
    for (id, c) in p {
        println!(
            "  {:<40} {:<10} {:>12} {:>14} {:>12} {:>14}",
            cell(&c["policy"]),
            id,
            cell(&c["egress_packets"]),
            cell(&c["egress_bytes"]),
            cell(&c["reply_packets"]),
            cell(&c["reply_bytes"])
        );
    }
}

/// The NAT event counters.
fn print_nat_events(dp: &serde_json::Value) {
    let Some(e) = dp.get("nat_events").and_then(|v| v.as_object()) else {
        return;
    };
    println!("\nNAT EVENTS");
    for (event, n) in e {
        println!("  {event:<20} {:>12}", cell(n));
    }
}

/// Packets and bytes by name: the drops by reason, what XDP sent by path.
fn print_packets_and_bytes(dp: &serde_json::Value, title: &str, key: &str) {
    let Some(d) = dp.get(key).and_then(|v| v.as_object()) else {
        return;
    };
    println!("\n{title}");
    for (reason, c) in d {
        println!(
            "  {:<20} {:>12} {:>14}",
            reason,
            cell(&c["packets"]),
            cell(&c["bytes"])
        );
    }
}
