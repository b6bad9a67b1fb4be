//! IPv4 routes by IPv6 next hops (RFC 8950) through our reflector, every
//! session over IPv6: a BIRD, a GoBGP and an FRR client each announce an
//! IPv4 and an IPv6 prefix by their own IPv6 address, and each of them
//! gets the other two's IPv4 prefixes with exactly that address as next
//! hop. A fourth client, FRR without `capability extended-nexthop`, has
//! no way to take such routes: our reflector withholds them (it still gets
//! the IPv6 ones), rather than sending something it would misread.
//!
//! What each kind does with RFC 8950 on an IPv6 session:
//! - FRR 8.4 offers it only with `neighbor X capability extended-nexthop`
//!   (on its own only to unnumbered, link-local neighbours), and then
//!   announces its IPv4 routes by its global IPv6 address (with its
//!   link-local one beside it).
//! - BIRD 2.0.12 offers it with `extended next hop on` in the ipv4
//!   channel; once it is negotiated, the session's IPv6 source address is
//!   acceptable as the channel's next hop address, so no `next hop self`
//!   or `next hop address` is needed for BIRD's own routes.
//! - GoBGP 3.10 offers it for every configured family but IPv6 unicast,
//!   on every session, with no setting; a route added with `gobgp global
//!   rib add` (unspecified next hop) goes to an iBGP peer by the
//!   session's local address, which for an IPv4 route over IPv6 means
//!   MP_REACH_NLRI of AFI 1 with an IPv6 next hop.
//! - Ours offers it on every session and sends an IPv4 route by an IPv6
//!   next hop only where the peer offered it too.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::Value;

use crate::lab::{ip6, Kind, Lan, Router, RouterCfg, NO_PEERS};
use crate::{hold, peer_status, wait_until};

const WAIT: Duration = Duration::from_secs(60);

fn v4_prefix(n: u8) -> String {
    format!("10.244.{n}.0/24")
}

fn v6_prefix(n: u8) -> String {
    format!("2001:db8:{n}::/48")
}

/// Node numbers: the reflector, the clients that negotiate extended next
/// hop, and the FRR client that does not.
const RR: u8 = 1;
const CLIENTS: [(Kind, &str, u8); 3] = [
    (Kind::Bird, "bird", 11),
    (Kind::Gobgp, "gobgp", 12),
    (Kind::Frr, "frr", 13),
];
const PLAIN: u8 = 14;

/// What `r` lacks of what it should hold: each of `want`'s prefixes with
/// exactly its one next hop. Empty when it has it all.
fn missing(r: &Router, want: &BTreeMap<String, IpAddr>) -> Result<Vec<String>> {
    let have = r.next_hops()?;
    Ok(want
        .iter()
        .filter(|(p, nh)| have.get(*p) != Some(&BTreeSet::from([**nh])))
        .map(|(p, nh)| format!("{p} via {nh} (has {:?})", have.get(p)))
        .collect())
}

/// Whether FRR's session with `peer` negotiated the extended next hop
/// capability: (advertised, received) as `show bgp neighbors` reports.
fn frr_ext_next_hop(frr: &Router, peer: IpAddr) -> Result<(bool, bool)> {
    let v: Value = serde_json::from_str(&frr.vtysh(&format!("show bgp neighbors {peer} json"))?)?;
    let caps = &v[peer.to_string()]["neighborCapabilities"];
    let enh = caps
        .get("extendedNexthop")
        .with_context(|| format!("no extendedNexthop in {caps}"))?;
    let s = enh.as_str().unwrap_or("");
    Ok((
        s.contains("advertised"),
        s.contains("received") || s.contains("Received"),
    ))
}

pub(crate) fn ipv4_by_ipv6_next_hops() -> Result<()> {
    let mut lan = Lan::new()?;
    let rr = ip6(RR);
    let mut clients_of_rr: Vec<IpAddr> = CLIENTS.iter().map(|c| ip6(c.2).into()).collect();
    clients_of_rr.push(ip6(PLAIN).into());
    let ours = lan.reflector("rr", rr, &clients_of_rr, &NO_PEERS, vec![])?;
    let mut clients = Vec::new();
    for (kind, label, n) in CLIENTS {
        let announce = vec![v4_prefix(n), v6_prefix(n)];
        clients.push((n, lan.peer(kind, label, ip6(n), &[rr], announce)?));
    }
    let mut plain_cfg = RouterCfg::peer_of(ip6(PLAIN), &[rr], vec![v6_prefix(PLAIN)]);
    plain_cfg.neighbors[0].ext_next_hop = false;
    let plain = Router::start(Kind::Frr, lan.node("plain", ip6(PLAIN))?, plain_cfg)?;

    let all: BTreeSet<IpAddr> = clients_of_rr.iter().copied().collect();
    wait_until("every session up at our reflector", WAIT, || {
        Ok(ours.established()? == all)
    })?;

    // Every announcement at the reflector, by its announcer's address.
    let mut announced = BTreeMap::new();
    for (_, _, n) in CLIENTS {
        announced.insert(v4_prefix(n), IpAddr::from(ip6(n)));
        announced.insert(v6_prefix(n), IpAddr::from(ip6(n)));
    }
    announced.insert(v6_prefix(PLAIN), IpAddr::from(ip6(PLAIN)));
    let mut last = Vec::new();
    wait_until("every announcement at our reflector", WAIT, || {
        last = missing(&ours, &announced)?;
        Ok(last.is_empty())
    })
    .with_context(|| format!("missing at our reflector: {last:?}"))?;

    // Each client: the others' prefixes of both families, by the
    // announcer's IPv6 address.
    for (n, r) in &clients {
        let want: BTreeMap<String, IpAddr> = announced
            .iter()
            .filter(|(_, nh)| **nh != IpAddr::from(ip6(*n)))
            .map(|(p, nh)| (p.clone(), *nh))
            .collect();
        let mut last = Vec::new();
        wait_until(
            &format!("the others' routes at {:?}", r.cfg.me),
            WAIT,
            || {
                last = missing(r, &want)?;
                Ok(last.is_empty())
            },
        )
        .with_context(|| format!("missing at {}: {last:?}", r.cfg.me))?;
    }

    // The FRR client without the capability: the IPv6 routes, no IPv4
    // one. FRR's own report says the capability was not agreed; the one
    // that has it agreed it both ways.
    let frr = &clients.iter().find(|(n, _)| *n == 13).context("frr")?.1;
    let (adv, recv) = frr_ext_next_hop(frr, rr.into())?;
    hold(adv && recv, || {
        format!("FRR with the capability: advertised {adv}, received {recv}")
    })?;
    let (adv, _) = frr_ext_next_hop(&plain, rr.into())?;
    hold(!adv, || "FRR without the capability advertised it".into())?;
    let v6_only: BTreeMap<String, IpAddr> = CLIENTS
        .iter()
        .map(|c| (v6_prefix(c.2), IpAddr::from(ip6(c.2))))
        .collect();
    let mut last = Vec::new();
    wait_until(
        "the IPv6 routes at FRR without extended next hop",
        WAIT,
        || {
            last = missing(&plain, &v6_only)?;
            Ok(last.is_empty())
        },
    )
    .with_context(|| format!("missing: {last:?}"))?;
    // Our reflector's Adj-RIB-Out toward it holds just those three, while
    // it holds all seven and sends the FRR client with the capability
    // everything but its own two.
    let doc = ours.ours_doc()?;
    let to_plain = &peer_status(&doc, ip6(PLAIN))?["advertised"];
    hold(*to_plain == v6_only.len(), || {
        format!("advertised to FRR without extended next hop: {to_plain}")
    })?;
    let to_frr = &peer_status(&doc, ip6(13))?["advertised"];
    hold(*to_frr == announced.len() - 2, || {
        format!("advertised to FRR with extended next hop: {to_frr}")
    })?;
    // And FRR has had our End-of-RIB for IPv4 unicast: the table it got
    // is the whole of what it is sent.
    wait_until(
        "End-of-RIB for IPv4 at FRR without extended next hop",
        WAIT,
        || {
            let text = plain.vtysh(&format!("show bgp neighbors {rr} json"))?;
            let v: Value = serde_json::from_str(&text)?;
            Ok(v[rr.to_string()]["gracefulRestartInfo"]["endOfRibRecv"]["ipv4Unicast"] == true)
        },
    )?;
    let held = plain.next_hops()?;
    let v4: Vec<&String> = held.keys().filter(|p| !p.contains(':')).collect();
    hold(v4.is_empty(), || {
        format!("IPv4 routes at FRR without extended next hop: {held:?}")
    })?;
    Ok(())
}
