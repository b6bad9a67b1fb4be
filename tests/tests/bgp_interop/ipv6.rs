use std::time::Duration;

use anyhow::Result;
use serde_json::Value;

use crate::lab::{ip, Kind, Lan};
use crate::wait_until;

/// IPv6 unicast over an IPv4 session (MP_REACH_NLRI, RFC 4760): a client
/// of ours announces an IPv6 prefix (next hop: the IPv4-mapped form of its
/// address); FRR upstream gets it through our reflector.
pub(crate) fn ipv6_routes_reach_frr() -> Result<()> {
    let mut lan = Lan::new()?;
    let rr = ip(1);
    let up = ip(254);
    let frr = lan.peer(Kind::Frr, "up", up, &[rr], vec![])?;
    let _rr = lan.reflector("rr", rr, &[ip(11)], &[up], vec![])?;
    let _c = lan.peer(
        Kind::Ours,
        "c",
        ip(11),
        &[rr],
        vec!["2001:db8:11::/48".into()],
    )?;
    wait_until("the IPv6 prefix at FRR", Duration::from_secs(30), || {
        let v: Value = serde_json::from_str(&frr.vtysh("show bgp ipv6 unicast json")?)?;
        Ok(v["routes"].get("2001:db8:11::/48").is_some())
    })?;
    let v: Value =
        serde_json::from_str(&frr.vtysh("show bgp ipv6 unicast 2001:db8:11::/48 json")?)?;
    let text = v.to_string();
    // 10.99.0.11 as an IPv4-mapped IPv6 address, as FRR prints it.
    assert!(text.contains("::ffff:a63:b"), "next hop: {text}");
    Ok(())
}
