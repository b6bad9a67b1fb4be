//! One size of the benchmark, from an empty fabric to its figures, and the
//! controller process.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use egress_control::api::PodRecord;
use egress_control::controller::{run_controller, RunConfig};
use egress_control::datastore::typed::pod_object;
use egress_control::datastore::{Datastore, Kind, ObjectKey};
use egress_failover::FailoverTimers;
use egress_tests::etcd::EtcdServer;
use egress_tests::topology::{Topology, FABRIC_UNDERLAY_IP};
use egress_tests::PinDir;
use serde_json::{json, Map, Value};

use super::real_agent::{self, Counters, RealAgent};
use super::seed::{seed, seeded_pod};
use super::stats::{cpu_ms, now_ns, pct, peak_mb, round};
use super::{connect, node_name, pod_ip, tracing_on, Size};

/// Builds the fabric (etcd and the measured node), then runs the size's
/// processes inside the fabric's namespace.
pub fn run_size(size: Size) -> Result<Map<String, Value>> {
    let topo = Topology::build(&[&node_name(size.measured_node())])?;
    let etcd = EtcdServer::start_in(topo.fabric.name(), &FABRIC_UNDERLAY_IP.to_string())?;
    let endpoint = etcd.endpoint();
    let pin = PinDir::new("cpbench")?;
    let egress = real_agent::egress_bin()?;
    let agent = real_agent::command(&egress, &topo.nodes[0].ns, size, pin.path(), &endpoint);
    let pin_path = pin.path().to_owned();
    let figures = topo.fabric.enter(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?;
        rt.block_on(measure(size, endpoint, agent, egress, pin_path))
    })?;
    drop(etcd);
    drop(pin);
    drop(topo);
    Ok(figures)
}

/// The lines the simulated agents print, and a wait for one.
struct Lines(Receiver<String>);

impl Lines {
    fn follow(child: &mut Child) -> Self {
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        let out = child.stdout.take().expect("piped");
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Self(rx)
    }

    /// The time (ns) on the next line that starts with `prefix`.
    fn wait(&self, prefix: &str, timeout: Duration) -> Result<u128> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let l = self
                .0
                .recv_timeout(left)
                .with_context(|| format!("no {prefix} line within {timeout:?}"))?;
            if let Some(rest) = l.strip_prefix(prefix) {
                let t = rest.split_whitespace().last().unwrap_or_default();
                return t.parse().with_context(|| format!("a time in {l:?}"));
            }
        }
    }
}

fn ms_since(start: u128, end: u128) -> f64 {
    end.saturating_sub(start) as f64 / 1e6
}

/// The processes of one size.
struct Procs {
    ctl: Child,
    sim: Child,
}

impl Drop for Procs {
    fn drop(&mut self) {
        for c in [&mut self.ctl, &mut self.sim] {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

async fn measure(
    size: Size,
    endpoint: String,
    agent_cmd: Command,
    egress: PathBuf,
    pin: PathBuf,
) -> Result<Map<String, Value>> {
    let ds = connect(&endpoint).await;
    let t = Instant::now();
    seed(ds.as_ref(), size).await;
    eprintln!(
        "{}: seeded {} nodes, {} policies, {} pods in {:.1}s",
        size.name,
        size.nodes,
        size.policies,
        size.pods,
        t.elapsed().as_secs_f64()
    );
    let exe = std::env::current_exe()?;
    let t0 = now_ns();
    let ctl = Command::new(&exe)
        .args(["controller", &endpoint])
        .stdout(Stdio::null())
        .spawn()?;
    let mut sim = Command::new(&exe)
        .args(["agents", &endpoint, size.name])
        .stdout(Stdio::piped())
        .spawn()?;
    let lines = Lines::follow(&mut sim);
    let procs = Procs { ctl, sim };
    let mut out = Map::new();
    let cold = lines.wait("COLD", Duration::from_secs(300))?;
    let cold_s = ms_since(t0, cold) / 1e3;
    eprintln!("{}: cold start {cold_s:.2}s", size.name);
    out.insert("cold_start_s".into(), round(cold_s, 3).into());

    let agent = RealAgent::start(agent_cmd, egress, pin)?;
    let own = first_pod_of(size, size.measured_node());
    agent.wait_source(&own.ips[0], true, Duration::from_secs(120))?;
    eprintln!("{}: the measured agent holds its pods", size.name);

    let (ctl_pid, agent_pid) = (procs.ctl.id(), agent.proc.pid());
    let (ctl0, agent0) = (cpu_ms(ctl_pid), cpu_ms(agent_pid));
    let seen0 = agent.counters()?;
    let others_started = Instant::now();
    relabels(ds.as_ref(), size, &lines, &mut out).await?;
    new_pods(ds.as_ref(), size, &lines, &mut out).await?;
    let elsewhere = (size.changes + size.new_pods) as f64;
    let (ctl1, agent1) = (cpu_ms(ctl_pid), cpu_ms(agent_pid));
    let seen1 = agent.counters()?;
    let others_s = others_started.elapsed().as_secs_f64();
    let own_started = Instant::now();
    own_changes(ds.as_ref(), size, &agent, &mut out).await?;
    let agent2 = cpu_ms(agent_pid);
    let own_s = own_started.elapsed().as_secs_f64();
    out.insert("other_changes_s".into(), round(others_s, 1).into());
    out.insert("own_changes_s".into(), round(own_s, 1).into());
    // What the agent spends with nothing changing (heartbeats, port-use
    // scans, probes, the periodic resync's share): the phases above last
    // longer at the large size, so their per-change figures carry more of it.
    let idle_rate = idle_cpu_ms_per_s(agent_pid, IDLE_WINDOW).await;
    out.insert("agent_idle_cpu_ms_per_s".into(), round(idle_rate, 3).into());
    let net = |cpu: f64, secs: f64, n: f64| round(((cpu - idle_rate * secs) / n).max(0.0), 3);
    out.insert(
        "agent_cpu_per_other_change_net_ms".into(),
        net(agent1 - agent0, others_s, elsewhere).into(),
    );
    out.insert(
        "agent_cpu_per_own_change_net_ms".into(),
        net(agent2 - agent1, own_s, size.own_changes as f64).into(),
    );
    let seen2 = agent.counters()?;
    put_wakeups(&mut out, "other", &seen0, &seen1, elsewhere);
    put_wakeups(&mut out, "own", &seen1, &seen2, size.own_changes as f64);

    out.insert(
        "controller_cpu_per_change_ms".into(),
        round((ctl1 - ctl0) / elsewhere, 3).into(),
    );
    out.insert(
        "agent_cpu_per_other_change_ms".into(),
        round((agent1 - agent0) / elsewhere, 3).into(),
    );
    out.insert(
        "agent_cpu_per_own_change_ms".into(),
        round((agent2 - agent1) / size.own_changes as f64, 3).into(),
    );
    out.insert(
        "controller_peak_mb".into(),
        round(peak_mb(ctl_pid), 1).into(),
    );
    out.insert("agent_peak_mb".into(), round(peak_mb(agent_pid), 1).into());
    out.insert(
        "sim_agents_peak_mb".into(),
        round(peak_mb(procs.sim.id()), 1).into(),
    );
    for (k, v) in [
        ("nodes", size.nodes),
        ("pods", size.pods),
        ("policies", size.policies),
        ("changes", size.changes),
        ("new_pods", size.new_pods),
        ("own_changes", size.own_changes),
    ] {
        out.insert(k.into(), v.into());
    }
    drop(agent);
    drop(procs);
    Ok(out)
}

/// How long the agent's idle CPU is measured: past the periodic resync
/// (30 s) would be better, but each size's run would grow by as much.
const IDLE_WINDOW: Duration = Duration::from_secs(12);

/// The agent's CPU per second over `window` with no change made.
async fn idle_cpu_ms_per_s(pid: u32, window: Duration) -> f64 {
    let before = cpu_ms(pid);
    tokio::time::sleep(window).await;
    (cpu_ms(pid) - before) / window.as_secs_f64()
}

/// How often the measured agent was woken per change (`passes`: reconcile
/// passes; `batches`: watch batches, of which `skipped` did not concern it).
fn put_wakeups(out: &mut Map<String, Value>, what: &str, a: &Counters, b: &Counters, changes: f64) {
    let per = |x: u64, y: u64| round((y - x) as f64 / changes, 3);
    // Which kinds' changes made the agent rebuild its prepared parts.
    let by_kind: Map<String, Value> = b
        .rebuilt_by
        .iter()
        .map(|(k, n)| {
            let before = a.rebuilt_by.get(k).copied().unwrap_or(0);
            (k.clone(), per(before, *n).into())
        })
        .collect();
    out.insert(
        format!("agent_rebuilds_per_{what}_change_by_kind"),
        by_kind.into(),
    );
    out.insert(
        format!("agent_passes_per_{what}_change"),
        per(a.passes, b.passes).into(),
    );
    out.insert(
        format!("agent_batches_per_{what}_change"),
        per(a.batches, b.batches).into(),
    );
    out.insert(
        format!("agent_skipped_per_{what}_change"),
        per(a.skipped, b.skipped).into(),
    );
    // A list costs in proportion to the cluster, not to the changes.
    out.insert(
        format!("agent_lists_during_{what}_changes"),
        (b.lists - a.lists).into(),
    );
}

/// The first seeded pod on node `node`.
fn first_pod_of(size: Size, node: usize) -> PodRecord {
    let k = (0..size.pods)
        .find(|k| size.pod_node(*k) == node)
        .expect("a pod on every worker");
    seeded_pod(size, k)
}

fn put_percentiles(out: &mut Map<String, Value>, name: &str, v: &mut [f64]) {
    out.insert(format!("{name}_p50_ms"), round(pct(v, 0.5), 2).into());
    out.insert(format!("{name}_p99_ms"), round(pct(v, 0.99), 2).into());
}

/// Relabels a pod to another policy's app, one at a time, none on the
/// measured node: until the new rule is in the node's desired state
/// (`change`), and until the node also holds a block of its EIP.
async fn relabels(
    ds: &dyn Datastore,
    size: Size,
    lines: &Lines,
    out: &mut Map<String, Value>,
) -> Result<()> {
    let (mut lat, mut grant_lat, mut write_ms) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..size.changes {
        let mut k = (i * 37) % size.pods;
        if size.pod_node(k) == size.measured_node() {
            k = (k + 1) % size.pods;
        }
        let key = super::seed::pod_key(size, k);
        let cur = ds.get(Kind::Pod, &key).await?.context("a seeded pod")?;
        let mut v = cur.value.clone();
        super::seed::relabel(size, k, &mut v);
        v["metadata"]["labels"]["bench-seq"] = json!(i.to_string());
        let start = now_ns();
        ds.update(Kind::Pod, v, cur.revision).await?;
        write_ms.push(ms_since(start, now_ns()));
        lat.push(ms_since(
            start,
            lines.wait(&format!("SEEN {i} "), Duration::from_secs(30))?,
        ));
        let granted = lines.wait(&format!("GRANT {i} "), Duration::from_secs(30))?;
        grant_lat.push(ms_since(start, granted));
        if tracing_on() {
            eprintln!(
                "driver: change {i}: write {:.1} ms, seen after {:.1} ms, granted after {:.1} ms",
                write_ms[i], lat[i], grant_lat[i]
            );
        }
    }
    put_percentiles(out, "change", &mut lat);
    put_percentiles(out, "change_with_grant", &mut grant_lat);
    put_percentiles(out, "etcd_write", &mut write_ms);
    Ok(())
}

/// New pods where the controller must grant a new block: policy j's pods
/// sit on one class of nodes (`pod_node`), the next node is outside it.
async fn new_pods(
    ds: &dyn Datastore,
    size: Size,
    lines: &Lines,
    out: &mut Map<String, Value>,
) -> Result<()> {
    let mut lat = Vec::new();
    for i in 0..size.new_pods {
        let j = (i * 53 + 7) % size.policies;
        let w = size.workers();
        let mut node = size.gateway_nodes + ((j * 7919) % w + 1) % w;
        if node == size.measured_node() {
            node = size.gateway_nodes + ((j * 7919) % w + 3) % w;
        }
        let p = PodRecord {
            name: format!("new{i:03}"),
            namespace: format!("ns{}", j % 10),
            labels: [
                ("app".to_string(), format!("app{j}")),
                ("bench-seq".to_string(), format!("n{i}")),
            ]
            .into(),
            node: node_name(node),
            ips: vec![pod_ip(node, 200 + i)],
        };
        let start = now_ns();
        ds.create(Kind::Pod, pod_object(&p)).await?;
        let granted = lines.wait(&format!("GRANT n{i} "), Duration::from_secs(30))?;
        lat.push(ms_since(start, granted));
        if tracing_on() {
            eprintln!("driver: new pod {i}: granted after {:.1} ms", lat[i]);
        }
    }
    put_percentiles(out, "new_pod_grant", &mut lat);
    Ok(())
}

/// A pod of a policy the measured node already carries, created and
/// deleted again, each until the real agent's maps say so.
async fn own_changes(
    ds: &dyn Datastore,
    size: Size,
    agent: &RealAgent,
    out: &mut Map<String, Value>,
) -> Result<()> {
    let node = size.measured_node();
    let like = first_pod_of(size, node);
    let ip = pod_ip(node, 253);
    let pod = PodRecord {
        name: "own".into(),
        ips: vec![ip.clone()],
        ..like
    };
    let key = ObjectKey::namespaced(pod.namespace.clone(), "own");
    let mut lat = Vec::new();
    for i in 0..size.own_changes {
        let create = i % 2 == 0;
        let start = Instant::now();
        if create {
            ds.create(Kind::Pod, pod_object(&pod)).await?;
        } else {
            ds.delete(Kind::Pod, &key, None).await?;
        }
        agent.wait_source(&ip, create, Duration::from_secs(30))?;
        lat.push(start.elapsed().as_secs_f64() * 1e3);
    }
    put_percentiles(out, "own_change", &mut lat);
    Ok(())
}

pub async fn controller(endpoint: &str) {
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
