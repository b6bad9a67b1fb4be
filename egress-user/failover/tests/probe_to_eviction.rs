//! The controller's path from a probe failure to an eviction, with real
//! probers on 127.0.0.1: the gateway's datastore heartbeat stays fresh, only
//! its datapath (here: its prober) dies, and the monitor still moves its EIPs.

use std::time::{Duration, Instant};

use egress_failover::monitor::{evaluate, EventType, NodeObservation, ProbeHealth};
use egress_failover::probe::SessionConfig;
use egress_failover::{FailoverTimers, Prober, ProberConfig, TunnelPhase};

fn config(accept_unknown_peers: bool) -> ProberConfig {
    ProberConfig {
        bind: "127.0.0.1:0".parse().unwrap(),
        session: SessionConfig {
            desired_min_tx_ms: 100,
            required_min_rx_ms: 100,
            detect_multiplier: 3,
        },
        accept_unknown_peers,
    }
}

#[tokio::test]
async fn a_dead_datapath_with_a_healthy_heartbeat_evicts() {
    let timers = FailoverTimers::default();
    let started = Instant::now();
    let (controller, mut events) = Prober::start(config(false)).await.unwrap();
    let (gateway, _gateway_events) = Prober::start(config(true)).await.unwrap();
    controller.add_peer(gateway.local_addr());

    let observe = |health: ProbeHealth, phase: TunnelPhase| NodeObservation {
        node: "gw1".into(),
        phase,
        // The heartbeat is renewed all along: the datastore is healthy.
        last_heartbeat: Some(Instant::now()),
        probe: health,
        eip_count: 2,
    };

    let event = tokio::time::timeout(Duration::from_secs(5), events.recv())
        .await
        .unwrap()
        .unwrap();
    let mut health = ProbeHealth::after(event.event);
    assert_eq!(health, ProbeHealth::Up);
    let d = evaluate(
        Instant::now(),
        started,
        &timers,
        &[observe(health, TunnelPhase::Ready)],
    );
    assert_eq!(d.phases["gw1"], TunnelPhase::Ready);
    assert!(d.evict.is_empty());

    let killed = Instant::now();
    gateway.abort();
    let event = tokio::time::timeout(Duration::from_millis(300 + 400), events.recv())
        .await
        .expect("the controller's prober reports the dead gateway within 3 x 100 ms + margin")
        .unwrap();
    health = ProbeHealth::after(event.event);
    assert_eq!(health, ProbeHealth::Down);
    let d = evaluate(
        Instant::now(),
        started,
        &timers,
        &[observe(health, TunnelPhase::Ready)],
    );
    assert_eq!(d.phases["gw1"], TunnelPhase::Failed);
    assert_eq!(d.evict, ["gw1"]);
    assert_eq!(d.events.len(), 1);
    assert_eq!(d.events[0].event_type, EventType::Warning);
    assert_eq!(
        d.events[0].message,
        "EgressTunnel gw1 status changes to Failed"
    );
    assert!(
        event.at - killed < timers.eip_eviction_timeout,
        "far faster than the heartbeat path"
    );
    controller.shutdown().await;
}
