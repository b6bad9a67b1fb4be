//! BGP interop with real peers from Debian's packages (FRR 8.4, BIRD 2,
//! GoBGP 3) in network namespaces, and the route-reflector incident as a
//! regression test. Needs root:
//!
//! ```text
//! cargo build -p egress-bgp --examples
//! cargo test -p egress-tests --test bgp_interop -- --ignored --test-threads=1
//! ```
//!
//! Our side runs as the `bgp-speaker` example process (so it can be killed
//! with SIGKILL and started again); set BGP_SPEAKER_BIN to use another
//! build. Every peer's routes are read with its own JSON or CLI output.

mod add_path; // ADD-PATH to an FRR upstream with zebra: an ECMP route
mod client; // `kind` as a client of our reflector
mod ext_next_hop; // IPv4 routes by IPv6 next hops, sessions over IPv6 only
mod fleet_restart; // our reflector restarted under 100 light clients
mod graceful_restart; // graceful restart both ways
mod incident; // two reflectors, one cluster id, one killed and restarted
mod ipv6; // IPv6 unicast over an IPv4 session
mod lab; // namespaces, the LAN, and the routers: ours, FRR, BIRD, GoBGP
mod md5; // TCP-MD5 sessions
mod upstream; // `kind` as upstream non-client receives every route

use std::net::IpAddr;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use egress_tests::is_root;
use serde_json::Value;

use add_path::ecmp_at_frr_through_add_path;
use client::client_of_our_reflector;
use ext_next_hop::ipv4_by_ipv6_next_hops;
use fleet_restart::reflector_restart_under_a_fleet;
use graceful_restart::graceful_restart_both_ways;
use incident::incident;
use ipv6::ipv6_routes_reach_frr;
use lab::{Kind, Router};
use md5::{md5_for_peers_added_at_run_time, md5_session};
use upstream::upstream_receives_every_route;

pub(crate) const ASN: u32 = 65000;
pub(crate) const CLUSTER: &str = "1.1.1.1";

/// A broken invariant (a route that must never leave a table did): fails
/// a [`wait_until`] at once. Other errors, such as a daemon not answering
/// while it restarts, are retried until the timeout.
#[derive(Debug)]
struct Violation(String);

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Violation {}

pub(crate) fn hold(ok: bool, what: impl FnOnce() -> String) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(Violation(what()).into())
    }
}

pub(crate) fn wait_until(
    what: &str,
    timeout: Duration,
    mut f: impl FnMut() -> Result<bool>,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    let mut last_err = None;
    loop {
        match f() {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) if e.downcast_ref::<Violation>().is_some() => return Err(e),
            Err(e) => last_err = Some(e),
        }
        if Instant::now() > deadline {
            bail!("timed out after {timeout:?} waiting for {what} (last error: {last_err:?})");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One peer's entry in our speaker's status document.
pub(crate) fn peer_status(doc: &Value, addr: impl Into<IpAddr>) -> Result<Value> {
    let addr = addr.into();
    doc["status"]["peers"]
        .as_array()
        .context("peers")?
        .iter()
        .find(|p| p["address"] == addr.to_string())
        .cloned()
        .with_context(|| format!("no peer {addr} in {doc}"))
}

pub(crate) fn client_prefix(i: u8) -> String {
    format!("10.244.{i}.0/24")
}

/// How many of `prefixes` the router holds.
pub(crate) fn count_present(r: &Router, prefixes: &[String]) -> Result<usize> {
    let routes = r.routes()?;
    Ok(prefixes.iter().filter(|p| routes.contains_key(*p)).count())
}

fn skip_unless_root() -> bool {
    if !is_root() {
        eprintln!("skipped: needs root");
        return true;
    }
    false
}

macro_rules! interop {
    ($name:ident, $body:expr) => {
        #[test]
        #[ignore = "needs root"]
        fn $name() -> Result<()> {
            if skip_unless_root() {
                return Ok(());
            }
            $body
        }
    };
}

interop!(
    frr_upstream_receives_every_route,
    upstream_receives_every_route(Kind::Frr)
);
interop!(
    bird_upstream_receives_every_route,
    upstream_receives_every_route(Kind::Bird)
);
interop!(
    gobgp_upstream_receives_every_route,
    upstream_receives_every_route(Kind::Gobgp)
);
interop!(frr_as_client, client_of_our_reflector(Kind::Frr));
interop!(bird_as_client, client_of_our_reflector(Kind::Bird));
interop!(gobgp_as_client, client_of_our_reflector(Kind::Gobgp));
interop!(
    frr_graceful_restart_both_ways,
    graceful_restart_both_ways(Kind::Frr)
);
interop!(
    bird_graceful_restart_both_ways,
    graceful_restart_both_ways(Kind::Bird)
);
interop!(
    gobgp_graceful_restart_both_ways,
    graceful_restart_both_ways(Kind::Gobgp)
);
interop!(incident_with_our_clients, incident(Kind::Ours, 20));
interop!(incident_with_frr_clients, incident(Kind::Frr, 20));
interop!(incident_with_bird_clients, incident(Kind::Bird, 20));
interop!(frr_tcp_md5, md5_session(Kind::Frr));
interop!(bird_tcp_md5, md5_session(Kind::Bird));
interop!(gobgp_tcp_md5, md5_session(Kind::Gobgp));
interop!(
    frr_tcp_md5_with_peers_added_at_run_time,
    md5_for_peers_added_at_run_time()
);
interop!(frr_ipv6_unicast, ipv6_routes_reach_frr());
interop!(
    ipv4_by_ipv6_next_hops_among_bird_gobgp_frr_over_ipv6_sessions,
    ipv4_by_ipv6_next_hops()
);
interop!(
    frr_upstream_installs_ecmp_from_add_path,
    ecmp_at_frr_through_add_path()
);
interop!(
    our_reflector_restarts_under_100_clients_without_losing_a_route,
    reflector_restart_under_a_fleet(100)
);
