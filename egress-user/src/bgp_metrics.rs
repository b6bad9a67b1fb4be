//! The BGP part of the Prometheus metrics, shared by every process that runs
//! a speaker (the agent, the controller's embedded reflector, `egress
//! reflector`). It reads the same [`Status`] that `egress bgp status` shows,
//! so the two never disagree.

use egress_bgp::{fsm::State, speaker::Status};
use prometheus_client::{
    encoding::text::encode,
    metrics::{family::Family, gauge::Gauge},
    registry::Registry,
};

type Labels = Vec<(String, String)>;

/// Every session state (RFC 4271 8.2.2), so a count of 0 is shown as 0.
pub const STATES: [State; 6] = [
    State::Idle,
    State::Connect,
    State::Active,
    State::OpenSent,
    State::OpenConfirm,
    State::Established,
];

/// A state as `egress bgp status` prints it.
pub fn state_name(s: State) -> String {
    format!("{s:?}")
}

/// Pure: how many sessions are in each state (every state present).
pub fn sessions_by_state(status: &Status) -> Vec<(State, usize)> {
    STATES
        .iter()
        .map(|s| (*s, status.peers.iter().filter(|p| p.state == *s).count()))
        .collect()
}

/// Registers the speaker's session and prefix metrics into `reg` (whose
/// prefix is `egress`).
pub fn register(reg: &mut Registry, status: &Status) {
    let sessions = Family::<Labels, Gauge>::default();
    reg.register(
        "bgp_sessions",
        "BGP sessions of this speaker, by FSM state",
        sessions.clone(),
    );
    for (state, n) in sessions_by_state(status) {
        sessions
            .get_or_create(&vec![("state".to_string(), state_name(state))])
            .set(n as i64);
    }
    let up = Family::<Labels, Gauge>::default();
    let received = Family::<Labels, Gauge>::default();
    let advertised = Family::<Labels, Gauge>::default();
    let stale = Family::<Labels, Gauge>::default();
    reg.register(
        "bgp_peer_up",
        "1 while the session with the peer is Established",
        up.clone(),
    );
    reg.register(
        "bgp_prefixes_received",
        "Prefixes received from the peer and kept (Adj-RIB-In)",
        received.clone(),
    );
    reg.register(
        "bgp_prefixes_advertised",
        "Prefixes advertised to the peer (Adj-RIB-Out)",
        advertised.clone(),
    );
    reg.register(
        "bgp_prefixes_stale",
        "Received prefixes kept only because the peer restarts gracefully",
        stale.clone(),
    );
    for p in &status.peers {
        let l = vec![("peer".to_string(), p.address.to_string())];
        up.get_or_create(&l)
            .set(i64::from(p.state == State::Established));
        received.get_or_create(&l).set(p.received as i64);
        advertised.get_or_create(&l).set(p.advertised as i64);
        stale.get_or_create(&l).set(p.stale as i64);
    }
    let best = Gauge::<i64>::default();
    best.set(status.best_routes as i64);
    reg.register("bgp_best_routes", "Best routes in this speaker's RIB", best);
}

/// The BGP metrics alone (`egress reflector`'s /metrics).
pub fn render(status: &Status) -> String {
    let mut reg = Registry::with_prefix("egress");
    register(&mut reg, status);
    let mut out = String::new();
    let _ = encode(&mut out, &reg);
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use egress_bgp::speaker::PeerStatus;

    pub(crate) fn status() -> Status {
        let peer = |addr: &str, state, received, advertised| PeerStatus {
            address: addr.parse().unwrap(),
            asn: 64512,
            client: true,
            state,
            received,
            advertised,
            stale: 0,
            graceful_restart: String::new(),
            bgp_id: None,
            bgp_id_shared_with: Vec::new(),
        };
        Status {
            local_asn: 64512,
            router_id: "10.10.0.254".parse().unwrap(),
            cluster_id: "10.10.0.254".parse().unwrap(),
            deferring: false,
            best_routes: 5,
            peers: vec![
                peer("10.10.0.1", State::Established, 2, 3),
                peer("10.10.0.2", State::Established, 1, 4),
                peer("10.10.0.3", State::Active, 0, 0),
            ],
        }
    }

    #[test]
    fn sessions_are_counted_per_state_and_prefixes_per_peer() {
        let text = render(&status());
        assert!(text.ends_with("# EOF\n"), "{text}");
        for line in [
            "# HELP egress_bgp_sessions BGP sessions of this speaker, by FSM state.",
            "# TYPE egress_bgp_sessions gauge",
            "egress_bgp_sessions{state=\"Established\"} 2",
            "egress_bgp_sessions{state=\"Active\"} 1",
            "egress_bgp_sessions{state=\"Idle\"} 0",
            "egress_bgp_peer_up{peer=\"10.10.0.1\"} 1",
            "egress_bgp_peer_up{peer=\"10.10.0.3\"} 0",
            "egress_bgp_prefixes_received{peer=\"10.10.0.1\"} 2",
            "egress_bgp_prefixes_advertised{peer=\"10.10.0.2\"} 4",
            "egress_bgp_prefixes_stale{peer=\"10.10.0.2\"} 0",
            "egress_bgp_best_routes 5",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in:\n{text}");
        }
    }
}
