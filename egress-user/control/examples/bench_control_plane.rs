//! Control-plane benchmark (issue 4): 1,000 policies, 10,000 pods, 100 nodes
//! on a real etcd. Runs as three processes so each one's peak memory can be
//! read: this driver, one controller (`controller ENDPOINT`) and one process
//! that simulates every agent (`agents ENDPOINT`): it keeps one watch cache
//! and computes each node's desired maps with `agent_state::desired` (no
//! datapath), which is what a real agent does before its map diff.
//!
//! Figures: cold start (controller and agents started on a filled datastore,
//! until every node's desired state holds every selected pod), then the time
//! from a pod label change written by the driver to the new rule in that
//! node's desired state (sequential changes, p50/p99), the same until that
//! node also holds a port block of the new policy's EIP (the controller's
//! grant: `change_with_grant_*`), and the peak RSS of
//! the controller and agents processes. The last line is one JSON object.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use egress_control::agent_state::{AgentConfig, NodeDesired, Prepared};
use egress_control::api::{NodeRecord, PodRecord, API_VERSION};
use egress_control::controller::{run_controller, RunConfig, ViewCache};
use egress_control::datastore::etcd::EtcdDatastore;
use egress_control::datastore::typed::{node_object, pod_object};
use egress_control::datastore::{Datastore, Kind, ObjectKey, StatusPatch};
use egress_failover::FailoverTimers;
use serde_json::json;

const NODES: usize = 100;
const GATEWAY_NODES: usize = 10;
const POLICIES: usize = 1000;
const PODS: usize = 10_000;
const CHANGES: usize = 200;
/// New pods, each on a node that holds no block of its policy's EIP yet.
const NEW_PODS: usize = 50;
const PREFIX: &str = "/bench";

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

fn node_name(i: usize) -> String {
    format!("node-{i:03}")
}

fn peak_mb(pid: u32) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .map(|kb| kb / 1024.0)
        .unwrap_or(0.0)
}

async fn connect(endpoint: &str) -> Arc<dyn Datastore> {
    Arc::new(
        EtcdDatastore::connect(&[endpoint.to_string()], PREFIX)
            .await
            .expect("etcd"),
    )
}

async fn seed(ds: &dyn Datastore) {
    ds.create(
        Kind::EgressGateway,
        json!({"apiVersion": API_VERSION, "kind": "EgressGateway", "metadata": {"name": "egw"},
               "spec": {"ippools": {"ipv4": ["10.100.0.0/22"]},
                        "nodeSelector": {"selector": {"matchLabels": {"egress": "true"}}}}}),
    )
    .await
    .unwrap();
    for i in 0..NODES {
        let gw = i < GATEWAY_NODES;
        let n = NodeRecord {
            name: node_name(i),
            labels: [("egress".to_string(), gw.to_string())].into(),
            addresses: vec![format!("172.20.{}.{}", i / 200, i % 200 + 1)],
            pod_cidrs: vec![format!("10.{}.{}.0/24", 200 + i / 256, i % 256)],
            ready: true,
        };
        ds.create(Kind::Node, node_object(&n)).await.unwrap();
        ds.create(
            Kind::EgressTunnel,
            json!({"apiVersion": API_VERSION, "kind": "EgressTunnel", "metadata": {"name": n.name}, "spec": {}}),
        )
        .await
        .unwrap();
        ds.write_status(
            Kind::EgressTunnel,
            &ObjectKey::cluster(&n.name),
            &StatusPatch {
                manager: "egress-agent".into(),
                owned: vec!["tunnel".into()],
                status: json!({"tunnel": {"ipv4": n.addresses[0], "mac": "02:00:00:00:00:01"}}),
            },
        )
        .await
        .unwrap();
        // The phase as a previous controller left it (agents never write it).
        ds.write_status(
            Kind::EgressTunnel,
            &ObjectKey::cluster(&n.name),
            &StatusPatch {
                manager: "egress-controller".into(),
                owned: vec!["phase".into()],
                status: json!({"phase": "Ready"}),
            },
        )
        .await
        .unwrap();
    }
    use futures::StreamExt;
    futures::stream::iter(0..POLICIES)
        .for_each_concurrent(64, |j| async move {
            ds.create(
                Kind::EgressPolicy,
                json!({"apiVersion": API_VERSION, "kind": "EgressPolicy",
                       "metadata": {"name": format!("p{j:04}"), "namespace": format!("ns{}", j % 10)},
                       "spec": {"egressGatewayName": "egw", "egressIP": {"allocatorPolicy": "rr"},
                                "appliedTo": {"podSelector": {"matchLabels": {"app": format!("app{j}")}}},
                                "destSubnet": ["0.0.0.0/0"]}}),
            )
            .await
            .unwrap();
        })
        .await;
    futures::stream::iter(0..PODS)
        .for_each_concurrent(64, |k| async move {
            let j = k % POLICIES;
            let node = GATEWAY_NODES + (k * 7919) % (NODES - GATEWAY_NODES);
            let p = PodRecord {
                name: format!("pod{k:05}"),
                namespace: format!("ns{}", j % 10),
                labels: [("app".to_string(), format!("app{j}"))].into(),
                node: node_name(node),
                ips: vec![format!(
                    "10.{}.{}.{}",
                    200 + node / 256,
                    node % 256,
                    k / 90 % 250 + 2
                )],
            };
            ds.create(Kind::Pod, pod_object(&p)).await.unwrap();
        })
        .await;
}

/// Every node's desired state holds a rule for each of its selected pods.
fn complete(
    v: &egress_control::controller::ClusterView,
    d: &BTreeMap<String, NodeDesired>,
) -> bool {
    let mut want: BTreeMap<&str, usize> = BTreeMap::new();
    for p in &v.pods {
        *want.entry(p.node.as_str()).or_default() += p.ips.len();
    }
    want.iter()
        .all(|(n, c)| d.get(*n).is_some_and(|x| x.rules.len() >= *c))
}

async fn agents(endpoint: &str) {
    let ds = connect(endpoint).await;
    let mut cache = ViewCache::start(ds.as_ref()).await.unwrap();
    let cfg = |n: &str| AgentConfig {
        node: n.to_string(),
        ..Default::default()
    };
    let names: Vec<String> = (0..NODES).map(node_name).collect();
    let mut state: BTreeMap<String, NodeDesired> = BTreeMap::new();
    let mut announced = false;
    let mut seen_seq: BTreeMap<String, (bool, bool)> = BTreeMap::new();
    // Each real agent computes only its own node, in parallel with the
    // others. Simulated in one process: the nodes whose pods changed are
    // computed at once; other nodes a change may affect (every node after a
    // global change; the worker and the gateway candidates after a grant
    // change) are marked dirty and recomputed one at a time on one prepared
    // view, stopping as soon as a change waits, so one agent's work never
    // waits behind the others'.
    let mut dirty: std::collections::BTreeSet<String> = names.iter().cloned().collect();
    let mut waiting = false;
    loop {
        let batch = if dirty.is_empty() || waiting {
            waiting = false;
            cache.next_batch().await
        } else {
            let t = Instant::now();
            let mut done = 0;
            {
                let (view, mut pending) = cache.split();
                let prep = Prepared::new(view);
                while let Some(n) = dirty.pop_first() {
                    state.insert(n.clone(), prep.node(&cfg(&n)));
                    done += 1;
                    if pending.any() {
                        waiting = true;
                        break;
                    }
                }
            }
            if tracing_on() {
                eprintln!(
                    "agents: {done} dirty nodes in {:.1} ms, {} left",
                    t.elapsed().as_secs_f64() * 1e3,
                    dirty.len()
                );
            }
            if !announced && dirty.is_empty() && complete(&cache.view, &state) {
                announced = true;
                println!("COLD {}", now_ns());
            }
            report(&cache.view, &state, &mut seen_seq);
            tokio::task::yield_now().await;
            continue;
        };
        let t_batch = Instant::now();
        let changed = match batch {
            Some(Ok(c)) => c,
            Some(Err(e)) => panic!("watch: {e}"),
            None => return,
        };
        if changed.global {
            dirty.extend(names.iter().cloned());
        } else if !changed.grant_nodes.is_empty() {
            // Grants of a node changed: its own port blocks, and the reply
            // steering of every gateway-eligible node.
            dirty.extend(changed.grant_nodes.iter().cloned());
            dirty.extend(egress_control::controller::gateway_eligible(&cache.view));
        }
        let t = Instant::now();
        let mut t_prep = Duration::ZERO;
        // The nodes this batch is about first (their own agents would not
        // wait for the others); the gateway candidates' steering after.
        let now: Vec<&String> = changed
            .pod_nodes
            .iter()
            .chain(if changed.global {
                &[][..]
            } else {
                &changed.grant_nodes[..]
            })
            .collect();
        if !now.is_empty() {
            let prep = Prepared::new(&cache.view);
            t_prep = t.elapsed();
            for n in now {
                dirty.remove(n);
                state.insert(n.clone(), prep.node(&cfg(n)));
            }
        }
        if tracing_on() {
            eprintln!(
                "agents: batch global={} pod_nodes={} prepare {:.1} ms, nodes {:.1} ms, since wake {:.1} ms",
                changed.global,
                changed.pod_nodes.len(),
                t_prep.as_secs_f64() * 1e3,
                (t.elapsed() - t_prep).as_secs_f64() * 1e3,
                t_batch.elapsed().as_secs_f64() * 1e3,
            );
        }
        report(&cache.view, &state, &mut seen_seq);
        if !announced && dirty.is_empty() && complete(&cache.view, &state) {
            announced = true;
            println!("COLD {}", now_ns());
        }
    }
}

/// Prints `SEEN seq time` for each relabelled pod once its new rule is in
/// its node's desired state, and `GRANT seq time` once that node also holds
/// a port block of the new policy's EIP (what the pod's traffic needs).
fn report(
    view: &egress_control::controller::ClusterView,
    state: &BTreeMap<String, NodeDesired>,
    seen_seq: &mut BTreeMap<String, (bool, bool)>,
) {
    for p in view
        .pods
        .iter()
        .filter(|p| p.labels.contains_key("bench-seq"))
    {
        let seq = p.labels["bench-seq"].clone();
        let done = seen_seq.entry(seq.clone()).or_default();
        if done.0 && done.1 {
            continue;
        }
        let Some(d) = state.get(&p.node) else {
            continue;
        };
        let ip: std::net::IpAddr = p.ips[0].parse().unwrap();
        let target = p.labels["app"].clone();
        let policy = d.rules.iter().find_map(|r| match r.action {
            egress_control::agent_state::RuleAction::Egress(id) if r.src == ip => {
                d.policies.get(&id).filter(|t| {
                    view.policies.iter().any(|q| {
                        q.metadata.name.as_deref() == Some(t.key.name.as_str())
                            && q.spec
                                .applied_to
                                .pod_selector
                                .as_ref()
                                .is_some_and(|s| s.match_labels.get("app") == Some(&target))
                    })
                })
            }
            _ => None,
        });
        let Some(t) = policy else { continue };
        if !done.0 {
            done.0 = true;
            println!("SEEN {seq} {}", now_ns());
        }
        let granted = t.eip_v4.is_some_and(|e| {
            d.port_blocks
                .get(&std::net::IpAddr::V4(e))
                .is_some_and(|b| !b.is_empty())
        });
        if !done.1 && granted {
            done.1 = true;
            println!("GRANT {seq} {}", now_ns());
        }
    }
}

/// `EGRESS_BENCH_TRACE=1`: the controller logs each pass's timings and the
/// agents each batch's, on stderr (to see where a change's time goes).
fn tracing_on() -> bool {
    std::env::var_os("EGRESS_BENCH_TRACE").is_some()
}

async fn controller(endpoint: &str) {
    if tracing_on() {
        tracing_subscriber::fmt()
            .with_env_filter("egress_control=debug")
            .with_writer(std::io::stderr)
            .init();
    }
    let ds = connect(endpoint).await;
    let cfg = RunConfig {
        identity: "bench".into(),
        lease_ttl: Duration::from_secs(10),
        timers: FailoverTimers {
            tunnel_update_period: Duration::from_secs(5),
            tunnel_monitor_period: Duration::from_secs(5),
            eip_eviction_timeout: Duration::from_secs(3600),
        },
        ..Default::default()
    };
    run_controller(ds, cfg, std::future::pending())
        .await
        .unwrap();
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    if v.is_empty() {
        return f64::NAN;
    }
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i]
}

async fn driver() {
    let etcd = egress_tests::etcd::EtcdServer::start().expect("etcd");
    let endpoint = etcd.endpoint();
    let ds = connect(&endpoint).await;
    let t = Instant::now();
    seed(ds.as_ref()).await;
    eprintln!(
        "seeded {NODES} nodes, {POLICIES} policies, {PODS} pods in {:.1}s",
        t.elapsed().as_secs_f64()
    );

    let exe = std::env::current_exe().unwrap();
    let t0 = now_ns();
    let mut ctl = Command::new(&exe)
        .args(["controller", &endpoint])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut ag = Command::new(&exe)
        .args(["agents", &endpoint])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let out = ag.stdout.take().unwrap();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    let wait = |prefix: &str, timeout: Duration| -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let l = rx
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("no {prefix} line within {timeout:?}"));
            if l.starts_with(prefix) {
                return l;
            }
        }
    };
    let cold = wait("COLD", Duration::from_secs(300));
    let cold_s = (cold.split(' ').nth(1).unwrap().parse::<u128>().unwrap() - t0) as f64 / 1e9;
    eprintln!("cold start {cold_s:.2}s");

    // Changes: relabel a pod to another policy's app, one at a time.
    let mut lat = Vec::new();
    let mut grant_lat = Vec::new();
    let mut write_ms = Vec::new();
    for i in 0..CHANGES {
        let k = (i * 37) % PODS;
        let j = k % POLICIES;
        let key = ObjectKey::namespaced(format!("ns{}", j % 10), format!("pod{k:05}"));
        let cur = ds.get(Kind::Pod, &key).await.unwrap().unwrap();
        let mut v = cur.value.clone();
        // Another policy of the same namespace (j + 10 keeps j % 10).
        v["metadata"]["labels"]["app"] = json!(format!("app{}", (j + 10) % POLICIES));
        v["metadata"]["labels"]["bench-seq"] = json!(i.to_string());
        let start = now_ns();
        ds.update(Kind::Pod, v, cur.revision).await.unwrap();
        write_ms.push((now_ns() - start) as f64 / 1e6);
        let l = wait(&format!("SEEN {i} "), Duration::from_secs(30));
        let end: u128 = l.split(' ').nth(2).unwrap().parse().unwrap();
        lat.push((end - start) as f64 / 1e6);
        let l = wait(&format!("GRANT {i} "), Duration::from_secs(30));
        let end: u128 = l.split(' ').nth(2).unwrap().parse().unwrap();
        grant_lat.push((end - start) as f64 / 1e6);
        if tracing_on() {
            eprintln!(
                "driver: change {i}: write {:.1} ms, seen after {:.1} ms, granted after {:.1} ms",
                write_ms[i], lat[i], grant_lat[i]
            );
        }
    }
    // New pods where the controller must grant a new block: the relabels
    // above always land where the node already holds one (every policy has
    // pods on 9 nodes of one class, `(node - 10) % 10`, and keeps them
    // there), so they do not time the grant path. Policy j's pods are on
    // the nodes GATEWAY_NODES + (j*7919 - 10m) % 90: one node further has none.
    let mut new_grant = Vec::new();
    for i in 0..NEW_PODS {
        let j = (i * 53 + 7) % POLICIES;
        let node =
            GATEWAY_NODES + ((j * 7919) % (NODES - GATEWAY_NODES) + 1) % (NODES - GATEWAY_NODES);
        let p = PodRecord {
            name: format!("new{i:03}"),
            namespace: format!("ns{}", j % 10),
            labels: [
                ("app".to_string(), format!("app{j}")),
                ("bench-seq".to_string(), format!("n{i}")),
            ]
            .into(),
            node: node_name(node),
            ips: vec![format!(
                "10.{}.{}.{}",
                200 + node / 256,
                node % 256,
                200 + i
            )],
        };
        let start = now_ns();
        ds.create(Kind::Pod, pod_object(&p)).await.unwrap();
        let l = wait(&format!("GRANT n{i} "), Duration::from_secs(30));
        let end: u128 = l.split(' ').nth(2).unwrap().parse().unwrap();
        new_grant.push((end - start) as f64 / 1e6);
        if tracing_on() {
            eprintln!("driver: new pod {i}: granted after {:.1} ms", new_grant[i]);
        }
    }
    let controller_peak_mb = peak_mb(ctl.id());
    let agent_peak_mb = peak_mb(ag.id());
    let _ = ctl.kill();
    let _ = ag.kill();
    let _ = ctl.wait();
    let _ = ag.wait();
    let p50 = pct(&mut lat, 0.5);
    let p99 = pct(&mut lat, 0.99);
    let new_grant_p50 = pct(&mut new_grant, 0.5);
    let new_grant_p99 = pct(&mut new_grant, 0.99);
    let grant_p50 = pct(&mut grant_lat, 0.5);
    let grant_p99 = pct(&mut grant_lat, 0.99);
    let write_p50 = pct(&mut write_ms, 0.5);
    let write_p99 = pct(&mut write_ms, 0.99);
    eprintln!(
        "slowest changes (ms): {:?}",
        lat.iter()
            .rev()
            .take(5)
            .map(|x| (x * 10.0).round() / 10.0)
            .collect::<Vec<_>>()
    );
    println!(
        "{}",
        json!({
            "bench": "control-plane",
            "datastore": "etcd",
            "policies": POLICIES, "pods": PODS, "nodes": NODES, "changes": CHANGES,
            "cold_start_s": (cold_s * 1000.0).round() / 1000.0,
            "change_p50_ms": (p50 * 100.0).round() / 100.0,
            "change_p99_ms": (p99 * 100.0).round() / 100.0,
            "change_with_grant_p50_ms": (grant_p50 * 100.0).round() / 100.0,
            "change_with_grant_p99_ms": (grant_p99 * 100.0).round() / 100.0,
            "new_pods": NEW_PODS,
            "new_pod_grant_p50_ms": (new_grant_p50 * 100.0).round() / 100.0,
            "new_pod_grant_p99_ms": (new_grant_p99 * 100.0).round() / 100.0,
            "etcd_write_p50_ms": (write_p50 * 100.0).round() / 100.0,
            "etcd_write_p99_ms": (write_p99 * 100.0).round() / 100.0,
            "controller_peak_mb": (controller_peak_mb * 10.0).round() / 10.0,
            "agent_peak_mb": (agent_peak_mb * 10.0).round() / 10.0,
            "agent_peak_note": "one process simulating all 100 agents with one shared watch cache",
            "target_cold_start_s": 5, "target_change_p99_ms": 100,
        })
    );
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("controller") => controller(&args[2]).await,
        Some("agents") => agents(&args[2]).await,
        _ => driver().await,
    }
}
