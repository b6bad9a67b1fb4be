//! ADD-PATH (RFC 7911) toward FRR: two of our clients announce the same
//! EIP /32 with themselves as next hop and equal LOCAL_PREF; our reflector
//! sends both paths to an FRR upstream (bgpd with zebra, `maximum-paths
//! ibgp 8`), which installs an ECMP route in its namespace's kernel. When a
//! path leaves the multipath set (withdrawn, or beaten on LOCAL_PREF) the
//! upstream loses exactly that next hop.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::time::Duration;

use anyhow::Result;
use egress_tests::Netns;
use serde_json::Value;

use crate::lab::{ip, Kind, Lan, Router, RouterCfg};
use crate::{wait_until, ASN};

const EIP: &str = "10.200.0.10/32";
const WAIT: Duration = Duration::from_secs(30);

/// bgpd's paths of the EIP: (next hop, addpathRxId), all multipath, JSON.
type BgpView = (BTreeSet<(String, u64)>, bool, String);

/// FRR's zebra and bgpd in one namespace, so that bgpd's multipath route
/// reaches the kernel (the harness's forwarding upstream router).
struct FrrWithZebra {
    // Field order is drop order: FRR before its namespace.
    frr: egress_tests::frr::Frr,
    ns: Netns,
}

impl FrrWithZebra {
    fn start(ns: Netns, me: Ipv4Addr, reflector: Ipv4Addr) -> Result<Self> {
        let frr = egress_tests::frr::Frr::start_forwarding(&ns, me, ASN, &[(reflector, ASN)])?;
        Ok(Self { frr, ns })
    }

    /// The EIP's paths in bgpd: (next hop, addpathRxId), whether bgpd
    /// has selected them all as multipath, and the raw JSON.
    fn bgp_paths(&self) -> Result<BgpView> {
        let text = self
            .frr
            .vtysh(&format!("show bgp ipv4 unicast {EIP} json"))?;
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
            let hops = egress_tests::frr::kernel_next_hops(&self.ns, EIP)?;
            if hops == want {
                eprintln!("{what}: kernel next hops {hops:?}");
            }
            Ok(hops == want)
        })
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
