//! At most one announcer over a partition: a deterministic simulation of
//! two gateway agents (their `Fence`s) and the controller's own pass
//! (`tick_cached_report`: the heartbeat monitor, reconcile, the writes) on
//! the memory datastore, stepped 1 ms at a time on a paused clock.
//!
//! Node "a" owns the EIP at epoch 1 and loses the datastore at T0; the
//! controller moves the EIP to "b" once "a"'s heartbeat is
//! `eipEvictionTimeout` old; "a" comes back later. Checked at every step:
//! never two announcers; "a" silent from T0 + eipEvictionTimeout at the
//! latest; "b" takes over; no move back.

mod fixture;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use egress_control::api::EgressGateway;
use egress_control::controller::{
    tick_cached_report, HeartbeatMonitor, RunConfig, TickReport, ViewCache,
};
use egress_control::datastore::memory::MemoryDatastore;
use egress_control::datastore::Datastore;
use egress_failover::fence::{Assignment, Fence};
use egress_failover::FailoverTimers;

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

const NODES: [&str; 2] = ["a", "b"];

/// The EIP's assignment in the controller's view (its writes included).
fn assignment(cache: &ViewCache) -> Option<Assignment> {
    let gw: &EgressGateway = cache.view.gateways.first()?;
    let st = gw.status.as_ref()?;
    st.node_list.iter().find_map(|n| {
        let e = n.eips.first()?;
        Some(Assignment {
            eip: e.ipv4.parse::<IpAddr>().ok()?,
            node: n.name.clone(),
            epoch: e.epoch,
        })
    })
}

#[tokio::test(start_paused = true)]
async fn at_most_one_announcer_over_a_partition() {
    let timers = FailoverTimers::new(ms(100), ms(100), ms(300)).unwrap();
    let mut runs = 0;
    for latency in [0u64, 1, 7, 20] {
        for monitor_phase in [0u64, 37, 99] {
            for partition_at in [1000u64, 1001, 1050, 1099] {
                Simulation::new(&timers, latency, monitor_phase, partition_at)
                    .await
                    .run()
                    .await;
                runs += 1;
            }
        }
    }
    assert_eq!(runs, 48);
}

/// Renewals in flight: (lands in the datastore at, answered at, node, sent at).
type InFlight = Vec<(u64, u64, &'static str, u64)>;

struct Simulation {
    ctx: String,
    timers: FailoverTimers,
    latency: u64,
    monitor_phase: u64,
    partition_at: u64,
    heal_at: u64,
    t0: Instant,
    clock0: tokio::time::Instant,
    ds: MemoryDatastore,
    cache: ViewCache,
    monitor: HeartbeatMonitor,
    cfg: RunConfig,
    /// Every assignment the controller wrote, with the time it wrote it.
    history: Vec<(u64, Assignment)>,
    in_flight: InFlight,
    fences: BTreeMap<&'static str, Fence>,
    moved_at: Option<u64>,
    b_announced_at: Option<u64>,
}

impl Simulation {
    async fn new(
        timers: &FailoverTimers,
        latency: u64,
        monitor_phase: u64,
        partition_at: u64,
    ) -> Self {
        let ds = fixture::two_gateway_nodes("10.0.0.10", NODES).await;
        let cfg = RunConfig {
            timers: *timers,
            ..Default::default()
        };
        let clock0 = tokio::time::Instant::now();
        let mut monitor = HeartbeatMonitor::new(clock0.into_std());
        let mut cache = ViewCache::start_for_controller(&ds).await.unwrap();
        // The controller's first pass, at T = 0: "a" gets the EIP, epoch 1.
        tick_cached_report(&ds, &mut cache, &mut monitor, &cfg)
            .await
            .unwrap();
        let first = assignment(&cache).expect("the EIP is assigned");
        assert_eq!((first.node.as_str(), first.epoch), ("a", 1));
        Self {
            ctx: format!("latency {latency} ms, monitor phase {monitor_phase} ms, partition at {partition_at} ms"),
            timers: *timers,
            latency,
            monitor_phase,
            partition_at,
            heal_at: partition_at + 2000,
            t0: Instant::now(),
            clock0,
            ds,
            cache,
            monitor,
            cfg,
            history: vec![(0, first)],
            in_flight: Vec::new(),
            fences: NODES.iter().map(|n| (*n, Fence::new(*n, timers))).collect(),
            moved_at: None,
            b_announced_at: None,
        }
    }

    fn at(&self, v: u64) -> Instant {
        self.t0 + ms(v)
    }

    fn partitioned(&self, node: &str, now: u64) -> bool {
        node == "a" && (self.partition_at..self.heal_at).contains(&now)
    }

    async fn run(mut self) {
        let end = self.heal_at + 2000;
        for now in 0..=end {
            self.renewals(now).await;
            let monitor = self.timers.tunnel_monitor_period.as_millis() as u64;
            if now % monitor == self.monitor_phase % monitor {
                self.controller_pass(now).await;
            }
            self.agents_read(now);
            self.check(now);
        }
        self.check_end(end);
    }

    /// Agents renew; a partitioned agent's renewals are lost, and so is the
    /// answer to a renewal sent before the partition.
    async fn renewals(&mut self, now: u64) {
        let update = self.timers.tunnel_update_period.as_millis() as u64;
        for (i, node) in NODES.iter().enumerate() {
            if (now + i as u64 * 13).is_multiple_of(update) && !self.partitioned(node, now) {
                self.in_flight
                    .push((now + self.latency, now + 2 * self.latency, node, now));
            }
        }
        let mut still = InFlight::new();
        for (lands, answered, node, sent) in std::mem::take(&mut self.in_flight) {
            if lands == now {
                self.ds.renew_heartbeat(node, ms(60_000)).await.unwrap();
            }
            if answered != now {
                still.push((lands, answered, node, sent));
            } else if !self.partitioned(node, now) {
                let sent_at = self.at(sent);
                self.fences
                    .get_mut(node)
                    .unwrap()
                    .on_heartbeat_renewed(sent_at);
            }
        }
        self.in_flight = still;
    }

    /// The controller's pass as production runs it, at `now` on its clock.
    async fn controller_pass(&mut self, now: u64) {
        let at = self.clock0 + ms(now);
        tokio::time::advance(at.saturating_duration_since(tokio::time::Instant::now())).await;
        let report: TickReport =
            tick_cached_report(&self.ds, &mut self.cache, &mut self.monitor, &self.cfg)
                .await
                .unwrap();
        for m in &report.moves {
            assert_eq!(
                (m.from.as_str(), m.to.as_str()),
                ("a", "b"),
                "{}: only a is evicted",
                self.ctx
            );
        }
        let current = assignment(&self.cache).expect("the EIP stays assigned");
        if current != self.history.last().unwrap().1 {
            self.history.push((now, current));
            self.moved_at.get_or_insert(now);
        }
    }

    /// Agents read the assignment as it was `latency` ago.
    fn agents_read(&mut self, now: u64) {
        for node in NODES {
            if self.partitioned(node, now) {
                continue;
            }
            let visible = self
                .history
                .iter()
                .rev()
                .find(|(w, _)| w + self.latency <= now)
                .map(|(_, a)| a.clone());
            if let Some(a) = visible {
                let at = self.at(now);
                self.fences
                    .get_mut(node)
                    .unwrap()
                    .apply_assignments(at, [a]);
            }
        }
    }

    fn check(&mut self, now: u64) {
        let (ctx, at) = (&self.ctx, self.at(now));
        let eviction = self.timers.eip_eviction_timeout.as_millis() as u64;
        let announcing: Vec<&str> = NODES
            .into_iter()
            .filter(|n| !self.fences[n].announcements(at).is_empty())
            .collect();
        assert!(
            announcing.len() <= 1,
            "{ctx}: {announcing:?} announce at {now} ms"
        );
        if now >= self.partition_at + eviction {
            assert!(
                !announcing.contains(&"a"),
                "{ctx}: a still announces at {now} ms"
            );
        }
        if announcing == ["b"] {
            self.b_announced_at.get_or_insert(now);
            let epochs: Vec<u64> = self.fences["b"]
                .announcements(at)
                .iter()
                .map(|a| a.epoch)
                .collect();
            assert_eq!(epochs, [2], "{ctx}");
        }
        if now > 500 && now < self.partition_at {
            assert_eq!(announcing, ["a"], "{ctx}: a announces before the partition");
        }
    }

    fn check_end(&self, end: u64) {
        let ctx = &self.ctx;
        let update = self.timers.tunnel_update_period.as_millis() as u64;
        let eviction = self.timers.eip_eviction_timeout.as_millis() as u64;
        let moved_at = self.moved_at.expect("the EIP moved");
        assert!(
            moved_at >= self.partition_at + eviction - update,
            "{ctx}: moved too early at {moved_at}"
        );
        assert!(
            self.at(moved_at)
                <= self.at(self.partition_at + self.latency) + self.timers.worst_case_detection(),
            "{ctx}: moved late at {moved_at}"
        );
        assert!(
            self.b_announced_at
                .is_some_and(|t| t <= moved_at + self.latency),
            "{ctx}: b took over"
        );
        assert_eq!(self.history.len(), 2, "{ctx}: exactly one move, none back");
        assert!(
            self.fences["a"].announcements(self.at(end)).is_empty(),
            "{ctx}: a stays silent after healing"
        );
    }
}
