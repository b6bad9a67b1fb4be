use std::collections::BTreeSet;

use serde_json::{json, Value};

use crate::{default_values, schema, schema_errors, set};

// ---------------------------------------------------------------------------
// 1. values.yaml and values.schema.json
// ---------------------------------------------------------------------------

#[test]
fn schema_is_valid_draft7() {
    let schema = schema();
    assert_eq!(
        schema["$schema"], "http://json-schema.org/draft-07/schema#",
        "the schema declares draft-07"
    );
    if let Err(e) = jsonschema::draft7::meta::validate(&schema) {
        panic!("values.schema.json is not a valid draft-07 schema: {e}");
    }
}

#[test]
fn default_values_match_schema() {
    let errors = schema_errors(&default_values());
    assert!(
        errors.is_empty(),
        "values.yaml fails its schema:\n{}",
        errors.join("\n")
    );
}

/// Every property is typed and described, and every object with declared
/// properties refuses unknown keys.
#[test]
fn every_value_is_typed_and_described() {
    fn walk(path: &str, node: &Value, problems: &mut Vec<String>) {
        let Some(props) = node.get("properties").and_then(Value::as_object) else {
            return;
        };
        if node.get("additionalProperties") != Some(&Value::Bool(false)) {
            problems.push(format!("{path}: additionalProperties is not false"));
        }
        for (name, prop) in props {
            let here = if path.is_empty() {
                name.clone()
            } else {
                format!("{path}.{name}")
            };
            let typed = prop.get("type").is_some()
                || prop
                    .get("anyOf")
                    .and_then(Value::as_array)
                    .is_some_and(|alts| alts.iter().all(|a| a.get("type").is_some()));
            if !typed {
                problems.push(format!("{here}: no type"));
            }
            if prop
                .get("description")
                .and_then(Value::as_str)
                .is_none_or(|d| d.trim().len() < 5)
            {
                problems.push(format!("{here}: no description"));
            }
            walk(&here, prop, problems);
            if let Some(items) = prop.get("items") {
                walk(&format!("{here}[]"), items, problems);
            }
        }
    }
    let mut problems = Vec::new();
    walk("", &schema(), &mut problems);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The schema covers every key of values.yaml (and so `additionalProperties:
/// false` does not reject the defaults), and every leaf default is listed.
#[test]
fn values_and_schema_cover_the_same_keys() {
    /// The dotted paths of the keys of the map `map_of` finds in `v`, and
    /// below them; maps of free keys (resources, nodeSelector, labels) and
    /// Kubernetes objects passed through (seccompProfile) end here.
    fn key_paths(
        prefix: &str,
        v: &Value,
        map_of: fn(&Value) -> Option<&serde_json::Map<String, Value>>,
        out: &mut BTreeSet<String>,
    ) {
        if let Some(map) = map_of(v) {
            for (k, child) in map {
                let here = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                out.insert(here.clone());
                if !matches!(
                    k.as_str(),
                    "resources" | "nodeSelector" | "labels" | "seccompProfile"
                ) {
                    key_paths(&here, child, map_of, out);
                }
            }
        }
    }
    let mut in_values = BTreeSet::new();
    key_paths("", &default_values(), Value::as_object, &mut in_values);
    let mut in_schema = BTreeSet::new();
    key_paths(
        "",
        &schema(),
        |v| v.get("properties").and_then(Value::as_object),
        &mut in_schema,
    );
    in_schema.remove("global"); // set by helm for subcharts only
    let only_values: Vec<_> = in_values.difference(&in_schema).collect();
    let only_schema: Vec<_> = in_schema.difference(&in_values).collect();
    assert!(
        only_values.is_empty(),
        "in values.yaml, not in the schema: {only_values:?}"
    );
    // upstreamPeers items' keys are inside an array: not in values.yaml
    let only_schema: Vec<_> = only_schema
        .into_iter()
        .filter(|k| !k.contains("upstreamPeers."))
        .collect();
    assert!(
        only_schema.is_empty(),
        "in the schema, without a default in values.yaml: {only_schema:?}"
    );
}

/// The values the brief and DESIGN.md fix.
#[test]
fn defaults_are_the_documented_ones() {
    let v = default_values();
    assert_eq!(v["feature"]["tunnelMonitorPeriod"], "5s");
    assert_eq!(v["feature"]["tunnelUpdatePeriod"], "5s");
    assert_eq!(v["feature"]["eipEvictionTimeout"], "15s");
    assert_eq!(v["feature"]["vxlan"]["id"], 100);
    assert_eq!(v["feature"]["vxlan"]["port"], 7789);
    assert_eq!(v["feature"]["portBlockSize"], 64);
    assert_eq!(v["feature"]["maxPortsPerNode"], 65536);
    assert_eq!(v["feature"]["gatewayFailover"]["probeIntervalMs"], 50);
    assert_eq!(v["feature"]["gatewayFailover"]["probeDetectMultiplier"], 4);
    assert_eq!(v["controller"]["replicas"], 2);
    assert_eq!(v["agent"]["privileged"], false);
    assert_eq!(v["agent"]["tolerations"], json!([{"operator": "Exists"}]));
}

#[test]
fn schema_rejects_bad_values() {
    let cases: &[(&str, Value)] = &[
        ("feature.eipEvictionTimeout", json!(3)),
        ("feature.eipEvictionTimeout", json!("15")),
        ("feature.tunnelUpdatePeriod", json!("5 s")),
        ("feature.tunnelMonitorPeriod", json!("")),
        ("unknownTopLevel", json!(true)),
        ("agent.hostNetwork", json!(false)),
        ("feature.vxlan.name", json!("egress.vxlan")),
        ("feature.vxlan.id", json!(0)),
        ("feature.vxlan.id", json!(16_777_216)),
        ("feature.vxlan.port", json!(70_000)),
        ("feature.nodeIpPortRange", json!("61000")),
        ("feature.portBlockSize", json!(1000)),
        ("feature.portBlockSize", json!(32)),
        ("feature.portBlockSize", json!(32768)),
        ("feature.portBlockSize", json!("1024")),
        ("feature.maxPortsPerNode", json!(0)),
        ("feature.maxPortsPerNode", json!(65537)),
        ("feature.nodeIpPortRange", json!("61000-65535 --bgp=true")),
        ("feature.vxlan.mtu", json!(1000)),
        ("feature.vxlan.mtu", json!("1450")),
        ("feature.gatewayFailover.enable", json!("yes")),
        ("feature.gatewayFailover.probeIntervalMs", json!(0)),
        ("feature.gatewayFailover.probeDetectMultiplier", json!(0)),
        ("feature.clusterCIDR.extraCidr", json!(["10.96.0.0/33"])),
        ("feature.clusterCIDR.extraCidr", json!(["10.96.0.0"])),
        ("feature.clusterCIDR.extraCidr", json!("10.96.0.0/12")),
        ("agent.privileged", json!("true")),
        ("agent.sysAdminForBpf", json!("yes")),
        ("agent.seccompProfile", json!({"type": "Strict"})),
        (
            "agent.seccompProfile",
            json!({"localhostProfile": "p.json"}),
        ),
        ("agent.pinDir", json!("/var/run/egress")),
        ("agent.uplink", json!("eth0 --mtu=1")),
        ("agent.tolerations", json!([{"operator": "Sometimes"}])),
        ("agent.resources", json!({"requests": {"cpu": "lots"}})),
        ("controller.replicas", json!(0)),
        ("controller.leaderElection.leaseDuration", json!(15)),
        ("image.pullPolicy", json!("Sometimes")),
        ("image.repository", json!("")),
        ("bgp.asn", json!(0)),
        ("bgp.asn", json!(4_294_967_296u64)),
        ("bgp.routerId", json!("router-1")),
        ("bgp.routerId", json!("256.0.0.1")),
        ("bgp.clusterId", json!("")),
        ("bgp.holdTime", json!(2)),
        ("bgp.listenAddress", json!("localhost")),
        ("bgp.gracefulRestartTime", json!(5000)),
        ("bgp.password", json!("hunter2")),
        ("bgp.password.existingSecret", json!("Not_A_Name")),
        ("bgp.upstreamPeers", json!([{"address": "192.0.2.1"}])),
        (
            "bgp.upstreamPeers",
            json!([{"address": "router", "asn": 65000}]),
        ),
        (
            "bgp.upstreamPeers",
            json!([{"address": "192.0.2.1", "asn": 65000, "md5": "x"}]),
        ),
        ("metrics.port", json!(80)),
        ("log.level", json!("verbose")),
        ("log.json", json!(1)),
        ("rbac.agentOwnNodeOnly", json!(null)),
    ];
    let mut accepted = Vec::new();
    for (path, bad) in cases {
        let mut values = default_values();
        set(&mut values, path, bad.clone());
        if schema_errors(&values).is_empty() {
            accepted.push(format!("{path} = {bad}"));
        }
    }
    assert!(
        accepted.is_empty(),
        "the schema accepted bad values:\n{}",
        accepted.join("\n")
    );

    // a missing required value fails too
    let mut values = default_values();
    values["feature"]
        .as_object_mut()
        .unwrap()
        .remove("eipEvictionTimeout");
    assert!(
        !schema_errors(&values).is_empty(),
        "missing feature.eipEvictionTimeout accepted"
    );
}

#[test]
fn schema_accepts_good_values() {
    let cases: &[(&str, Value)] = &[
        ("feature.eipEvictionTimeout", json!("1m30s")),
        ("feature.tunnelUpdatePeriod", json!("250ms")),
        ("feature.tunnelMonitorPeriod", json!("0.5s")),
        ("feature.vxlan.mtu", json!(1450)),
        ("feature.vxlan.mtu", json!(9000)),
        ("feature.portBlockSize", json!(64)),
        ("feature.portBlockSize", json!(16384)),
        ("feature.maxPortsPerNode", json!(1)),
        ("feature.maxPortsPerNode", json!(65536)),
        ("feature.vxlan.id", json!(16_777_215)),
        (
            "feature.clusterCIDR.extraCidr",
            json!(["10.96.0.0/12", "fd00:10:96::/108"]),
        ),
        ("bgp.asn", json!(4_200_000_000u64)),
        ("bgp.routerId", json!("192.0.2.10")),
        ("bgp.holdTime", json!(0)),
        (
            "bgp.upstreamPeers",
            json!([{"address": "192.0.2.1", "asn": 65000}, {"address": "2001:db8::1", "asn": 65001, "port": 1179}]),
        ),
        ("bgp.password.existingSecret", json!("bgp-md5")),
        ("agent.maxUnavailable", json!("10%")),
        (
            "agent.resources",
            json!({"requests": {"cpu": "250m", "memory": "1Gi"}, "limits": {"cpu": 2}}),
        ),
        (
            "agent.tolerations",
            json!([{"key": "dedicated", "operator": "Equal", "value": "egress", "effect": "NoSchedule"}]),
        ),
        ("imagePullSecrets", json!([{"name": "regcred"}])),
    ];
    for (path, good) in cases {
        let mut values = default_values();
        set(&mut values, path, good.clone());
        let errors = schema_errors(&values);
        assert!(
            errors.is_empty(),
            "{path} = {good} rejected:\n{}",
            errors.join("\n")
        );
    }
}

/// The NAT table size the chart accepts is the one the agent accepts.
#[test]
fn the_nat_table_size_is_bounded_as_the_agent_bounds_it() {
    for (size, ok) in [
        (1024, true),
        (65536, true),
        (16_777_216, true),
        (1000, false),
        (16_777_217, false),
    ] {
        let mut v = default_values();
        set(&mut v, "agent.natTableSize", json!(size));
        assert_eq!(schema_errors(&v).is_empty(), ok, "natTableSize {size}");
    }
}

/// `feature.vxlan.underlay` takes the agent's three families and nothing else.
#[test]
fn the_underlay_is_one_the_agent_knows() {
    for (family, ok) in [
        ("ipv4", true),
        ("ipv6", true),
        ("auto", true),
        ("IPv6", false),
        ("", false),
    ] {
        let mut v = default_values();
        set(&mut v, "feature.vxlan.underlay", json!(family));
        assert_eq!(schema_errors(&v).is_empty(), ok, "underlay {family:?}");
    }
}

/// `agent.uplinkXdp` takes the agent's three modes and nothing else.
#[test]
fn the_uplink_xdp_mode_is_one_the_agent_knows() {
    for (mode, ok) in [
        ("auto", true),
        ("native", true),
        ("off", true),
        ("generic", false),
        ("", false),
    ] {
        let mut v = default_values();
        set(&mut v, "agent.uplinkXdp", json!(mode));
        assert_eq!(schema_errors(&v).is_empty(), ok, "uplinkXdp {mode:?}");
    }
}
