//! FRR's bgpd as an upstream router in a namespace (no zebra: it only
//! speaks BGP and keeps its RIB, which is what a test reads).

use std::{net::Ipv4Addr, path::PathBuf, time::Duration};

use anyhow::{Context, Result};

use crate::{netns::unique_name, process::Proc, Netns};

pub struct Frr {
    proc: Option<Proc>,
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
        let dir = std::env::temp_dir().join(unique_name("frr"));
        std::fs::create_dir_all(&dir)?;
        let mut conf = format!(
            "frr defaults datacenter\nhostname upstream\nrouter bgp {asn}\n bgp router-id {router_id}\n \
             no bgp ebgp-requires-policy\n bgp graceful-restart\n"
        );
        for (addr, peer_asn) in neighbors {
            conf += &format!(" neighbor {addr} remote-as {peer_asn}\n neighbor {addr} timers 3 9\n neighbor {addr} timers connect 1\n");
        }
        conf += " address-family ipv6 unicast\n";
        for (addr, _) in neighbors {
            conf += &format!("  neighbor {addr} activate\n");
        }
        conf += " exit-address-family\n";
        std::fs::write(dir.join("bgpd.conf"), conf)?;
        crate::run(&["chown", "-R", "frr:frr", &dir.to_string_lossy()])
            .context("chown to the frr user (is frr installed?)")?;
        let proc = spawn_bgpd(ns, &dir.to_string_lossy())?;
        let frr = Self {
            proc: Some(proc),
            dir,
            ns: ns.name().to_owned(),
        };
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

impl Drop for Frr {
    fn drop(&mut self) {
        drop(self.proc.take());
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Starts FRR's bgpd in `ns` with `dir/bgpd.conf`, its pid file and vty
/// socket in `dir` (owned by the frr user), no zebra, no listener of its own
/// beyond the configured neighbors (`-P 0`: no vty port).
pub fn spawn_bgpd(ns: &Netns, dir: &str) -> Result<Proc> {
    let conf = format!("{dir}/bgpd.conf");
    let pid = format!("{dir}/bgpd.pid");
    ns.spawn(&[
        "/usr/lib/frr/bgpd",
        "-f",
        &conf,
        "-Z",
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
    ])
}
