use std::time::{Duration, Instant};

use anyhow::Result;

use crate::lab::{ip, Kind, Lan, NO_PEERS};
use crate::{client_prefix, count_present, hold, peer_status, wait_until};

/// Graceful restart both ways between our speaker and `kind`:
/// 1. ours is killed and restarted while `kind` keeps its route: polled
///    every 50 ms, the route never leaves `kind`'s table;
/// 2. `kind` is killed and restarted while our reflector keeps its route
///    and goes on reflecting it: our observer client never loses it.
pub(crate) fn graceful_restart_both_ways(kind: Kind) -> Result<()> {
    let mut lan = Lan::new()?;
    let rr = ip(1);
    let mut ours = lan.reflector(
        "rr",
        rr,
        &[ip(11), ip(12)],
        &NO_PEERS,
        vec!["192.0.2.1/32".into()],
    )?;
    let mut theirs = lan.peer(kind, "peer", ip(11), &[rr], vec![client_prefix(11)])?;
    let observer = lan.peer(Kind::Ours, "obs", ip(12), &[rr], vec![])?;
    let ours_route = vec!["192.0.2.1/32".to_string()];
    let their_route = vec![client_prefix(11)];
    let observer_has_theirs =
        || -> Result<bool> { Ok(count_present(&observer, &their_route)? == 1) };
    wait_until("our route at theirs", Duration::from_secs(30), || {
        Ok(count_present(&theirs, &ours_route)? == 1)
    })?;
    wait_until(
        "their route at the observer",
        Duration::from_secs(30),
        observer_has_theirs,
    )?;

    // 1. We restart; they help.
    ours.kill9();
    let restart_at = Instant::now();
    wait_until("them to notice our crash", Duration::from_secs(20), || {
        hold(count_present(&theirs, &ours_route)? == 1, || {
            format!("{kind:?} dropped our route")
        })?;
        Ok(!theirs.established()?.contains(&rr.into()))
    })?;
    ours.spawn()?;
    wait_until(
        "session back after our restart",
        Duration::from_secs(40),
        || {
            hold(count_present(&theirs, &ours_route)? == 1, || {
                format!(
                    "{kind:?} dropped our route {:?} after our restart",
                    restart_at.elapsed()
                )
            })?;
            Ok(theirs.established()?.contains(&rr.into())
                && ours.established()?.contains(&ip(11).into()))
        },
    )
    .map_err(|e| anyhow::anyhow!("{e:#}"))?;
    // The restart is over once we stopped deferring, hold their route
    // again, and the observer has nothing stale from us.
    wait_until("our restart to complete", Duration::from_secs(40), || {
        hold(count_present(&theirs, &ours_route)? == 1, || {
            format!("{kind:?} dropped our route")
        })?;
        let doc = ours.ours_doc()?;
        let peer = peer_status(&doc, ip(11))?;
        let obs = peer_status(&observer.ours_doc()?, rr)?;
        Ok(doc["status"]["deferring"] == false
            && peer["received"] == 1
            && obs["stale"] == 0
            && obs["state"] == "Established")
    })?;
    // Routes learned from them reach the observer again. (Not checked
    // without a gap: when they claim a restart of their own (R bit, as FRR
    // does shortly after it starts), RFC 4724 says not to wait for their
    // End-of-RIB, so our table can go out before their routes are back.)
    wait_until(
        "their route at the observer again",
        Duration::from_secs(20),
        observer_has_theirs,
    )?;

    // 2. They restart; we help, and keep reflecting their route. GoBGP
    // gets its route from the CLI after it starts, so it sends End-of-RIB
    // before the route exists and the route rightly goes away for a moment:
    // for GoBGP only the return of the route is checked.
    let table_at_start = kind != Kind::Gobgp;
    theirs.kill9();
    wait_until("our side to notice", Duration::from_secs(20), || {
        hold(!table_at_start || observer_has_theirs()?, || {
            "observer lost their route".into()
        })?;
        Ok(!ours.established()?.contains(&ip(11).into()))
    })?;
    theirs.spawn()?;
    wait_until("their session back", Duration::from_secs(40), || {
        hold(!table_at_start || observer_has_theirs()?, || {
            "observer lost their route".into()
        })?;
        Ok(ours.established()?.contains(&ip(11).into()))
    })?;
    // Their table came back: nothing stale is left on our side.
    wait_until("stale routes resolved", Duration::from_secs(20), || {
        hold(!table_at_start || observer_has_theirs()?, || {
            "observer lost their route".into()
        })?;
        let peer = peer_status(&ours.ours_doc()?, ip(11))?;
        Ok(peer["stale"] == 0 && peer["received"] == 1 && observer_has_theirs()?)
    })?;
    Ok(())
}
