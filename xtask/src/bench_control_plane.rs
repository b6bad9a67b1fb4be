//! `cargo xtask bench control-plane` (issue 4): 1,000 policies, 10,000 pods,
//! 100 nodes on a real etcd. The work is done by the `bench_control_plane`
//! example of egress-control (driver, controller and simulated agents as
//! three processes, so each one's peak memory is known); this runs it in
//! release mode, relays its output and checks the figures are all there.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

/// Keys the last line must carry.
const KEYS: &[&str] = &[
    "cold_start_s",
    "change_p50_ms",
    "change_p99_ms",
    "controller_peak_mb",
    "agent_peak_mb",
];

pub fn run(root: &Path) -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut child = Command::new(cargo)
        .current_dir(root)
        .args([
            "run",
            "--release",
            "-p",
            "egress-control",
            "--example",
            "bench_control_plane",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .context("starting the control-plane benchmark")?;
    let mut last = String::new();
    for line in BufReader::new(child.stdout.take().expect("piped")).lines() {
        let line = line?;
        println!("{line}");
        if !line.trim().is_empty() {
            last = line;
        }
    }
    let status = child.wait()?;
    if !status.success() {
        bail!("the control-plane benchmark failed ({status})");
    }
    let v: serde_json::Value =
        serde_json::from_str(&last).with_context(|| format!("last line is not JSON: {last}"))?;
    for k in KEYS {
        if v.get(k).and_then(serde_json::Value::as_f64).is_none() {
            bail!("the benchmark's result lacks {k}: {last}");
        }
    }
    Ok(())
}
