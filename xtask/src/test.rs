//! `cargo xtask test`: the README's test command and what CI runs.

use std::path::Path;

use anyhow::{bail, Result};

use crate::{
    build_ebpf, setup,
    shell::{cargo, exec, step},
};

pub fn run(root: &Path, unprivileged: bool) -> Result<()> {
    setup::run(root)?;
    build_ebpf::build(root, true)?;
    // The benchmark's object too: a test checks that the verifier takes
    // every program in it.
    build_ebpf::build_bench(root)?;

    step("format");
    exec(&mut cargo(root, &["fmt", "--all", "--check"]))?;
    exec(
        std::process::Command::new("cargo")
            .current_dir(root.join("egress-ebpf"))
            .args(["+nightly", "fmt", "--check"])
            .env_remove("RUSTUP_TOOLCHAIN"),
    )?;

    step("clippy");
    exec(&mut cargo(
        root,
        &[
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ],
    ))?;

    // Tests start the real `egress` binary from the same target folder.
    step("build the binaries the tests run");
    crate::shell::build_binaries(root, false)?;

    step("tests (unprivileged)");
    exec(&mut cargo(root, &["test", "--workspace"]))?;

    // A short, fixed round per BGP codec fuzz target from the seed corpus;
    // `cargo xtask fuzz --seconds N` runs longer.
    crate::fuzz::run(root, crate::fuzz::CI_SECONDS)?;

    if unprivileged {
        println!("\nskipped the privileged tests (--unprivileged)");
        return Ok(());
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!(
            "the privileged tests need root (namespaces, BPF); run as root or pass --unprivileged"
        );
    }
    // The containerised tests run the agent and controller from the chart's
    // image, packed around the debug binary just built.
    crate::image::build(
        root,
        Some(&crate::image::target_dir(root).join("debug/egress")),
    )?;
    step("tests (privileged: namespaces, BPF, real peers)");
    // Every privileged test is #[ignore]d so that a plain `cargo test` runs
    // anywhere; benchmarks and generators are ignored too and skipped here.
    exec(&mut cargo(
        root,
        &[
            "test",
            "--workspace",
            "--no-fail-fast",
            "--",
            "--ignored",
            // One at a time: the end-to-end tests time real failovers and BGP
            // restarts, which two cores shared by parallel clusters blur.
            "--test-threads=1",
            "--skip",
            "bench_",
            "--skip",
            "write_seed_corpus",
        ],
    ))?;
    step("demo, short mode (sub-second timers), asserting its summary");
    crate::demo::run(
        root,
        crate::demo::DemoArgs {
            keep: false,
            no_build: true,
            debug: true,
            fast: true,
            stop: false,
        },
    )?;
    step("demo --keep: each printed command, then --stop removes exactly the demo");
    crate::demo_check::run(root)?;
    Ok(())
}
