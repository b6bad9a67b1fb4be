use std::time::Duration;

use anyhow::Result;

use crate::lab::{ip, Kind, Lan, NO_PEERS};
use crate::{client_prefix, wait_until};

/// `kind` as a client of our reflector next to one of our clients: each
/// gets the other's route.
pub(crate) fn client_of_our_reflector(kind: Kind) -> Result<()> {
    let mut lan = Lan::new()?;
    let rr = ip(1);
    let _rr = lan.reflector("rr", rr, &[ip(11), ip(12)], &NO_PEERS, vec![])?;
    let theirs = lan.peer(kind, "peer", ip(11), &[rr], vec![client_prefix(11)])?;
    let ours = lan.peer(Kind::Ours, "c", ip(12), &[rr], vec![client_prefix(12)])?;
    wait_until(
        "our client's route at theirs",
        Duration::from_secs(30),
        || Ok(theirs.routes()?.contains_key(&client_prefix(12))),
    )?;
    wait_until("their route at our client", Duration::from_secs(30), || {
        Ok(ours.routes()?.contains_key(&client_prefix(11)))
    })?;
    Ok(())
}
