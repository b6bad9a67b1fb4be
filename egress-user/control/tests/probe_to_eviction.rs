//! The controller's path from a probe failure to an eviction, with real
//! probers on 127.0.0.1 and the controller's own pass on the memory
//! datastore: the gateway's heartbeat stays fresh, only its datapath (here:
//! its prober) dies, and the pass marks it Failed and moves its EIP.

mod fixture;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use egress_control::api::TunnelPhase;
use egress_control::controller::{
    tick_cached_report, HeartbeatMonitor, RunConfig, TickReport, ViewCache,
};
use egress_control::datastore::memory::MemoryDatastore;
use egress_control::datastore::{Datastore, Event, Kind};
use egress_failover::monitor::ProbeHealth;
use egress_failover::probe::SessionConfig;
use egress_failover::{FailoverTimers, Prober, ProberConfig};

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

/// The controller's state between passes.
struct Controller {
    ds: MemoryDatastore,
    cache: ViewCache,
    monitor: HeartbeatMonitor,
    cfg: RunConfig,
}

impl Controller {
    /// One pass after both gateways renewed their heartbeats (the datastore
    /// is healthy), with the probes' verdict on gw1.
    async fn pass(&mut self, gw1: ProbeHealth) -> TickReport {
        for node in ["gw1", "gw2"] {
            self.ds
                .renew_heartbeat(node, Duration::from_secs(60))
                .await
                .unwrap();
        }
        let down = (gw1 == ProbeHealth::Down).then(|| "gw1".to_string());
        self.monitor
            .set_probe_down(down.into_iter().collect::<BTreeSet<_>>());
        tick_cached_report(&self.ds, &mut self.cache, &mut self.monitor, &self.cfg)
            .await
            .unwrap()
    }

    async fn tunnel_events(&self) -> Vec<Event> {
        let events = self.ds.events().await.unwrap();
        events
            .into_iter()
            .filter(|e| e.kind == Kind::EgressTunnel)
            .collect()
    }
}

#[tokio::test]
async fn a_dead_datapath_with_a_healthy_heartbeat_evicts() {
    let timers = FailoverTimers::default();
    let ds = fixture::two_gateway_nodes("10.0.0.1", ["gw1", "gw2"]).await;
    let cache = ViewCache::start_for_controller(&ds).await.unwrap();
    let cfg = RunConfig {
        timers,
        ..Default::default()
    };
    let monitor = HeartbeatMonitor::new(Instant::now());
    let mut ctl = Controller {
        ds,
        cache,
        monitor,
        cfg,
    };
    let (controller, mut events) = Prober::start(config(false)).await.unwrap();
    let (gateway, _gateway_events) = Prober::start(config(true)).await.unwrap();
    controller.add_peer(gateway.local_addr());

    let event = tokio::time::timeout(Duration::from_secs(5), events.recv())
        .await
        .unwrap()
        .unwrap();
    let mut health = ProbeHealth::after(event.event);
    assert_eq!(health, ProbeHealth::Up);
    let report = ctl.pass(health).await;
    assert_eq!(ctl.cache.view.phase("gw1"), TunnelPhase::Ready);
    assert!(report.moves.is_empty(), "{:?}", report.moves);

    let killed = Instant::now();
    gateway.abort();
    let event = tokio::time::timeout(Duration::from_millis(300 + 400), events.recv())
        .await
        .expect("the controller's prober reports the dead gateway within 3 x 100 ms + margin")
        .unwrap();
    health = ProbeHealth::after(event.event);
    assert_eq!(health, ProbeHealth::Down);
    let report = ctl.pass(health).await;
    assert_eq!(ctl.cache.view.phase("gw1"), TunnelPhase::Failed);
    let moved: Vec<_> = report.moves.iter().map(|m| m.from.as_str()).collect();
    assert_eq!(moved, ["gw1"]);
    let tunnel_events = ctl.tunnel_events().await;
    assert_eq!(tunnel_events.len(), 1, "{tunnel_events:?}");
    assert_eq!(tunnel_events[0].type_, "Warning");
    assert_eq!(
        tunnel_events[0].message,
        "EgressTunnel gw1 status changes to Failed"
    );
    assert!(
        event.at - killed < timers.eip_eviction_timeout,
        "far faster than the heartbeat path"
    );
    controller.shutdown().await;
}
