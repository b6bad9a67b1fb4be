//! What the agent publishes about itself: `/state`, `/metrics`,
//! `/healthz` and `/readyz` on its admin endpoint, from the state its loop
//! keeps (`Published`).

use std::{
    collections::BTreeMap,
    net::IpAddr,
    path::PathBuf,
    sync::{Arc, Mutex},
};

use crate::admin::{self, Response};

/// What the admin endpoint shows.
#[derive(Default, serde::Serialize)]
pub(super) struct Published {
    pub(super) ready: bool,
    pub(super) reconciles: u64,
    /// Full lists of the datastore (the view cache started): one at start,
    /// one per failed watch and per `Datastore::relist_period`, none per change.
    pub(super) datastore_lists: u64,
    /// Batches of watch events applied to the view.
    pub(super) watch_batches: u64,
    /// Of those, the ones that did not concern this node (other nodes'
    /// pods only): no reconcile.
    pub(super) batches_skipped: u64,
    /// Rebuilds of the prepared parts by the kind whose change caused them
    /// (`PreparedCache::rebuilt_by`): what a pass recomputes beyond its pods.
    pub(super) prepared_rebuilt_by: BTreeMap<&'static str, u64>,
    /// Pods the view holds: the node's own where the datastore sends an
    /// agent only those (Kubernetes, etcd with its pod index), every pod
    /// of the cluster otherwise.
    pub(super) view_pods: usize,
    pub(super) last_error: Option<String>,
    pub(super) fenced: bool,
    pub(super) announced: Vec<IpAddr>,
    pub(super) policies: usize,
    pub(super) written: usize,
    pub(super) removed: usize,
    /// Policy id (the key of its counters) -> kind/namespace/name.
    pub(super) policy_names: BTreeMap<u32, String>,
    /// Policies the maps could not hold (see `capacity`).
    pub(super) over_capacity: Vec<egress_control::api::PolicyOverCapacity>,
    /// What this run took over from the previous one's pinned state.
    pub(super) resumed: Resumed,
    /// Which program sends the gateway's common replies back out, and why.
    pub(super) uplink_reply_path: Option<crate::datapath::uplink_xdp::ReplyPath>,
    /// When the heartbeat was last renewed (for the metrics).
    #[serde(skip)]
    pub(super) last_renewal: Option<std::time::Instant>,
}

/// Pinned state a (re)started agent found and kept, for `/state`.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub(super) struct Resumed {
    /// The fence started from the previous run's announce lease.
    pub(super) announce_lease: bool,
    /// Pod-veth links taken over (program swapped in place) / created.
    pub(super) pod_links_taken_over: u32,
    pub(super) pod_links_new: u32,
}

pub(super) type Learned = Arc<Mutex<BTreeMap<egress_bgp::types::Prefix, super::routes::Learned>>>;

pub(super) fn admin_handler(
    published: Arc<Mutex<Published>>,
    learned: Option<Learned>,
    speaker: Option<egress_bgp::speaker::SpeakerHandle>,
    pin_dir: PathBuf,
) -> admin::Handler {
    Arc::new(move |path: String| {
        let published = published.clone();
        let learned = learned.clone();
        let speaker = speaker.clone();
        let pin_dir = pin_dir.clone();
        Box::pin(async move {
            // Asked before the lock is taken: the speaker answers over a channel.
            let bgp = match (&speaker, path.as_str()) {
                (Some(h), "/metrics") => h.status().await.ok(),
                _ => None,
            };
            let p = published.lock().unwrap();
            match path.as_str() {
                "/metrics" => {
                    let facts = super::metrics::AgentFacts {
                        policy_names: p.policy_names.clone(),
                        over_capacity: p.over_capacity.clone(),
                        announced_eips: p.announced.len(),
                        fenced: p.fenced,
                        reconciles: p.reconciles,
                        datastore_lists: p.datastore_lists,
                        watch_batches: p.watch_batches,
                        bgp_learned_routes: learned.map(|l| l.lock().unwrap().len()).unwrap_or(0),
                        heartbeat_renewal_age: p.last_renewal.map(|t| t.elapsed()),
                        uplink_xdp: p.uplink_reply_path.as_ref().is_some_and(|r| r.is_xdp()),
                        bgp,
                    };
                    Response::ok(
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        super::metrics::render(&pin_dir, &facts),
                    )
                }
                "/healthz" => Response::ok("text/plain", "ok\n".into()),
                "/readyz" if p.ready => Response::ok("text/plain", "ok\n".into()),
                "/readyz" => Response::unavailable("the first reconcile has not finished"),
                "/state" => {
                    let mut v = serde_json::to_value(&*p).unwrap_or_default();
                    let routes: BTreeMap<String, String> = learned
                        .map(|l| {
                            l.lock()
                                .unwrap()
                                .iter()
                                .map(|(p, l)| (p.to_string(), l.next_hop.to_string()))
                                .collect()
                        })
                        .unwrap_or_default();
                    v["bgp_learned"] = serde_json::json!(routes);
                    Response::json(&v)
                }
                _ => Response::not_found(),
            }
        })
    })
}
