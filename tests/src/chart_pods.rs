//! The agent and controller as the Helm chart deploys them: each container
//! spec of the rendered chart (command and args, env, security context,
//! volume mounts, host network) turned into a `podman run` of the chart's
//! image inside one of the harness's namespaces.
//!
//! What Kubernetes would provide and the harness stands in for:
//! - the downward API (`fieldRef` env: node name, node and pod addresses,
//!   pod name and namespace) and the `$(VAR)` expansion of args from env;
//! - the service account token: a kubeconfig for the in-memory API server
//!   (`KUBECONFIG`, mounted read-only), with the chart's RBAC behind it;
//! - the node: hostNetwork joins the node's namespace, a pod network is the
//!   fabric namespace (where the controller runs in the harness);
//! - one bpffs per node: here every node shares the host's, so each agent's
//!   `--pin-dir` is replaced by its node's own folder.
//!
//! Everything else is taken from the chart as rendered.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, ensure, Context, Result};
use serde_yaml::Value;

use crate::{process::Proc, Netns};

/// The mount of a volume into a container.
#[derive(Clone, Debug, PartialEq)]
pub struct Mount {
    pub path: String,
    pub read_only: bool,
    /// `HostToContainer`, `Bidirectional` or none.
    pub propagation: Option<String>,
    pub source: VolumeSource,
}

#[derive(Clone, Debug, PartialEq)]
pub enum VolumeSource {
    HostPath(String),
    EmptyDir,
}

/// An env var: a value, or a downward API field (`spec.nodeName`, ...).
#[derive(Clone, Debug, PartialEq)]
pub enum EnvValue {
    Value(String),
    Field(String),
}

/// The seccomp profile a container asks for (its own, else its pod's).
#[derive(Clone, Debug, PartialEq)]
pub enum Seccomp {
    /// `RuntimeDefault`: the container runtime's default profile, the one
    /// [`ContainerSpec::runtime_default`] stands for.
    RuntimeDefault,
    Unconfined,
    /// `Localhost` with its `localhostProfile` (not run here).
    Localhost(String),
    /// None asked for: the kubelet runs it unconfined (unless its
    /// `SeccompDefault` is on, which the harness does not model).
    Unset,
}

/// Which container runtime's default seccomp profile `RuntimeDefault` is.
/// They differ on the one system call the agent lives on.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub enum RuntimeDefault {
    /// containerd's: bpf() is let through to a process holding `CAP_BPF`
    /// (or `CAP_SYS_ADMIN`). Run here as containers-common's profile with
    /// that one rule changed: bpf() moves out of the `CAP_SYS_ADMIN`-only
    /// rules into one of its own for `CAP_BPF`.
    #[default]
    CapBpfAllowsBpf,
    /// containers-common's (podman's own default, and CRI-O's, as on
    /// Debian 12): bpf() only with `CAP_SYS_ADMIN`.
    SysAdminGatesBpf,
}

/// containers-common's default profile, the base of both [`RuntimeDefault`]s.
const CONTAINERS_COMMON_PROFILE: &str = "/usr/share/containers/seccomp.json";

/// Writes the [`RuntimeDefault::CapBpfAllowsBpf`] profile, made from
/// containers-common's, and returns its path.
fn cap_bpf_profile() -> Result<PathBuf> {
    let text = std::fs::read_to_string(CONTAINERS_COMMON_PROFILE)
        .with_context(|| format!("reading {CONTAINERS_COMMON_PROFILE} (containers-common)"))?;
    let mut profile: serde_json::Value = serde_json::from_str(&text)?;
    let rules = profile["syscalls"]
        .as_array_mut()
        .context("no syscalls in the profile")?;
    let mut moved = 0;
    for rule in rules.iter_mut() {
        let gated = rule["includes"]["caps"] == serde_json::json!(["CAP_SYS_ADMIN"])
            || rule["excludes"]["caps"] == serde_json::json!(["CAP_SYS_ADMIN"]);
        if let (true, Some(names)) = (gated, rule["names"].as_array_mut()) {
            let before = names.len();
            names.retain(|n| n != "bpf");
            moved += before - names.len();
        }
    }
    ensure!(
        moved > 0,
        "{CONTAINERS_COMMON_PROFILE} gates no bpf() rule on CAP_SYS_ADMIN"
    );
    rules.push(serde_json::json!({
        "names": ["bpf"],
        "action": "SCMP_ACT_ALLOW",
        "includes": {"caps": ["CAP_BPF"]},
    }));
    rules.push(serde_json::json!({
        "names": ["bpf"],
        "action": "SCMP_ACT_ALLOW",
        "includes": {"caps": ["CAP_SYS_ADMIN"]},
        "excludes": {"caps": ["CAP_BPF"]},
    }));
    let dir = root().join("target/tmp");
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("seccomp-cap-bpf-allows-bpf.json");
    std::fs::write(&path, serde_json::to_vec_pretty(&profile)?)?;
    Ok(path)
}

/// One container of the rendered chart, with its pod's settings that shape it.
#[derive(Clone, Debug)]
pub struct ContainerSpec {
    pub name: String,
    pub command: Vec<String>,
    pub args: Vec<String>,
    pub env: Vec<(String, EnvValue)>,
    pub privileged: bool,
    pub caps_add: Vec<String>,
    pub caps_drop: Vec<String>,
    /// The container's runAsUser, else the pod's.
    pub run_as_user: Option<u64>,
    pub run_as_group: Option<u64>,
    pub read_only_root: bool,
    pub no_new_privileges: bool,
    pub apparmor_unconfined: bool,
    pub seccomp: Seccomp,
    /// What `RuntimeDefault` means for this run (not from the chart: the
    /// runtime of the node).
    pub runtime_default: RuntimeDefault,
    /// The pod's namespaced sysctls.
    pub sysctls: Vec<(String, String)>,
    /// Names the cluster DNS would answer, with their addresses (not from
    /// the chart: the harness's stand-in for the DNS).
    pub hosts: Vec<(String, String)>,
    pub mounts: Vec<Mount>,
    pub host_network: bool,
}

/// The chart's image and its two containers, rendered with some values.
#[derive(Clone, Debug)]
pub struct ChartPods {
    pub image: String,
    pub agent: ContainerSpec,
    pub controller: ContainerSpec,
}

/// What the kubelet and the API server would fill in for one pod.
pub struct PodEnv<'a> {
    pub node_name: &'a str,
    pub node_ip: String,
    pub pod_ip: String,
    pub pod_name: String,
    pub namespace: &'a str,
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The image reference of the chart's default values (`repository:appVersion`).
pub fn chart_image() -> Result<String> {
    let chart = root().join("charts/egress-gateway");
    let values: Value = serde_yaml::from_str(&std::fs::read_to_string(chart.join("values.yaml"))?)?;
    let meta: Value = serde_yaml::from_str(&std::fs::read_to_string(chart.join("Chart.yaml"))?)?;
    let repo = values["image"]["repository"]
        .as_str()
        .context("image.repository")?;
    let tag = match values["image"]["tag"].as_str() {
        Some(t) if !t.is_empty() => t.to_owned(),
        _ => meta["appVersion"]
            .as_str()
            .context("appVersion")?
            .to_owned(),
    };
    Ok(format!("{repo}:{tag}"))
}

/// `helm template` of the chart with `sets` (`key=value`), as YAML documents.
pub fn render(sets: &[String]) -> Result<Vec<Value>> {
    let mut cmd = Command::new(crate::chart_rbac::helm_bin()?);
    cmd.args(["template", crate::chart_rbac::RELEASE])
        .arg(root().join("charts/egress-gateway"))
        .args(["--namespace", crate::chart_rbac::NAMESPACE]);
    for s in sets {
        cmd.args(["--set", s]);
    }
    let out = cmd.output().context("running helm")?;
    ensure!(
        out.status.success(),
        "helm template: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    use serde::Deserialize;
    serde_yaml::Deserializer::from_slice(&out.stdout)
        .map(|d| Value::deserialize(d).map_err(Into::into))
        .collect()
}

impl ChartPods {
    /// Renders the chart with `sets` and takes the agent's and the
    /// controller's container specs.
    pub fn render(sets: &[String]) -> Result<Self> {
        let docs = render(sets)?;
        let find = |kind: &str, container: &str| -> Result<ContainerSpec> {
            let doc = docs
                .iter()
                .find(|d| d["kind"] == kind)
                .with_context(|| format!("no {kind} in the rendered chart"))?;
            ContainerSpec::from_pod(&doc["spec"]["template"]["spec"], container)
        };
        Ok(Self {
            image: chart_image()?,
            agent: find("DaemonSet", "agent")?,
            controller: find("Deployment", "controller")?,
        })
    }
}

/// The `seccompProfile` of a (pod or container) security context, if any.
fn seccomp_of(security_context: &Value) -> Option<Seccomp> {
    let profile = &security_context["seccompProfile"];
    Some(match profile["type"].as_str()? {
        "RuntimeDefault" => Seccomp::RuntimeDefault,
        "Unconfined" => Seccomp::Unconfined,
        _ => Seccomp::Localhost(
            profile["localhostProfile"]
                .as_str()
                .unwrap_or("")
                .to_owned(),
        ),
    })
}

fn strings(v: &Value) -> Vec<String> {
    v.as_sequence()
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(str::to_owned))
        .collect()
}

impl ContainerSpec {
    /// The container `name` of a pod spec.
    pub fn from_pod(pod: &Value, name: &str) -> Result<Self> {
        let c = pod["containers"]
            .as_sequence()
            .into_iter()
            .flatten()
            .find(|c| c["name"] == name)
            .with_context(|| format!("no container {name}"))?;
        let sc = &c["securityContext"];
        let psc = &pod["securityContext"];
        let mut env = Vec::new();
        for e in c["env"].as_sequence().into_iter().flatten() {
            let key = e["name"].as_str().context("env name")?.to_owned();
            let value = if let Some(v) = e["value"].as_str() {
                EnvValue::Value(v.to_owned())
            } else if let Some(f) = e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                EnvValue::Field(f.to_owned())
            } else {
                bail!("env {key}: neither a value nor a fieldRef")
            };
            env.push((key, value));
        }
        let mut mounts = Vec::new();
        for m in c["volumeMounts"].as_sequence().into_iter().flatten() {
            let vol_name = m["name"].as_str().context("mount name")?;
            let vol = pod["volumes"]
                .as_sequence()
                .into_iter()
                .flatten()
                .find(|v| v["name"] == vol_name)
                .with_context(|| format!("no volume {vol_name}"))?;
            let source = if let Some(p) = vol["hostPath"]["path"].as_str() {
                VolumeSource::HostPath(p.to_owned())
            } else if vol.get("emptyDir").is_some() {
                VolumeSource::EmptyDir
            } else {
                bail!("volume {vol_name}: only hostPath and emptyDir are run here")
            };
            mounts.push(Mount {
                path: m["mountPath"].as_str().context("mountPath")?.to_owned(),
                read_only: m["readOnly"].as_bool().unwrap_or(false),
                propagation: m["mountPropagation"].as_str().map(str::to_owned),
                source,
            });
        }
        let uid = |k: &str| sc[k].as_u64().or_else(|| psc[k].as_u64());
        Ok(Self {
            name: name.to_owned(),
            command: strings(&c["command"]),
            args: strings(&c["args"]),
            env,
            privileged: sc["privileged"].as_bool().unwrap_or(false),
            caps_add: strings(&sc["capabilities"]["add"]),
            caps_drop: strings(&sc["capabilities"]["drop"]),
            run_as_user: uid("runAsUser"),
            run_as_group: uid("runAsGroup"),
            read_only_root: sc["readOnlyRootFilesystem"].as_bool().unwrap_or(false),
            no_new_privileges: sc["allowPrivilegeEscalation"].as_bool() == Some(false),
            apparmor_unconfined: sc["appArmorProfile"]["type"] == "Unconfined",
            seccomp: seccomp_of(sc)
                .or_else(|| seccomp_of(psc))
                .unwrap_or(Seccomp::Unset),
            runtime_default: RuntimeDefault::default(),
            sysctls: psc["sysctls"]
                .as_sequence()
                .into_iter()
                .flatten()
                .filter_map(|s| {
                    Some((
                        s["name"].as_str()?.to_owned(),
                        s["value"].as_str()?.to_owned(),
                    ))
                })
                .collect(),
            hosts: Vec::new(),
            mounts,
            host_network: pod["hostNetwork"].as_bool().unwrap_or(false),
        })
    }

    /// The env as the kubelet would set it for `pod`, plus `extra`.
    fn resolved_env(
        &self,
        pod: &PodEnv,
        extra: &[(String, String)],
    ) -> Result<Vec<(String, String)>> {
        let mut out = Vec::new();
        for (k, v) in &self.env {
            let v = match v {
                EnvValue::Value(v) => v.clone(),
                EnvValue::Field(f) => match f.as_str() {
                    "spec.nodeName" => pod.node_name.to_owned(),
                    "status.hostIP" => pod.node_ip.clone(),
                    "status.podIP" => pod.pod_ip.clone(),
                    "metadata.name" => pod.pod_name.clone(),
                    "metadata.namespace" => pod.namespace.to_owned(),
                    other => bail!("env {k}: no stand-in for the field {other}"),
                },
            };
            out.push((k.clone(), v));
        }
        out.extend(extra.iter().cloned());
        Ok(out)
    }

    /// The `podman run` command line of this container from `image`, in
    /// network namespace `ns`, named `name`. `replace` swaps the value of
    /// `--flag=` args (the harness's per-node stand-ins); `files` are host
    /// files mounted read-only at the same path; `env` is added to the chart's.
    #[allow(clippy::too_many_arguments)]
    pub fn podman_argv(
        &self,
        image: &str,
        name: &str,
        ns: &Netns,
        pod: &PodEnv,
        replace: &[(&str, String)],
        files: &[&Path],
        env: &[(String, String)],
    ) -> Result<Vec<String>> {
        let env = self.resolved_env(pod, env)?;
        let mut argv: Vec<String> = podman_base();
        argv.extend(
            [
                "run",
                "--rm",
                "--name",
                name,
                "--pull=never",
                "--ulimit",
                "nofile=1024:1024",
                "--ulimit",
                "nproc=1024:1024",
            ]
            .map(String::from),
        );
        argv.push(format!("--network=ns:{}", ns.path().display()));
        if self.privileged {
            argv.push("--privileged".into());
        }
        for c in &self.caps_drop {
            argv.push(format!("--cap-drop={}", cap_name(c)));
        }
        for c in &self.caps_add {
            argv.push(format!("--cap-add={}", cap_name(c)));
        }
        match (self.run_as_user, self.run_as_group) {
            (Some(u), Some(g)) => argv.push(format!("--user={u}:{g}")),
            (Some(u), None) => argv.push(format!("--user={u}")),
            _ => {}
        }
        if self.read_only_root {
            // Only what the chart mounts is writable (no podman /run, /tmp, ...).
            argv.extend(["--read-only".into(), "--read-only-tmpfs=false".into()]);
        }
        if self.no_new_privileges {
            argv.push("--security-opt=no-new-privileges".into());
        }
        if self.apparmor_unconfined {
            argv.push("--security-opt=apparmor=unconfined".into());
        }
        for (k, v) in &self.sysctls {
            argv.push(format!("--sysctl={k}={v}"));
        }
        for (name, ip) in &self.hosts {
            argv.push(format!("--add-host={name}:{ip}"));
        }
        match (&self.seccomp, self.runtime_default) {
            (Seccomp::RuntimeDefault, RuntimeDefault::SysAdminGatesBpf) => {}
            (Seccomp::RuntimeDefault, RuntimeDefault::CapBpfAllowsBpf) => argv.push(format!(
                "--security-opt=seccomp={}",
                cap_bpf_profile()?.display()
            )),
            (Seccomp::Unconfined | Seccomp::Unset, _) => {
                argv.push("--security-opt=seccomp=unconfined".into())
            }
            (Seccomp::Localhost(p), _) => bail!("seccomp profile Localhost {p}: not run here"),
        }
        for m in &self.mounts {
            match &m.source {
                VolumeSource::HostPath(p) => {
                    let mut opts = vec![if m.read_only { "ro" } else { "rw" }];
                    match m.propagation.as_deref() {
                        Some("HostToContainer") => opts.push("rslave"),
                        Some("Bidirectional") => opts.push("rshared"),
                        _ => {}
                    }
                    argv.push(format!("--volume={p}:{}:{}", m.path, opts.join(",")));
                }
                // An emptyDir is a fresh folder of the pod; a tmpfs is one
                // that needs no cleanup.
                VolumeSource::EmptyDir => argv.push(format!("--tmpfs={}:rw", m.path)),
            }
        }
        for f in files {
            argv.push(format!("--volume={0}:{0}:ro", f.display()));
        }
        for (k, v) in &env {
            argv.push(format!("--env={k}={v}"));
        }
        let (entry, rest) = self
            .command
            .split_first()
            .context("the container has no command")?;
        argv.push(format!("--entrypoint={entry}"));
        argv.push(image.to_owned());
        argv.extend(rest.iter().cloned());
        for a in &self.args {
            let mut a = expand(a, &env);
            for (flag, value) in replace {
                if a.starts_with(&format!("{flag}=")) {
                    a = format!("{flag}={value}");
                }
            }
            argv.push(a);
        }
        Ok(argv)
    }

    /// Starts this container (see [`ContainerSpec::podman_argv`]); the
    /// returned process removes the container when killed or dropped.
    #[allow(clippy::too_many_arguments)]
    pub fn spawn(
        &self,
        image: &str,
        label: &str,
        ns: &Netns,
        pod: &PodEnv,
        replace: &[(&str, String)],
        files: &[&Path],
        env: &[(String, String)],
    ) -> Result<Proc> {
        let name = crate::unique_name(label);
        let argv = self.podman_argv(image, &name, ns, pod, replace, files, env)?;
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..]);
        let mut rm = podman_base();
        rm.extend(["rm", "--force", "--time", "0", &name].map(String::from));
        Proc::spawn_with_cleanup(cmd, format!("container {name}: {}", argv.join(" ")), rm)
    }
}

/// Kubernetes names capabilities without the `CAP_` prefix.
fn cap_name(c: &str) -> String {
    if c == "ALL" || c.starts_with("CAP_") {
        c.to_owned()
    } else {
        format!("CAP_{c}")
    }
}

/// `$(VAR)` in an arg, from the container's env (as the kubelet expands it;
/// an unknown name stays as written).
fn expand(arg: &str, env: &[(String, String)]) -> String {
    let mut out = arg.to_owned();
    for (k, v) in env {
        out = out.replace(&format!("$({k})"), v);
    }
    out
}

/// podman with the settings this machine kind needs: runc (crun refuses the
/// hybrid cgroup layout), cgroupfs (no systemd) and the vfs storage driver
/// (no overlay mounts inside a container host).
pub fn podman_base() -> Vec<String> {
    [
        "podman",
        "--runtime",
        "runc",
        "--cgroup-manager",
        "cgroupfs",
        "--storage-driver",
        "vfs",
    ]
    .map(String::from)
    .to_vec()
}

/// True when podman has `image` (built by `cargo xtask image`).
pub fn image_exists(image: &str) -> bool {
    let argv = podman_base();
    Command::new(&argv[0])
        .args(&argv[1..])
        .args(["image", "exists", image])
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn args_expand_from_env_and_caps_get_their_prefix() {
        let env = vec![("NODE_IP".to_string(), "10.0.0.1".to_string())];
        assert_eq!(expand("--id=$(NODE_IP)", &env), "--id=10.0.0.1");
        assert_eq!(expand("--x=$(OTHER)", &env), "--x=$(OTHER)");
        assert_eq!(cap_name("BPF"), "CAP_BPF");
        assert_eq!(cap_name("ALL"), "ALL");
    }
}
