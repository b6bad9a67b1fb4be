//! The failover scenarios of issue 5 (see `egress_tests::scenarios`) with
//! short timers (heartbeat 250 ms, check 250 ms, eviction 1.5 s, leader lease
//! 2 s) so the suite stays fast. `cargo xtask e2e NAME` runs one scenario
//! with the same timers and prints its JSON line.

use std::sync::Mutex;

use egress_tests::scenarios::{run_and_report, Bins, Options};

/// One scenario at a time: they measure sub-second timings, and two
/// clusters at once on a small machine would measure each other.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn scenario(name: &str) -> anyhow::Result<()> {
    run(name, &Options::fast())
}

fn run(name: &str, opts: &Options) -> anyhow::Result<()> {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let bins = Bins::beside_test()?;
    run_and_report(&bins, name, opts).map(|_| ())
}

/// The scenarios whose datastore traffic matters, on Kubernetes: the
/// heartbeats are Lease patches, the controllers' election a Lease, the
/// statuses server-side applies, every process under the chart's RBAC.
#[test]
#[ignore = "needs root: namespaces, BPF"]
fn on_kubernetes_gateway_kill() -> anyhow::Result<()> {
    run("gateway-kill", &Options::fast().on_kubernetes())
}

#[test]
#[ignore = "needs root: namespaces, BPF"]
fn on_kubernetes_gateway_link_down() -> anyhow::Result<()> {
    run("gateway-link-down", &Options::fast().on_kubernetes())
}

#[test]
#[ignore = "needs root: namespaces, BPF"]
fn on_kubernetes_datastore_partition() -> anyhow::Result<()> {
    run("datastore-partition", &Options::fast().on_kubernetes())
}

#[test]
#[ignore = "needs root: namespaces, BPF"]
fn on_kubernetes_controller_kill() -> anyhow::Result<()> {
    run("controller-kill", &Options::fast().on_kubernetes())
}

#[test]
#[ignore = "needs root: namespaces, BPF, etcd"]
fn gateway_kill() -> anyhow::Result<()> {
    scenario("gateway-kill")
}

#[test]
#[ignore = "needs root: namespaces, BPF, etcd"]
fn gateway_link_down() -> anyhow::Result<()> {
    scenario("gateway-link-down")
}

#[test]
#[ignore = "needs root: namespaces, BPF, etcd"]
fn datastore_partition() -> anyhow::Result<()> {
    scenario("datastore-partition")
}

#[test]
#[ignore = "needs root: namespaces, BPF, etcd"]
fn controller_kill() -> anyhow::Result<()> {
    scenario("controller-kill")
}

#[test]
#[ignore = "needs root: namespaces, BPF, etcd"]
fn gateway_recover() -> anyhow::Result<()> {
    scenario("gateway-recover")
}

#[test]
#[ignore = "needs root: namespaces, BPF, etcd"]
fn gateway_agent_crash() -> anyhow::Result<()> {
    scenario("gateway-agent-crash")
}

/// With the product's default timers and probes, a busy gateway (every CPU
/// taken, then a saturating flow through it) is never declared down.
#[test]
#[ignore = "needs root: namespaces, BPF"]
fn gateway_under_load_with_default_timers() -> anyhow::Result<()> {
    run("gateway-under-load", &Options::defaults())
}

/// The failover scenarios on an IPv6-only underlay: the nodes have no IPv4
/// address, the tunnels run over IPv6 (IPv4 pod traffic inside), etcd and
/// the controller's probes are reached over IPv6.
mod on_an_ipv6_underlay {
    use super::*;

    #[test]
    #[ignore = "needs root: namespaces, BPF, etcd"]
    fn gateway_kill() -> anyhow::Result<()> {
        run("gateway-kill", &Options::fast().on_ipv6_underlay())
    }

    #[test]
    #[ignore = "needs root: namespaces, BPF, etcd"]
    fn gateway_link_down() -> anyhow::Result<()> {
        run("gateway-link-down", &Options::fast().on_ipv6_underlay())
    }

    #[test]
    #[ignore = "needs root: namespaces, BPF, etcd"]
    fn datastore_partition() -> anyhow::Result<()> {
        run("datastore-partition", &Options::fast().on_ipv6_underlay())
    }

    #[test]
    #[ignore = "needs root: namespaces, BPF, etcd"]
    fn controller_kill() -> anyhow::Result<()> {
        run("controller-kill", &Options::fast().on_ipv6_underlay())
    }

    #[test]
    #[ignore = "needs root: namespaces, BPF, etcd"]
    fn gateway_recover() -> anyhow::Result<()> {
        run("gateway-recover", &Options::fast().on_ipv6_underlay())
    }

    #[test]
    #[ignore = "needs root: namespaces, BPF, etcd"]
    fn gateway_agent_crash() -> anyhow::Result<()> {
        run("gateway-agent-crash", &Options::fast().on_ipv6_underlay())
    }

    /// On Kubernetes: the API server is reached over IPv6, the Nodes have
    /// only IPv6 InternalIPs.
    #[test]
    #[ignore = "needs root: namespaces, BPF"]
    fn on_kubernetes_gateway_kill() -> anyhow::Result<()> {
        run("gateway-kill", &on_kubernetes())
    }

    #[test]
    #[ignore = "needs root: namespaces, BPF"]
    fn on_kubernetes_gateway_link_down() -> anyhow::Result<()> {
        run("gateway-link-down", &on_kubernetes())
    }

    #[test]
    #[ignore = "needs root: namespaces, BPF"]
    fn on_kubernetes_datastore_partition() -> anyhow::Result<()> {
        run("datastore-partition", &on_kubernetes())
    }

    #[test]
    #[ignore = "needs root: namespaces, BPF"]
    fn on_kubernetes_controller_kill() -> anyhow::Result<()> {
        run("controller-kill", &on_kubernetes())
    }

    /// With the product's default timers and probes over IPv6, a busy
    /// gateway is never declared down.
    #[test]
    #[ignore = "needs root: namespaces, BPF"]
    fn gateway_under_load_with_default_timers() -> anyhow::Result<()> {
        run(
            "gateway-under-load",
            &Options::defaults().on_ipv6_underlay(),
        )
    }

    fn on_kubernetes() -> Options {
        Options::fast().on_ipv6_underlay().on_kubernetes()
    }
}
