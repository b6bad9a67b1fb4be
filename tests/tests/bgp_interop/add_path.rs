//! ADD-PATH (RFC 7911) toward FRR: two of our clients announce the same
//! EIP /32 with themselves as next hop and equal LOCAL_PREF; our reflector
//! sends both paths to an FRR upstream (bgpd with zebra, `maximum-paths
//! ibgp 8`), which installs an ECMP route in its namespace's kernel. When a
//! path leaves the multipath set (withdrawn, or beaten on LOCAL_PREF) the
//! upstream loses exactly that next hop.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::time::Duration;

use anyhow::{Context, Result};
use egress_tests::{run, Netns, Proc};
use serde_json::Value;

use crate::lab::{ip, Dir, Kind, Lan, Router, RouterCfg};
use crate::{wait_until, ASN};

const EIP: &str = "10.200.0.10/32";
const WAIT: Duration = Duration::from_secs(30);

/// bgpd's paths of the EIP: (next hop, addpathRxId), all multipath, JSON.
type BgpView = (BTreeSet<(String, u64)>, bool, String);

/// FRR's zebra and bgpd in one namespace, so that bgpd's multipath route
/// reaches the kernel. Dropped in reverse order: bgpd, then zebra.
struct FrrWithZebra {
    bgpd: Option<Proc>,
    zebra: Option<Proc>,
    ns: Netns,
    dir: Dir,
}

impl FrrWithZebra {
    fn start(ns: Netns, me: Ipv4Addr, reflector: Ipv4Addr) -> Result<Self> {
        let dir = Dir::new("frrz")?;
        let conf = format!(
            "frr defaults datacenter\nhostname up\nrouter bgp {ASN}\n bgp router-id {me}\n \
             no bgp ebgp-requires-policy\n neighbor {reflector} remote-as {ASN}\n \
             neighbor {reflector} timers 3 9\n neighbor {reflector} timers connect 1\n \
             address-family ipv4 unicast\n  maximum-paths ibgp 8\n exit-address-family\n"
        );
        std::fs::write(dir.file("bgpd.conf"), conf)?;
        std::fs::write(dir.file("zebra.conf"), "hostname up\n")?;
        run(&["chown", "-R", "frr:frr", dir.path()]).context("chown (is frr installed?)")?;
        let d = dir.path().to_string();
        let zserv = format!("{d}/zserv.api");
        // In the foreground (no -d), so the Proc guard owns it.
        let zebra = ns.spawn(&[
            "/usr/lib/frr/zebra",
            "-f",
            &format!("{d}/zebra.conf"),
            "-i",
            &format!("{d}/zebra.pid"),
            "-z",
            &zserv,
            "--vty_socket",
            &d,
            "-u",
            "frr",
            "-g",
            "frr",
            "-P",
            "0",
        ])?;
        let mut me = FrrWithZebra {
            bgpd: None,
            zebra: Some(zebra),
            ns,
            dir,
        };
        wait_until("zebra's zserv socket", WAIT, || {
            Ok(std::path::Path::new(&zserv).exists())
        })?;
        me.bgpd = Some(me.ns.spawn(&[
            "/usr/lib/frr/bgpd",
            "-f",
            &format!("{d}/bgpd.conf"),
            "-z",
            &zserv,
            "-i",
            &format!("{d}/bgpd.pid"),
            "--vty_socket",
            &d,
            "-u",
            "frr",
            "-g",
            "frr",
            "-P",
            "0",
        ])?);
        wait_until("bgpd answers vtysh", WAIT, || {
            Ok(me.vtysh("show bgp summary json").is_ok())
        })?;
        Ok(me)
    }

    fn vtysh(&self, cmd: &str) -> Result<String> {
        self.ns
            .exec(&["vtysh", "--vty_socket", self.dir.path(), "-c", cmd])
    }

    /// The EIP's paths in bgpd: (next hop, addpathRxId), whether bgpd
    /// has selected them all as multipath, and the raw JSON.
    fn bgp_paths(&self) -> Result<BgpView> {
        let text = self.vtysh(&format!("show bgp ipv4 unicast {EIP} json"))?;
        let v: Value = serde_json::from_str(&text)?;
        let mut out = BTreeSet::new();
        let paths = v["paths"].as_array().cloned().unwrap_or_default();
        for p in &paths {
            let nh = p["nexthops"][0]["ip"].as_str().unwrap_or("?").to_string();
            out.insert((nh, p["addpathRxId"].as_u64().unwrap_or(0)));
        }
        let all_multipath = paths.iter().all(|p| p["multipath"] == true);
        Ok((out, all_multipath, text))
    }

    /// The EIP's next hops in the namespace's kernel table, and the raw
    /// `ip` output.
    fn kernel_next_hops(&self) -> Result<(BTreeSet<String>, String)> {
        let text = self.ns.exec(&["ip", "-j", "route", "show", EIP])?;
        let v: Value = serde_json::from_str(text.trim())?;
        let mut out = BTreeSet::new();
        for r in v.as_array().into_iter().flatten() {
            if let Some(nhs) = r["nexthops"].as_array() {
                out.extend(
                    nhs.iter()
                        .filter_map(|n| n["gateway"].as_str())
                        .map(String::from),
                );
            } else if let Some(g) = r["gateway"].as_str() {
                out.insert(g.to_string());
            } else if let Some(id) = r["nhid"].as_u64() {
                out.extend(self.group_gateways(id)?);
            }
        }
        Ok((out, text))
    }

    /// Gateways of a kernel nexthop object (a group's members, or itself).
    fn group_gateways(&self, id: u64) -> Result<Vec<String>> {
        let show = |id: u64| -> Result<Value> {
            let t = self
                .ns
                .exec(&["ip", "-j", "nexthop", "show", "id", &id.to_string()])?;
            let v: Value = serde_json::from_str(t.trim())?;
            Ok(v.as_array().and_then(|a| a.first()).cloned().unwrap_or(v))
        };
        let nh = show(id)?;
        let mut out = Vec::new();
        match nh["group"].as_array() {
            Some(members) => {
                for m in members {
                    let g = show(m["id"].as_u64().context("member id")?)?;
                    out.extend(g["gateway"].as_str().map(String::from));
                }
            }
            None => out.extend(nh["gateway"].as_str().map(String::from)),
        }
        Ok(out)
    }

    /// Waits until bgpd holds exactly the paths via `want` (with distinct
    /// path ids) and the kernel route has exactly those next hops.
    fn wait_for(&self, want: &[Ipv4Addr], what: &str) -> Result<()> {
        let want: BTreeSet<String> = want.iter().map(|a| a.to_string()).collect();
        wait_until(&format!("{what}: bgpd paths via {want:?}"), WAIT, || {
            let (paths, multipath, text) = self.bgp_paths()?;
            let hops: BTreeSet<String> = paths.iter().map(|(nh, _)| nh.clone()).collect();
            let ids: BTreeSet<u64> = paths.iter().map(|(_, id)| *id).collect();
            let ok = hops == want
                && ids.len() == paths.len()
                && paths.len() == want.len()
                && (want.len() == 1 || multipath);
            if ok {
                eprintln!("{what}: bgpd: {text}");
            }
            Ok(ok)
        })?;
        wait_until(&format!("{what}: kernel next hops {want:?}"), WAIT, || {
            let (hops, text) = self.kernel_next_hops()?;
            if hops == want {
                eprintln!("{what}: kernel: {}", text.trim());
            }
            Ok(hops == want)
        })
    }
}

impl Drop for FrrWithZebra {
    fn drop(&mut self) {
        drop(self.bgpd.take());
        drop(self.zebra.take());
    }
}

pub(crate) fn ecmp_at_frr_through_add_path() -> Result<()> {
    let mut lan = Lan::new()?;
    let rr = ip(1);
    let up = ip(254);
    let (a, b) = (ip(11), ip(12));
    let upstream = FrrWithZebra::start(lan.node("up", up)?, up, rr)?;
    let mut rr_cfg = RouterCfg::reflector(rr, &[a, b], &[up], vec![]);
    for n in rr_cfg.neighbors.iter_mut().filter(|n| !n.client) {
        n.add_path = true;
    }
    let _rr = Router::start(Kind::Ours, lan.node("rr", rr)?, rr_cfg)?;
    let ca = lan.peer(Kind::Ours, "c", a, &[rr], vec![EIP.into()])?;
    let _cb = lan.peer(Kind::Ours, "c", b, &[rr], vec![EIP.into()])?;

    upstream.wait_for(&[a, b], "both gateways announce")?;

    ca.ours_command(&format!("withdraw {EIP}\n"))?;
    upstream.wait_for(&[b], "the first gateway withdrew")?;

    // Back with a higher LOCAL_PREF: the other path now loses on step a)
    // and leaves the multipath set, so it is withdrawn upstream.
    ca.ours_command(&format!("announce {EIP} {a} 200\n"))?;
    upstream.wait_for(&[a], "the first gateway returned with LOCAL_PREF 200")?;
    Ok(())
}
