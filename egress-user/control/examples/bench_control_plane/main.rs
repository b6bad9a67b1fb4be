//! Control-plane benchmark (issues 4 and 16) on a real etcd, at two sizes
//! side by side: 100 nodes / 10,000 pods / 1,000 policies, and 1,000 nodes /
//! 50,000 pods / 5,000 policies (keys prefixed `large_`).
//!
//! Each size runs as several processes, so each one's peak memory and CPU
//! can be read: this driver, one controller (`controller ENDPOINT SIZE`),
//! one process that simulates every agent's desired state
//! (`agents ENDPOINT SIZE`, see `sim_agents`) and one real `egress agent`
//! with its datapath, in a network namespace of its own, as one of the
//! workers (`real_agent`). etcd, the driver and the controller run in the
//! fabric namespace that the real agent's node is wired to.
//!
//! Figures per size: cold start (controller and simulated agents started on
//! a filled datastore, until every node's desired state holds every
//! selected pod), pod relabels until the new rule is in that node's desired
//! state (p50/p99) and until the node also holds a block of the new
//! policy's EIP, new pods on nodes without a block (the controller's grant
//! path), the controller's CPU per change, and the real agent's CPU per
//! change of its own pods (a pod created or deleted on its node, until its
//! maps say so) and per change elsewhere. The last line is one JSON object.

mod driver;
mod passes;
mod real_agent;
mod seed;
mod sim_agents;
mod stats;

use egress_control::datastore::etcd::EtcdDatastore;
use egress_control::datastore::Datastore;
use std::sync::Arc;

/// One size of the benchmark's cluster.
#[derive(Clone, Copy, Debug)]
pub struct Size {
    pub name: &'static str,
    pub nodes: usize,
    pub gateway_nodes: usize,
    pub policies: usize,
    pub pods: usize,
    /// Sequential pod relabels.
    pub changes: usize,
    /// New pods, each on a node that holds no block of its policy's EIP yet.
    pub new_pods: usize,
    /// Pods created and deleted on the real agent's node, one at a time.
    pub own_changes: usize,
}

pub const SMALL: Size = Size {
    name: "small",
    nodes: 100,
    gateway_nodes: 10,
    policies: 1000,
    pods: 10_000,
    changes: 200,
    new_pods: 50,
    own_changes: 160,
};

pub const LARGE: Size = Size {
    name: "large",
    nodes: 1000,
    gateway_nodes: 10,
    policies: 5000,
    pods: 50_000,
    changes: 200,
    new_pods: 50,
    own_changes: 160,
};

impl Size {
    fn named(name: &str) -> Size {
        match name {
            "large" => LARGE,
            _ => SMALL,
        }
    }

    /// Workers: every node after the gateway candidates.
    pub fn workers(&self) -> usize {
        self.nodes - self.gateway_nodes
    }

    /// The node of seeded pod `k` (7919 is prime, so the pods of one node
    /// are `k0 + m * workers`).
    pub fn pod_node(&self, k: usize) -> usize {
        self.gateway_nodes + (k * 7919) % self.workers()
    }

    /// The node the real agent plays.
    pub fn measured_node(&self) -> usize {
        self.gateway_nodes + 5
    }
}

pub const PREFIX: &str = "/bench";

pub fn node_name(i: usize) -> String {
    format!("node-{i:04}")
}

/// A pod address on node `node`: the node's /24, host `host`.
pub fn pod_ip(node: usize, host: usize) -> String {
    format!("10.{}.{}.{}", 200 + node / 256, node % 256, host)
}

pub fn pod_cidr(node: usize) -> String {
    format!("10.{}.{}.0/24", 200 + node / 256, node % 256)
}

pub async fn connect(endpoint: &str) -> Arc<dyn Datastore> {
    Arc::new(
        EtcdDatastore::connect(&[endpoint.to_string()], PREFIX)
            .await
            .expect("etcd"),
    )
}

/// `EGRESS_BENCH_TRACE=1`: the controller logs each pass's timings and the
/// simulated agents each batch's, on stderr (to see where a change's time goes).
pub fn tracing_on() -> bool {
    std::env::var_os("EGRESS_BENCH_TRACE").is_some()
}

/// `EGRESS_BENCH_SIZES=small` (or `large`) runs one size only.
fn sizes() -> Vec<Size> {
    match std::env::var("EGRESS_BENCH_SIZES").as_deref() {
        Ok("small") => vec![SMALL],
        Ok("large") => vec![LARGE],
        _ => vec![SMALL, LARGE],
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rt = || {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    match args.get(1).map(String::as_str) {
        Some("controller") => rt().block_on(driver::controller(&args[2])),
        Some("agents") => rt().block_on(sim_agents::run(&args[2], Size::named(&args[3]))),
        // The controller's pass alone, in this process (quick to run).
        Some("passes") => {
            let mut all = serde_json::Map::new();
            let per_size: Vec<_> = sizes()
                .into_iter()
                .map(|size| (size, rt().block_on(passes::measure(size))))
                .collect();
            stats::merge(&mut all, &per_size);
            println!("{}", serde_json::Value::Object(all));
        }
        _ => {
            let mut all = serde_json::Map::new();
            let mut per_size = Vec::new();
            for size in sizes() {
                let mut figures = driver::run_size(size)
                    .unwrap_or_else(|e| panic!("the {} size failed: {e:#}", size.name));
                figures.extend(rt().block_on(passes::measure(size)));
                per_size.push((size, figures));
            }
            stats::merge(&mut all, &per_size);
            println!("{}", serde_json::Value::Object(all));
        }
    }
}
