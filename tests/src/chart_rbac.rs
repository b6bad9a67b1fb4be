//! The permissions the Helm chart gives the agent and the controller, as
//! rules for the fake API server: `helm template` with the chart's
//! defaults, then, for the service account each workload runs as, the
//! rules of every role its bindings name (a RoleBinding scopes them to its
//! namespace). A cluster on the Kubernetes datastore runs its processes
//! with exactly these, so a request the chart does not allow fails there
//! as it would in a real cluster.

#[path = "../../xtask/src/helm.rs"]
mod helm;

use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::Deserialize;
use serde_json::Value;

use crate::kube_api::authz::{rules_of, Rule};

/// The release namespace the chart is rendered into (the Leases' namespace too).
pub const NAMESPACE: &str = "egress-system";

pub struct ChartRbac {
    pub agent: Vec<Rule>,
    pub controller: Vec<Rule>,
}

/// The release name the chart is rendered with (its object names follow).
pub const RELEASE: &str = "egw";

/// A working helm (installed under target/tools first if missing).
pub fn helm_bin() -> Result<std::path::PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .context("tests/ lives in the workspace")?
        .to_owned();
    helm::ensure_helm(&root)
}

fn render() -> Result<Vec<Value>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .context("tests/ lives in the workspace")?
        .to_owned();
    let helm = helm::ensure_helm(&root)?;
    let out = std::process::Command::new(helm)
        .args(["template", "egw"])
        .arg(root.join("charts/egress-gateway"))
        .args(["--namespace", NAMESPACE])
        .output()
        .context("running helm template")?;
    if !out.status.success() {
        bail!("helm template: {}", String::from_utf8_lossy(&out.stderr));
    }
    let text = String::from_utf8(out.stdout)?;
    let mut docs = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let v = Value::deserialize(doc)?;
        if !v.is_null() {
            docs.push(v);
        }
    }
    Ok(docs)
}

fn service_account(docs: &[Value], kind: &str) -> Result<String> {
    docs.iter()
        .find(|d| d["kind"] == kind)
        .and_then(|d| d.pointer("/spec/template/spec/serviceAccountName"))
        .and_then(Value::as_str)
        .map(str::to_string)
        .with_context(|| format!("the chart's {kind} names no service account"))
}

/// Every rule bound to service account `sa` of [`NAMESPACE`].
fn rules_for(docs: &[Value], sa: &str) -> Vec<Rule> {
    let mut out = Vec::new();
    for b in docs
        .iter()
        .filter(|d| d["kind"] == "ClusterRoleBinding" || d["kind"] == "RoleBinding")
    {
        let bound = b["subjects"].as_array().is_some_and(|subjects| {
            subjects.iter().any(|s| {
                s["kind"] == "ServiceAccount" && s["name"] == sa && s["namespace"] == NAMESPACE
            })
        });
        if !bound {
            continue;
        }
        let binding_ns = b.pointer("/metadata/namespace").and_then(Value::as_str);
        let Some(role) = docs.iter().find(|d| {
            d["kind"] == b["roleRef"]["kind"]
                && d["metadata"]["name"] == b["roleRef"]["name"]
                && (d["kind"] == "ClusterRole"
                    || d.pointer("/metadata/namespace").and_then(Value::as_str) == binding_ns)
        }) else {
            continue;
        };
        let mut rules = rules_of(role);
        if b["kind"] == "RoleBinding" {
            for r in &mut rules {
                r.namespace = binding_ns.map(str::to_string);
            }
        }
        out.extend(rules);
    }
    out
}

/// The agent's (DaemonSet) and the controller's (Deployment) rules.
pub fn chart_rbac() -> Result<ChartRbac> {
    let docs = render()?;
    let agent = rules_for(&docs, &service_account(&docs, "DaemonSet")?);
    let controller = rules_for(&docs, &service_account(&docs, "Deployment")?);
    if agent.is_empty() || controller.is_empty() {
        bail!("the chart binds no role to the agent or the controller");
    }
    Ok(ChartRbac { agent, controller })
}
