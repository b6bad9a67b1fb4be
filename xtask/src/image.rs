//! `cargo xtask image`: the chart's container image, built from the
//! repository's `Containerfile` with podman.
//!
//! No image registry is reachable from the project's machines, so the
//! `debian:bookworm-slim` base the Containerfile starts from is made locally
//! from Debian's packages with `mmdebstrap` the first time (about a minute and
//! a half) and kept in podman's storage; later runs reuse it. The build itself
//! reuses podman's layer cache, so a second build with the same binary only
//! re-tags.
//!
//! The binary is the release build by default; `--binary PATH` packs another
//! one (the tests pack the debug build they already have). Either is copied
//! without its debug sections to `target/image/egress`, the path the
//! Containerfile is given as `EGRESS_BIN`.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};

use crate::shell::{exec, step, succeeds};

/// The base the Containerfile names (`FROM debian:bookworm-slim`), as podman
/// resolves it.
const BASE: &str = "docker.io/library/debian:bookworm-slim";

/// podman with the settings this machine kind needs, the same the test
/// harness runs the chart's pods with ([`egress_tests::chart_pods::podman_base`]).
pub fn podman() -> Command {
    let argv = egress_tests::chart_pods::podman_base();
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]);
    cmd
}

/// The image reference the chart's default values resolve to:
/// `image.repository` : (`image.tag` or the chart's appVersion).
pub fn chart_image(root: &Path) -> Result<String> {
    let chart = root.join("charts/egress-gateway");
    let values = std::fs::read_to_string(chart.join("values.yaml"))?;
    let chart_yaml = std::fs::read_to_string(chart.join("Chart.yaml"))?;
    let repository = yaml_value_under(&values, "image", "repository")
        .context("image.repository in the chart's values.yaml")?;
    let tag = yaml_value_under(&values, "image", "tag")
        .filter(|t| !t.is_empty())
        .or_else(|| top_level_value(&chart_yaml, "appVersion"))
        .context("image.tag or appVersion in the chart")?;
    Ok(format!("{repository}:{tag}"))
}

/// `key: value` of a top-level YAML line, unquoted.
fn top_level_value(yaml: &str, key: &str) -> Option<String> {
    yaml.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .map(unquote)
}

/// `key: value` indented under the top-level `section:`, unquoted.
fn yaml_value_under(yaml: &str, section: &str, key: &str) -> Option<String> {
    let mut inside = false;
    for line in yaml.lines() {
        if !line.starts_with(' ') && !line.starts_with('#') && !line.is_empty() {
            inside = line.trim_end() == format!("{section}:");
            continue;
        }
        if inside {
            if let Some(v) = line.trim_start().strip_prefix(&format!("{key}:")) {
                return Some(unquote(v));
            }
        }
    }
    None
}

fn unquote(v: &str) -> String {
    v.split(" #")
        .next()
        .unwrap_or("")
        .trim()
        .trim_matches('"')
        .to_owned()
}

/// The cargo target folder (`$CARGO_TARGET_DIR` or `root/target`).
pub fn target_dir(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|t| if t.is_relative() { root.join(t) } else { t })
        .unwrap_or_else(|| root.join("target"))
}

/// Builds the chart's image around `binary` (default: a release build, made
/// first) and returns the reference it is tagged with.
pub fn build(root: &Path, binary: Option<&Path>) -> Result<String> {
    let binary = match binary {
        Some(b) => b.to_owned(),
        None => {
            crate::build_ebpf::build(root, true)?;
            step("release build of egress");
            crate::shell::build_binaries(root, true)?;
            target_dir(root).join("release/egress")
        }
    };
    if !binary.is_file() {
        bail!("{} does not exist", binary.display());
    }
    ensure_base()?;

    step(&format!(
        "image from Containerfile with {}",
        binary.display()
    ));
    // The build context is the repository root; `.containerignore` keeps it
    // down to the packed binary.
    let staged = root.join("target/image/egress");
    std::fs::create_dir_all(staged.parent().expect("has a parent"))?;
    let _ = std::fs::remove_file(&staged);
    // Debug sections are most of a debug build (300 MB of 370); without
    // them every container copy (vfs storage) is a fifth the size.
    exec(
        Command::new("objcopy")
            .arg("--strip-debug")
            .arg(&binary)
            .arg(&staged),
    )
    .context("copying the binary without debug sections (binutils' objcopy)")?;

    let image = chart_image(root)?;
    // Kubernetes resolves the chart's `egress:0.1.0` as
    // docker.io/library/egress:0.1.0; podman's own short name is localhost/.
    let full = format!("docker.io/library/{image}");
    exec(
        podman()
            .current_dir(root)
            .args(["build", "--pull=never", "--network", "host"])
            .args([
                "--ulimit",
                "nofile=1024:1024",
                "--ulimit",
                "nproc=1024:1024",
            ])
            .args(["--build-arg", "EGRESS_BIN=target/image/egress"])
            .args(["-f", "Containerfile", "-t", &image, "-t", &full, "."]),
    )?;
    println!("tagged {image} and {full}");
    Ok(image)
}

/// Makes `debian:bookworm-slim` from Debian's packages unless podman
/// already has it.
fn ensure_base() -> Result<()> {
    step("base image");
    let exists = |r: &str| {
        podman()
            .args(["image", "exists", r])
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    };
    if exists(BASE) {
        println!("present: {BASE}");
        return Ok(());
    }
    if !succeeds("mmdebstrap", &["--version"]) {
        bail!("mmdebstrap is missing (cargo xtask setup installs it)");
    }
    println!("making {BASE} with mmdebstrap (about 90 s)");
    // mmdebstrap writes a tarball of the root filesystem to stdout, which
    // podman imports as a one-layer image.
    let mut debstrap = Command::new("mmdebstrap")
        .args([
            "--variant=minbase",
            "--include=bpftool,ca-certificates",
            "bookworm",
            "-",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .context("starting mmdebstrap")?;
    let tar = debstrap.stdout.take().expect("piped");
    let import = podman()
        .args(["import", "-", BASE])
        .stdin(tar)
        .status()
        .context("starting podman import")?;
    let made = debstrap.wait()?;
    if !made.success() || !import.success() {
        bail!("making the base image failed (mmdebstrap {made}, podman import {import})");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_read_under_their_section() {
        let yaml = "image:\n  # c\n  repository: a/b\n  tag: \"\"\nother:\n  tag: x\n";
        assert_eq!(
            yaml_value_under(yaml, "image", "repository").as_deref(),
            Some("a/b")
        );
        assert_eq!(yaml_value_under(yaml, "image", "tag").as_deref(), Some(""));
        assert_eq!(yaml_value_under(yaml, "other", "tag").as_deref(), Some("x"));
        assert_eq!(
            top_level_value("appVersion: \"1.2\"\n", "appVersion").as_deref(),
            Some("1.2")
        );
    }
}
