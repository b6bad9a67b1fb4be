//! The agent's Prometheus metrics, read from the pinned maps at scrape time
//! (the maps are the source of truth; nothing is double-counted in
//! userspace).

use std::{collections::BTreeMap, path::Path};

use prometheus_client::{
    encoding::text::encode,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

use crate::prom::register_gauge;

use crate::datapath::stats::{read_drops, read_nat_use, read_policy_stats};

type Labels = Vec<(String, String)>;

/// What the agent knows beyond the maps, for labels and gauges.
#[derive(Clone, Debug, Default)]
pub struct AgentFacts {
    /// Policy id -> "kind/namespace/name".
    pub policy_names: BTreeMap<u32, String>,
    /// Policies the maps could not hold.
    pub over_capacity: Vec<egress_control::api::PolicyOverCapacity>,
    pub announced_eips: usize,
    pub fenced: bool,
    pub reconciles: u64,
    /// Full lists of the datastore, and batches of watch events (see `/state`).
    pub datastore_lists: u64,
    pub watch_batches: u64,
    pub bgp_learned_routes: usize,
    /// Time since this node's last successful heartbeat renewal (None: the
    /// node does not heartbeat, not gateway-eligible, or has not renewed yet).
    pub heartbeat_renewal_age: Option<std::time::Duration>,
    /// The node's BGP speaker (None: BGP off).
    pub bgp: Option<egress_bgp::speaker::Status>,
    /// The gateway's replies leave by the XDP program (else by TC alone).
    pub uplink_xdp: bool,
}

/// Renders the metrics in Prometheus' text format.
pub fn render(pin_dir: &Path, facts: &AgentFacts) -> String {
    let mut reg = Registry::with_prefix("egress");
    register_policy_traffic(&mut reg, pin_dir, facts);
    register_over_capacity(&mut reg, facts);
    register_drops(&mut reg, pin_dir);
    register_nat(&mut reg, pin_dir);
    register_node_state(&mut reg, facts);
    register_reply_path(&mut reg, pin_dir, facts);
    if let Some(status) = &facts.bgp {
        crate::bgp_metrics::register(&mut reg, status);
    }
    register_loop_counters(&mut reg, facts);
    let mut out = String::new();
    let _ = encode(&mut out, &reg);
    out
}

/// `policy_packets` and `policy_bytes`: the policy counters, by policy name
/// and direction.
fn register_policy_traffic(reg: &mut Registry, pin_dir: &Path, facts: &AgentFacts) {
    let packets = Family::<Labels, Counter>::default();
    let bytes = Family::<Labels, Counter>::default();
    reg.register(
        "policy_packets",
        "Packets matched by a policy, by direction",
        packets.clone(),
    );
    reg.register(
        "policy_bytes",
        "Bytes matched by a policy, by direction",
        bytes.clone(),
    );
    let Ok(stats) = read_policy_stats(pin_dir) else {
        return;
    };
    for (id, s) in stats {
        let name = facts
            .policy_names
            .get(&id)
            .cloned()
            .unwrap_or_else(|| format!("id:{id}"));
        for (dir, p, b) in [
            ("egress", s.egress_packets, s.egress_bytes),
            ("reply", s.reply_packets, s.reply_bytes),
        ] {
            let l = vec![
                ("policy".to_string(), name.clone()),
                ("direction".to_string(), dir.to_string()),
            ];
            packets.get_or_create(&l).inc_by(p);
            bytes.get_or_create(&l).inc_by(b);
        }
    }
}

/// `policy_over_capacity` per policy and `policies_over_capacity`, their count.
fn register_over_capacity(reg: &mut Registry, facts: &AgentFacts) {
    let over = Family::<Labels, Gauge>::default();
    reg.register(
        "policy_over_capacity",
        "Policies this node's datapath cannot hold (their traffic is dropped): what the policy needs, by the limit it exceeds and that limit's size",
        over.clone(),
    );
    // The count is always there (an empty family prints nothing): an
    // alert on `egress_policies_over_capacity > 0` needs no per-policy series.
    register_gauge(
        reg,
        "policies_over_capacity",
        "How many policies this node's datapath cannot hold (0 when all fit)",
        facts.over_capacity.len() as i64,
    );
    for r in &facts.over_capacity {
        let l = vec![
            (
                "policy".to_string(),
                crate::agent::capacity::policy_label(r),
            ),
            ("limit".to_string(), r.limit.clone()),
            ("max".to_string(), r.max.to_string()),
        ];
        over.get_or_create(&l).set(r.count as i64);
    }
}

/// `drops`: the datapath's drop counters, by reason.
fn register_drops(reg: &mut Registry, pin_dir: &Path) {
    let drops = Family::<Labels, Counter>::default();
    reg.register(
        "drops",
        "Packets dropped by the datapath, by reason",
        drops.clone(),
    );
    if let Ok(d) = read_drops(pin_dir) {
        for (reason, c) in d {
            drops
                .get_or_create(&vec![("reason".to_string(), reason.to_string())])
                .inc_by(c.packets);
        }
    }
}

/// The NAT table's use per EIP, its events and how full it is.
fn register_nat(reg: &mut Registry, pin_dir: &Path) {
    let nat_entries = Family::<Labels, Gauge>::default();
    let ports = Family::<Labels, Gauge>::default();
    reg.register(
        "nat_entries",
        "NAT entries per EIP on this worker",
        nat_entries.clone(),
    );
    reg.register(
        "nat_ports_in_use",
        "EIP ports in use on this worker",
        ports.clone(),
    );
    let events = Family::<Labels, Counter>::default();
    reg.register(
        "nat_events",
        "NAT events on this worker: `new` translations made; `tcp_midstream`, TCP \
         segments other than a SYN that found no translation (evicted from a full \
         table, or begun before the policy applied): the server resets those connections",
        events.clone(),
    );
    if let Ok(ev) = crate::datapath::stats::read_nat_events(pin_dir) {
        for (event, c) in ev {
            events
                .get_or_create(&vec![("event".to_string(), event.to_string())])
                .inc_by(c.packets);
        }
    }
    let mut nat_total = 0u64;
    if let Ok(uses) = read_nat_use(pin_dir) {
        for u in uses {
            let l = vec![("eip".to_string(), u.eip.to_string())];
            nat_entries.get_or_create(&l).set(u.entries as i64);
            ports.get_or_create(&l).set(u.ports_in_use as i64);
            nat_total += u.entries;
        }
    }
    register_nat_fill(reg, pin_dir, nat_total);
}

/// The node's own state: EIPs announced, fencing, routes learned and the
/// heartbeat's age.
fn register_node_state(reg: &mut Registry, facts: &AgentFacts) {
    register_gauge(
        reg,
        "announced_eips",
        "EIPs this node announces now",
        facts.announced_eips as i64,
    );
    register_gauge(
        reg,
        "fenced",
        "1 while this gateway-eligible node has fenced itself (datastore lost too long) and announces no EIP; always 0 on other nodes",
        i64::from(facts.fenced),
    );
    register_gauge(
        reg,
        "bgp_learned_routes",
        "Routes learned from the reflectors",
        facts.bgp_learned_routes as i64,
    );
    if let Some(age) = facts.heartbeat_renewal_age {
        let g = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        g.set(age.as_secs_f64());
        reg.register(
            "heartbeat_renewal_age_seconds",
            "Seconds since this node last renewed its heartbeat in the datastore",
            g,
        );
    }
}

/// `uplink_xdp`: whether the XDP program is attached, and `xdp_tx`: what
/// it sent, by path (the TC paths' packets are not in it).
fn register_reply_path(reg: &mut Registry, pin_dir: &Path, facts: &AgentFacts) {
    register_gauge(
        reg,
        "uplink_xdp",
        "1 when the gateway's common replies and forwards leave by the native XDP program on the uplink, 0 when by TC alone (the agent's /state says why)",
        i64::from(facts.uplink_xdp),
    );
    let sent = Family::<Labels, Counter>::default();
    reg.register(
        "xdp_tx",
        "Packets the gateway's XDP program sent back out of the uplink, by path: reply (steered to a worker, encapsulated), forward (decapsulated, to the server)",
        sent.clone(),
    );
    if let Ok(t) = crate::datapath::stats::read_xdp_tx(pin_dir) {
        for (path, c) in t {
            sent.get_or_create(&vec![("path".to_string(), path.to_string())])
                .inc_by(c.packets);
        }
    }
}

/// The agent loop's counters: reconciles, datastore lists and watch batches.
fn register_loop_counters(reg: &mut Registry, facts: &AgentFacts) {
    for (name, help, n) in [
        (
            "reconciles",
            "Reconcile passes that wrote the maps",
            facts.reconciles,
        ),
        (
            "datastore_lists",
            "Full lists of the datastore (start, a failed watch, every 5 minutes)",
            facts.datastore_lists,
        ),
        (
            "watch_batches",
            "Batches of datastore watch events applied to the agent's view",
            facts.watch_batches,
        ),
    ] {
        let c = Counter::<u64>::default();
        c.inc_by(n);
        reg.register(name, help, c);
    }
}

/// How full the NAT table is. An LRU table that is full makes room for a
/// new flow by evicting the least recently used entry: an idle flow first,
/// a live one only under real overload; an evicted live flow's next reply
/// is dropped as `no_nat_entry` (docs/deploy.md, "Limits").
fn register_nat_fill(reg: &mut Registry, pin_dir: &std::path::Path, entries: u64) {
    let Some(capacity) =
        crate::datapath::loader::pinned_capacity(pin_dir, egress_common::maps::NAT_REV)
    else {
        return;
    };
    let cap = Gauge::<i64>::default();
    cap.set(i64::from(capacity));
    reg.register(
        "nat_table_capacity",
        "Entries the NAT table holds (each of the forward and reverse tables)",
        cap,
    );
    let used = Gauge::<i64>::default();
    used.set(entries as i64);
    reg.register(
        "nat_table_entries",
        "Entries in the NAT table now, idle ones not yet evicted included",
        used,
    );
    let fill = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
    fill.set(entries as f64 / f64::from(capacity.max(1)));
    reg.register(
        "nat_table_fill_ratio",
        "NAT table entries over its capacity; at 1 new flows evict the least recently used",
        fill,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_over_capacity_is_a_gauge_of_what_it_needs() {
        let facts = AgentFacts {
            over_capacity: vec![egress_control::api::PolicyOverCapacity {
                kind: "EgressPolicy".into(),
                namespace: "ns".into(),
                name: "big".into(),
                limit: "destinationCIDRs".into(),
                count: 20000,
                max: 16384,
            }],
            ..Default::default()
        };
        let text = render(Path::new("/nonexistent"), &facts);
        let line = text
            .lines()
            .find(|l| l.starts_with("egress_policy_over_capacity{"))
            .unwrap_or_else(|| panic!("{text}"));
        for part in [
            "policy=\"EgressPolicy/ns/big\"",
            "limit=\"destinationCIDRs\"",
            "max=\"16384\"",
            "} 20000",
        ] {
            assert!(line.contains(part), "{part} in {line}");
        }
    }

    #[test]
    fn renders_gauges_even_without_maps() {
        let facts = AgentFacts {
            announced_eips: 2,
            fenced: true,
            reconciles: 5,
            datastore_lists: 2,
            watch_batches: 7,
            ..Default::default()
        };
        let text = render(Path::new("/nonexistent"), &facts);
        assert!(text.contains("egress_datastore_lists_total 2"), "{text}");
        assert!(text.contains("egress_watch_batches_total 7"), "{text}");
        assert!(text.contains("egress_announced_eips 2"), "{text}");
        assert!(text.contains("egress_fenced 1"), "{text}");
        assert!(text.contains("egress_reconciles_total 5"), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
        assert!(!text.contains("egress_bgp_sessions"), "{text}");
        assert!(!text.contains("heartbeat_renewal_age"), "{text}");
    }

    #[test]
    fn renders_the_speaker_and_the_heartbeat_age() {
        let facts = AgentFacts {
            heartbeat_renewal_age: Some(std::time::Duration::from_millis(250)),
            bgp: Some(crate::bgp_metrics::tests::status()),
            ..Default::default()
        };
        let text = render(Path::new("/nonexistent"), &facts);
        for line in [
            "# TYPE egress_heartbeat_renewal_age_seconds gauge",
            "egress_heartbeat_renewal_age_seconds 0.25",
            "egress_bgp_sessions{state=\"Established\"} 2",
            "egress_bgp_peer_up{peer=\"10.10.0.3\"} 0",
            "egress_bgp_prefixes_advertised{peer=\"10.10.0.1\"} 3",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in:\n{text}");
        }
    }
}
