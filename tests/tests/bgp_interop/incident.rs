use std::net::Ipv4Addr;
use std::time::Duration;

use anyhow::Result;

use crate::lab::{ip, Kind, Lan};
use crate::{client_prefix, count_present, hold, peer_status, wait_until};

/// The incident: two of our reflectors share one cluster id, `n` clients
/// of kind `clients`, FRR upstream. Each reflector alone sends every
/// client prefix upstream; then one reflector is killed with SIGKILL and
/// started again while FRR is polled every 50 ms: the number of client
/// prefixes at FRR never drops.
pub(crate) fn incident(clients: Kind, n: u8) -> Result<()> {
    let mut lan = Lan::new()?;
    let rrs = [ip(1), ip(2)];
    let up = ip(254);
    let client_ips: Vec<Ipv4Addr> = (0..n).map(|i| ip(11 + i)).collect();
    let prefixes: Vec<String> = (0..n).map(|i| client_prefix(11 + i)).collect();
    let frr = lan.peer(Kind::Frr, "up", up, &rrs, vec![])?;
    let mut reflectors = Vec::new();
    for (i, me) in rrs.iter().enumerate() {
        reflectors.push(lan.reflector("rr", *me, &client_ips, &[up, rrs[1 - i]], vec![])?);
    }
    let mut cs = Vec::new();
    for (i, a) in client_ips.iter().enumerate() {
        cs.push(lan.peer(clients, "c", *a, &rrs, vec![prefixes[i].clone()])?);
    }
    // Each reflector alone sends all client prefixes upstream.
    wait_until(
        "every prefix from both reflectors at FRR",
        Duration::from_secs(60),
        || {
            let routes = frr.routes()?;
            Ok(prefixes.iter().all(|p| {
                routes
                    .get(p)
                    .is_some_and(|from| rrs.iter().all(|r| from.contains(&(*r).into())))
            }))
        },
    )?;
    // And by its own count (the status file lags by up to 50 ms).
    for rr in &reflectors {
        wait_until("reflector's own count", Duration::from_secs(5), || {
            Ok(peer_status(&rr.ours_doc()?, up)?["advertised"] == n as u64)
        })?;
    }

    // Kill one reflector and start it again; FRR must never lose a prefix.
    let victim = &mut reflectors[0];
    victim.kill9();
    let min_seen = std::cell::Cell::new(usize::MAX);
    let poll = || -> Result<usize> {
        let c = count_present(&frr, &prefixes)?;
        min_seen.set(min_seen.get().min(c));
        hold(c == prefixes.len(), || {
            format!("FRR dropped to {c} of {} client prefixes", prefixes.len())
        })?;
        Ok(c)
    };
    wait_until(
        "FRR to notice the reflector is gone",
        Duration::from_secs(20),
        || {
            poll()?;
            Ok(!frr.established()?.contains(&rrs[0].into()))
        },
    )?;
    victim.spawn()?;
    wait_until(
        "restarted reflector to send its table again",
        Duration::from_secs(60),
        || {
            poll()?;
            let routes = frr.routes()?;
            Ok(frr.established()?.contains(&rrs[0].into())
                && prefixes.iter().all(|p| {
                    routes
                        .get(p)
                        .is_some_and(|from| from.contains(&rrs[0].into()))
                }))
        },
    )?;
    assert_eq!(min_seen.get(), prefixes.len());
    Ok(())
}
