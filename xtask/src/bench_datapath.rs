//! `cargo xtask bench datapath`: builds the eBPF object, runs the datapath
//! benchmark (tests/tests/datapath_bench/, needs root) and prints its
//! output; the last line is one JSON object with every figure (those of
//! the IPv6 underlay under the same names prefixed `v6u_`, the gateway's
//! XDP-against-TC reply rate among them).

use std::{
    path::Path,
    process::{Command, Stdio},
};

use anyhow::{bail, Context, Result};

pub fn run(root: &Path) -> Result<()> {
    // The agent's object (the throughput runs) and the benchmark's (TestRun).
    crate::build_ebpf::build(root, true)?;
    crate::build_ebpf::build_bench(root)?;
    let out = Command::new("cargo")
        .current_dir(root)
        .args([
            "test",
            "-p",
            "egress-tests",
            "--test",
            "datapath_bench",
            "--",
            "--ignored",
            "--exact",
            "bench_datapath",
            "--nocapture",
            "--test-threads=1",
        ])
        .stderr(Stdio::inherit())
        .output()
        .context("running the datapath benchmark")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        print!("{stdout}");
        bail!(
            "the datapath benchmark failed ({}); it needs root",
            out.status
        );
    }
    // libtest may print "test bench_datapath ... " on the same line first.
    let json = stdout
        .lines()
        .rev()
        .filter_map(|l| l.find('{').map(|i| &l[i..]))
        .find(|l| serde_json::from_str::<serde_json::Value>(l).is_ok())
        .context("the benchmark printed no JSON line")?
        .to_string();
    for line in stdout.lines().filter(|l| !l.contains(json.as_str())) {
        let l = line.trim();
        if !l.is_empty() && l != "ok" && !l.starts_with("test ") && !l.starts_with("running ") {
            println!("{line}");
        }
    }
    println!("{json}");
    Ok(())
}
