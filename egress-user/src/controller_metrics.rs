//! The controller's Prometheus metrics: leadership, passes, failovers,
//! heartbeat ages and probe states per node, and the embedded reflector's
//! BGP sessions. [`facts`] takes a snapshot of the loop's plain data at
//! scrape time; [`render`] turns a snapshot into text and does nothing else.

use std::{collections::BTreeMap, sync::atomic::Ordering::Relaxed, time::Duration};

use egress_bgp::speaker::Status;
use egress_control::controller::{FailoverReason, LoopStats};
use egress_failover::monitor::ProbeHealth;
use prometheus_client::{
    encoding::text::encode,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

use crate::prom::register_gauge;

type Labels = Vec<(String, String)>;

/// Everything the controller's metrics show, as plain data.
#[derive(Clone, Debug, Default)]
pub struct ControllerFacts {
    pub leader: bool,
    pub term: u64,
    pub passes: u64,
    pub writes: u64,
    pub errors: u64,
    /// EIP moves this replica wrote, by reason.
    pub failovers: BTreeMap<FailoverReason, u64>,
    /// While leading: time since each gateway-eligible node's last heartbeat.
    pub heartbeat_age: BTreeMap<String, Duration>,
    /// The datapath probe's view of each gateway-eligible node (None: probes off).
    pub probes: Option<BTreeMap<String, ProbeHealth>>,
    /// The embedded reflector's status (None: no reflector in this process).
    pub bgp: Option<Status>,
    /// Port grants of the last written pass.
    pub ports: egress_control::controller::ports::PortFacts,
}

/// Pure: the snapshot of the loop's counters at `now`.
pub fn facts(
    stats: &LoopStats,
    now: tokio::time::Instant,
    probes: Option<BTreeMap<String, ProbeHealth>>,
    bgp: Option<Status>,
) -> ControllerFacts {
    ControllerFacts {
        leader: stats.leader.load(Relaxed),
        term: stats.term.load(Relaxed),
        passes: stats.passes.load(Relaxed),
        writes: stats.writes.load(Relaxed),
        errors: stats.errors.load(Relaxed),
        failovers: stats
            .failovers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone(),
        heartbeat_age: stats
            .last_heartbeat
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(n, t)| (n.clone(), now.saturating_duration_since(*t)))
            .collect(),
        probes,
        bgp,
        ports: stats
            .ports
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone(),
    }
}

/// The label of a probe health.
pub fn health_name(h: ProbeHealth) -> &'static str {
    match h {
        ProbeHealth::Unknown => "unknown",
        ProbeHealth::Up => "up",
        ProbeHealth::Down => "down",
        ProbeHealth::AdminDown => "admin_down",
    }
}

const HEALTHS: [ProbeHealth; 4] = [
    ProbeHealth::Unknown,
    ProbeHealth::Up,
    ProbeHealth::Down,
    ProbeHealth::AdminDown,
];

/// Renders the metrics in the OpenMetrics text format.
pub fn render(f: &ControllerFacts) -> String {
    let mut reg = Registry::with_prefix("egress");
    register_leadership_and_passes(&mut reg, f);
    register_failovers(&mut reg, f);
    register_heartbeat_ages(&mut reg, f);
    if let Some(probes) = &f.probes {
        register_probes(&mut reg, probes);
    }
    crate::controller_port_metrics::register(&mut reg, &f.ports);
    if let Some(status) = &f.bgp {
        crate::bgp_metrics::register(&mut reg, status);
    }
    let mut out = String::new();
    let _ = encode(&mut out, &reg);
    out
}

/// A counter at `v`, registered as `name`.
fn register_counter(reg: &mut Registry, name: &str, help: &str, v: u64) {
    let c = Counter::<u64>::default();
    c.inc_by(v);
    reg.register(name, help, c);
}

/// `controller_*`: whether this replica leads, its term, and its passes'
/// counters.
fn register_leadership_and_passes(reg: &mut Registry, f: &ControllerFacts) {
    register_gauge(
        reg,
        "controller_leader",
        "1 while this replica leads (only the leader writes and moves EIPs)",
        i64::from(f.leader),
    );
    register_gauge(
        reg,
        "controller_term",
        "Leadership term this replica last held",
        f.term as i64,
    );
    register_counter(
        reg,
        "controller_passes",
        "Reconcile passes as leader",
        f.passes,
    );
    register_counter(
        reg,
        "controller_writes",
        "Objects written by reconcile passes",
        f.writes,
    );
    register_counter(
        reg,
        "controller_errors",
        "Reconcile passes that failed",
        f.errors,
    );
}

/// `failovers`: the EIP moves this replica wrote, by reason.
fn register_failovers(reg: &mut Registry, f: &ControllerFacts) {
    let failovers = Family::<Labels, Counter>::default();
    reg.register(
        "failovers",
        "EIPs moved off a node that could no longer hold them, by reason (written by this replica as leader)",
        failovers.clone(),
    );
    // The causes the failover design names are shown from the start, at 0.
    for r in [
        FailoverReason::HeartbeatTimeout,
        FailoverReason::ProbeFailed,
    ] {
        failovers
            .get_or_create(&vec![("reason".to_string(), r.as_str().to_string())])
            .inc_by(0);
    }
    for (r, n) in &f.failovers {
        failovers
            .get_or_create(&vec![("reason".to_string(), r.as_str().to_string())])
            .inc_by(*n);
    }
}

/// `heartbeat_age_seconds` per gateway-eligible node.
fn register_heartbeat_ages(reg: &mut Registry, f: &ControllerFacts) {
    let age = Family::<Labels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
    reg.register(
        "heartbeat_age_seconds",
        "Seconds since the last heartbeat the leader saw from a gateway-eligible node (since it began leading, for a node not seen yet)",
        age.clone(),
    );
    for (node, d) in &f.heartbeat_age {
        age.get_or_create(&vec![("node".to_string(), node.clone())])
            .set(d.as_secs_f64());
    }
}

/// `probe_up` and `probe_state`: the datapath probe's view of each node.
fn register_probes(reg: &mut Registry, probes: &BTreeMap<String, ProbeHealth>) {
    let up = Family::<Labels, Gauge>::default();
    let state = Family::<Labels, Gauge>::default();
    reg.register(
        "probe_up",
        "1 while the controller's datapath probe of the node is up",
        up.clone(),
    );
    reg.register(
        "probe_state",
        "The datapath probe's state per node: 1 for the current state (unknown, up, down, admin_down)",
        state.clone(),
    );
    for (node, h) in probes {
        up.get_or_create(&vec![("node".to_string(), node.clone())])
            .set(i64::from(*h == ProbeHealth::Up));
        for s in HEALTHS {
            state
                .get_or_create(&vec![
                    ("node".to_string(), node.clone()),
                    ("state".to_string(), health_name(s).to_string()),
                ])
                .set(i64::from(s == *h));
        }
    }
}

/// Content type of [`render`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[cfg(test)]
mod tests {
    use super::*;

    fn has(text: &str, line: &str) -> bool {
        text.lines().any(|l| l == line)
    }

    #[test]
    fn failovers_heartbeats_probes_and_bgp() {
        let f = ControllerFacts {
            leader: true,
            term: 3,
            passes: 10,
            writes: 4,
            errors: 0,
            failovers: BTreeMap::from([(FailoverReason::ProbeFailed, 2)]),
            heartbeat_age: BTreeMap::from([
                ("g1".to_string(), Duration::from_millis(2500)),
                ("g2".to_string(), Duration::from_millis(100)),
            ]),
            probes: Some(BTreeMap::from([
                ("g1".to_string(), ProbeHealth::Down),
                ("g2".to_string(), ProbeHealth::Up),
            ])),
            bgp: Some(crate::bgp_metrics::tests::status()),
            ports: Default::default(),
        };
        let text = render(&f);
        for line in [
            "# HELP egress_failovers EIPs moved off a node that could no longer hold them, by reason (written by this replica as leader).",
            "# TYPE egress_failovers counter",
            "egress_failovers_total{reason=\"probe_failed\"} 2",
            "egress_failovers_total{reason=\"heartbeat_timeout\"} 0",
            "egress_controller_leader 1",
            "egress_controller_term 3",
            "egress_controller_passes_total 10",
            "# TYPE egress_heartbeat_age_seconds gauge",
            "egress_heartbeat_age_seconds{node=\"g1\"} 2.5",
            "egress_heartbeat_age_seconds{node=\"g2\"} 0.1",
            "egress_probe_up{node=\"g1\"} 0",
            "egress_probe_up{node=\"g2\"} 1",
            "egress_probe_state{node=\"g1\",state=\"down\"} 1",
            "egress_probe_state{node=\"g1\",state=\"up\"} 0",
            "egress_bgp_sessions{state=\"Established\"} 2",
            "egress_bgp_prefixes_received{peer=\"10.10.0.1\"} 2",
        ] {
            assert!(has(&text, line), "no {line:?} in:\n{text}");
        }
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    #[test]
    fn a_replica_without_probes_or_reflector_shows_neither() {
        let text = render(&ControllerFacts::default());
        assert!(has(&text, "egress_controller_leader 0"), "{text}");
        assert!(
            has(
                &text,
                "egress_failovers_total{reason=\"heartbeat_timeout\"} 0"
            ),
            "{text}"
        );
        assert!(!text.contains("egress_probe_up"), "{text}");
        assert!(!text.contains("egress_bgp_"), "{text}");
        assert!(!text.contains("egress_heartbeat_age_seconds{"), "{text}");
    }

    #[test]
    fn facts_take_ages_at_scrape_time_and_count_per_reason() {
        use egress_control::controller::{EipMove, TickReport};
        let stats = LoopStats::default();
        let t0 = tokio::time::Instant::now();
        let mv = |reason| EipMove {
            gateway: "default".into(),
            what: "EIP 10.10.0.200".into(),
            from: "g1".into(),
            to: "g2".into(),
            reason,
        };
        stats.record(TickReport {
            writes: 3,
            moves: vec![
                mv(FailoverReason::ProbeFailed),
                mv(FailoverReason::ProbeFailed),
            ],
            last_heartbeat: BTreeMap::from([("g1".to_string(), t0)]),
            ports: Default::default(),
        });
        stats.record(TickReport {
            writes: 1,
            moves: vec![mv(FailoverReason::HeartbeatTimeout)],
            last_heartbeat: BTreeMap::from([("g1".to_string(), t0)]),
            ports: Default::default(),
        });
        let f = facts(&stats, t0 + Duration::from_secs(2), None, None);
        assert_eq!(f.failovers[&FailoverReason::ProbeFailed], 2);
        assert_eq!(f.failovers[&FailoverReason::HeartbeatTimeout], 1);
        assert_eq!(f.heartbeat_age["g1"], Duration::from_secs(2));
        stats.lost_leadership();
        let f = facts(&stats, t0, None, None);
        assert!(f.heartbeat_age.is_empty(), "a follower shows no ages");
        assert_eq!(f.failovers.len(), 2, "counters survive a leadership change");
    }
}
