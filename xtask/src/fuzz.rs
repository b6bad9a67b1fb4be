//! `cargo xtask fuzz`: the BGP codec's cargo-fuzz targets, each for a fixed
//! time from its checked-in seed corpus; a crash or a round-trip mismatch
//! (the targets assert) fails the task. `cargo xtask test` runs it for
//! [`CI_SECONDS`] per target.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

use crate::shell::step;

/// The targets under egress-user/bgp/fuzz/fuzz_targets.
const TARGETS: &[&str] = &["decode", "roundtrip"];

/// Seconds per target in `cargo xtask test`.
pub const CI_SECONDS: u64 = 60;

/// The largest BGP message (RFC 4271 4.1); longer inputs are not worth it.
const MAX_LEN: &str = "-max_len=4096";

pub fn run(root: &Path, seconds: u64) -> Result<()> {
    let dir = root.join("egress-user/bgp/fuzz");
    let mut done = Vec::new();
    for target in TARGETS {
        step(&format!("fuzz {target} for {seconds} s"));
        done.push((target, run_target(&dir, target, seconds)?));
    }
    println!();
    for (target, runs) in done {
        println!("fuzz {target}: {runs}, no crash");
    }
    Ok(())
}

/// Runs one target on a single process; returns libFuzzer's closing
/// "Done N runs in S second(s)" figure.
fn run_target(dir: &Path, target: &str, seconds: u64) -> Result<String> {
    // New inputs go to a scratch folder (listed first, so libFuzzer writes
    // there), never into the checked-in seeds.
    let scratch = dir.join("target/corpus").join(target);
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch).with_context(|| format!("creating {scratch:?}"))?;
    let seeds = dir.join("corpus").join(target);
    let mut cmd = Command::new("cargo");
    cmd.current_dir(dir)
        .args(["+nightly", "fuzz", "run", target])
        .arg(&scratch)
        .arg(&seeds)
        .arg("--")
        .arg(format!("-max_total_time={seconds}"))
        .arg(MAX_LEN)
        // The fuzz project is its own workspace with its own target folder.
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("CARGO_TARGET_DIR")
        .stderr(Stdio::piped());
    let shown = format!("{cmd:?}");
    let mut child = cmd.spawn().with_context(|| format!("starting {shown}"))?;
    let stderr = child.stderr.take().expect("stderr is piped");
    let mut summary = None;
    for line in BufReader::new(stderr).lines() {
        let line = line?;
        if let Some(rest) = line.strip_prefix("Done ") {
            summary = Some(rest.to_owned());
        }
        if !is_progress(&line) {
            eprintln!("{line}");
        }
    }
    let status = child.wait()?;
    if !status.success() {
        bail!("{shown} failed ({status}): a crash or a round-trip mismatch, input saved above");
    }
    summary.with_context(|| format!("{shown} ended without libFuzzer's summary"))
}

/// libFuzzer's line per new coverage unit ("#1234\tNEW ..."): hundreds a
/// minute, not worth a CI log. Everything else (start, final stats, a
/// crash and its input) is shown.
fn is_progress(line: &str) -> bool {
    let stat = line.strip_prefix('#').and_then(|l| l.split_once('\t'));
    let noisy = stat.is_some_and(|(_, what)| {
        ["NEW", "REDUCE", "pulse"]
            .iter()
            .any(|k| what.starts_with(k))
    });
    // The closing "recommended dictionary" is of no use here either.
    let dictionary = line.starts_with('"') && line.contains("# Uses: ");
    noisy || dictionary || line.trim_start().starts_with("NEW_FUNC")
}

#[cfg(test)]
mod tests {
    use super::is_progress;

    #[test]
    fn only_per_input_progress_is_hidden() {
        let hidden = [
            "#2115143\tNEW    cov: 1307 ft: 3080 corp: 271/73Kb lim: 4096 exec/s: 48071",
            "#512\tREDUCE cov: 932 ft: 1500 corp: 20/2Kb lim: 4096 exec/s: 0",
            "#8388608\tpulse  cov: 1329 ft: 3310 corp: 318/87Kb lim: 4096",
            "\tNEW_FUNC[1/3]: 0x560c66c1c780 in core::ptr::drop_glue",
            "\"\\377\\377\" # Uses: 9520",
        ];
        let shown = [
            "#12\tINITED cov: 932 ft: 1418 corp: 11/1352b exec/s: 0 rss: 38Mb",
            "#2458055\tDONE   cov: 1298 ft: 3022 corp: 343/105Kb lim: 4096",
            "Done 2458055 runs in 61 second(s)",
            "==1234== ERROR: libFuzzer: deadly signal",
            "thread '<unnamed>' panicked at fuzz_targets/roundtrip.rs:36:5:",
        ];
        for l in hidden {
            assert!(is_progress(l), "{l:?} should be hidden");
        }
        for l in shown {
            assert!(!is_progress(l), "{l:?} should be shown");
        }
    }
}
