//! A reflector in the BGP benchmarks' seat: ours, BIRD, FRR or GoBGP
//! started in a namespace with a configuration written for its
//! neighbours, and the figures read off its process (peak RSS, CPU time).
//! Both the feed (`bench_bgp`) and the cluster shape (`bench_bgp_cluster`)
//! seat their reflectors here.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use egress_tests::{run, unique_name, Netns, Proc};
use serde_json::json;

pub(crate) const ASN: u32 = 65000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reflector {
    Ours,
    Gobgp,
    Bird,
    Frr,
}

impl Reflector {
    pub const ALL: [Reflector; 4] = [
        Reflector::Ours,
        Reflector::Gobgp,
        Reflector::Bird,
        Reflector::Frr,
    ];

    pub fn parse(s: &str) -> Option<Reflector> {
        Reflector::ALL.into_iter().find(|r| r.key() == s)
    }

    pub(crate) fn key(self) -> &'static str {
        match self {
            Reflector::Ours => "ours",
            Reflector::Gobgp => "gobgp",
            Reflector::Bird => "bird",
            Reflector::Frr => "frr",
        }
    }
}

/// A scratch folder, world-writable for FRR's own user, removed on drop.
pub(crate) struct Dir(PathBuf);

impl Dir {
    pub(crate) fn new() -> Result<Dir> {
        let p = std::env::temp_dir().join(unique_name("bgpbench"));
        std::fs::create_dir_all(&p)?;
        run(&["chmod", "0777", p.to_str().context("path")?])?;
        Ok(Dir(p))
    }

    pub(crate) fn file(&self, name: &str) -> String {
        self.0.join(name).to_string_lossy().into_owned()
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Where a reflector sits: its address, its neighbours (address, is a
/// client) and, for ours, graceful restart (restart time, restarting now).
pub(crate) struct Seat {
    pub me: String,
    pub neighbors: Vec<(String, bool)>,
    pub graceful_restart: Option<(u16, bool)>,
    /// The neighbours are behind a router, not on the link, reached
    /// through `routed`'s gateway (prefix, gateway) for BIRD's next hops.
    pub routed: Option<(String, String)>,
}

pub(crate) fn start_reflector(
    kind: Reflector,
    ns: &Netns,
    dir: &Dir,
    seat: &Seat,
    speaker: &Path,
) -> Result<Proc> {
    let neighbors = &seat.neighbors;
    let me = &seat.me;
    match kind {
        Reflector::Ours => {
            let peers: Vec<_> = neighbors
                .iter()
                .map(|(a, c)| json!({"address": a, "asn": ASN, "client": c, "passive": true}))
                .collect();
            let (restart_time, restarting) = seat.graceful_restart.unwrap_or((0, false));
            let cfg = json!({"asn": ASN, "router_id": me, "cluster_id": "1.1.1.1", "listen": format!("{me}:179"),
                "restart_time": restart_time, "restarting": restarting, "peers": peers, "print_routes": false});
            std::fs::write(dir.file("speaker.json"), cfg.to_string())?;
            // For profiling: BENCH_BGP_WRAP="perf record -g -o /tmp/p.data"
            // or "heaptrack -o /tmp/h" runs our reflector under that tool.
            let wrap = std::env::var("BENCH_BGP_WRAP").unwrap_or_default();
            let mut argv: Vec<&str> = wrap.split_whitespace().collect();
            let cfg_path = dir.file("speaker.json");
            argv.extend([speaker.to_str().context("speaker path")?, &cfg_path]);
            let mut p = ns.spawn(&argv)?;
            p.wait_for_line("ready", Duration::from_secs(60))?;
            Ok(p)
        }
        Reflector::Bird => {
            let mut s = format!("router id {me};\nprotocol device {{ }}\n");
            // Next hops behind a router resolve through a route (BIRD
            // resolves iBGP next hops recursively off the link).
            let hop = match &seat.routed {
                None => "direct",
                Some((net, via)) => {
                    let _ = writeln!(s, "protocol static {{ ipv4; route {net} via {via}; }}");
                    "multihop"
                }
            };
            for (i, (a, client)) in neighbors.iter().enumerate() {
                let rr = if *client {
                    "  rr client;\n  rr cluster id 1.1.1.1;\n"
                } else {
                    ""
                };
                let _ = write!(
                    s,
                    "protocol bgp n{i} {{\n  local {me} as {ASN};\n  neighbor {a} as {ASN};\n  {hop};\n  passive on;\n{rr}  \
                     ipv4 {{ import all; export all; }};\n}}\n"
                );
            }
            std::fs::write(dir.file("rr-bird.conf"), s)?;
            ns.spawn(&[
                "bird",
                "-f",
                "-c",
                &dir.file("rr-bird.conf"),
                "-s",
                &dir.file("rr-bird.ctl"),
            ])
        }
        Reflector::Frr => {
            let mut s = format!(
                "frr defaults datacenter\nhostname rr\nrouter bgp {ASN}\n bgp router-id {me}\n bgp cluster-id 1.1.1.1\n \
                 no bgp ebgp-requires-policy\n"
            );
            for (a, _) in neighbors {
                let _ = writeln!(s, " neighbor {a} remote-as {ASN}\n neighbor {a} passive");
            }
            s += " address-family ipv4 unicast\n";
            for (a, client) in neighbors {
                if *client {
                    let _ = writeln!(s, "  neighbor {a} route-reflector-client");
                }
            }
            s += " exit-address-family\n";
            std::fs::write(dir.file("bgpd.conf"), s)?;
            // The same launch as the tests' FRR (no zebra, no vty port).
            egress_tests::frr::spawn_bgpd(ns, &dir.0.to_string_lossy())
        }
        Reflector::Gobgp => {
            let mut s = format!(
                "[global.config]\n  as = {ASN}\n  router-id = \"{me}\"\n  local-address-list = [\"{me}\"]\n"
            );
            for (a, client) in neighbors {
                let _ = write!(
                    s,
                    "[[neighbors]]\n  [neighbors.config]\n    neighbor-address = \"{a}\"\n    peer-as = {ASN}\n  \
                     [neighbors.transport.config]\n    passive-mode = true\n"
                );
                if *client {
                    s += "  [neighbors.route-reflector.config]\n    route-reflector-client = true\n    \
                          route-reflector-cluster-id = \"1.1.1.1\"\n";
                }
                s += "  [[neighbors.afi-safis]]\n    [neighbors.afi-safis.config]\n      afi-safi-name = \"ipv4-unicast\"\n";
            }
            std::fs::write(dir.file("gobgp.toml"), s)?;
            ns.spawn(&[
                "gobgpd",
                "-f",
                &dir.file("gobgp.toml"),
                "--api-hosts",
                "127.0.0.1:50051",
                "-l",
                "warn",
            ])
        }
    }
}

pub(crate) fn peak_rss_mb(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| {
                l.split_whitespace()
                    .nth(1)
                    .and_then(|k| k.parse::<f64>().ok())
            })
        })
        .map(|kb| kb / 1024.0)
        .unwrap_or(f64::NAN)
}

/// CPU seconds (user + system) the process has used so far.
pub(crate) fn cpu_seconds(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            // Fields after the command name, which is in parentheses.
            let rest = &s[s.rfind(')')? + 2..];
            let f: Vec<&str> = rest.split_whitespace().collect();
            let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
            Some(ticks / 100.0)
        })
        .unwrap_or(f64::NAN)
}
