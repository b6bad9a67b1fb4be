//! The failover scenarios of issue 5 (see `egress_tests::scenarios`) with
//! short timers (heartbeat 200 ms, check 200 ms, eviction 1 s, leader lease
//! 2 s) so the suite stays fast. `cargo xtask e2e NAME` runs one scenario
//! with the same timers and prints its JSON line.

use egress_tests::scenarios::{run_and_report, Bins, Options};

fn scenario(name: &str) -> anyhow::Result<()> {
    let bins = Bins::beside_test()?;
    run_and_report(&bins, name, &Options::fast()).map(|_| ())
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
