//! `cargo xtask setup`: everything the build and tests need, installed once.
//!
//! Each part is checked first and skipped when present, so a second run
//! takes seconds.

use std::process::Command;

use anyhow::{bail, Result};

use crate::shell::{exec, output, step, succeeds};

/// Debian packages the build, the tests, the demo and the benchmarks use.
const PACKAGES: &[&str] = &[
    // bpf-linker against LLVM 22 (same major as the nightly toolchain)
    "llvm-22-dev",
    "libpolly-22-dev",
    "zlib1g-dev",
    "libzstd-dev",
    // etcd-client's build (protoc and the well-known .proto files)
    "protobuf-compiler",
    "libprotobuf-dev",
    // the datapath and its tests
    "bpftool",
    "iproute2",
    "util-linux",
    "procps",
    "iputils-ping",
    "iperf3",
    "tcpdump",
    "netcat-openbsd",
    // the kept demo's printed commands (an agent's /state)
    "curl",
    // the CNI reference plugins (bridge, ptp, host-local) that wire test pods
    "containernetworking-plugins",
    // baselines (spidernet-style path)
    "iptables",
    "ipset",
    // BGP peers for interop tests and benchmarks
    "frr",
    "bird2",
    "gobgpd",
    // the chart's image (`cargo xtask image`) and the tests that run the agent
    // and controller in it: podman on runc, its base made with mmdebstrap,
    // objcopy to pack a binary without its debug sections
    "podman",
    "runc",
    "mmdebstrap",
    "binutils",
    // the etcd datastore
    "etcd-server",
    "etcd-client",
];

const BPF_LINKER_VERSION: &str = "0.13.0";
/// Runs the BGP codec's fuzz targets (`cargo xtask fuzz`, and the bounded
/// round in `cargo xtask test`).
const CARGO_FUZZ_VERSION: &str = "0.13.2";

pub fn run(root: &std::path::Path) -> Result<()> {
    step("setup: toolchains");
    if !succeeds("rustup", &["run", "nightly", "rustc", "--version"]) {
        bail!(
            "the nightly Rust toolchain is missing; the eBPF programs are built with nightly and \
             -Z build-std=core. Install it with `rustup toolchain install nightly --component rust-src`"
        );
    }
    ensure_component("nightly", "rust-src")?;
    ensure_component("nightly", "rustfmt")?;
    ensure_component("stable", "clippy")?;
    ensure_component("stable", "rustfmt")?;

    step("setup: Debian packages");
    let missing: Vec<&str> = PACKAGES
        .iter()
        .copied()
        .filter(|p| !is_installed(p))
        .collect();
    if missing.is_empty() {
        println!("all {} packages present", PACKAGES.len());
    } else {
        println!("installing: {}", missing.join(" "));
        exec(Command::new("apt-get").arg("update").arg("-q"))?;
        exec(
            Command::new("apt-get")
                .args(["install", "-y", "-q", "--no-install-recommends"])
                .args(&missing)
                .env("DEBIAN_FRONTEND", "noninteractive"),
        )?;
    }

    step("setup: bpf-linker");
    match output("bpf-linker", &["--version"]) {
        Ok(v) => println!("present: {}", v.trim()),
        Err(_) => {
            println!(
                "installing bpf-linker {BPF_LINKER_VERSION} against LLVM 22 (about 4 minutes)"
            );
            let path = format!(
                "/usr/lib/llvm-22/bin:{}",
                std::env::var("PATH").unwrap_or_default()
            );
            exec(
                Command::new("cargo")
                    .args(["install", "bpf-linker", "--version", BPF_LINKER_VERSION])
                    .args(["--no-default-features", "--features", "llvm-22"])
                    .env("PATH", path),
            )?;
        }
    }

    ensure_cargo_fuzz()?;

    step("setup: helm (renders the chart in its tests)");
    let helm = crate::helm::ensure_helm(root)?;
    println!("present: {}", helm.display());
    Ok(())
}

/// cargo-fuzz, installed once (`cargo xtask fuzz` checks it too).
pub fn ensure_cargo_fuzz() -> Result<()> {
    step("setup: cargo-fuzz");
    if let Ok(v) = output("cargo", &["fuzz", "--version"]) {
        println!("present: {}", v.trim());
        return Ok(());
    }
    println!("installing cargo-fuzz {CARGO_FUZZ_VERSION} (about 4 minutes)");
    exec(Command::new("cargo").args([
        "install",
        "cargo-fuzz",
        "--version",
        CARGO_FUZZ_VERSION,
        "--locked",
    ]))
}

fn is_installed(package: &str) -> bool {
    output("dpkg-query", &["-W", "-f=${Status}", package])
        .map(|s| s.contains("install ok installed"))
        .unwrap_or(false)
}

fn ensure_component(toolchain: &str, component: &str) -> Result<()> {
    let installed = output(
        "rustup",
        &["component", "list", "--installed", "--toolchain", toolchain],
    )?;
    if installed.lines().any(|l| l.starts_with(component)) {
        println!("present: {component} ({toolchain})");
        return Ok(());
    }
    println!("installing: {component} ({toolchain})");
    exec(Command::new("rustup").args(["component", "add", component, "--toolchain", toolchain]))
}
