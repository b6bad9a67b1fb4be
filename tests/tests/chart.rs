//! Tests of the Helm chart in `charts/egress-gateway`, without a cluster.
//!
//! 1. `values.yaml` against `values.schema.json` (draft-07), and bad values
//!    that the schema must reject.
//! 2. `helm lint` and `helm template` with the defaults and with value
//!    combinations; every rendered object is deserialised into the typed
//!    `k8s-openapi` struct of its kind and serialised back: an unknown or
//!    misplaced field makes the two JSON values differ and fails the test.
//! 3. RBAC least privilege, checked on the rendered roles.
//!
//! Helm comes from `xtask/src/helm.rs` (an npm package ships the binary); set
//! `EGRESS_HELM` to use another one.

#[path = "../../xtask/src/helm.rs"]
mod helm;

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
};

use k8s_openapi::{
    api::{
        admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding},
        apps::v1::{DaemonSet, Deployment},
        core::v1::{Container, PodSpec, Service, ServiceAccount},
        policy::v1::PodDisruptionBudget,
        rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding},
    },
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    Resource,
};
use serde::{de::DeserializeOwned, Serialize};
use serde_json::{json, Value};

const NAMESPACE: &str = "egress-system";
const RELEASE: &str = "egw";
const GROUP: &str = "egressgateway.egress.dev";
const VAP_API: &str = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ lives in the workspace")
        .to_owned()
}

fn chart_dir() -> PathBuf {
    root().join("charts/egress-gateway")
}

fn yaml_file(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn default_values() -> Value {
    yaml_file(&chart_dir().join("values.yaml"))
}

fn schema() -> Value {
    let path = chart_dir().join("values.schema.json");
    let text = std::fs::read_to_string(&path).expect("values.schema.json");
    serde_json::from_str(&text).expect("values.schema.json is JSON")
}

/// Schema errors of `values`, as readable lines.
fn schema_errors(values: &Value) -> Vec<String> {
    let schema = schema();
    let validator = jsonschema::draft7::new(&schema).expect("the schema compiles");
    validator
        .iter_errors(values)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect()
}

/// Sets `value` at a dotted path, creating objects on the way.
fn set(values: &mut Value, dotted: &str, value: Value) {
    let mut cur = values;
    let parts: Vec<&str> = dotted.split('.').collect();
    for part in &parts[..parts.len() - 1] {
        cur = cur
            .as_object_mut()
            .expect("an object on the path")
            .entry(part.to_string())
            .or_insert_with(|| json!({}));
    }
    cur.as_object_mut()
        .expect("an object at the end of the path")
        .insert(parts[parts.len() - 1].to_string(), value);
}

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
    fn keys(prefix: &str, v: &Value, out: &mut BTreeSet<String>) {
        if let Some(map) = v.as_object() {
            for (k, child) in map {
                let here = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                out.insert(here.clone());
                // maps of free keys (resources, nodeSelector) end here
                if !matches!(k.as_str(), "resources" | "nodeSelector") {
                    keys(&here, child, out);
                }
            }
        }
    }
    fn schema_keys(prefix: &str, v: &Value, out: &mut BTreeSet<String>) {
        if let Some(props) = v.get("properties").and_then(Value::as_object) {
            for (k, child) in props {
                let here = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                out.insert(here.clone());
                if !matches!(k.as_str(), "resources" | "nodeSelector") {
                    schema_keys(&here, child, out);
                }
            }
        }
    }
    let mut in_values = BTreeSet::new();
    keys("", &default_values(), &mut in_values);
    let mut in_schema = BTreeSet::new();
    schema_keys("", &schema(), &mut in_schema);
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
    assert_eq!(v["feature"]["portBlockSize"], 1024);
    assert_eq!(v["feature"]["gatewayFailover"]["probeDetectMultiplier"], 3);
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

// ---------------------------------------------------------------------------
// 2. helm lint, helm template, Kubernetes schemas
// ---------------------------------------------------------------------------

fn helm_bin() -> &'static Path {
    static HELM: OnceLock<PathBuf> = OnceLock::new();
    HELM.get_or_init(|| {
        helm::ensure_helm(&root()).unwrap_or_else(|e| {
            panic!(
                "no helm for the chart tests: {e:#}\n(set {} to a helm binary to skip the install)",
                helm::HELM_ENV
            )
        })
    })
}

/// `helm <args>` on the chart with overrides written to a values file (so
/// types stay exact); Ok(stdout) or Err(stdout and stderr).
fn helm(subcommand: &[&str], overrides: &Value, extra: &[&str]) -> Result<String, String> {
    helm_with(helm_bin(), subcommand, overrides, extra)
}

fn helm_with(
    bin: &Path,
    subcommand: &[&str],
    overrides: &Value,
    extra: &[&str],
) -> Result<String, String> {
    let file = tempfile_path("values");
    std::fs::write(&file, serde_json::to_string(overrides).unwrap()).unwrap();
    let out = Command::new(bin)
        .args(subcommand)
        .arg(chart_dir())
        .args(["--namespace", NAMESPACE, "--values"])
        .arg(&file)
        .args(extra)
        .output()
        .expect("running helm");
    let _ = std::fs::remove_file(&file);
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

fn parse_docs(out: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(out)
        .filter_map(|doc| {
            let v = Value::deserialize(doc).expect("helm printed YAML");
            (!v.is_null()).then_some(v)
        })
        .collect()
}

fn tempfile_path(what: &str) -> PathBuf {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    std::env::temp_dir().join(format!(
        "egress-chart-{what}-{}-{}.json",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ))
}

/// The rendered objects of `helm template` with these overrides.
fn render_with(overrides: &Value, extra: &[&str]) -> Vec<Value> {
    let out = helm(&["template", RELEASE], overrides, extra)
        .unwrap_or_else(|e| panic!("helm template failed with {overrides}:\n{e}"));
    parse_docs(&out)
}

use serde::Deserialize;

fn render(overrides: &Value) -> Vec<Value> {
    render_with(overrides, &[])
}

fn find<'a>(objs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objs.iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} rendered; got {:?}", names(objs)))
}

fn names(objs: &[Value]) -> Vec<String> {
    objs.iter()
        .map(|o| {
            format!(
                "{}/{}",
                o["kind"].as_str().unwrap_or("?"),
                o["metadata"]["name"].as_str().unwrap_or("?")
            )
        })
        .collect()
}

/// Deserialises `obj` into `T` and back; the two JSON values must be equal.
fn roundtrip<T: Resource + DeserializeOwned + Serialize>(obj: &Value) -> Result<(), String> {
    if obj["apiVersion"] != T::API_VERSION || obj["kind"] != T::KIND {
        return Err(format!("expected {}/{}", T::API_VERSION, T::KIND));
    }
    let typed: T =
        serde_json::from_value(obj.clone()).map_err(|e| format!("does not deserialise: {e}"))?;
    let back = serde_json::to_value(&typed).map_err(|e| e.to_string())?;
    if &back != obj {
        return Err(format!(
            "fields lost in the typed round trip: {}",
            diff(obj, &back, "")
        ));
    }
    Ok(())
}

/// The first place where `a` has something `b` does not (for messages).
fn diff(a: &Value, b: &Value, path: &str) -> String {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for (k, v) in x {
                match y.get(k) {
                    None => return format!("{path}.{k} (unknown or misplaced)"),
                    Some(w) if v != w => return diff(v, w, &format!("{path}.{k}")),
                    _ => {}
                }
            }
            format!("{path}: extra keys after the round trip")
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (v, w)) in x.iter().zip(y).enumerate() {
                if v != w {
                    return diff(v, w, &format!("{path}[{i}]"));
                }
            }
            path.to_owned()
        }
        _ => format!("{path}: {a} became {b}"),
    }
}

/// Checks one rendered object against the Kubernetes type of its kind.
fn check_k8s_schema(obj: &Value) -> Result<(), String> {
    let kind = obj["kind"].as_str().unwrap_or_default();
    match kind {
        "ServiceAccount" => roundtrip::<ServiceAccount>(obj),
        "Service" => roundtrip::<Service>(obj),
        "ClusterRole" => roundtrip::<ClusterRole>(obj),
        "ClusterRoleBinding" => roundtrip::<ClusterRoleBinding>(obj),
        "Role" => roundtrip::<Role>(obj),
        "RoleBinding" => roundtrip::<RoleBinding>(obj),
        "DaemonSet" => roundtrip::<DaemonSet>(obj),
        "Deployment" => roundtrip::<Deployment>(obj),
        "PodDisruptionBudget" => roundtrip::<PodDisruptionBudget>(obj),
        "ValidatingAdmissionPolicy" => roundtrip::<ValidatingAdmissionPolicy>(obj),
        "ValidatingAdmissionPolicyBinding" => roundtrip::<ValidatingAdmissionPolicyBinding>(obj),
        "CustomResourceDefinition" => roundtrip::<CustomResourceDefinition>(obj),
        other => Err(format!("no Kubernetes schema known for kind {other:?}")),
    }
}

fn check_all(objs: &[Value]) {
    assert!(!objs.is_empty(), "nothing rendered");
    let failures: Vec<String> = objs
        .iter()
        .filter_map(|o| {
            check_k8s_schema(o).err().map(|e| {
                format!(
                    "{}/{}: {e}",
                    o["kind"].as_str().unwrap_or("?"),
                    o["metadata"]["name"].as_str().unwrap_or("?")
                )
            })
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    for o in objs {
        // namespaced kinds land in the release namespace, cluster-wide ones carry none
        let cluster_wide = matches!(
            o["kind"].as_str().unwrap(),
            "ClusterRole"
                | "ClusterRoleBinding"
                | "ValidatingAdmissionPolicy"
                | "ValidatingAdmissionPolicyBinding"
                | "CustomResourceDefinition"
        );
        let ns = &o["metadata"]["namespace"];
        if cluster_wide {
            assert!(ns.is_null(), "{} has a namespace", o["metadata"]["name"]);
        } else {
            assert_eq!(
                ns, NAMESPACE,
                "{} is not in the release namespace",
                o["metadata"]["name"]
            );
        }
        let name = o["metadata"]["name"].as_str().unwrap();
        assert!(name.len() <= 63, "{name} is longer than 63 characters");
    }
}

/// Value sets the chart must render, each checked against the schemas.
fn combinations() -> Vec<(&'static str, Value)> {
    vec![
        ("defaults", json!({})),
        ("privileged", json!({"agent": {"privileged": true}})),
        (
            "bgp off, metrics off",
            json!({"bgp": {"enabled": false}, "metrics": {"enabled": false}}),
        ),
        (
            "bgp with peers, password, router id, host network",
            json!({
                "bgp": {
                    "asn": 4_200_000_000u64, "routerId": "192.0.2.10", "clusterId": "10.0.0.1",
                    "listenAddress": "::", "listenPort": 1179, "holdTime": 9, "keepaliveTime": 3, "gracefulRestartTime": 300,
                    "password": {"existingSecret": "bgp-md5", "key": "md5"},
                    "upstreamPeers": [{"address": "192.0.2.1", "asn": 65000}, {"address": "2001:db8::1", "asn": 65001, "port": 1179}]
                },
                "controller": {"hostNetwork": true, "replicas": 1}
            }),
        ),
        (
            "host network, BGP on 179",
            json!({"controller": {"hostNetwork": true}}),
        ),
        (
            "fast timers, big numbers, extra CIDRs, JSON logs",
            json!({
                "feature": {
                    "tunnelUpdatePeriod": "200ms", "tunnelMonitorPeriod": "100ms", "eipEvictionTimeout": "1s",
                    "gatewayFailover": {"enable": true, "probeIntervalMs": 100, "probeDetectMultiplier": 3},
                    "vxlan": {"id": 16_777_215, "port": 4790, "mtu": 8950},
                    "portBlockSize": 4096, "nodeIpPortRange": "49152-65535",
                    "clusterCIDR": {"extraCidr": ["10.96.0.0/12", "fd00:10:96::/108"]}
                },
                "log": {"level": "debug", "json": true},
                "metrics": {"port": 19477},
                "bgp": {"keepaliveTime": 0},
                "image": {"repository": "registry.example/egress", "tag": "1.2.3", "pullPolicy": "Always"},
                "imagePullSecrets": [{"name": "regcred"}]
            }),
        ),
        (
            "one controller, no failover probes",
            json!({"controller": {"replicas": 1}, "feature": {"gatewayFailover": {"enable": false}}}),
        ),
        (
            "agent policy off",
            json!({"rbac": {"agentOwnNodeOnly": false}}),
        ),
    ]
}

#[test]
fn helm_lint_passes() {
    for (name, overrides) in combinations() {
        if let Err(e) = helm(&["lint", "--strict"], &overrides, &[]) {
            panic!("helm lint --strict failed for {name}:\n{e}");
        }
    }
}

#[test]
fn rendered_objects_match_kubernetes_schemas() {
    for (name, overrides) in combinations() {
        let objs = render_with(&overrides, &["--api-versions", VAP_API, "--include-crds"]);
        eprintln!("{name}: {} objects", objs.len());
        check_all(&objs);
    }
}

/// The round trip does catch unknown and misplaced fields (so the test above
/// can fail).
#[test]
fn schema_check_catches_unknown_and_misplaced_fields() {
    let objs = render(&json!({}));
    let deploy = find(&objs, "Deployment", "egw-egress-gateway-controller").clone();
    assert_eq!(check_k8s_schema(&deploy), Ok(()));

    let mut unknown = deploy.clone();
    unknown["spec"]["template"]["spec"]["containers"][0]["privilegd"] = json!(true);
    assert!(
        check_k8s_schema(&unknown).is_err(),
        "a misspelt field passed"
    );

    let mut misplaced = deploy.clone();
    misplaced["spec"]["template"]["spec"]["containers"][0]["hostNetwork"] = json!(true);
    assert!(
        check_k8s_schema(&misplaced).is_err(),
        "hostNetwork on a container passed"
    );

    let mut wrong_type = deploy.clone();
    wrong_type["spec"]["replicas"] = json!("two");
    assert!(
        check_k8s_schema(&wrong_type).is_err(),
        "replicas as a string passed"
    );

    let mut wrong_version = deploy;
    wrong_version["apiVersion"] = json!("extensions/v1beta1");
    assert!(
        check_k8s_schema(&wrong_version).is_err(),
        "a removed apiVersion passed"
    );
}

#[test]
fn helm_rejects_bad_values() {
    let cases: Vec<(Value, &str)> = vec![
        (
            json!({"feature": {"eipEvictionTimeout": 3}}),
            "eipEvictionTimeout",
        ),
        (json!({"agent": {"bogus": 1}}), "bogus"),
        (json!({"bogus": 1}), "bogus"),
        // the cross-value rules of the templates (the binary applies the same)
        (
            json!({"feature": {"eipEvictionTimeout": "10s"}}),
            "must be greater than feature.tunnelMonitorPeriod",
        ),
        (
            json!({"feature": {"eipEvictionTimeout": "1s", "tunnelMonitorPeriod": "500ms", "tunnelUpdatePeriod": "500ms"}}),
            "must be greater than",
        ),
        (
            json!({"feature": {"eipEvictionTimeout": "1m", "tunnelUpdatePeriod": "1m"}}),
            "must be greater than",
        ),
        (
            json!({"bgp": {"holdTime": 9, "keepaliveTime": 9}}),
            "keepaliveTime",
        ),
        (json!({"bgp": {"listenPort": 9477}}), "listenPort"),
        // no whole block in the node-IP range (the controller refuses it too)
        (
            json!({"feature": {"portBlockSize": 8192}}),
            "holds no whole block of 8192 ports",
        ),
        (
            json!({"feature": {"nodeIpPortRange": "65000-61000"}}),
            "holds no whole block",
        ),
        // one fixed router id for several reflectors
        (
            json!({"bgp": {"routerId": "192.0.2.10"}}),
            "every reflector needs its own",
        ),
        (json!({"bgp": {"listenAddress": "any"}}), "listenAddress"),
    ];
    for (overrides, expected) in cases {
        match helm(&["template", RELEASE], &overrides, &[]) {
            Ok(_) => panic!("helm template accepted {overrides}"),
            Err(e) => assert!(
                e.contains(expected),
                "{overrides}: error does not mention {expected:?}:\n{e}"
            ),
        }
    }
    // just above the limit is fine, in mixed units
    render(
        &json!({"feature": {"eipEvictionTimeout": "1m0.5s", "tunnelMonitorPeriod": "30s", "tunnelUpdatePeriod": "30000ms"}}),
    );
    render(&json!({"feature": {"eipEvictionTimeout": "1h", "tunnelUpdatePeriod": "59m"}}));
}

fn pod_spec(objs: &[Value], kind: &str, name: &str) -> PodSpec {
    serde_json::from_value(find(objs, kind, name)["spec"]["template"]["spec"].clone())
        .expect("a PodSpec")
}

fn agent(objs: &[Value]) -> PodSpec {
    pod_spec(objs, "DaemonSet", "egw-egress-gateway-agent")
}

fn controller(objs: &[Value]) -> PodSpec {
    pod_spec(objs, "Deployment", "egw-egress-gateway-controller")
}

/// `--flag=value` arguments as a map (repeated flags keep every value).
fn flags(c: &Container) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for a in c.args.as_deref().unwrap_or_default() {
        if let Some(rest) = a.strip_prefix("--") {
            let (k, v) = rest.split_once('=').unwrap_or((rest, ""));
            out.entry(k.to_owned()).or_default().push(v.to_owned());
        }
    }
    out
}

fn flag(f: &BTreeMap<String, Vec<String>>, name: &str) -> String {
    match f.get(name).map(Vec::as_slice) {
        Some([one]) => one.clone(),
        other => panic!("--{name}: expected one value, got {other:?} in {f:?}"),
    }
}

/// What the API server would refuse in a pod's security settings (rules of
/// the apiserver's validation that the typed structs cannot know).
fn apiserver_pod_rules(spec: &PodSpec) -> Result<(), String> {
    for c in &spec.containers {
        let sc = c.security_context.clone().unwrap_or_default();
        let privileged = sc.privileged == Some(true);
        let adds: Vec<String> = sc
            .capabilities
            .clone()
            .and_then(|c| c.add)
            .unwrap_or_default();
        if sc.allow_privilege_escalation == Some(false)
            && (privileged
                || adds
                    .iter()
                    .any(|a| a == "SYS_ADMIN" || a == "CAP_SYS_ADMIN"))
        {
            return Err(format!(
                "{}: allowPrivilegeEscalation false with privileged or SYS_ADMIN",
                c.name
            ));
        }
        for m in c.volume_mounts.as_deref().unwrap_or_default() {
            if m.mount_propagation.as_deref() == Some("Bidirectional") && !privileged {
                return Err(format!(
                    "{}: Bidirectional mount propagation needs a privileged container",
                    c.name
                ));
            }
        }
        let ports: BTreeSet<String> = c
            .ports
            .iter()
            .flatten()
            .filter_map(|p| p.name.clone())
            .collect();
        for probe in [&c.liveness_probe, &c.readiness_probe]
            .into_iter()
            .flatten()
        {
            if let Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(p)) =
                probe.http_get.as_ref().map(|h| h.port.clone())
            {
                if !ports.contains(&p) {
                    return Err(format!("{}: probe port {p} is not a named port", c.name));
                }
            }
        }
    }
    if spec.host_network == Some(true) {
        let sysctls = spec
            .security_context
            .as_ref()
            .and_then(|s| s.sysctls.clone())
            .unwrap_or_default();
        if !sysctls.is_empty() {
            return Err("namespaced sysctls are not allowed with hostNetwork".into());
        }
    }
    Ok(())
}

#[test]
fn apiserver_rules_hold_for_every_combination() {
    for (name, overrides) in combinations() {
        let objs = render(&overrides);
        for spec in [agent(&objs), controller(&objs)] {
            if let Err(e) = apiserver_pod_rules(&spec) {
                panic!("{name}: {e}");
            }
        }
    }
    // and the rules do catch the two classic mistakes
    let mut spec = agent(&render(&json!({})));
    spec.containers[0].volume_mounts.as_mut().unwrap()[0].mount_propagation =
        Some("Bidirectional".into());
    assert!(apiserver_pod_rules(&spec).is_err());
    let mut spec = agent(&render(&json!({})));
    spec.containers[0]
        .security_context
        .as_mut()
        .unwrap()
        .allow_privilege_escalation = Some(false);
    assert!(apiserver_pod_rules(&spec).is_err());
}

#[test]
fn agent_daemonset_by_default() {
    let objs = render(&json!({}));
    let spec = agent(&objs);
    assert_eq!(spec.host_network, Some(true));
    assert_eq!(spec.dns_policy.as_deref(), Some("ClusterFirstWithHostNet"));
    assert_eq!(
        spec.service_account_name.as_deref(),
        Some("egw-egress-gateway-agent")
    );
    // runs on every node: tolerates every taint
    let tol = spec.tolerations.clone().unwrap();
    assert!(
        tol.iter().any(|t| t.operator.as_deref() == Some("Exists")
            && t.key.is_none()
            && t.effect.is_none()),
        "no catch-all toleration: {tol:?}"
    );
    let c = &spec.containers[0];
    assert_eq!(c.image.as_deref(), Some("egress:0.1.0"));
    assert_eq!(c.command.as_deref(), Some(&["egress".to_owned()][..]));
    assert_eq!(c.args.as_ref().unwrap()[0], "agent");
    let sc = c.security_context.clone().unwrap();
    assert_ne!(sc.privileged, Some(true));
    let caps = sc.capabilities.unwrap();
    assert_eq!(caps.drop, Some(vec!["ALL".to_owned()]));
    let add: BTreeSet<String> = caps.add.unwrap().into_iter().collect();
    let want: BTreeSet<String> = ["BPF", "NET_ADMIN", "SYS_ADMIN", "NET_RAW"]
        .map(String::from)
        .into();
    assert_eq!(add, want);
    // bpffs and /sys from the host
    let vols = spec.volumes.clone().unwrap();
    let host_path = |name: &str| {
        vols.iter()
            .find(|v| v.name == name)
            .and_then(|v| v.host_path.clone())
            .unwrap_or_else(|| panic!("no hostPath volume {name}"))
            .path
    };
    assert_eq!(host_path("bpffs"), "/sys/fs/bpf");
    assert_eq!(host_path("sys"), "/sys");
    let mounts = c.volume_mounts.clone().unwrap();
    let bpffs = mounts.iter().find(|m| m.name == "bpffs").unwrap();
    assert_eq!(bpffs.mount_path, "/sys/fs/bpf");
    assert_eq!(bpffs.mount_propagation.as_deref(), Some("HostToContainer"));
    assert!(mounts
        .iter()
        .any(|m| m.name == "sys" && m.mount_path == "/sys" && m.read_only == Some(true)));
    // NODE_NAME from the downward API
    let env = c.env.clone().unwrap();
    let node_name = env
        .iter()
        .find(|e| e.name == "NODE_NAME")
        .expect("NODE_NAME");
    assert_eq!(
        node_name
            .value_from
            .as_ref()
            .unwrap()
            .field_ref
            .as_ref()
            .unwrap()
            .field_path,
        "spec.nodeName"
    );
    assert!(
        env.iter().all(|e| e.name != "EGRESS_BGP_PASSWORD"),
        "a password without a Secret"
    );
    // probes on the metrics port
    let metrics = c
        .ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some("metrics"))
        .unwrap();
    assert_eq!(metrics.container_port, 9477);
    let path = |p: &Option<k8s_openapi::api::core::v1::Probe>| {
        p.as_ref().unwrap().http_get.as_ref().unwrap().path.clone()
    };
    assert_eq!(path(&c.liveness_probe).as_deref(), Some("/healthz"));
    assert_eq!(path(&c.readiness_probe).as_deref(), Some("/readyz"));
    // flags
    let f = flags(c);
    assert_eq!(flag(&f, "datastore"), "kubernetes");
    assert_eq!(flag(&f, "node-name"), "$(NODE_NAME)");
    assert_eq!(flag(&f, "pin-dir"), "/sys/fs/bpf/egress");
    assert_eq!(flag(&f, "lease-namespace"), NAMESPACE);
    assert_eq!(flag(&f, "tunnel-update-period"), "5s");
    assert_eq!(flag(&f, "tunnel-monitor-period"), "5s");
    assert_eq!(flag(&f, "eip-eviction-timeout"), "15s");
    assert_eq!(flag(&f, "gateway-failover"), "true");
    assert_eq!(flag(&f, "probe-interval-ms"), "200");
    assert_eq!(flag(&f, "probe-detect-multiplier"), "3");
    assert_eq!(flag(&f, "vxlan-id"), "100");
    assert_eq!(flag(&f, "vxlan-port"), "7789");
    assert_eq!(flag(&f, "mtu"), "0");
    assert_eq!(flag(&f, "metrics-port"), "9477");
    assert_eq!(flag(&f, "bgp"), "true");
    assert_eq!(flag(&f, "bgp-asn"), "64512");
    assert_eq!(
        flag(&f, "bgp-reflectors"),
        format!("egw-egress-gateway-reflector.{NAMESPACE}.svc")
    );
    assert_eq!(flag(&f, "bgp-reflector-port"), "179");
    assert!(!f.contains_key("log-json"));
    assert!(!f.contains_key("extra-cidr"));
    assert_eq!(flag(&f, "bgp-router-id"), "$(NODE_IP)");
    assert!(
        !f.contains_key("bgp-listen"),
        "agents must not listen on the BGP port in the host network"
    );
    let node_ip = c
        .env
        .as_ref()
        .unwrap()
        .iter()
        .find(|e| e.name == "NODE_IP")
        .unwrap();
    assert_eq!(
        node_ip
            .value_from
            .as_ref()
            .unwrap()
            .field_ref
            .as_ref()
            .unwrap()
            .field_path,
        "status.hostIP"
    );
}

#[test]
fn agent_privileged_when_asked() {
    let objs = render(&json!({"agent": {"privileged": true}}));
    let c = &agent(&objs).containers[0];
    let sc = c.security_context.clone().unwrap();
    assert_eq!(sc.privileged, Some(true));
    assert!(
        sc.capabilities.is_none(),
        "capabilities listed next to privileged"
    );
    let bpffs = c
        .volume_mounts
        .as_ref()
        .unwrap()
        .iter()
        .find(|m| m.name == "bpffs")
        .unwrap();
    assert_eq!(bpffs.mount_propagation.as_deref(), Some("Bidirectional"));
}

#[test]
fn values_reach_the_flags() {
    let (_, overrides) = combinations()
        .into_iter()
        .find(|(n, _)| n.starts_with("fast timers"))
        .unwrap();
    let objs = render(&overrides);
    let a = &agent(&objs).containers[0];
    let f = flags(a);
    assert_eq!(flag(&f, "tunnel-update-period"), "200ms");
    assert_eq!(flag(&f, "tunnel-monitor-period"), "100ms");
    assert_eq!(flag(&f, "eip-eviction-timeout"), "1s");
    assert_eq!(flag(&f, "probe-interval-ms"), "100");
    assert_eq!(
        flag(&f, "vxlan-id"),
        "16777215",
        "a large number printed in float notation?"
    );
    assert_eq!(flag(&f, "vxlan-port"), "4790");
    assert_eq!(flag(&f, "mtu"), "8950");
    assert_eq!(flag(&f, "metrics-port"), "19477");
    assert_eq!(
        f["extra-cidr"],
        vec!["10.96.0.0/12".to_owned(), "fd00:10:96::/108".to_owned()]
    );
    assert!(f.contains_key("log-json"));
    assert_eq!(a.image.as_deref(), Some("registry.example/egress:1.2.3"));
    assert_eq!(a.image_pull_policy.as_deref(), Some("Always"));
    let rust_log = a
        .env
        .as_ref()
        .unwrap()
        .iter()
        .find(|e| e.name == "RUST_LOG")
        .unwrap();
    assert_eq!(rust_log.value.as_deref(), Some("debug"));
    let ports: Vec<i32> = a.ports.iter().flatten().map(|p| p.container_port).collect();
    assert!(ports.contains(&19477) && ports.contains(&4790), "{ports:?}");
    let c = &controller(&objs).containers[0];
    let f = flags(c);
    assert_eq!(flag(&f, "tunnel-monitor-period"), "100ms");
    assert_eq!(flag(&f, "eip-eviction-timeout"), "1s");
    assert_eq!(
        flag(&f, "port-block-size"),
        "4096",
        "a large number printed in float notation?"
    );
    assert_eq!(flag(&f, "node-ip-port-range"), "49152-65535");
    let probe_port = &c
        .liveness_probe
        .as_ref()
        .unwrap()
        .http_get
        .as_ref()
        .unwrap()
        .port;
    let named = c
        .ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some("metrics"))
        .unwrap();
    assert_eq!(named.container_port, 19477);
    assert_eq!(
        probe_port,
        &k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String("metrics".into())
    );
    let svc = find(&objs, "Service", "egw-egress-gateway-agent-metrics");
    assert_eq!(svc["spec"]["ports"][0]["port"], 19477);

    // no probes flags when fast failover is off
    let objs = render(&json!({"feature": {"gatewayFailover": {"enable": false}}}));
    let f = flags(&agent(&objs).containers[0]);
    assert_eq!(flag(&f, "gateway-failover"), "false");
    assert!(!f.contains_key("probe-interval-ms"));
}

#[test]
fn controller_deployment_runs_the_reflector() {
    let objs = render(&json!({}));
    let deploy = find(&objs, "Deployment", "egw-egress-gateway-controller");
    assert_eq!(deploy["spec"]["replicas"], 2);
    let spec = controller(&objs);
    assert_ne!(spec.host_network, Some(true));
    assert_eq!(
        spec.service_account_name.as_deref(),
        Some("egw-egress-gateway-controller")
    );
    let psc = spec.security_context.clone().unwrap();
    assert_eq!(psc.run_as_non_root, Some(true));
    // the non-root reflector may bind 179 in its own network namespace
    let sysctls = psc.sysctls.unwrap();
    assert_eq!(sysctls[0].name, "net.ipv4.ip_unprivileged_port_start");
    assert_eq!(sysctls[0].value, "179");
    let c = &spec.containers[0];
    let sc = c.security_context.clone().unwrap();
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(sc.capabilities.unwrap().add, None);
    assert_eq!(c.args.as_ref().unwrap()[0], "controller");
    let bgp = c
        .ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some("bgp"))
        .expect("BGP port exposed");
    assert_eq!(bgp.container_port, 179);
    let f = flags(c);
    assert_eq!(flag(&f, "datastore"), "kubernetes");
    assert_eq!(
        flag(&f, "leader-election-lease-name"),
        "egw-egress-gateway-controller"
    );
    assert_eq!(flag(&f, "leader-election-lease-duration"), "15s");
    assert_eq!(flag(&f, "lease-namespace"), NAMESPACE);
    assert_eq!(flag(&f, "bgp-asn"), "64512");
    assert_eq!(flag(&f, "bgp-cluster-id"), "0.0.0.1");
    assert_eq!(flag(&f, "bgp-listen"), "0.0.0.0:179");
    assert_eq!(flag(&f, "bgp-router-id"), "$(POD_IP)");
    assert_eq!(flag(&f, "bgp-hold-time"), "90");
    assert_eq!(flag(&f, "bgp-keepalive-time"), "30");
    assert_eq!(flag(&f, "bgp-graceful-restart-time"), "120");
    assert!(!f.contains_key("bgp-peer"));
    // the agents find the reflectors through a headless Service
    let svc = find(&objs, "Service", "egw-egress-gateway-reflector");
    assert_eq!(svc["spec"]["clusterIP"], "None");
    assert_eq!(svc["spec"]["ports"][0]["port"], 179);
    assert_eq!(
        svc["spec"]["selector"],
        deploy["spec"]["selector"]["matchLabels"]
    );
    let pdb = find(
        &objs,
        "PodDisruptionBudget",
        "egw-egress-gateway-controller",
    );
    assert_eq!(pdb["spec"]["maxUnavailable"], 1);
    // a selector that picks the pods of the other component would be a bug
    let agent_labels =
        &find(&objs, "DaemonSet", "egw-egress-gateway-agent")["spec"]["selector"]["matchLabels"];
    assert_ne!(agent_labels, &deploy["spec"]["selector"]["matchLabels"]);
}

#[test]
fn bgp_values_reach_the_flags() {
    let (_, overrides) = combinations()
        .into_iter()
        .find(|(n, _)| n.starts_with("bgp with peers"))
        .unwrap();
    let objs = render(&overrides);
    let spec = controller(&objs);
    assert_eq!(spec.host_network, Some(true));
    let c = &spec.containers[0];
    let f = flags(c);
    assert_eq!(flag(&f, "bgp-asn"), "4200000000");
    assert_eq!(flag(&f, "bgp-router-id"), "192.0.2.10");
    assert_eq!(flag(&f, "bgp-cluster-id"), "10.0.0.1");
    assert_eq!(flag(&f, "bgp-listen"), "[::]:1179");
    assert_eq!(flag(&f, "bgp-hold-time"), "9");
    assert_eq!(flag(&f, "bgp-keepalive-time"), "3");
    assert_eq!(flag(&f, "bgp-graceful-restart-time"), "300");
    assert_eq!(
        f["bgp-peer"],
        vec![
            "192.0.2.1,asn=65000,port=179".to_owned(),
            "2001:db8::1,asn=65001,port=1179".to_owned()
        ]
    );
    // port 1179 needs neither root nor a sysctl
    let psc = spec.security_context.clone().unwrap();
    assert_eq!(psc.run_as_non_root, Some(true));
    assert!(psc.sysctls.is_none());
    // host network: replicas must not share a node
    let affinity = spec.affinity.clone().unwrap().pod_anti_affinity.unwrap();
    assert!(affinity
        .required_during_scheduling_ignored_during_execution
        .is_some());
    assert_eq!(
        find(&objs, "Deployment", "egw-egress-gateway-controller")["spec"]["replicas"],
        1
    );
    assert!(
        objs.iter().all(|o| o["kind"] != "PodDisruptionBudget"),
        "a PodDisruptionBudget for one replica blocks node drains"
    );
    for spec in [agent(&objs), spec] {
        let env = spec.containers[0].env.clone().unwrap();
        let pw = env
            .iter()
            .find(|e| e.name == "EGRESS_BGP_PASSWORD")
            .expect("password env");
        let key = pw
            .value_from
            .as_ref()
            .unwrap()
            .secret_key_ref
            .as_ref()
            .unwrap();
        assert_eq!((key.name.as_str(), key.key.as_str()), ("bgp-md5", "md5"));
    }
    let a = flags(&agent(&objs).containers[0]);
    assert_eq!(flag(&a, "bgp-reflector-port"), "1179");

    // host network on port 179: root with NET_BIND_SERVICE only, no sysctl
    let objs = render(&json!({"controller": {"hostNetwork": true}}));
    let spec = controller(&objs);
    let psc = spec.security_context.clone().unwrap();
    assert_eq!(psc.run_as_user, Some(0));
    assert!(psc.sysctls.is_none());
    let caps = spec.containers[0]
        .security_context
        .clone()
        .unwrap()
        .capabilities
        .unwrap();
    assert_eq!(caps.add, Some(vec!["NET_BIND_SERVICE".to_owned()]));
    assert_eq!(caps.drop, Some(vec!["ALL".to_owned()]));
}

#[test]
fn bgp_and_metrics_can_be_turned_off() {
    let objs = render(&json!({"bgp": {"enabled": false}, "metrics": {"enabled": false}}));
    for spec in [agent(&objs), controller(&objs)] {
        let c = &spec.containers[0];
        let f = flags(c);
        assert_eq!(flag(&f, "bgp"), "false");
        assert!(
            f.keys().all(|k| !k.starts_with("bgp-")),
            "BGP flags with BGP off: {f:?}"
        );
        assert!(c
            .ports
            .iter()
            .flatten()
            .all(|p| p.name.as_deref() != Some("bgp")));
        // the health server stays for the probes
        assert!(c.liveness_probe.is_some() && c.readiness_probe.is_some());
    }
    let kinds = names(&objs);
    assert!(
        kinds.iter().all(|n| !n.starts_with("Service/")),
        "Services with BGP and metrics off: {kinds:?}"
    );
    let ds = find(&objs, "DaemonSet", "egw-egress-gateway-agent");
    assert!(ds["spec"]["template"]["metadata"]["annotations"].is_null());
    // and on by default
    let objs = render(&json!({}));
    find(&objs, "Service", "egw-egress-gateway-agent-metrics");
    find(&objs, "Service", "egw-egress-gateway-controller-metrics");
}

#[test]
fn agent_admission_policy() {
    // rendered only where the cluster serves the API
    let objs = render(&json!({}));
    assert!(objs
        .iter()
        .all(|o| o["kind"] != "ValidatingAdmissionPolicy"));
    let objs = render_with(&json!({}), &["--api-versions", VAP_API]);
    let vap = find(
        &objs,
        "ValidatingAdmissionPolicy",
        "egw-egress-gateway-agent-own-node",
    );
    let condition = vap["spec"]["matchConditions"][0]["expression"]
        .as_str()
        .unwrap();
    assert!(
        condition.contains(&format!(
            "system:serviceaccount:{NAMESPACE}:egw-egress-gateway-agent"
        )),
        "{condition}"
    );
    let rule = vap["spec"]["validations"][0]["expression"]
        .as_str()
        .unwrap();
    assert!(
        rule.contains("authentication.kubernetes.io/node-name"),
        "{rule}"
    );
    let resources: Vec<&str> = vap["spec"]["matchConstraints"]["resourceRules"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| {
            r["resources"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap())
        })
        .collect();
    assert!(
        resources.contains(&"egresstunnels/status") && resources.contains(&"leases"),
        "{resources:?}"
    );
    let binding = find(
        &objs,
        "ValidatingAdmissionPolicyBinding",
        "egw-egress-gateway-agent-own-node",
    );
    assert_eq!(binding["spec"]["policyName"], vap["metadata"]["name"]);
    assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
    let objs = render_with(
        &json!({"rbac": {"agentOwnNodeOnly": false}}),
        &["--api-versions", VAP_API],
    );
    assert!(objs
        .iter()
        .all(|o| o["kind"] != "ValidatingAdmissionPolicy"));
}

#[test]
fn notes_render() {
    let version = helm::helm_version(helm_bin()).unwrap();
    if version.starts_with("v3.") {
        // helm 3's `install --dry-run=client` still asks a cluster for its version
        eprintln!("note: NOTES.txt is rendered with helm 4 only; {version} given");
        return;
    }
    let out = helm(&["install", RELEASE, "--dry-run=client"], &json!({}), &[])
        .unwrap_or_else(|e| panic!("helm install --dry-run=client: {e}"));
    let notes = out.split("NOTES:").nth(1).expect("NOTES printed");
    assert!(notes.contains("kubectl get egresstunnels"), "{notes}");
    assert!(notes.contains("no upstream peers"), "{notes}");
    assert!(notes.contains("EIPs move after 15s"), "{notes}");
}

/// The CRDs in `crds/` (generated from the Rust types by another part of the
/// project, drift-tested there) are valid CustomResourceDefinitions of this
/// project's group, the RBAC rules name exactly their plurals, and each has
/// the status subresource that the `*/status` rules grant.
#[test]
fn crds_match_the_rbac_rules() {
    let dir = chart_dir().join("crds");
    let files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
                .collect()
        })
        .unwrap_or_default();
    assert!(!files.is_empty(), "{} holds no CRDs", dir.display());
    let mut plurals = BTreeSet::new();
    for f in files {
        let crd = yaml_file(&f);
        if let Err(e) = check_k8s_schema(&crd) {
            panic!("{}: {e}", f.display());
        }
        assert_eq!(crd["spec"]["group"], GROUP, "{}", f.display());
        for v in crd["spec"]["versions"].as_array().unwrap() {
            assert!(
                v["subresources"]["status"].is_object(),
                "{}: version {} has no status subresource",
                f.display(),
                v["name"]
            );
        }
        let plural = crd["spec"]["names"]["plural"].as_str().unwrap().to_owned();
        let scope = crd["spec"]["scope"].as_str().unwrap();
        // EgressPolicy is the one namespaced kind (DESIGN.md)
        let want_scope = if plural == "egresspolicies" {
            "Namespaced"
        } else {
            "Cluster"
        };
        assert_eq!(scope, want_scope, "{plural}");
        plurals.insert(plural);
    }
    let want: BTreeSet<String> = CRD_PLURALS.iter().map(|s| s.to_string()).collect();
    assert_eq!(
        plurals, want,
        "the RBAC rules name other plurals than the CRDs"
    );
}

// ---------------------------------------------------------------------------
// 3. RBAC least privilege
// ---------------------------------------------------------------------------

const CRD_PLURALS: &[&str] = &[
    "egressclusterpolicies",
    "egressgateways",
    "egresspolicies",
    "egresstunnels",
];
const READ: &[&str] = &["get", "list", "watch"];

/// (apiGroup, resource, verb, namespaced role?) for every grant of one role kind and name.
fn grants(objs: &[Value], kind: &str, name: &str) -> Vec<(String, String, String)> {
    let rules: Vec<PolicyRule> =
        serde_json::from_value(find(objs, kind, name)["rules"].clone()).expect("rules");
    let mut out = Vec::new();
    for r in rules {
        assert!(r.non_resource_urls.is_none(), "{name}: nonResourceURLs");
        assert!(
            r.resource_names.is_none(),
            "{name}: resourceNames are not used"
        );
        for g in r.api_groups.unwrap_or_default() {
            for res in r.resources.clone().unwrap_or_default() {
                for v in &r.verbs {
                    out.push((g.clone(), res.clone(), v.clone()));
                }
            }
        }
    }
    out
}

fn writes(g: &[(String, String, String)]) -> BTreeSet<(String, String)> {
    g.iter()
        .filter(|(_, _, v)| !READ.contains(&v.as_str()))
        .map(|(grp, res, _)| (grp.clone(), res.clone()))
        .collect()
}

fn pairs(list: &[(&str, &str)]) -> BTreeSet<(String, String)> {
    list.iter()
        .map(|(g, r)| (g.to_string(), r.to_string()))
        .collect()
}

#[test]
fn rbac_has_no_wildcards_or_secrets() {
    let objs = render(&json!({}));
    let mut roles = 0;
    for o in objs
        .iter()
        .filter(|o| o["kind"] == "Role" || o["kind"] == "ClusterRole")
    {
        roles += 1;
        let rules: Vec<PolicyRule> = serde_json::from_value(o["rules"].clone()).unwrap();
        for r in rules {
            let all = r
                .api_groups
                .iter()
                .flatten()
                .chain(r.resources.iter().flatten())
                .chain(r.verbs.iter());
            for word in all {
                assert!(
                    !word.contains('*'),
                    "{}: wildcard {word:?}",
                    o["metadata"]["name"]
                );
            }
            for res in r.resources.iter().flatten() {
                assert!(
                    !matches!(
                        res.as_str(),
                        "secrets"
                            | "configmaps"
                            | "serviceaccounts/token"
                            | "nodes/proxy"
                            | "pods/exec"
                    ),
                    "{}: access to {res}",
                    o["metadata"]["name"]
                );
            }
            for v in &r.verbs {
                assert!(
                    !matches!(
                        v.as_str(),
                        "escalate" | "bind" | "impersonate" | "deletecollection"
                    ),
                    "{}: verb {v}",
                    o["metadata"]["name"]
                );
            }
        }
    }
    assert_eq!(roles, 4, "two roles each for the agent and the controller");
}

#[test]
fn agent_rbac_is_least_privilege() {
    let objs = render(&json!({}));
    let cluster = grants(&objs, "ClusterRole", "egw-egress-gateway-agent");
    let namespaced = grants(&objs, "Role", "egw-egress-gateway-agent");
    // writes: its EgressTunnel's status cluster-wide, Leases in the release namespace only
    assert_eq!(writes(&cluster), pairs(&[(GROUP, "egresstunnels/status")]));
    assert_eq!(
        writes(&namespaced),
        pairs(&[("coordination.k8s.io", "leases")])
    );
    let verbs = |g: &[(String, String, String)], res: &str| -> BTreeSet<String> {
        g.iter()
            .filter(|(_, r, _)| r == res)
            .map(|(_, _, v)| v.clone())
            .collect()
    };
    assert!(!verbs(&cluster, "egresstunnels/status").contains("delete"));
    assert!(
        !verbs(&namespaced, "leases").contains("delete"),
        "an agent may not delete Leases (the leader's)"
    );
    // reads: what decides the maps
    for res in [
        "egresspolicies",
        "egressclusterpolicies",
        "egressgateways",
        "egresstunnels",
    ] {
        for v in READ {
            assert!(
                cluster.contains(&(GROUP.into(), res.into(), v.to_string())),
                "agent cannot {v} {res}"
            );
        }
    }
    for res in ["nodes", "pods"] {
        for v in READ {
            assert!(
                cluster.contains(&(String::new(), res.into(), v.to_string())),
                "agent cannot {v} {res}"
            );
        }
    }
    // every CRD resource named exists
    for (g, res, _) in &cluster {
        if g == GROUP {
            let plural = res.split('/').next().unwrap();
            assert!(CRD_PLURALS.contains(&plural), "unknown resource {res}");
        }
    }
    check_binding(
        &objs,
        "ClusterRoleBinding",
        "egw-egress-gateway-agent",
        "ClusterRole",
    );
    check_binding(&objs, "RoleBinding", "egw-egress-gateway-agent", "Role");
    let role = find(&objs, "Role", "egw-egress-gateway-agent");
    assert_eq!(role["metadata"]["namespace"], NAMESPACE);
}

#[test]
fn controller_rbac_is_least_privilege() {
    let objs = render(&json!({}));
    let cluster = grants(&objs, "ClusterRole", "egw-egress-gateway-controller");
    let namespaced = grants(&objs, "Role", "egw-egress-gateway-controller");
    let allowed_writes: BTreeSet<(String, String)> = CRD_PLURALS
        .iter()
        .flat_map(|p| {
            [
                (GROUP.to_owned(), p.to_string()),
                (GROUP.to_owned(), format!("{p}/status")),
            ]
        })
        .chain([
            ("".to_owned(), "events".to_owned()),
            ("events.k8s.io".to_owned(), "events".to_owned()),
        ])
        .collect();
    let w = writes(&cluster);
    assert!(
        w.is_subset(&allowed_writes),
        "controller writes outside its objects: {:?}",
        w.difference(&allowed_writes)
    );
    for p in CRD_PLURALS {
        assert!(
            w.contains(&(GROUP.to_owned(), format!("{p}/status"))),
            "controller cannot write {p}/status"
        );
        for v in READ {
            assert!(
                cluster.contains(&(GROUP.into(), p.to_string(), v.to_string())),
                "controller cannot {v} {p}"
            );
        }
    }
    // events: create and patch only
    let event_verbs: BTreeSet<&str> = cluster
        .iter()
        .filter(|(_, r, _)| r == "events")
        .map(|(_, _, v)| v.as_str())
        .collect();
    assert_eq!(event_verbs, ["create", "patch"].into());
    // core objects: read only
    for (g, res, v) in &cluster {
        if g.is_empty() && res != "events" {
            assert!(READ.contains(&v.as_str()), "controller may {v} {res}");
        }
    }
    // deleting is for EgressTunnels of removed nodes only
    let deletes: BTreeSet<&str> = cluster
        .iter()
        .filter(|(_, _, v)| v == "delete")
        .map(|(_, r, _)| r.as_str())
        .collect();
    assert_eq!(deletes, ["egresstunnels"].into());
    // Leases: in the release namespace only
    assert_eq!(
        writes(&namespaced),
        pairs(&[("coordination.k8s.io", "leases")])
    );
    assert!(
        cluster.iter().all(|(_, r, _)| r != "leases"),
        "cluster-wide Lease access"
    );
    check_binding(
        &objs,
        "ClusterRoleBinding",
        "egw-egress-gateway-controller",
        "ClusterRole",
    );
    check_binding(
        &objs,
        "RoleBinding",
        "egw-egress-gateway-controller",
        "Role",
    );
}

/// A binding gives its role to the service account of the same name, in the
/// release namespace, and that account is the one the pods run as.
fn check_binding(objs: &[Value], kind: &str, name: &str, role_kind: &str) {
    let b = find(objs, kind, name);
    assert_eq!(b["roleRef"]["kind"], role_kind);
    assert_eq!(b["roleRef"]["name"], name);
    let subjects = b["subjects"].as_array().unwrap();
    assert_eq!(subjects.len(), 1, "{name}: one subject");
    assert_eq!(subjects[0]["kind"], "ServiceAccount");
    assert_eq!(subjects[0]["name"], name);
    assert_eq!(subjects[0]["namespace"], NAMESPACE);
    find(objs, "ServiceAccount", name);
}

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
                Some("resources" | "nodeSelector")
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
        ("agent.pinDir", json!("/sys/fs/bpf/other"), json!({})),
        ("agent.uplink", json!("ens5"), json!({})),
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
        ("feature.nodeIpPortRange", json!("49152-65535"), json!({})),
        ("feature.portBlockSize", json!(256), json!({})),
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
    "node-name",
    "pin-dir",
    "probe-detect-multiplier",
    "probe-interval-ms",
    "tunnel-monitor-period",
    "tunnel-update-period",
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

// ---------------------------------------------------------------------------
// The admission policy's CEL, evaluated
// ---------------------------------------------------------------------------

/// Evaluates a CEL expression with `request` bound to an admission request.
/// cel-interpreter is not the API server's CEL environment (no Kubernetes
/// extension libraries, no type checking), so this checks the logic of the
/// expressions, not that the API server compiles them.
fn cel(expr: &str, request: &Value) -> Result<cel_interpreter::Value, String> {
    let program = cel_interpreter::Program::compile(expr).map_err(|e| format!("{expr}: {e}"))?;
    let mut ctx = cel_interpreter::Context::default();
    ctx.add_variable("request", request.clone())
        .map_err(|e| e.to_string())?;
    program.execute(&ctx).map_err(|e| format!("{expr}: {e}"))
}

#[test]
fn agent_admission_policy_expressions() {
    let objs = render_with(&json!({}), &["--api-versions", VAP_API]);
    let vap = find(
        &objs,
        "ValidatingAdmissionPolicy",
        "egw-egress-gateway-agent-own-node",
    );
    let condition = vap["spec"]["matchConditions"][0]["expression"]
        .as_str()
        .unwrap();
    let validation = vap["spec"]["validations"][0]["expression"]
        .as_str()
        .unwrap();
    let message = vap["spec"]["validations"][0]["messageExpression"]
        .as_str()
        .unwrap();
    let agent = format!("system:serviceaccount:{NAMESPACE}:egw-egress-gateway-agent");
    let request = |user: &str, name: &str, extra: Value| json!({"name": name, "userInfo": {"username": user, "extra": extra}});
    let on_node = |node: &str| json!({"authentication.kubernetes.io/node-name": [node]});
    let yes = cel_interpreter::Value::Bool(true);
    let no = cel_interpreter::Value::Bool(false);

    // the policy looks at the agent only
    assert_eq!(
        cel(condition, &request(&agent, "node-a", on_node("node-a"))),
        Ok(yes.clone())
    );
    for other in [
        format!("system:serviceaccount:{NAMESPACE}:egw-egress-gateway-controller"),
        "system:serviceaccount:other:egw-egress-gateway-agent".to_owned(),
        "kubernetes-admin".to_owned(),
    ] {
        assert_eq!(
            cel(condition, &request(&other, "x", json!({}))),
            Ok(no.clone()),
            "{other}"
        );
    }
    // its own node's objects pass, any other name is refused
    assert_eq!(
        cel(validation, &request(&agent, "node-a", on_node("node-a"))),
        Ok(yes)
    );
    assert_eq!(
        cel(validation, &request(&agent, "node-b", on_node("node-a"))),
        Ok(no.clone())
    );
    assert_eq!(
        cel(
            validation,
            &request(&agent, "egw-egress-gateway-controller", on_node("node-a"))
        ),
        Ok(no.clone()),
        "an agent took the leader's Lease"
    );
    // a token without the node name (older cluster, or not pod-bound) is refused, not an error
    assert_eq!(
        cel(validation, &request(&agent, "node-a", json!({}))),
        Ok(no.clone())
    );
    assert_eq!(
        cel(
            validation,
            &json!({"name": "node-a", "userInfo": {"username": agent}})
        ),
        Ok(no)
    );
    let text = cel(message, &request(&agent, "node-b", on_node("node-a"))).unwrap();
    match text {
        cel_interpreter::Value::String(s) => assert!(s.ends_with("node-b"), "{s}"),
        other => panic!("messageExpression gave {other:?}"),
    }
}
