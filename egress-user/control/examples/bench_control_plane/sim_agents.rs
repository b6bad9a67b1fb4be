//! Every agent's desired state, simulated in one process: one shared watch
//! cache, and each node's desired maps computed with `agent_state` (no
//! datapath), which is what a real agent does before its map diff. Prints
//! `COLD time` once every node holds every selected pod, and `SEEN` /
//! `GRANT` lines for the driver's changes (see [`report`]).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use egress_control::agent_state::{AgentConfig, NodeDesired, PreparedCache, RuleAction};
use egress_control::controller::{ClusterView, ViewCache};

use super::stats::now_ns;
use super::{connect, node_name, tracing_on, Size};

/// Every node's desired state holds a rule for each of its selected pods.
fn complete(v: &ClusterView, d: &BTreeMap<String, NodeDesired>) -> bool {
    let mut want: BTreeMap<&str, usize> = BTreeMap::new();
    for p in &v.pods {
        *want.entry(p.node.as_str()).or_default() += p.ips.len();
    }
    want.iter()
        .all(|(n, c)| d.get(*n).is_some_and(|x| x.rules.len() >= *c))
}

fn cfg(n: &str) -> AgentConfig {
    AgentConfig {
        node: n.to_string(),
        ..Default::default()
    }
}

pub async fn run(endpoint: &str, size: Size) {
    let ds = connect(endpoint).await;
    let listing = Instant::now();
    let mut cache = ViewCache::start(ds.as_ref()).await.unwrap();
    if tracing_on() {
        eprintln!(
            "agents: listed in {:.1} ms",
            listing.elapsed().as_secs_f64() * 1e3
        );
    }
    let names: Vec<String> = (0..size.nodes).map(node_name).collect();
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
    let mut dirty: BTreeSet<String> = names.iter().cloned().collect();
    let mut waiting = false;
    // As each agent keeps its own: only pods changed, the rest is kept.
    let mut prepared = PreparedCache::default();
    loop {
        if !dirty.is_empty() && !waiting {
            waiting = compute_dirty(&mut cache, &mut prepared, &mut dirty, &mut state);
        } else {
            waiting = false;
            let t_batch = Instant::now();
            let changed = match cache.next_batch().await {
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
            let t = Instant::now();
            let mut t_prep = Duration::ZERO;
            if !now.is_empty() {
                let prep = prepared.prepare(&cache.view);
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
        }
        report(&cache.view, &state, &mut seen_seq);
        if !announced && dirty.is_empty() && complete(&cache.view, &state) {
            announced = true;
            println!("COLD {}", now_ns());
        }
        tokio::task::yield_now().await;
    }
}

/// Recomputes dirty nodes on one prepared view until none is left or a
/// change waits (returns true then).
fn compute_dirty(
    cache: &mut ViewCache,
    prepared: &mut PreparedCache,
    dirty: &mut BTreeSet<String>,
    state: &mut BTreeMap<String, NodeDesired>,
) -> bool {
    let t = Instant::now();
    let mut done = 0;
    let mut waiting = false;
    {
        let (view, mut pending) = cache.split();
        let prep = prepared.prepare(view);
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
    waiting
}

/// Prints `SEEN seq time` for each relabelled pod once its new rule is in
/// its node's desired state, and `GRANT seq time` once that node also holds
/// a port block of the new policy's EIP (what the pod's traffic needs).
fn report(
    view: &ClusterView,
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
            RuleAction::Egress(id) if r.src == ip => d.policies.get(&id).filter(|t| {
                view.policies.iter().any(|q| {
                    q.metadata.name.as_deref() == Some(t.key.name.as_str())
                        && q.spec
                            .applied_to
                            .pod_selector
                            .as_ref()
                            .is_some_and(|s| s.match_labels.get("app") == Some(&target))
                })
            }),
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
