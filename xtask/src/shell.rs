//! Running commands with their output shown, and failing with the command line.

use std::{path::Path, process::Command};

use anyhow::{bail, Context, Result};

/// Runs `cmd` with inherited stdio; a non-zero exit is an error naming it.
pub fn exec(cmd: &mut Command) -> Result<()> {
    let shown = format!("{cmd:?}");
    let status = cmd.status().with_context(|| format!("starting {shown}"))?;
    if !status.success() {
        bail!("{shown} failed ({status})");
    }
    Ok(())
}

/// True when the command runs and exits 0 (its output is discarded).
pub fn succeeds(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// Stdout of a command that must succeed.
pub fn output(program: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("starting {program}"))?;
    if !out.status.success() {
        bail!(
            "{program} {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `cargo` with the given arguments, run in the workspace root.
pub fn cargo(root: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(root).args(args);
    cmd
}

/// Builds `egress` and `egress-traffic` in the debug or release profile.
/// The one build of them in xtask: the demo, the tests, the benchmarks and
/// the image all call it. The whole workspace is selected, as a plain
/// `cargo build [--release] --bin egress` in the root selects it, so the
/// features of shared dependencies come out the same in every one of them
/// and none redoes another's (or the user's own) work.
pub fn build_binaries(root: &Path, release: bool) -> Result<()> {
    let mut args = vec![
        "build",
        "--workspace",
        "--bin",
        "egress",
        "--bin",
        "egress-traffic",
    ];
    if release {
        args.push("--release");
    }
    exec(&mut cargo(root, &args))
}

/// Prints a step header so long tasks show where they are.
pub fn step(what: &str) {
    println!("\n==> {what}");
}
