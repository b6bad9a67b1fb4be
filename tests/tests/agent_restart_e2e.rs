//! Issue 4: "a restart of the agent reuses the pinned maps and programs and
//! reconciles them: traffic does not stop". The `agent-restart` scenario
//! (see `egress_tests::scenarios`) kills the agents of the pod's worker and
//! of the EIP's owner, keeps them down for a second and starts them again.

use egress_tests::scenarios::{run_and_report, Bins, Options};

#[test]
#[ignore = "needs root: namespaces, BPF, etcd"]
fn traffic_does_not_stop_when_agents_restart() -> anyhow::Result<()> {
    let bins = Bins::beside_test()?;
    run_and_report(&bins, "agent-restart", &Options::fast()).map(|_| ())
}

/// The same on Kubernetes: the restarted agents find their EgressTunnels
/// (they may not create them) and resume from their pinned state.
#[test]
#[ignore = "needs root: namespaces, BPF"]
fn on_kubernetes_traffic_does_not_stop_when_agents_restart() -> anyhow::Result<()> {
    let bins = Bins::beside_test()?;
    run_and_report(&bins, "agent-restart", &Options::fast().on_kubernetes()).map(|_| ())
}

/// The same on an IPv6-only underlay: the pinned state the restarted
/// agents resume from holds IPv6 tunnel endpoints.
#[test]
#[ignore = "needs root: namespaces, BPF, etcd"]
fn on_an_ipv6_underlay_traffic_does_not_stop_when_agents_restart() -> anyhow::Result<()> {
    let bins = Bins::beside_test()?;
    run_and_report(&bins, "agent-restart", &Options::fast().on_ipv6_underlay()).map(|_| ())
}

/// On Kubernetes over an IPv6-only underlay.
#[test]
#[ignore = "needs root: namespaces, BPF"]
fn on_kubernetes_on_an_ipv6_underlay_traffic_does_not_stop_when_agents_restart(
) -> anyhow::Result<()> {
    let bins = Bins::beside_test()?;
    let opts = Options::fast().on_ipv6_underlay().on_kubernetes();
    run_and_report(&bins, "agent-restart", &opts).map(|_| ())
}
