//! `cargo xtask build-ebpf`: builds egress-ebpf for bpfel-unknown-none with
//! BTF and copies it to target/ebpf/egress.bpf.o, where egress-user's build
//! script embeds it from. The datapath benchmark's variant (feature `bench`)
//! goes to target/ebpf/egress-bench.bpf.o.

use std::path::Path;

use anyhow::{Context, Result};

use crate::shell::{exec, step};

pub fn build(root: &Path, release: bool) -> Result<std::path::PathBuf> {
    build_object(root, release, None)
}

/// The benchmark's object: the same programs plus the `bench_*` ones.
pub fn build_bench(root: &Path) -> Result<std::path::PathBuf> {
    build_object(root, true, Some("bench"))
}

fn build_object(root: &Path, release: bool, feature: Option<&str>) -> Result<std::path::PathBuf> {
    step(&format!(
        "build-ebpf ({}{})",
        if release { "release" } else { "dev" },
        feature
            .map(|f| format!(", feature {f}"))
            .unwrap_or_default()
    ));
    let target_dir = root.join("target/ebpf");
    let mut cmd = std::process::Command::new("cargo");
    cmd.current_dir(root.join("egress-ebpf"))
        .args([
            "+nightly",
            "build",
            "-Z",
            "build-std=core",
            "--target",
            "bpfel-unknown-none",
        ])
        .arg("--target-dir")
        .arg(&target_dir)
        // BTF in the object: bpftool prints named fields of every map.
        .env("RUSTFLAGS", "-C debuginfo=2 -C link-arg=--btf")
        // cargo's own variables from this xtask run must not leak into the nested build.
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("RUSTC")
        .env_remove("RUSTC_WRAPPER")
        .env_remove("CARGO_TARGET_DIR");
    if release {
        cmd.arg("--release");
    }
    if let Some(f) = feature {
        cmd.args(["--features", f]);
    }
    exec(&mut cmd)?;
    let profile = if release { "release" } else { "debug" };
    let built = target_dir
        .join("bpfel-unknown-none")
        .join(profile)
        .join("egress");
    let object = target_dir.join(match feature {
        Some(f) => format!("egress-{f}.bpf.o"),
        None => "egress.bpf.o".to_string(),
    });
    std::fs::copy(&built, &object)
        .with_context(|| format!("copying {} to {}", built.display(), object.display()))?;
    println!("eBPF object: {}", object.display());
    Ok(object)
}
