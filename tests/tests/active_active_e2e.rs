//! Active-active egress IPs (issue 17): three gateways hold one EIP in BGP
//! mode behind a real upstream router (FRR with zebra, ECMP), with the
//! short heartbeat timers of the failover tests and the binaries' default
//! probes. See `egress_tests::scenarios` (`active-active-*`).

use std::sync::Mutex;

use egress_tests::scenarios::{run_and_report, Bins, Options};

/// One scenario at a time: they measure gaps of a few tens of milliseconds.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn scenario(name: &str) -> anyhow::Result<()> {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    run_and_report(&Bins::beside_test()?, name, &Options::fast()).map(|_| ())
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
