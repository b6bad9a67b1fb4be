//! `cargo xtask e2e NAME`: one failover scenario of issue 5 (or `all`) in
//! network namespaces, with the real binaries. The scenarios live in
//! `egress_tests::scenarios`; this builds the binaries and runs one.

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use egress_tests::scenarios::{run_and_report, Bins, Options, LOAD_SCENARIOS, SCENARIOS};

use crate::shell::step;

/// Builds `egress` and `egress-traffic` (debug profile) and returns them.
pub fn build_bins(root: &Path) -> Result<Bins> {
    // The binary embeds the eBPF object: a stale one would not match the
    // userspace's maps (e.g. a map added since).
    crate::build_ebpf::build(root, true)?;
    step("build egress and egress-traffic");
    crate::shell::build_binaries(root, false)?;
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|t| if t.is_relative() { root.join(t) } else { t })
        .unwrap_or_else(|| root.join("target"));
    Bins::in_dir(&target.join("debug"))
}

pub fn require_root() -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the failover scenarios need root (namespaces, BPF)");
    }
    Ok(())
}

/// How `cargo xtask e2e` runs its scenarios.
pub struct Choices {
    /// The product's defaults (5 s / 5 s / 15 s, lease 15 s); otherwise the
    /// short timers of the e2e tests (250 ms / 250 ms / 1.5 s, lease 2 s).
    pub default_timers: bool,
    /// The datapath probes (interval ms, multiplier).
    pub probe: Option<(u64, u32)>,
    /// On the Kubernetes datastore.
    pub kubernetes: bool,
    /// On an IPv6-only underlay.
    pub ipv6_underlay: bool,
}

/// Runs scenario `name` (or every one with `all`) as `how` says.
pub fn run(root: &Path, name: &str, how: Choices) -> Result<()> {
    let names: Vec<&str> = match name {
        "all" => SCENARIOS.to_vec(),
        n if SCENARIOS.contains(&n) || LOAD_SCENARIOS.contains(&n) => vec![n],
        other => bail!(
            "unknown scenario {other:?}; one of: {}, {}, all",
            SCENARIOS.join(", "),
            LOAD_SCENARIOS.join(", ")
        ),
    };
    require_root()?;
    let bins = build_bins(root)?;
    let mut opts = if how.default_timers {
        Options::defaults()
    } else {
        Options::fast()
    };
    opts.timers.probe = how.probe;
    opts.kubernetes = how.kubernetes;
    opts.ipv6_underlay = how.ipv6_underlay;
    let mut failed = Vec::new();
    for n in names {
        step(&format!("scenario {n}"));
        if let Err(e) = run_and_report(&bins, n, &opts) {
            eprintln!("error: {e:#}");
            failed.push(n);
        }
    }
    if !failed.is_empty() {
        bail!("failed: {}", failed.join(", "));
    }
    Ok(())
}
