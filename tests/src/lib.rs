//! Network-namespace harness for the end-to-end tests and the demo.
//!
//! Every namespace, pin folder and process made here has a name that is
//! unique to this process and test, and is removed on drop, also when the
//! test panics. Commands run in a namespace with `nsenter --net`, which
//! changes only the network namespace: the host's /sys/fs/bpf stays visible,
//! so maps pinned by an agent in a "node" can be read from outside.

pub mod cluster;
pub mod etcd;
pub mod frr;
mod netns;
mod process;
pub mod scenarios;
pub mod topology;

pub use netns::{link_veth, unique_name, Netns, PinDir};
pub use process::{run, Proc};

/// Runs the TC program `prog` of `ebpf` once on `pkt` with
/// BPF_PROG_TEST_RUN (loading it first if needed): (verdict, output frame).
pub fn run_classifier(
    ebpf: &mut aya::Ebpf,
    prog: &str,
    pkt: &[u8],
) -> anyhow::Result<(u32, Vec<u8>)> {
    use aya::programs::{SchedClassifier, TestRun, TestRunOptions};
    let p: &mut SchedClassifier = ebpf
        .program_mut(prog)
        .ok_or_else(|| anyhow::anyhow!("no program {prog}"))?
        .try_into()?;
    if p.fd().is_err() {
        p.load()?;
    }
    let mut out = vec![0u8; pkt.len() + 256];
    let r = p.test_run(TestRunOptions {
        data_in: Some(pkt),
        data_out: Some(&mut out),
        ..TestRunOptions::new()
    })?;
    out.truncate(r.data_size_out as usize);
    Ok((r.return_value, out))
}

/// True when this process can create namespaces and load BPF programs.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Path of the `egress-traffic` tool (built from this crate) next to the test executable.
pub fn traffic_bin() -> anyhow::Result<std::path::PathBuf> {
    sibling_bin(
        "egress-traffic",
        "EGRESS_TRAFFIC_BIN",
        "cargo build -p egress-tests --bins",
    )
}

/// Path of the `egress` binary to test: `$EGRESS_BIN`, or the one cargo built
/// next to this test executable (`cargo build -p egress-user` first; `cargo
/// xtask test` does).
pub fn egress_bin() -> anyhow::Result<std::path::PathBuf> {
    sibling_bin("egress", "EGRESS_BIN", "cargo build -p egress-user")
}

/// `$env_var`, or the binary `name` in the target folder this test runs from.
fn sibling_bin(name: &str, env_var: &str, how: &str) -> anyhow::Result<std::path::PathBuf> {
    if let Some(p) = std::env::var_os(env_var) {
        return Ok(p.into());
    }
    let exe = std::env::current_exe()?;
    // target/<profile>/deps/<test> -> target/<profile>/egress
    let candidate = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|profile| profile.join(name))
        .ok_or_else(|| anyhow::anyhow!("cannot place the egress binary from {}", exe.display()))?;
    anyhow::ensure!(
        candidate.exists(),
        "{} is missing: run `{how}` (or set {env_var})",
        candidate.display()
    );
    Ok(candidate)
}
