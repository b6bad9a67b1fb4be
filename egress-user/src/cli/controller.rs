//! `egress controller`: leader-elected EIP allocation, gateway election,
//! port blocks and heartbeat monitoring.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use egress_control::controller::{
    run_controller_with_stats, ControllerConfig, LoopStats, RunConfig,
};
use egress_control::datastore::Datastore;
use egress_failover::monitor::ProbeHealth;
use egress_failover::FailoverTimers;
use tokio::sync::watch;

use super::datastore::DatastoreArgs;
use crate::admin::{self, Response};

/// Ends a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Parses `5`, `1.5`, `5s`, `500ms`, `1m30s`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    // The same grammar as the agent's timer flags and the chart's schema
    // (300ms, 5s, 1.5s, 1m30s, a bare number of seconds).
    egress_failover::timers::parse_duration(s).map_err(|e| e.to_string())
}

#[derive(Debug, Args)]
pub struct ControllerArgs {
    #[command(flatten)]
    pub datastore: DatastoreArgs,
    /// Namespace of the Leases (leader election, heartbeats) on Kubernetes.
    #[arg(long, env = "POD_NAMESPACE", default_value = "egress-system")]
    pub lease_namespace: String,
    /// This replica's name in the election (default: hostname-pid).
    #[arg(long, env = "EGRESS_CONTROLLER_ID")]
    pub identity: Option<String>,
    /// Leader lease time.
    #[arg(long, alias = "lease-ttl", default_value = "15s", value_parser = parse_duration)]
    pub leader_election_lease_duration: Duration,
    /// Name of the election (the Lease name on Kubernetes).
    #[arg(long, default_value = "egress-controller")]
    pub leader_election_lease_name: String,
    /// How often agents renew their heartbeat.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub tunnel_update_period: Duration,
    /// How often the controller checks heartbeats.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub tunnel_monitor_period: Duration,
    /// A gateway node without heartbeat for this long loses its EIPs.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    pub eip_eviction_timeout: Duration,
    /// Ports per port block (a power of two, 64-16384). Workers are
    /// granted blocks by use: one first, more as their NAT use grows.
    #[arg(long, default_value_t = egress_control::controller::DEFAULT_PORT_BLOCK_SIZE)]
    pub port_block_size: u16,
    /// Most ports of one EIP one worker may hold (rounded up to whole
    /// blocks, 1-65536); a policy's `spec.maxPortsPerNode` may cap lower.
    #[arg(long, default_value_t = egress_control::controller::DEFAULT_MAX_PORTS_PER_NODE)]
    pub max_ports_per_node: u32,
    /// The ports (FIRST-LAST) handed out of a gateway node's own address
    /// (useNodeIP policies), in whole port blocks. Keep the node's own
    /// ports out of it: its `net.ipv4.ip_local_port_range` (Linux default
    /// 32768-60999) and its listeners.
    #[arg(long, default_value = "61000-65535", value_parser = parse_port_range)]
    pub node_ip_port_range: (u16, u16),
    /// Port of the HTTP endpoint (on every address) with /metrics, /healthz,
    /// /readyz and /bgp/status (0: none).
    #[arg(long, default_value_t = 0)]
    pub metrics_port: u16,
    /// Probe every gateway candidate's datapath (BFD-style UDP); a failed
    /// probe moves its EIPs like a heartbeat timeout.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub gateway_failover: bool,
    /// Probe interval in milliseconds.
    #[arg(long, default_value_t = u64::from(egress_failover::probe::DEFAULT_PROBE_INTERVAL_MS))]
    pub probe_interval_ms: u64,
    /// Probes missed before a gateway candidate is declared down.
    #[arg(long, default_value_t = u32::from(egress_failover::probe::DEFAULT_DETECT_MULTIPLIER))]
    pub probe_detect_multiplier: u32,
    /// UDP port the agents answer probes on.
    #[arg(long, default_value_t = egress_failover::prober::DEFAULT_PROBE_PORT)]
    pub probe_port: u16,
    /// Run the BGP route reflector in this process: every replica reflects
    /// (one shared --bgp-cluster-id), the nodes in the datastore are its clients.
    #[arg(long = "bgp", action = clap::ArgAction::Set, default_value_t = false)]
    pub bgp_enabled: bool,
    /// The agents announce EIPs by BGP (implied by --bgp=true; set it when
    /// the reflectors run elsewhere): EgressGateways may be ActiveActive.
    #[arg(long, action = clap::ArgAction::Set, default_value_t = false)]
    pub bgp_announcements: bool,
    /// After a change, the longest the controller gathers further changes
    /// before its next pass (it waits as long as its last pass took, up to
    /// this): lower answers sooner, higher folds a burst into fewer passes.
    #[arg(long, default_value = "50ms", value_parser = parse_duration)]
    pub coalesce: Duration,
    #[command(flatten)]
    pub bgp: super::bgp::BgpArgs,
}

/// The longest `--coalesce` the controller accepts.
const MAX_COALESCE: Duration = Duration::from_secs(5);

pub async fn run(args: ControllerArgs) -> anyhow::Result<()> {
    let timers = FailoverTimers::new(
        args.tunnel_update_period,
        args.tunnel_monitor_period,
        args.eip_eviction_timeout,
    )?;
    anyhow::ensure!(
        args.port_block_size.is_power_of_two() && (64..=16384).contains(&args.port_block_size),
        "--port-block-size: {} must be a power of two from 64 to 16384",
        args.port_block_size
    );
    anyhow::ensure!(
        (1..=65536).contains(&args.max_ports_per_node),
        "--max-ports-per-node: {} must be from 1 to 65536 (the ports of one EIP)",
        args.max_ports_per_node
    );
    anyhow::ensure!(
        args.coalesce <= MAX_COALESCE,
        "--coalesce: {:?} is more than {MAX_COALESCE:?}: every change would wait that long",
        args.coalesce
    );
    check_node_ip_range(
        args.node_ip_port_range,
        args.port_block_size,
        args.gateway_failover.then_some(args.probe_port),
    )
    .map_err(|e| anyhow::anyhow!(e))?;
    let identity = args.identity.clone().unwrap_or_else(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        format!("{}-{}", host.trim(), std::process::id())
    });
    let ds = super::datastore::connect(&args.datastore, &args.lease_namespace).await?;
    // Kept for the life of the process; the reflector runs on every replica.
    let reflector = if args.bgp_enabled {
        Some(start_reflector(&args.bgp, ds.clone()).await?)
    } else {
        None
    };
    let cfg = RunConfig {
        identity,
        election: args.leader_election_lease_name.clone(),
        lease_ttl: args.leader_election_lease_duration,
        timers,
        controller: ControllerConfig {
            port_block_size: args.port_block_size,
            first_port: 1024,
            node_ip_ports: args.node_ip_port_range,
            max_ports_per_node: args.max_ports_per_node,
            bgp: args.bgp_enabled || args.bgp_announcements,
        },
        coalesce: args.coalesce,
        ..Default::default()
    };
    let mut cfg = cfg;
    let mut probe_health = None;
    if args.gateway_failover {
        anyhow::ensure!(
            (10..=60_000).contains(&args.probe_interval_ms)
                && (1..=255).contains(&args.probe_detect_multiplier),
            "--probe-interval-ms must be 10..60000 and --probe-detect-multiplier 1..255"
        );
        let session = egress_failover::probe::SessionConfig {
            desired_min_tx_ms: args.probe_interval_ms as u32,
            required_min_rx_ms: args.probe_interval_ms as u32,
            detect_multiplier: args.probe_detect_multiplier as u8,
        };
        let refresh = args.tunnel_monitor_period.min(Duration::from_secs(1));
        let probes =
            crate::controller_probes::start(ds.clone(), session, args.probe_port, refresh).await?;
        cfg.probe_down = Some(probes.down);
        probe_health = Some(probes.health);
    }
    let stats = Arc::new(LoopStats::default());
    // Kept for the life of the process.
    let _admin = if args.metrics_port != 0 {
        let addr = std::net::SocketAddr::from(([0, 0, 0, 0], args.metrics_port));
        let handler = admin_handler(
            stats.clone(),
            probe_health,
            reflector.as_ref().map(|r| r.handle()),
        );
        let (bound, task) = admin::serve(addr, handler)
            .await
            .with_context(|| format!("--metrics-port {}", args.metrics_port))?;
        tracing::info!(%bound, "serving /metrics, /healthz, /readyz, /bgp/status");
        Some(AbortOnDrop(task))
    } else {
        None
    };
    println!("controller {} started", cfg.identity);
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    // SIGINT or SIGTERM: resign, so another replica takes over at once.
    run_controller_with_stats(
        ds,
        cfg,
        async move {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        },
        stats,
    )
    .await
}

/// Starts the route reflector and keeps its clients equal to the registered nodes.
async fn start_reflector(
    bgp: &super::bgp::BgpArgs,
    ds: Arc<dyn Datastore>,
) -> anyhow::Result<egress_bgp::speaker::Speaker> {
    let mut cfg = bgp.speaker_config(None)?;
    let mut exclude: std::collections::BTreeSet<std::net::IpAddr> =
        cfg.peers.iter().map(|p| p.address).collect();
    exclude.insert(std::net::IpAddr::V4(cfg.router_id));
    let asn = cfg.local_asn;
    let clients = crate::reflector_clients::initial_clients(&*ds, asn, &exclude).await;
    let initial = clients.iter().map(|p| p.address).collect();
    cfg.peers.extend(clients);
    let speaker = egress_bgp::speaker::Speaker::start(cfg).await?;
    tokio::spawn(crate::reflector_clients::keep_in_step(
        ds,
        speaker.handle(),
        asn,
        exclude,
        initial,
    ));
    Ok(speaker)
}

/// The routes of the controller's HTTP endpoint: `/metrics`, `/healthz`
/// (the process runs), `/readyz` (the datastore is connected, and the
/// reflector, if any, answers), `/bgp/status` (what `egress bgp status` reads).
fn admin_handler(
    stats: Arc<LoopStats>,
    probes: Option<watch::Receiver<BTreeMap<String, ProbeHealth>>>,
    reflector: Option<egress_bgp::speaker::SpeakerHandle>,
) -> admin::Handler {
    Arc::new(move |path: String| {
        let stats = stats.clone();
        let probes = probes.clone();
        let reflector = reflector.clone();
        Box::pin(async move {
            // The reflector's status, for the routes that show it; /healthz never waits for it.
            let bgp = match (&reflector, path.as_str()) {
                (Some(h), "/metrics" | "/readyz" | "/bgp/status") => Some(h.status().await),
                _ => None,
            };
            match path.as_str() {
                "/metrics" => {
                    let facts = crate::controller_metrics::facts(
                        &stats,
                        tokio::time::Instant::now(),
                        probes.map(|p| p.borrow().clone()),
                        bgp.and_then(Result::ok),
                    );
                    Response::ok(
                        crate::controller_metrics::CONTENT_TYPE,
                        crate::controller_metrics::render(&facts),
                    )
                }
                "/healthz" => Response::ok("text/plain", "ok\n".into()),
                "/readyz" => match bgp {
                    Some(Err(e)) => Response::unavailable(&format!("the reflector: {e}")),
                    _ => Response::ok("text/plain", "ok\n".into()),
                },
                "/bgp/status" => match bgp {
                    Some(Ok(s)) => Response::json(&super::bgp::status_json(&s)),
                    Some(Err(e)) => Response::unavailable(&e.to_string()),
                    None => Response::unavailable("no reflector in this controller (--bgp=false)"),
                },
                _ => Response::not_found(),
            }
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("5s").unwrap(), Duration::from_secs(5));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        // The error names the input.
        assert!(parse_duration("five").unwrap_err().contains("\"five\""));
        // What the chart's schema allows for the failover timers.
        assert_eq!(parse_duration("1m30s").unwrap(), Duration::from_secs(90));
    }
}

/// `--node-ip-port-range` against the other flags: it must hold a whole
/// port block, and not the probe port when probes run (the gateways steer
/// a cached reply before they look for probes).
fn check_node_ip_range(
    (first, last): (u16, u16),
    block_size: u16,
    probe_port: Option<u16>,
) -> Result<(), String> {
    if egress_control::controller::whole_blocks(first, last, block_size).is_empty() {
        return Err(format!(
            "--node-ip-port-range: {first}-{last} holds no whole block of {block_size} ports (--port-block-size)"
        ));
    }
    if let Some(p) = probe_port.filter(|p| (first..=last).contains(p)) {
        return Err(format!(
            "--node-ip-port-range: {first}-{last} contains --probe-port {p}; the probes would be steered to workers"
        ));
    }
    Ok(())
}

/// "FIRST-LAST", two ports, FIRST <= LAST.
fn parse_port_range(s: &str) -> Result<(u16, u16), String> {
    let (a, b) = s
        .split_once('-')
        .ok_or_else(|| format!("{s:?}: expected FIRST-LAST, e.g. 61000-65535"))?;
    let port = |p: &str| {
        p.trim()
            .parse::<u16>()
            .map_err(|e| format!("{s:?}: {p:?} is not a port: {e}"))
    };
    let (a, b) = (port(a)?, port(b)?);
    if a > b {
        return Err(format!("{s:?}: the first port is above the last"));
    }
    Ok((a, b))
}

#[cfg(test)]
mod port_range_tests {
    use super::{check_node_ip_range, parse_port_range};

    #[test]
    fn a_node_ip_range_without_a_whole_block_or_with_the_probe_port_is_refused() {
        assert_eq!(
            check_node_ip_range((61000, 65535), 1024, Some(13784)),
            Ok(())
        );
        let e = check_node_ip_range((61000, 61100), 1024, None).unwrap_err();
        assert!(
            e.contains("--node-ip-port-range") && e.contains("no whole block"),
            "{e}"
        );
        let e = check_node_ip_range((10000, 20000), 1024, Some(13784)).unwrap_err();
        assert!(e.contains("--probe-port 13784"), "{e}");
        // Without probes the probe port does not matter.
        assert_eq!(check_node_ip_range((10000, 20000), 1024, None), Ok(()));
    }

    #[test]
    fn port_ranges_parse_and_bad_ones_say_why() {
        assert_eq!(parse_port_range("61000-65535"), Ok((61000, 65535)));
        assert_eq!(parse_port_range(" 49152 - 65535 "), Ok((49152, 65535)));
        for (bad, why) in [
            ("61000", "expected FIRST-LAST"),
            ("61000-70000", "is not a port"),
            ("x-65535", "is not a port"),
            ("65000-61000", "first port is above the last"),
        ] {
            let e = parse_port_range(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }
}
