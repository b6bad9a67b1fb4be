//! Project tasks: `cargo xtask <setup|build-ebpf|image|test|fuzz|demo|e2e|bench>`.

mod bench_bgp;
mod bench_bgp_cluster;
mod bench_control_plane;
mod bench_datapath;
mod bench_failover;
mod bgp_seat;
mod build_ebpf;
mod demo;
mod demo_check;
mod demo_stop;
mod e2e;
mod fuzz;
mod helm;
mod image;
mod setup;
mod shell;
mod test;

use std::path::PathBuf;

use clap::{error::ErrorKind, CommandFactory, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "cargo xtask",
    about = "Build, test and demo tasks of the egress gateway"
)]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Debug, Subcommand)]
enum Task {
    /// Install, idempotently, everything the build and tests need (Debian packages, rust-src, bpf-linker).
    Setup,
    /// Build the eBPF object that the userspace embeds.
    BuildEbpf {
        /// Build with the release profile (both profiles optimise; release is what CI and the demo use).
        #[arg(long)]
        release: bool,
        /// Also build the datapath benchmark's object (target/ebpf/egress-bench.bpf.o).
        #[arg(long)]
        bench: bool,
    },
    /// The chart's container image (`egress:<appVersion>`) from `Containerfile`, with podman.
    Image {
        /// Pack this binary instead of a release build (e.g. target/debug/egress).
        #[arg(long)]
        binary: Option<PathBuf>,
    },
    /// The README's test command: setup, build-ebpf, fmt, clippy, all tests, then the privileged tests.
    Test {
        /// Skip the tests that need root (namespaces, BPF); for a quick local loop only.
        #[arg(long)]
        unprivileged: bool,
    },
    /// Fuzz the BGP codec: each cargo-fuzz target for a fixed time from its seed corpus (installs cargo-fuzz if missing; needs nightly).
    Fuzz {
        /// Seconds per target (`cargo xtask test` runs 60).
        #[arg(long, default_value_t = fuzz::CI_SECONDS)]
        seconds: u64,
    },
    /// The README's first command: a local cluster in network namespaces, shown step by step.
    Demo(demo::DemoArgs),
    /// The test step on `demo --keep` / `--stop` alone (debug binaries built): every printed command works, --stop removes exactly the demo.
    DemoCheck,
    /// A failover scenario of issue 5 in namespaces (gateway-kill, gateway-link-down, datastore-partition, controller-kill, gateway-recover, or all).
    E2e {
        name: String,
        /// The product's default timers (5s/5s/15s) instead of the short test timers.
        #[arg(long)]
        default_timers: bool,
        /// Datapath probes: interval in ms (with --probe-detect-multiplier, default 3).
        #[arg(long)]
        probe_interval_ms: Option<u64>,
        #[arg(long, default_value_t = 3)]
        probe_detect_multiplier: u32,
        /// On the Kubernetes datastore (the tests' in-memory API server, the
        /// chart's RBAC) instead of etcd.
        #[arg(long)]
        kubernetes: bool,
        /// On an IPv6-only underlay (nodes without IPv4 addresses, `--underlay ipv6`).
        #[arg(long)]
        ipv6_underlay: bool,
    },
    /// Benchmarks (not part of the tests): `datapath`, `control-plane`, `failover`, `bgp`.
    Bench {
        what: String,
        /// For `bgp`: how many routes to send (default 100000).
        #[arg(long)]
        routes: Option<usize>,
        /// For `bgp`: which implementations take the reflector's seat, e.g. `ours,frr` (default all).
        #[arg(long)]
        only: Option<String>,
        /// For `bgp`: skip the 100,000-route feed.
        #[arg(long)]
        no_feed: bool,
        /// For `bgp`: the cluster shape's client counts, e.g. `250,500,1000` (the default); `none` skips it.
        #[arg(long)]
        cluster_sizes: Option<String>,
        /// For `bgp`: seconds each cluster phase may take before its figure is null (default 180).
        #[arg(long)]
        cluster_timeout: Option<u64>,
    },
}

fn main() {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e)
            if matches!(
                e.kind(),
                ErrorKind::InvalidSubcommand
                    | ErrorKind::MissingSubcommand
                    | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            ) =>
        {
            eprintln!(
                "{}",
                e.render()
                    .to_string()
                    .lines()
                    .next()
                    .unwrap_or("unknown task")
            );
            eprintln!();
            let _ = Cli::command().print_help();
            std::process::exit(2);
        }
        Err(e) => e.exit(),
    };
    let root = workspace_root();
    let result = match cli.task {
        Task::Setup => setup::run(&root),
        Task::BuildEbpf { release, bench } => {
            build_ebpf::build(&root, release).and_then(|_| match bench {
                true => build_ebpf::build_bench(&root).map(|_| ()),
                false => Ok(()),
            })
        }
        Task::Image { binary } => image::build(&root, binary.as_deref()).map(|_| ()),
        Task::Test { unprivileged } => test::run(&root, unprivileged),
        Task::Fuzz { seconds } => {
            setup::ensure_cargo_fuzz().and_then(|_| fuzz::run(&root, seconds))
        }
        Task::Demo(args) => demo::run(&root, args),
        Task::DemoCheck => demo_check::run(&root),
        Task::E2e {
            name,
            default_timers,
            probe_interval_ms,
            probe_detect_multiplier,
            kubernetes,
            ipv6_underlay,
        } => e2e::run(
            &root,
            &name,
            e2e::Choices {
                default_timers,
                probe: probe_interval_ms.map(|ms| (ms, probe_detect_multiplier)),
                kubernetes,
                ipv6_underlay,
            },
        ),
        Task::Bench {
            what,
            routes,
            only,
            no_feed,
            cluster_sizes,
            cluster_timeout,
        } => match what.as_str() {
            "datapath" => bench_datapath::run(&root),
            "control-plane" => bench_control_plane::run(&root),
            "failover" => bench_failover::run(&root),
            "bgp" => bench_bgp::run_cli(
                &root,
                bench_bgp::Cli {
                    routes,
                    only: only.as_deref(),
                    no_feed,
                    cluster_sizes: cluster_sizes.as_deref(),
                    cluster_timeout,
                },
            ),
            other => Err(anyhow::anyhow!(
                "unknown benchmark {other:?}; one of: datapath, control-plane, failover, bgp"
            )),
        },
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

/// The workspace root: the parent of this crate's manifest folder.
fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_owned()
}
