//! Network-namespace harness for the end-to-end tests and the demo.
//!
//! Every namespace, pin folder and process made here has a name that is
//! unique to this process and test, and is removed on drop, also when the
//! test panics. Commands run in a namespace with `nsenter --net`, which
//! changes only the network namespace: the host's /sys/fs/bpf stays visible,
//! so maps pinned by an agent in a "node" can be read from outside.

pub mod bgp_fleet;
pub mod chart_pods;
pub mod chart_rbac;
pub mod cluster;
pub mod cni;
pub mod etcd;
pub mod frr;
pub mod kube_api;
pub mod kube_objects;
mod netns;
mod process;
pub mod scenarios;
pub mod topology;

pub use netns::{link_veth, unique_name, Netns, PinDir};
pub use process::{run, Proc, LOG_DIR_VAR};

/// One scenario as two tests: `body(false)` on etcd and `body(true)` on
/// the Kubernetes datastore, each with its own attributes (its doc and
/// `#[ignore]` reason):
///
/// ```ignore
/// egress_tests::on_both_datastores! {
///     #[ignore = "needs root: namespaces, etcd"] fn it_works;
///     #[ignore = "needs root: namespaces"] fn on_kubernetes_it_works;
///     => scenario
/// }
/// ```
#[macro_export]
macro_rules! on_both_datastores {
    (
        $(#[$etcd_meta:meta])* fn $etcd:ident;
        $(#[$kube_meta:meta])* fn $kube:ident;
        => $body:path
    ) => {
        $(#[$etcd_meta])*
        #[test]
        fn $etcd() -> ::anyhow::Result<()> {
            $body(false)
        }

        $(#[$kube_meta])*
        #[test]
        fn $kube() -> ::anyhow::Result<()> {
            $body(true)
        }
    };
}

/// Value of the Prometheus text-format sample `name{labels...}` (labels in any order), or of
/// `name` without labels when `labels` is empty.
pub fn metric_sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines()
        .filter(|l| {
            l.starts_with(&format!("{name}{{"))
                || (labels.is_empty() && l.starts_with(&format!("{name} ")))
        })
        .find(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// Runs the TC program `prog` of `ebpf` once on `pkt` with
/// BPF_PROG_TEST_RUN (loading it first if needed): (verdict, output frame).
pub fn run_classifier(
    ebpf: &mut aya::Ebpf,
    prog: &str,
    pkt: &[u8],
) -> anyhow::Result<(u32, Vec<u8>)> {
    run_classifier_with(ebpf, prog, pkt, 0)
}

/// `BPF_F_TEST_SKB_CHECKSUM_COMPLETE` (Linux 6.11): the kernel gives the
/// test skb `CHECKSUM_COMPLETE` with `skb->csum` summed over the packet,
/// and after the run fails it with `EBADMSG` unless `skb->csum` still sums
/// the output packet. This is the state of a packet from a NIC that
/// checksums in hardware (mlx5, ice, ...); a program that rewrites such a
/// packet must carry `skb->csum` along.
pub const TEST_CHECKSUM_COMPLETE: u32 = 1 << 2;

/// [`run_classifier`] on a CHECKSUM_COMPLETE skb ([`TEST_CHECKSUM_COMPLETE`]):
/// fails unless the program leaves `skb->csum` right.
pub fn run_classifier_complete(
    ebpf: &mut aya::Ebpf,
    prog: &str,
    pkt: &[u8],
) -> anyhow::Result<(u32, Vec<u8>)> {
    run_classifier_with(ebpf, prog, pkt, TEST_CHECKSUM_COMPLETE)
}

/// Like [`run_classifier`], with BPF_PROG_TEST_RUN `flags` (aya does not
/// pass them through, so this calls bpf(2) itself). An `EBADMSG` from
/// [`TEST_CHECKSUM_COMPLETE`] comes back as an error saying so.
pub fn run_classifier_with(
    ebpf: &mut aya::Ebpf,
    prog: &str,
    pkt: &[u8],
    flags: u32,
) -> anyhow::Result<(u32, Vec<u8>)> {
    use aya::programs::SchedClassifier;
    use std::os::fd::{AsFd, AsRawFd};
    let p: &mut SchedClassifier = ebpf
        .program_mut(prog)
        .ok_or_else(|| anyhow::anyhow!("no program {prog}"))?
        .try_into()?;
    if p.fd().is_err() {
        p.load()?;
    }
    let fd = p.fd()?.as_fd().as_raw_fd();
    let mut out = vec![0u8; pkt.len() + 256];
    // The `test` member of `union bpf_attr` (uapi/linux/bpf.h).
    #[repr(C)]
    #[derive(Default)]
    struct TestAttr {
        prog_fd: u32,
        retval: u32,
        data_size_in: u32,
        data_size_out: u32,
        data_in: u64,
        data_out: u64,
        repeat: u32,
        duration: u32,
        ctx_size_in: u32,
        ctx_size_out: u32,
        ctx_in: u64,
        ctx_out: u64,
        flags: u32,
        cpu: u32,
        batch_size: u32,
        _pad: u32,
    }
    const BPF_PROG_TEST_RUN: libc::c_long = 10;
    let mut attr = TestAttr {
        prog_fd: fd as u32,
        data_size_in: pkt.len() as u32,
        data_size_out: out.len() as u32,
        data_in: pkt.as_ptr() as u64,
        data_out: out.as_mut_ptr() as u64,
        repeat: 1,
        flags,
        ..TestAttr::default()
    };
    // SAFETY: attr is a valid bpf_attr prefix whose buffers outlive the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_TEST_RUN,
            &mut attr as *mut TestAttr,
            std::mem::size_of::<TestAttr>(),
        )
    };
    if rc < 0 {
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::EBADMSG) {
            anyhow::bail!("{prog}: skb->csum no longer sums the packet the program left (EBADMSG)");
        }
        anyhow::bail!("{prog}: BPF_PROG_TEST_RUN: {err}");
    }
    out.truncate(attr.data_size_out as usize);
    Ok((attr.retval, out))
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
