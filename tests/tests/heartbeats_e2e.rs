//! Only gateway-eligible nodes heartbeat: with the example gateway selecting
//! g1 and g2, their heartbeat keys in etcd keep growing while the workers
//! never write one.

use std::time::Duration;

use egress_tests::{
    cluster::{examples_dir, wait_until, Cluster, ClusterSpec, Timers},
    egress_bin,
};

/// Heartbeat keys under the cluster's prefix with their versions (renewals).
fn heartbeats(cluster: &Cluster) -> anyhow::Result<Vec<(String, u64)>> {
    let out = cluster.topo.fabric.exec(&[
        "etcdctl",
        &format!("--endpoints={}", cluster.etcd().endpoint()),
        "get",
        "--prefix",
        "/egress/heartbeats/",
        "-w",
        "json",
    ])?;
    let v: serde_json::Value = serde_json::from_str(&out)?;
    let mut found = Vec::new();
    for kv in v["kvs"].as_array().into_iter().flatten() {
        let key = kv["key"].as_str().unwrap_or_default();
        let key = String::from_utf8(base64_decode(key)).unwrap_or_default();
        found.push((
            key.rsplit('/').next().unwrap_or_default().to_owned(),
            kv["version"].as_u64().unwrap_or(0),
        ));
    }
    Ok(found)
}

/// etcdctl prints keys in base64 (standard alphabet, with padding).
fn base64_decode(s: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        _ => 63,
    };
    let bytes: Vec<u8> = s.bytes().filter(|&c| c != b'=').map(val).collect();
    let mut out = Vec::new();
    for chunk in bytes.chunks(4) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, &b)| acc | (u32::from(b) << (18 - 6 * i)));
        out.extend_from_slice(&n.to_be_bytes()[1..chunk.len()]);
    }
    out
}

#[test]
#[ignore = "needs root: namespaces, BPF, etcd"]
fn only_gateway_eligible_nodes_heartbeat() -> anyhow::Result<()> {
    let egress = egress_bin()?;
    let timers = Timers {
        update: "200ms".into(),
        monitor: "200ms".into(),
        eviction: "1s".into(),
        ..Timers::default()
    };
    let cluster = Cluster::start(
        &egress,
        ClusterSpec {
            timers,
            ..ClusterSpec::default()
        },
    )?;
    cluster.apply(&examples_dir().join("gateway.yaml"))?;
    // Wait until both gateways have renewed several times...
    wait_until(
        "g1 and g2 renew their heartbeats",
        Duration::from_secs(30),
        || {
            let hb = heartbeats(&cluster)?;
            Ok(["g1", "g2"]
                .iter()
                .all(|g| hb.iter().any(|(n, v)| n == g && *v >= 5)))
        },
    )?;
    // ...by then a worker that heartbeats would have written its key too.
    let hb = heartbeats(&cluster)?;
    for w in ["w1", "w2"] {
        assert!(
            !hb.iter().any(|(n, _)| n == w),
            "{w} is not gateway-eligible but heartbeats: {hb:?}"
        );
    }
    Ok(())
}
