//! `cargo xtask bench control-plane` (issues 4 and 16): 100 nodes / 10,000
//! pods / 1,000 policies and 1,000 nodes / 50,000 pods / 5,000 policies on
//! a real etcd, side by side. The work is done by the `bench_control_plane`
//! example of egress-control (driver, controller, simulated agents and one
//! real agent with its datapath, as separate processes, so each one's peak
//! memory and CPU are known); this builds the agent, runs the example in
//! release mode, relays its output and checks the figures are all there.
//! Needs root (namespaces, BPF), like the other benchmarks of the datapath.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

/// Keys the last line must carry.
const KEYS: &[&str] = &[
    "cold_start_s",
    "change_p50_ms",
    "change_p99_ms",
    "new_pod_grant_p99_ms",
    "controller_peak_mb",
    "agent_peak_mb",
    "controller_cpu_per_change_ms",
    "agent_cpu_per_own_change_ms",
    "agent_cpu_per_other_change_ms",
    "large_nodes",
    "large_pods",
    "large_policies",
    "large_cold_start_s",
    "large_change_p99_ms",
    "large_new_pod_grant_p99_ms",
    "agent_cpu_per_change_ratio",
    "pass_full_ms",
    "pass_kept_ms",
    "large_pass_full_ms",
    "large_pass_kept_ms",
    "agent_idle_cpu_ms_per_s",
    "large_agent_idle_cpu_ms_per_s",
];

pub fn run(root: &Path) -> Result<()> {
    crate::e2e::require_root()?;
    // The measured agent is the release `egress`, with the eBPF object in it.
    crate::build_ebpf::build(root, true)?;
    crate::shell::step("build egress (release)");
    crate::shell::build_binaries(root, true)?;
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
