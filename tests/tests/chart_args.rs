//! The chart and the binary agree: every container command the chart renders
//! parses with the `egress` binary's own command line definition, so a
//! deployed agent or controller cannot crash-loop on an unknown flag.

#[path = "../../xtask/src/helm.rs"]
mod helm;

use std::{path::Path, process::Command};

use clap::Parser;
use egress_user::cli::Cli;

fn root() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `command` + `args` of every container in the rendered chart, by container name.
fn rendered_commands(sets: &[&str]) -> Vec<(String, Vec<String>)> {
    let helm = helm::ensure_helm(&root()).expect("helm for the chart tests");
    let mut cmd = Command::new(helm);
    cmd.args(["template", "rel"])
        .arg(root().join("charts/egress-gateway"));
    for s in sets {
        cmd.args(["--set", s]);
    }
    let out = cmd.output().expect("running helm");
    assert!(
        out.status.success(),
        "helm template failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut found = Vec::new();
    for doc in serde_yaml::Deserializer::from_slice(&out.stdout) {
        let v = serde_yaml::Value::deserialize(doc).unwrap();
        let containers = &v["spec"]["template"]["spec"]["containers"];
        for c in containers.as_sequence().into_iter().flatten() {
            let mut argv: Vec<String> = Vec::new();
            for key in ["command", "args"] {
                for a in c[key].as_sequence().into_iter().flatten() {
                    argv.push(a.as_str().unwrap_or_default().to_owned());
                }
            }
            found.push((c["name"].as_str().unwrap_or_default().to_owned(), argv));
        }
    }
    found
}

/// Kubernetes expands `$(VAR)` from the container's env; stand in plausible values.
fn expand(arg: &str) -> String {
    arg.replace("$(NODE_NAME)", "node-1")
        .replace("$(NODE_IP)", "10.0.0.11")
        .replace("$(POD_IP)", "10.244.0.9")
        .replace("$(POD_NAME)", "pod-1")
        .replace("$(POD_NAMESPACE)", "egress-system")
}

use serde::Deserialize;

fn assert_parses(sets: &[&str]) {
    let commands = rendered_commands(sets);
    let mut seen = 0;
    for (name, argv) in commands {
        if argv.first().map(String::as_str) != Some("egress") {
            continue;
        }
        seen += 1;
        let argv: Vec<String> = argv.iter().map(|a| expand(a)).collect();
        if let Err(e) = Cli::try_parse_from(&argv) {
            panic!("container {name} (values {sets:?}): the binary rejects {argv:?}:\n{e}");
        }
    }
    assert!(
        seen >= 2,
        "expected the agent and controller containers, found {seen}"
    );
}

#[test]
fn default_chart_commands_parse() {
    assert_parses(&[]);
}

#[test]
fn chart_commands_parse_with_bgp_and_failover_off() {
    assert_parses(&["bgp.enabled=false", "feature.gatewayFailover.enable=false"]);
}

#[test]
fn chart_commands_parse_with_a_nat_table_size() {
    assert_parses(&["agent.natTableSize=65536"]);
    let agent = rendered_commands(&["agent.natTableSize=65536"])
        .into_iter()
        .find(|(name, _)| name == "agent")
        .expect("the agent container");
    assert!(
        agent.1.contains(&"--nat-table-size=65536".to_string()),
        "{:?}",
        agent.1
    );
}

/// One VXLAN port everywhere: the agent's default is the chart's.
#[test]
fn the_agents_default_vxlan_port_is_the_charts() {
    let cli = Cli::try_parse_from(["egress", "agent", "--node-name", "n1"]).unwrap();
    let egress_user::cli::Command::Agent(agent) = cli.command else {
        panic!("not the agent")
    };
    let values: serde_yaml::Value = serde_yaml::from_str(
        &std::fs::read_to_string(root().join("charts/egress-gateway/values.yaml")).unwrap(),
    )
    .unwrap();
    let chart = values["feature"]["vxlan"]["port"].as_u64().unwrap();
    assert_eq!(u64::from(agent.vxlan_port), chart);
}
