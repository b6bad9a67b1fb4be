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
mod test_run;
pub mod topology;
pub mod veth_xdp;

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

pub use test_run::{
    run_classifier, run_classifier_complete, run_classifier_with, run_xdp, run_xdp_live,
    TEST_CHECKSUM_COMPLETE,
};

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
