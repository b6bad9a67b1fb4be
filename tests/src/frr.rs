//! FRR's bgpd as an upstream router in a namespace: without zebra it only
//! speaks BGP and keeps its RIB, which is what most tests read; with zebra
//! ([`Frr::start_forwarding`]) it installs its best paths, several at once
//! (ECMP), into the namespace's kernel and forwards by them.

use std::{
    collections::BTreeSet,
    net::{IpAddr, Ipv4Addr},
    path::PathBuf,
    time::Duration,
};

use serde_json::Value;

use anyhow::{Context, Result};

use crate::{netns::unique_name, process::Proc, Netns};

pub struct Frr {
    proc: Option<Proc>,
    zebra: Option<Proc>,
    dir: PathBuf,
    ns: String,
}

impl Frr {
    /// Starts bgpd in `ns` as AS `asn` with router id `router_id`, peering
    /// with each `(address, asn)` neighbour (graceful restart on).
    pub fn start(
        ns: &Netns,
        router_id: Ipv4Addr,
        asn: u32,
        neighbors: &[(Ipv4Addr, u32)],
    ) -> Result<Self> {
        Self::start_with(ns, router_id, asn, &addrs(neighbors), false)
    }

    /// As [`Frr::start`], with neighbours of either family: an IPv6 one is
    /// activated for IPv4 unicast too, with the extended next hop
    /// capability (RFC 8950), as on an IPv6-only underlay.
    pub fn start_on(
        ns: &Netns,
        router_id: Ipv4Addr,
        asn: u32,
        neighbors: &[(IpAddr, u32)],
    ) -> Result<Self> {
        Self::start_with(ns, router_id, asn, neighbors, false)
    }

    /// As [`Frr::start`], with zebra: up to 8 equal iBGP paths of a prefix
    /// make one multipath route in the namespace's kernel, and the
    /// namespace forwards.
    pub fn start_forwarding(
        ns: &Netns,
        router_id: Ipv4Addr,
        asn: u32,
        neighbors: &[(Ipv4Addr, u32)],
    ) -> Result<Self> {
        ns.enable_forwarding()?;
        Self::start_with(ns, router_id, asn, &addrs(neighbors), true)
    }

    /// As [`Frr::start_forwarding`], with neighbours of either family (as
    /// [`Frr::start_on`]): IPv4 routes learned with IPv6 next hops are
    /// installed as such (`via inet6`).
    pub fn start_forwarding_on(
        ns: &Netns,
        router_id: Ipv4Addr,
        asn: u32,
        neighbors: &[(IpAddr, u32)],
    ) -> Result<Self> {
        ns.enable_forwarding()?;
        Self::start_with(ns, router_id, asn, neighbors, true)
    }

    fn start_with(
        ns: &Netns,
        router_id: Ipv4Addr,
        asn: u32,
        neighbors: &[(IpAddr, u32)],
        zebra: bool,
    ) -> Result<Self> {
        let dir = std::env::temp_dir().join(unique_name("frr"));
        std::fs::create_dir_all(&dir)?;
        let mut conf = format!(
            "frr defaults datacenter\nhostname upstream\nrouter bgp {asn}\n bgp router-id {router_id}\n \
             no bgp ebgp-requires-policy\n bgp graceful-restart\n"
        );
        for (addr, peer_asn) in neighbors {
            conf += &format!(" neighbor {addr} remote-as {peer_asn}\n neighbor {addr} timers 3 9\n neighbor {addr} timers connect 1\n");
            if addr.is_ipv6() {
                conf += &format!(" neighbor {addr} capability extended-nexthop\n");
            }
        }
        conf += " address-family ipv4 unicast\n";
        if zebra {
            conf += "  maximum-paths ibgp 8\n";
        }
        for (addr, _) in neighbors.iter().filter(|(a, _)| a.is_ipv6()) {
            conf += &format!("  neighbor {addr} activate\n");
        }
        conf += " exit-address-family\n";
        conf += " address-family ipv6 unicast\n";
        for (addr, _) in neighbors {
            conf += &format!("  neighbor {addr} activate\n");
        }
        conf += " exit-address-family\n";
        std::fs::write(dir.join("bgpd.conf"), conf)?;
        std::fs::write(dir.join("zebra.conf"), "hostname upstream\n")?;
        crate::run(&["chown", "-R", "frr:frr", &dir.to_string_lossy()])
            .context("chown to the frr user (is frr installed?)")?;
        let d = dir.to_string_lossy().into_owned();
        let mut frr = Self {
            proc: None,
            zebra: None,
            dir,
            ns: ns.name().to_owned(),
        };
        let zserv = format!("{d}/zserv.api");
        if zebra {
            frr.zebra = Some(spawn_zebra(ns, &d, &zserv)?);
            crate::cluster::wait_until("zebra's zserv socket", Duration::from_secs(15), || {
                Ok(std::path::Path::new(&zserv).exists())
            })?;
        }
        frr.proc = Some(spawn_bgpd_with(ns, &d, zebra.then_some(zserv.as_str()))?);
        crate::cluster::wait_until("FRR answers vtysh", Duration::from_secs(15), || {
            Ok(frr.vtysh("show bgp summary json").is_ok())
        })?;
        Ok(frr)
    }

    /// Runs one vtysh command against this bgpd.
    pub fn vtysh(&self, cmd: &str) -> Result<String> {
        crate::run(&[
            "nsenter",
            &format!("--net=/run/netns/{}", self.ns),
            "--",
            "vtysh",
            "--vty_socket",
            &self.dir.to_string_lossy(),
            "-c",
            cmd,
        ])
    }

    /// The shell command an operator runs to ask this bgpd `cmd`.
    pub fn vtysh_command_line(&self, cmd: &str) -> String {
        format!(
            "ip netns exec {} vtysh --vty_socket {} -c '{cmd}'",
            self.ns,
            self.dir.display()
        )
    }

    /// The IPv4 unicast table: prefix -> next hop of the best path.
    pub fn ipv4_routes(&self) -> Result<std::collections::BTreeMap<String, String>> {
        let v: serde_json::Value =
            serde_json::from_str(&self.vtysh("show bgp ipv4 unicast json")?)?;
        let mut out = std::collections::BTreeMap::new();
        if let Some(routes) = v["routes"].as_object() {
            for (prefix, paths) in routes {
                let best = paths
                    .as_array()
                    .and_then(|ps| ps.iter().find(|p| p["bestpath"] == true).or(ps.first()));
                if let Some(nh) = best.and_then(|p| p["nexthops"][0]["ip"].as_str()) {
                    out.insert(prefix.clone(), nh.to_owned());
                }
            }
        }
        Ok(out)
    }
}

fn addrs(v4: &[(Ipv4Addr, u32)]) -> Vec<(IpAddr, u32)> {
    v4.iter().map(|(a, asn)| (IpAddr::V4(*a), *asn)).collect()
}

impl Drop for Frr {
    fn drop(&mut self) {
        drop(self.proc.take());
        drop(self.zebra.take());
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Starts FRR's bgpd in `ns` with `dir/bgpd.conf`, its pid file and vty
/// socket in `dir` (owned by the frr user), no zebra, no listener of its own
/// beyond the configured neighbors (`-P 0`: no vty port).
pub fn spawn_bgpd(ns: &Netns, dir: &str) -> Result<Proc> {
    spawn_bgpd_with(ns, dir, None)
}

/// bgpd as [`spawn_bgpd`] starts it, talking to the zebra at `zserv`
/// when there is one.
fn spawn_bgpd_with(ns: &Netns, dir: &str, zserv: Option<&str>) -> Result<Proc> {
    let zebra: &[&str] = match zserv {
        Some(z) => &["-z", z],
        None => &["-Z"],
    };
    spawn_daemon(ns, "bgpd", dir, zebra)
}

/// zebra in the foreground (the guard owns it), serving bgpd on `zserv`.
fn spawn_zebra(ns: &Netns, dir: &str, zserv: &str) -> Result<Proc> {
    spawn_daemon(ns, "zebra", dir, &["-z", zserv])
}

/// FRR daemon `name` in the foreground with `dir/NAME.conf`, its pid file
/// and vty socket in `dir`, as the frr user, without a vty port.
fn spawn_daemon(ns: &Netns, name: &str, dir: &str, extra: &[&str]) -> Result<Proc> {
    let bin = format!("/usr/lib/frr/{name}");
    let conf = format!("{dir}/{name}.conf");
    let pid = format!("{dir}/{name}.pid");
    let mut argv = vec![bin.as_str(), "-f", &conf];
    argv.extend_from_slice(extra);
    argv.extend_from_slice(&[
        "-i",
        &pid,
        "--vty_socket",
        dir,
        "-u",
        "frr",
        "-g",
        "frr",
        "-P",
        "0",
    ]);
    ns.spawn(&argv)
}

/// The next hops of the kernel's route for `prefix` in `ns` (a multipath
/// route's, or a nexthop group's members', which is how zebra installs
/// them), sorted.
pub fn kernel_next_hops(ns: &Netns, prefix: &str) -> Result<BTreeSet<String>> {
    let text = ns.exec(&["ip", "-j", "route", "show", prefix])?;
    let v: Value = serde_json::from_str(text.trim()).context("ip -j route")?;
    let mut out = BTreeSet::new();
    for r in v.as_array().into_iter().flatten() {
        if let Some(nhs) = r["nexthops"].as_array() {
            out.extend(nhs.iter().filter_map(gateway_of).map(String::from));
        } else if let Some(g) = gateway_of(r) {
            out.insert(g.to_string());
        } else if let Some(id) = r["nhid"].as_u64() {
            out.extend(group_gateways(ns, id)?);
        }
    }
    Ok(out)
}

/// A route's or next hop's gateway: `gateway`, or for an IPv4 route by an
/// IPv6 next hop (RFC 5549 routes), `via`'s host.
fn gateway_of(r: &Value) -> Option<&str> {
    r["gateway"].as_str().or_else(|| r["via"]["host"].as_str())
}

/// The gateways of kernel nexthop object `id`: a group's members', or its own.
fn group_gateways(ns: &Netns, id: u64) -> Result<Vec<String>> {
    let show = |id: u64| -> Result<Value> {
        let t = ns.exec(&["ip", "-j", "nexthop", "show", "id", &id.to_string()])?;
        let v: Value = serde_json::from_str(t.trim()).context("ip -j nexthop")?;
        Ok(v.as_array().and_then(|a| a.first()).cloned().unwrap_or(v))
    };
    let nh = show(id)?;
    let Some(members) = nh["group"].as_array() else {
        return Ok(gateway_of(&nh).map(String::from).into_iter().collect());
    };
    let mut out = Vec::new();
    for m in members {
        let g = show(m["id"].as_u64().context("nexthop group member id")?)?;
        out.extend(gateway_of(&g).map(String::from));
    }
    Ok(out)
}
