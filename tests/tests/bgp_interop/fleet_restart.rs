//! Our reflector killed (SIGKILL) and started again under a fleet of
//! clients, graceful restart negotiated both ways: no client loses a route
//! (none is withdrawn, none is left stale at End-of-RIB), and End-of-RIB
//! reaches every client. The benchmark runs the same at 1,000 clients
//! (`cargo xtask bench bgp`, `cluster_restart_*`).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use egress_tests::bgp_fleet::{cluster_clients, routed_link, Event, Fleet, FleetConfig};
use egress_tests::{Netns, Proc};
use serde_json::json;

use crate::lab::speaker_bin;
use crate::{ASN, CLUSTER};

const REFLECTOR: &str = "10.99.0.1";
const RESTART_TIME: u16 = 120;

/// Writes our reflector's configuration (`restarting`: the second start)
/// and starts it.
fn start_ours(ns: &Netns, cfg_path: &std::path::Path, n: usize, restarting: bool) -> Result<Proc> {
    let peers: Vec<_> = cluster_clients(n, 3)
        .iter()
        .map(
            |c| json!({"address": c.addr.to_string(), "asn": ASN, "client": true, "passive": true}),
        )
        .collect();
    let cfg = json!({"asn": ASN, "router_id": REFLECTOR, "cluster_id": CLUSTER,
        "listen": format!("{REFLECTOR}:179"), "restart_time": RESTART_TIME,
        "restarting": restarting, "deferral_time": 60, "peers": peers, "print_routes": false});
    std::fs::write(cfg_path, cfg.to_string())?;
    let bin = speaker_bin()?;
    let mut p = ns.spawn(&[
        bin.to_str().context("bin")?,
        cfg_path.to_str().context("cfg")?,
    ])?;
    p.wait_for_line("ready", Duration::from_secs(20))?;
    Ok(p)
}

pub(crate) fn reflector_restart_under_a_fleet(n: usize) -> Result<()> {
    let rr = Netns::new("fleetrr")?;
    let cl = Netns::new("fleetcl")?;
    routed_link(&rr, &cl, REFLECTOR, ("10.98.255.1", "10.98.255.2"))?;
    let cfg_path = std::env::temp_dir().join(egress_tests::unique_name("fleet-rr.json"));
    let _cfg_gone = scopeguard(cfg_path.clone());
    let mut ours = start_ours(&rr, &cfg_path, n, false)?;
    let fleet = Fleet::start(
        &cl,
        "lo",
        FleetConfig {
            asn: ASN,
            reflector: format!("{REFLECTOR}:179").parse::<SocketAddr>()?,
            restart_time: Some(RESTART_TIME),
            clients: cluster_clients(n, 3),
        },
    )?;
    fleet
        .wait_consistent(0, Duration::from_secs(60), |_| {})
        .map_err(|missing| anyhow::anyhow!("clients {missing:?} never held every route"))?;
    let removed_before = fleet.removed();

    let killed = Instant::now();
    ours.kill();
    let _ours = start_ours(&rr, &cfg_path, n, true)?;
    let until = killed + Duration::from_secs(60);
    let mut eor: Vec<Option<Instant>> = vec![None; n];
    let mut stale_left = 0;
    while eor.iter().any(Option::is_none) {
        let Some(e) = fleet.next_event(until) else {
            break;
        };
        if let Event::EndOfRib {
            client,
            at,
            stale_left: s,
        } = e
        {
            if at > killed && eor[client].is_none() {
                eor[client] = Some(at);
                stale_left += s;
            }
        }
        ensure!(
            fleet.removed() == removed_before,
            "a client lost {} routes during the restart",
            fleet.removed() - removed_before
        );
    }
    let missing: Vec<usize> = (0..n).filter(|i| eor[*i].is_none()).collect();
    ensure!(missing.is_empty(), "no End-of-RIB at clients {missing:?}");
    ensure!(stale_left == 0, "{stale_left} stale routes not sent again");
    let last = eor.iter().flatten().max().expect("n > 0");
    eprintln!(
        "{n} clients: End-of-RIB at every client {:?} after the kill, no route lost",
        last.duration_since(killed)
    );
    Ok(())
}

/// Removes a file when dropped.
fn scopeguard(p: std::path::PathBuf) -> impl Drop {
    struct Gone(std::path::PathBuf);
    impl Drop for Gone {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    Gone(p)
}
