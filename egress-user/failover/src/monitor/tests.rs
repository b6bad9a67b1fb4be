//! The phase rules of [`HeartbeatMonitor`], one tunnel at a time, and the
//! probe verdicts they take.

use std::time::Duration;

use super::*;
use crate::timers::FailoverTimers;
use TunnelPhase::*;

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

/// Default timers: 5 s / 5 s / 15 s.
fn timeout() -> Duration {
    FailoverTimers::default().eip_eviction_timeout
}

/// A registered, gateway-eligible node whose Node is Ready.
fn gateway(node: &str, phase: TunnelPhase) -> TunnelFacts<'_> {
    TunnelFacts {
        node,
        phase,
        node_ready: true,
        registered: true,
        eligible: true,
    }
}

struct Case {
    name: &'static str,
    facts: TunnelFacts<'static>,
    /// Milliseconds since the last heartbeat; None: never seen.
    silent_ms: Option<u64>,
    probe: ProbeHealth,
    want: TunnelPhase,
    want_event: Option<(EventType, &'static str)>,
}

fn case(
    name: &'static str,
    phase: TunnelPhase,
    silent_ms: Option<u64>,
    probe: ProbeHealth,
    want: TunnelPhase,
    want_event: Option<(EventType, &'static str)>,
) -> Case {
    Case {
        name,
        facts: gateway("gw1", phase),
        silent_ms,
        probe,
        want,
        want_event,
    }
}

const WARN: EventType = EventType::Warning;
const NORMAL: EventType = EventType::Normal;

#[rustfmt::skip]
fn cases() -> Vec<Case> {
    use ProbeHealth as P;
    let mut cases = vec![
        case("fresh heartbeat stays Ready", Ready, Some(1_000), P::Up, Ready, None),
        case("exactly the timeout is not yet a timeout", Ready, Some(15_000), P::Unknown, Ready, None),
        case("past the timeout", Ready, Some(15_001), P::Up, HeartbeatTimeout, Some((WARN, "HeartbeatTimeout"))),
        case("long past the timeout", Ready, Some(20_000), P::Unknown, HeartbeatTimeout, Some((WARN, "HeartbeatTimeout"))),
        case("still timed out: no new event", HeartbeatTimeout, Some(30_000), P::Down, HeartbeatTimeout, None),
        case("probe down with healthy datastore", Ready, Some(1_000), P::Down, Failed, Some((WARN, "Failed"))),
        case("probe admin down is not a failure", Ready, Some(1_000), P::AdminDown, Ready, None),
        case("heartbeat back: recovered", HeartbeatTimeout, Some(100), P::Unknown, Ready, Some((NORMAL, "Ready"))),
        case("probe back up: recovered", Failed, Some(100), P::Up, Ready, Some((NORMAL, "Ready"))),
        case("heartbeat back but probe still down", HeartbeatTimeout, Some(100), P::Down, Failed, Some((WARN, "Failed"))),
        case("never seen, within grace", Ready, None, P::Unknown, Ready, None),
        // A new leader has seen no heartbeat of a dead node yet: it is not
        // Ready (its EIPs still move), but waits as Init, not as dead.
        case("dead node under a new leader, within grace", HeartbeatTimeout, None, P::Unknown, Init, Some((WARN, "Init"))),
        case("dead node under a new leader, past the grace", HeartbeatTimeout, Some(15_001), P::Unknown, HeartbeatTimeout, None),
        case("first heartbeat makes an Init node Ready", Init, Some(100), P::Unknown, Ready, Some((NORMAL, "Ready"))),
        case("Init without a heartbeat stays Init", Init, None, P::Unknown, Init, None),
        case("a registered Pending node with a heartbeat is Ready", Pending, Some(100), P::Unknown, Ready, Some((NORMAL, "Ready"))),
    ];
    let mut with = |name, facts, want, want_event| {
        cases.push(Case {
            name,
            facts,
            silent_ms: Some(100),
            probe: ProbeHealth::Unknown,
            want,
            want_event,
        })
    };
    let unregistered = TunnelFacts {
        registered: false,
        ..gateway("gw1", Pending)
    };
    with("a node without tunnel address is left Pending", unregistered, Pending, None);
    let not_ready = TunnelFacts {
        node_ready: false,
        ..gateway("gw1", Ready)
    };
    with("a Node that is not Ready", not_ready, NodeNotReady, Some((WARN, "NodeNotReady")));
    let worker = TunnelFacts {
        eligible: false,
        ..gateway("gw1", Pending)
    };
    with("a worker needs no heartbeat", worker, Ready, Some((NORMAL, "Ready")));
    cases
}

#[test]
fn phase_table() {
    let started = Instant::now();
    let now = started + ms(60_000);
    for c in cases() {
        // "never seen" cases: the controller started 10 s ago.
        let mut m = HeartbeatMonitor::new(match c.silent_ms {
            None => now - ms(10_000),
            Some(_) => started,
        });
        if let Some(s) = c.silent_ms {
            m.observe("gw1", 1, "renewed", now - ms(s));
        }
        if c.probe == ProbeHealth::Down {
            m.set_probe_down(BTreeSet::from(["gw1".to_string()]));
        }
        assert_eq!(m.phase(&c.facts, now, timeout()), c.want, "{}", c.name);
        let changes = m.changes([c.facts], now, timeout());
        assert_eq!(
            changes.len(),
            usize::from(c.want != c.facts.phase),
            "{}",
            c.name
        );
        let event = changes.first().map(|ch| (ch.event_type(), ch.reason()));
        assert_eq!(event, c.want_event, "{}", c.name);
    }
}

#[test]
fn event_texts() {
    let now = Instant::now() + ms(100_000);
    let mut m = HeartbeatMonitor::new(now);
    m.observe("node-a", 1, "2026-01-01T00:00:00Z", now - ms(16_000));
    m.observe("node-b", 1, "2026-01-01T00:00:09Z", now - ms(10));
    let changes = m.changes(
        [
            gateway("node-a", Ready),
            gateway("node-b", HeartbeatTimeout),
        ],
        now,
        timeout(),
    );
    let got: Vec<_> = changes
        .iter()
        .map(|c| (c.node.as_str(), c.event_type(), c.reason(), c.message()))
        .collect();
    assert_eq!(
        got,
        vec![
            (
                "node-a",
                WARN,
                "HeartbeatTimeout",
                "EgressTunnel node-a status changes to HeartbeatTimeout".to_string()
            ),
            (
                "node-b",
                NORMAL,
                "Ready",
                "EgressTunnel node-b status changes to Ready".to_string()
            ),
        ]
    );
    assert_eq!(
        changes[1].last_heartbeat.as_deref(),
        Some("2026-01-01T00:00:09Z")
    );
}

#[test]
fn sub_second_timers() {
    let t = FailoverTimers::new(ms(100), ms(100), ms(300)).unwrap();
    let now = Instant::now() + ms(10_000);
    let phase_after = |silent| {
        let mut m = HeartbeatMonitor::new(now);
        m.observe("gw", 1, "", now - ms(silent));
        m.phase(&gateway("gw", Ready), now, t.eip_eviction_timeout)
    };
    assert_eq!(phase_after(300), Ready);
    assert_eq!(phase_after(301), HeartbeatTimeout);
}

#[test]
fn heartbeats_are_timed_on_the_monitors_clock() {
    let t0 = Instant::now();
    let mut m = HeartbeatMonitor::new(t0 - ms(1_000));
    assert_eq!(
        m.last_seen("a"),
        t0 - ms(1_000),
        "never seen: the grace start"
    );
    assert!(m.observe("a", 7, "", t0));
    assert!(!m.observe("a", 7, "", t0 + ms(5_000)));
    assert_eq!(m.last_seen("a"), t0);
    assert!(m.observe("a", 8, "", t0 + ms(6_000)));
    assert_eq!(m.last_seen("a"), t0 + ms(6_000));
    // A recreated lease restarts its counter: still a renewal.
    assert!(m.observe("a", 1, "", t0 + ms(7_000)));
    assert_eq!(m.last_seen("a"), t0 + ms(7_000));
}

#[test]
fn probe_health_from_events_and_majority() {
    let down = |reason| ProbeHealth::after(SessionEvent::SessionDown { reason });
    assert_eq!(ProbeHealth::after(SessionEvent::SessionUp), ProbeHealth::Up);
    assert_eq!(down(DownReason::DetectTimeExpired), ProbeHealth::Down);
    assert_eq!(down(DownReason::NeighborSignaledDown), ProbeHealth::Down);
    assert_eq!(down(DownReason::NeighborAdminDown), ProbeHealth::AdminDown);
    assert_eq!(down(DownReason::AdminDown), ProbeHealth::AdminDown);
    use ProbeHealth::*;
    let cases: &[(&[ProbeHealth], ProbeHealth)] = &[
        (&[], Unknown),
        (&[Down], Down),
        (&[Down, Up], Up),
        (&[Down, Down, Up], Down),
        (&[Down, Unknown, Unknown], Down),
        (&[AdminDown, Unknown], AdminDown),
        (&[AdminDown, Up], Up),
    ];
    for (views, want) in cases {
        assert_eq!(
            ProbeHealth::combine(views.iter().copied()),
            *want,
            "{views:?}"
        );
    }
}
