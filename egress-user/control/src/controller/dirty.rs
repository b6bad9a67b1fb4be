//! What changed in a cached view since the controller's last pass, so the
//! next pass redoes only the work those changes reach: the workers of the
//! nodes whose pods changed, and the port blocks of the addresses whose
//! grants or reports changed at some node. Anything else redoes the whole
//! pass. Recorded by the view cache as it applies each change.

use std::collections::BTreeSet;

use crate::api::EgressTunnel;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Dirty {
    /// Something other than pods, grants and agents' reports changed.
    pub global: bool,
    /// Nodes whose pods changed (a moved pod's old node and new one).
    pub pod_nodes: BTreeSet<String>,
    /// (gateway, address) of every grant or report that changed at some
    /// node: its old entry or its new one.
    pub addresses: BTreeSet<(String, String)>,
}

impl Dirty {
    /// Everything changed (a fresh list).
    pub fn everything() -> Self {
        Self {
            global: true,
            ..Self::default()
        }
    }

    /// Marks the addresses `t` holds blocks of or reports use of.
    pub fn tunnel_entries(&mut self, t: &EgressTunnel) {
        let Some(s) = &t.status else { return };
        let blocks = s.port_blocks.iter().map(|b| (&b.gateway, &b.eip));
        let reports = s.port_use.iter().map(|u| (&u.gateway, &u.eip));
        for (gw, eip) in blocks.chain(reports) {
            self.addresses.insert((gw.clone(), eip.clone()));
        }
    }

    /// The marked addresses of gateway `gw`.
    pub fn addresses_of<'a>(&'a self, gw: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.addresses
            .iter()
            .filter(move |(g, _)| g == gw)
            .map(|(_, a)| a.as_str())
    }
}
