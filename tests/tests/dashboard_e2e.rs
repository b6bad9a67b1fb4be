//! The chart's Grafana dashboard asks only for metrics the binaries export:
//! every `egress_*` name in its queries is served by a running agent
//! (worker and gateway), controller or reflector of a cluster with BGP.

use std::{collections::BTreeSet, time::Duration};

use egress_tests::{
    cluster::{wait_until, Cluster, ClusterSpec, REFLECTOR_ADMIN},
    egress_bin,
};

fn dashboard() -> serde_json::Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../charts/egress-gateway/dashboards/egress-gateway.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).expect("the dashboard is JSON")
}

/// The `egress_*` names in `text` (identifier characters after the prefix).
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("egress_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        out.insert(tail[..end].to_owned());
        rest = &tail[end..];
    }
    out
}

/// Every query expression of the dashboard.
fn queries(d: &serde_json::Value) -> Vec<String> {
    d["panels"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| t["expr"].as_str().map(str::to_owned))
        .collect()
}

#[test]
fn the_dashboard_has_the_panels_the_operators_need() {
    let d = dashboard();
    let asked: BTreeSet<String> = queries(&d).iter().flat_map(|q| metric_names(q)).collect();
    for needed in [
        "egress_policy_bytes_total",
        "egress_drops_total",
        "egress_nat_entries",
        "egress_nat_ports_in_use",
        "egress_failovers_total",
        "egress_probe_state",
        "egress_bgp_sessions",
    ] {
        assert!(asked.contains(needed), "no panel asks for {needed}");
    }
}

/// Every metric name a worker's and the gateway's agents, the controller
/// and the reflector serve now.
fn exported_names(cluster: &Cluster, gateway: usize) -> anyhow::Result<BTreeSet<String>> {
    let pages = [
        cluster.agent_http(0, "/metrics")?,
        cluster.agent_http(gateway, "/metrics")?,
        cluster.controller_http(0, "/metrics")?,
        cluster.fabric_http(REFLECTOR_ADMIN, "/metrics")?,
    ];
    // Sample names, and the families of `# TYPE` lines: a counter's family
    // is typed without the `_total` its samples carry.
    let mut exported = BTreeSet::new();
    for line in pages.iter().flat_map(|p| p.lines()) {
        if let Some(typed) = line.strip_prefix("# TYPE ") {
            let mut parts = typed.split(' ');
            let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
                continue;
            };
            exported.insert(name.to_owned());
            if kind == "counter" {
                exported.insert(format!("{name}_total"));
            }
        } else if !line.starts_with('#') {
            if let Some(name) = line.split([' ', '{']).next() {
                exported.insert(name.to_owned());
            }
        }
    }
    Ok(exported)
}

#[test]
#[ignore = "needs root: namespaces, BPF, etcd"]
fn every_metric_the_dashboard_asks_for_is_exported() -> anyhow::Result<()> {
    let egress = egress_bin()?;
    let spec = ClusterSpec {
        bgp: true,
        ..ClusterSpec::default()
    };
    let cluster = Cluster::start(&egress, spec)?;
    cluster.apply_examples()?;
    let owner = cluster.example_eip_owner()?;
    wait_until("w1 has translated a flow", Duration::from_secs(30), || {
        Ok(
            egress_tests::cluster::tcp_peer_seen(&cluster, &cluster.topo.nodes[0].pods[0].ns, 5000)
                .is_ok(),
        )
    })?;
    let asked: BTreeSet<String> = queries(&dashboard())
        .iter()
        .flat_map(|q| metric_names(q))
        .collect();
    // Families with no series yet print nothing (the controller's probe
    // states appear with its first probe session): scrape until all are
    // there, or show what is still missing.
    let mut missing = Vec::new();
    let complete = wait_until(
        "every asked-for metric is served",
        Duration::from_secs(30),
        || {
            let exported = exported_names(&cluster, owner)?;
            missing = asked.difference(&exported).cloned().collect();
            Ok(missing.is_empty())
        },
    );
    assert!(
        complete.is_ok(),
        "the dashboard asks for metrics nobody exports: {missing:?}"
    );
    Ok(())
}
