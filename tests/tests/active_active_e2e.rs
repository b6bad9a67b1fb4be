//! Active-active egress IPs (issue 17): three gateways hold one EIP in BGP
//! mode behind a real upstream router (FRR with zebra, ECMP), with the
//! short heartbeat timers of the failover tests and the binaries' default
//! probes. See `egress_tests::scenarios` (`active-active-*`).

use std::sync::Mutex;

use egress_tests::scenarios::{run_and_report, Bins, Options};

/// One scenario at a time: they measure gaps of a few tens of milliseconds.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn scenario(name: &str) -> anyhow::Result<()> {
    run(name, &Options::fast())
}

fn run(name: &str, opts: &Options) -> anyhow::Result<()> {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    run_and_report(&Bins::beside_test()?, name, opts).map(|_| ())
}

#[test]
#[ignore = "needs root: namespaces, BPF, FRR"]
fn active_active_gateway_kill_moves_only_its_flows() -> anyhow::Result<()> {
    scenario("active-active-kill")
}

#[test]
#[ignore = "needs root: namespaces, BPF, FRR"]
fn active_active_reflector_restart_removes_no_route() -> anyhow::Result<()> {
    scenario("active-active-reflector-restart")
}

#[test]
#[ignore = "needs root: namespaces, BPF, FRR"]
fn active_active_partitioned_gateway_fences_itself() -> anyhow::Result<()> {
    scenario("active-active-partition")
}

/// The same on an IPv6-only underlay: the gateways announce the IPv4 EIP
/// with their IPv6 addresses as next hops (RFC 8950), the upstream's zebra
/// installs one multipath route `via inet6` over them, and the workers
/// spread the flows over the gateways' IPv6 tunnel endpoints.
mod on_an_ipv6_underlay {
    use super::*;

    #[test]
    #[ignore = "needs root: namespaces, BPF, FRR"]
    fn active_active_gateway_kill_moves_only_its_flows() -> anyhow::Result<()> {
        run("active-active-kill", &Options::fast().on_ipv6_underlay())
    }

    #[test]
    #[ignore = "needs root: namespaces, BPF, FRR"]
    fn active_active_reflector_restart_removes_no_route() -> anyhow::Result<()> {
        let opts = Options::fast().on_ipv6_underlay();
        run("active-active-reflector-restart", &opts)
    }

    #[test]
    #[ignore = "needs root: namespaces, BPF, FRR"]
    fn active_active_partitioned_gateway_fences_itself() -> anyhow::Result<()> {
        run(
            "active-active-partition",
            &Options::fast().on_ipv6_underlay(),
        )
    }
}
