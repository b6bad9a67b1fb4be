use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::Result;

use crate::lab::{ip, Kind, Lan, Router, RouterCfg, NO_PEERS};
use crate::{hold, wait_until};

/// TCP-MD5 (RFC 2385): our reflector and `kind` share a key; the session
/// comes up and our route arrives.
pub(crate) fn md5_session(kind: Kind) -> Result<()> {
    let mut lan = Lan::new()?;
    let rr = ip(1);
    let _ours = Router::start_with_password(
        Kind::Ours,
        lan.node("rr", rr)?,
        RouterCfg::reflector(rr, &[ip(11)], &NO_PEERS, vec!["192.0.2.1/32".into()]),
        Some("s3cret"),
    )?;
    let theirs = Router::start_with_password(
        kind,
        lan.node("peer", ip(11))?,
        RouterCfg::peer_of(ip(11), &[rr], vec![]),
        Some("s3cret"),
    )?;
    wait_until(
        "our route over an MD5-signed session",
        Duration::from_secs(30),
        || Ok(theirs.routes()?.contains_key("192.0.2.1/32")),
    )
}

/// TCP-MD5 with the peers a reflector adds at run time (the agents it
/// finds in the datastore), from its default key: an FRR with the key comes
/// up and exchanges routes; an FRR with a wrong key, and one without a
/// key, never reach Established (the kernel drops their segments).
pub(crate) fn md5_for_peers_added_at_run_time() -> Result<()> {
    let mut lan = Lan::new()?;
    let rr = ip(1);
    let peers = [
        (ip(11), Some("s3cret")),
        (ip(12), Some("wrong")),
        (ip(13), None),
    ];
    let ours = Router::start_ours_with_late_peers(
        lan.node("rr", rr)?,
        RouterCfg::reflector(
            rr,
            &peers.iter().map(|(a, _)| *a).collect::<Vec<_>>(),
            &NO_PEERS,
            vec!["192.0.2.1/32".into()],
        ),
        "s3cret",
    )?;
    let mut frrs = Vec::new();
    for (a, pw) in peers {
        frrs.push(Router::start_with_password(
            Kind::Frr,
            lan.node("peer", a)?,
            RouterCfg::peer_of(a, &[rr], vec![format!("198.51.100.{}/32", a.octets()[3])]),
            pw,
        )?);
    }
    wait_until(
        "our route at the FRR with the key",
        Duration::from_secs(30),
        || Ok(frrs[0].routes()?.contains_key("192.0.2.1/32")),
    )?;
    wait_until(
        "its route at our reflector",
        Duration::from_secs(30),
        || Ok(ours.routes()?.contains_key("198.51.100.11/32")),
    )?;
    // Both sides retry every second: give the other two several chances.
    std::thread::sleep(Duration::from_secs(5));
    let up = ours.established()?;
    hold(up == BTreeSet::from([ip(11).into()]), || {
        format!("sessions up at our reflector: {up:?}")
    })?;
    for f in &frrs[1..] {
        let theirs = f.established()?;
        hold(theirs.is_empty(), || {
            format!("{} has a session: {theirs:?}", f.cfg.me)
        })?;
        hold(!f.routes()?.contains_key("192.0.2.1/32"), || {
            format!("{} got our route", f.cfg.me)
        })?;
    }
    Ok(())
}
