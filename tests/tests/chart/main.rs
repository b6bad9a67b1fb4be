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

#[path = "../../../xtask/src/helm.rs"]
mod helm;

mod admission; // the agent's admission policy, rendered and its CEL evaluated
mod coverage; // helm 3, every value changes the output, the agreed flags
mod rbac; // 3. RBAC least privilege (and the CRDs the rules name)
mod render; // 2. helm lint, helm template, Kubernetes schemas
mod values; // 1. values.yaml and values.schema.json
mod workloads; // 2. the agent DaemonSet, the controller Deployment, their flags

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
};

use k8s_openapi::{
    api::{
        admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding},
        apps::v1::{DaemonSet, Deployment},
        core::v1::{
            Container, ContainerPort, EnvVar, PodSpec, Service, ServiceAccount, VolumeMount,
        },
        policy::v1::PodDisruptionBudget,
        rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding},
    },
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    Resource,
};
use serde::{de::DeserializeOwned, Serialize};
use serde_json::{json, Value};

pub(crate) const NAMESPACE: &str = "egress-system";
pub(crate) const RELEASE: &str = "egw";
pub(crate) const GROUP: &str = "egressgateway.egress.dev";
pub(crate) const VAP_API: &str = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy";

pub(crate) fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ lives in the workspace")
        .to_owned()
}

pub(crate) fn chart_dir() -> PathBuf {
    root().join("charts/egress-gateway")
}

pub(crate) fn yaml_file(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub(crate) fn default_values() -> Value {
    yaml_file(&chart_dir().join("values.yaml"))
}

pub(crate) fn schema() -> Value {
    let path = chart_dir().join("values.schema.json");
    let text = std::fs::read_to_string(&path).expect("values.schema.json");
    serde_json::from_str(&text).expect("values.schema.json is JSON")
}

/// Schema errors of `values`, as readable lines.
pub(crate) fn schema_errors(values: &Value) -> Vec<String> {
    let schema = schema();
    let validator = jsonschema::draft7::new(&schema).expect("the schema compiles");
    validator
        .iter_errors(values)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect()
}

/// Sets `value` at a dotted path, creating objects on the way.
pub(crate) fn set(values: &mut Value, dotted: &str, value: Value) {
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

pub(crate) fn helm_bin() -> &'static Path {
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
pub(crate) fn helm(
    subcommand: &[&str],
    overrides: &Value,
    extra: &[&str],
) -> Result<String, String> {
    helm_with(helm_bin(), subcommand, overrides, extra)
}

pub(crate) fn helm_with(
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

pub(crate) fn parse_docs(out: &str) -> Vec<Value> {
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
pub(crate) fn render_with(overrides: &Value, extra: &[&str]) -> Vec<Value> {
    let out = helm(&["template", RELEASE], overrides, extra)
        .unwrap_or_else(|e| panic!("helm template failed with {overrides}:\n{e}"));
    parse_docs(&out)
}

use serde::Deserialize;

pub(crate) fn render(overrides: &Value) -> Vec<Value> {
    render_with(overrides, &[])
}

pub(crate) fn find<'a>(objs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objs.iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} rendered; got {:?}", names(objs)))
}

pub(crate) fn names(objs: &[Value]) -> Vec<String> {
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
pub(crate) fn check_k8s_schema(obj: &Value) -> Result<(), String> {
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

/// Value sets the chart must render, each checked against the schemas.
pub(crate) fn combinations() -> Vec<(&'static str, Value)> {
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
                    "portBlockSize": 4096, "maxPortsPerNode": 40000, "nodeIpPortRange": "49152-65535",
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
        (
            "bgp over an IPv6 underlay",
            json!({
                "bgp": {"listenAddress": "::"},
                "feature": {"vxlan": {"underlay": "ipv6"}}
            }),
        ),
    ]
}

fn pod_spec(objs: &[Value], kind: &str, name: &str) -> PodSpec {
    serde_json::from_value(find(objs, kind, name)["spec"]["template"]["spec"].clone())
        .expect("a PodSpec")
}

pub(crate) fn agent(objs: &[Value]) -> PodSpec {
    pod_spec(objs, "DaemonSet", "egw-egress-gateway-agent")
}

pub(crate) fn controller(objs: &[Value]) -> PodSpec {
    pod_spec(objs, "Deployment", "egw-egress-gateway-controller")
}

/// The overrides of the [`combinations`] case whose name starts with `prefix`.
pub(crate) fn combination(prefix: &str) -> Value {
    combinations()
        .into_iter()
        .find(|(n, _)| n.starts_with(prefix))
        .unwrap_or_else(|| panic!("no combination {prefix:?}"))
        .1
}

/// The item of `items` (of container `c`) called `name`.
fn named<'a, T>(
    c: &Container,
    items: &'a Option<Vec<T>>,
    name: &str,
    name_of: impl Fn(&T) -> Option<&str>,
) -> &'a T {
    items
        .iter()
        .flatten()
        .find(|i| name_of(i) == Some(name))
        .unwrap_or_else(|| panic!("no {name} in container {}", c.name))
}

/// The container's environment variable `name`.
pub(crate) fn env_var<'a>(c: &'a Container, name: &str) -> &'a EnvVar {
    named(c, &c.env, name, |e| Some(&e.name))
}

/// The downward API field an environment variable is read from.
pub(crate) fn field_path(e: &EnvVar) -> &str {
    let from = e.value_from.as_ref().expect("valueFrom");
    &from.field_ref.as_ref().expect("fieldRef").field_path
}

/// The container's volume mount `name`.
pub(crate) fn mount<'a>(c: &'a Container, name: &str) -> &'a VolumeMount {
    named(c, &c.volume_mounts, name, |m| Some(&m.name))
}

/// The container's port named `name`.
pub(crate) fn port<'a>(c: &'a Container, name: &str) -> &'a ContainerPort {
    named(c, &c.ports, name, |p| p.name.as_deref())
}

/// `--flag=value` arguments as a map (repeated flags keep every value).
pub(crate) fn flags(c: &Container) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for a in c.args.as_deref().unwrap_or_default() {
        if let Some(rest) = a.strip_prefix("--") {
            let (k, v) = rest.split_once('=').unwrap_or((rest, ""));
            out.entry(k.to_owned()).or_default().push(v.to_owned());
        }
    }
    out
}

/// Each `(flag, value)`: the flag is given once, with that value.
pub(crate) fn assert_flags(f: &BTreeMap<String, Vec<String>>, want: &[(&str, &str)]) {
    for (name, value) in want {
        assert_eq!(flag(f, name), *value, "--{name}");
    }
}

pub(crate) fn flag(f: &BTreeMap<String, Vec<String>>, name: &str) -> String {
    match f.get(name).map(Vec::as_slice) {
        Some([one]) => one.clone(),
        other => panic!("--{name}: expected one value, got {other:?} in {f:?}"),
    }
}
