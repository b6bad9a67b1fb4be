//! A policy with more destination CIDRs than a node's trie holds, on a
//! real cluster (agents, controller, etcd): it is reported on the policy
//! (condition, across passes) and in the agent's metric, its pod's traffic
//! is dropped rather than sent with the pod's address, and the report goes
//! once the policy fits again.

use std::time::Duration;

use anyhow::{Context, Result};
use egress_tests::{
    cluster::{examples_dir, traffic_report, wait_until, Cluster},
    topology::SERVER_IP,
};
use serde_json::Value;

/// The OverCapacity condition of policy `web`, if it has one.
fn over_capacity(cluster: &Cluster) -> Result<Option<Value>> {
    let out = cluster.egress(&["get", "egp", "web", "-n", "default", "-o", "json"])?;
    let v: Value = serde_json::from_str(&out).context("egress get egp -o json")?;
    let conds = v["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    Ok(conds.into_iter().find(|c| c["reason"] == "OverCapacity"))
}

/// The example policy with 20,000 destinations (its own /24 among them).
fn oversized_policy() -> String {
    let example = std::fs::read_to_string(examples_dir().join("policy.yaml")).unwrap();
    let head = example.split("  destSubnet:").next().unwrap().to_string();
    let mut dests = vec!["198.51.100.0/24".to_string()];
    dests.extend((1..20_000u32).map(|i| format!("100.{}.{}.0/24", 64 + i / 256, i % 256)));
    let list: String = dests.iter().map(|d| format!("    - {d}\n")).collect();
    format!("{head}  destSubnet:\n{list}")
}

fn drops_no_gateway(cluster: &Cluster) -> Result<f64> {
    let m = cluster.agent_http(0, "/metrics")?;
    Ok(m.lines()
        .find(|l| l.starts_with("egress_drops_total{") && l.contains("reason=\"no_gateway\""))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0))
}

#[test]
#[ignore = "needs root: namespaces, BPF, etcd"]
fn an_oversized_policy_is_reported_and_fails_closed_until_it_fits() -> Result<()> {
    let cluster = Cluster::start_default()?;
    cluster.apply_example_policy()?;
    let dir = tempfile_dir()?;
    let big = dir.join("big.yaml");
    std::fs::write(&big, oversized_policy())?;
    cluster.apply(&big)?;
    wait_until("the policy is reported", Duration::from_secs(60), || {
        Ok(over_capacity(&cluster)?.is_some())
    })?;
    let c = over_capacity(&cluster)?.unwrap();
    let msg = c["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains(": 20000 destination CIDRs, the datapath holds 16384"),
        "{c}"
    );
    assert_eq!(
        (c["type"].as_str(), c["status"].as_str()),
        (Some("Applied"), Some("False"))
    );
    let metrics = cluster.agent_http(0, "/metrics")?;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("egress_policy_over_capacity{")
                && l.contains("EgressPolicy/default/web")
                && l.ends_with(" 20000")),
        "{metrics}"
    );
    // Its pod's traffic is dropped, not sent untranslated.
    let before = drops_no_gateway(&cluster)?;
    let _ = traffic_report(
        &cluster.topo.nodes[0].pods[0].ns,
        &["udp-source", &format!("{SERVER_IP}:6000"), "1"],
        0.2,
    );
    assert!(
        drops_no_gateway(&cluster)? > before,
        "dropped as no_gateway"
    );
    // Later passes keep it: the agent reconciles again, the condition stays.
    let passes = cluster.agent_state(0)?["reconciles"].as_u64().unwrap_or(0);
    cluster.apply(&big)?;
    cluster.add_pod("extra", "app=other", "w1", "10.244.1.77")?;
    wait_until("the agent passes again", Duration::from_secs(30), || {
        Ok(cluster.agent_state(0)?["reconciles"].as_u64().unwrap_or(0) > passes)
    })?;
    assert!(
        over_capacity(&cluster)?.is_some(),
        "still not applied, still reported"
    );
    // Back to the example: it fits, the condition goes.
    cluster.apply(&examples_dir().join("policy.yaml"))?;
    wait_until("the report is gone", Duration::from_secs(60), || {
        Ok(over_capacity(&cluster)?.is_none())
    })?;
    Ok(())
}

fn tempfile_dir() -> Result<std::path::PathBuf> {
    let d = std::env::temp_dir().join(format!("egress-capacity-{}", std::process::id()));
    std::fs::create_dir_all(&d)?;
    Ok(d)
}
