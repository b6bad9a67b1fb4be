//! A stand-alone speaker for interop tests and the benchmark, which need a
//! process they can kill -9 and start again. The `egress` binary embeds
//! the library instead.
//!
//! Usage: `bgp-speaker CONFIG.json`. Prints `ready` once listening, then
//! one JSON line per best-route change, and a status JSON line for every
//! line read on stdin (or, with the best routes, in `status_file`,
//! rewritten every 50 ms). SIGTERM: stop for restart (connections closed
//! without NOTIFICATION, so graceful-restart helpers keep our routes);
//! SIGINT: Cease to every peer. With RUST_LOG set, logs to stderr.
//! With `command_file`, that file is read (and removed) whenever it
//! appears, one command a line: `withdraw PREFIX` or
//! `announce PREFIX NEXT_HOP [LOCAL_PREF]` (a test's way to change what
//! the speaker announces while it runs).
//!
//! ```json
//! {"asn": 65000, "router_id": "10.0.0.1", "cluster_id": "1.1.1.1",
//!  "listen": "10.0.0.1:179", "hold_time": 9, "restart_time": 30,
//!  "restarting": true, "deferral_time": 10,
//!  "peers": [{"address": "10.0.0.2", "asn": 65000, "client": true, "passive": true}],
//!  "late_peers": [], "default_password": null,
//!  "announce": [["10.244.1.0/24", "10.0.0.1"]]}
//! ```

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use egress_bgp::gr::GrConfig;
use egress_bgp::rib::BestChange;
use egress_bgp::speaker::{PeerSpec, Speaker, SpeakerConfig};
use egress_bgp::Prefix;
use serde::Deserialize;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::signal::unix::{signal, SignalKind};

#[derive(Deserialize)]
struct Config {
    asn: u32,
    router_id: Ipv4Addr,
    cluster_id: Option<Ipv4Addr>,
    listen: Option<SocketAddr>,
    #[serde(default = "default_hold")]
    hold_time: u16,
    /// 0 turns graceful restart off.
    #[serde(default = "default_restart")]
    restart_time: u16,
    #[serde(default)]
    restarting: bool,
    #[serde(default = "default_deferral")]
    deferral_time: u64,
    /// RFC 9494 long-lived stale time; 0: off.
    #[serde(default)]
    llgr_stale_time: u32,
    #[serde(default = "default_retry_ms")]
    connect_retry_ms: u64,
    #[serde(default)]
    peers: Vec<PeerSpec>,
    /// Added through the handle once running, as a reflector adds the
    /// nodes it finds in the datastore.
    #[serde(default)]
    late_peers: Vec<PeerSpec>,
    /// TCP-MD5 key for every peer without its own (late ones included).
    default_password: Option<String>,
    #[serde(default)]
    announce: Vec<(Prefix, IpAddr)>,
    /// Print best-route changes (off for large benchmark tables).
    #[serde(default = "yes")]
    print_routes: bool,
    /// Rewrite this file with the status JSON every 50 ms (for tests
    /// that poll the speaker from outside).
    status_file: Option<std::path::PathBuf>,
    /// Put the best routes in the status file too (costly for big tables).
    #[serde(default = "yes")]
    status_routes: bool,
    /// Commands to run, written by a test (see the top of this file).
    command_file: Option<std::path::PathBuf>,
}

fn default_hold() -> u16 {
    90
}
fn default_restart() -> u16 {
    120
}
fn default_deferral() -> u64 {
    60
}
fn default_retry_ms() -> u64 {
    1000
}
fn yes() -> bool {
    true
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Quiet unless asked (RUST_LOG=info): the tests print a child's stderr.
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    let path = std::env::args()
        .nth(1)
        .ok_or("usage: bgp-speaker CONFIG.json")?;
    let c: Config = serde_json::from_str(&std::fs::read_to_string(path)?)?;
    let mut cfg = SpeakerConfig::new(c.asn, c.router_id);
    cfg.cluster_id = c.cluster_id;
    cfg.listen = c.listen;
    cfg.hold_time = c.hold_time;
    cfg.connect_retry = Duration::from_millis(c.connect_retry_ms);
    cfg.restarting = c.restarting;
    cfg.graceful_restart = (c.restart_time > 0).then(|| GrConfig {
        restart_time: c.restart_time,
        deferral_time: Duration::from_secs(c.deferral_time),
        llgr_stale_time: c.llgr_stale_time,
        ..GrConfig::default()
    });
    cfg.peers = c.peers;
    cfg.default_password = c.default_password;
    let speaker = Speaker::start(cfg).await?;
    let h = speaker.handle();
    for p in c.late_peers {
        h.add_peer(p).await?;
    }
    h.announce_many(c.announce).await?;
    // Only when someone reads the best routes: the controller's reflector
    // does not follow them either.
    let mut changes = if c.print_routes || (c.status_file.is_some() && c.status_routes) {
        Some(h.subscribe().await?)
    } else {
        None
    };
    println!("ready");
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut stdin = BufReader::new(tokio::io::stdin()).lines();
    let mut stdin_open = true;
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    // The best routes, by prefix: (next hop, peer it came from).
    let mut routes: BTreeMap<String, (IpAddr, Option<IpAddr>)> = BTreeMap::new();
    loop {
        tokio::select! {
            _ = tick.tick(), if c.status_file.is_some() || c.command_file.is_some() => {
                if let Some(cmds) = &c.command_file {
                    run_commands(&h, cmds).await?;
                }
                let Some(path) = c.status_file.as_ref() else {
                    continue;
                };
                let tmp = path.with_extension("tmp");
                let doc = if c.status_routes {
                    serde_json::json!({"status": h.status().await?, "routes": routes})
                } else {
                    serde_json::json!({"status": h.status().await?})
                };
                std::fs::write(&tmp, serde_json::to_vec(&doc)?)?;
                std::fs::rename(&tmp, path)?;
            }
            Some(change) = next_change(&mut changes) => {
                if c.print_routes {
                    println!("{}", serde_json::to_string(&change)?);
                }
                if c.status_file.is_some() && c.status_routes {
                    match change {
                        BestChange::Set { prefix, next_hop, from, .. } => {
                            routes.insert(prefix.to_string(), (next_hop, from));
                        }
                        BestChange::Removed { prefix } => {
                            routes.remove(&prefix.to_string());
                        }
                    }
                }
            }
            line = stdin.next_line(), if stdin_open => match line {
                Ok(Some(_)) => println!("{}", serde_json::to_string(&h.status().await?)?),
                _ => stdin_open = false,
            },
            _ = term.recv() => {
                speaker.abort();
                return Ok(());
            }
            _ = int.recv() => {
                speaker.shutdown().await;
                return Ok(());
            }
        }
    }
}

/// Runs and removes the command file, if there is one.
async fn run_commands(
    h: &egress_bgp::speaker::SpeakerHandle,
    file: &std::path::Path,
) -> Result<(), Box<dyn std::error::Error>> {
    let Ok(text) = std::fs::read_to_string(file) else {
        return Ok(());
    };
    std::fs::remove_file(file)?;
    for line in text.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        match w.as_slice() {
            ["withdraw", p] => h.withdraw(p.parse()?).await?,
            ["announce", p, nh] => h.announce(p.parse()?, nh.parse()?).await?,
            ["announce", p, nh, lp] => {
                h.announce_with_local_pref(p.parse()?, nh.parse()?, lp.parse()?)
                    .await?
            }
            [] => {}
            _ => return Err(format!("unknown command {line:?}").into()),
        }
    }
    Ok(())
}

async fn next_change(
    rx: &mut Option<tokio::sync::mpsc::UnboundedReceiver<BestChange>>,
) -> Option<BestChange> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}
