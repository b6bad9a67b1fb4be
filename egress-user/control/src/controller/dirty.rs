//! What changed in a cached view since the controller's last pass, so the
//! next pass redoes only the work those changes reach: the workers of the
//! nodes whose pods changed, and the port blocks of the addresses whose
//! grants or reports changed at some node. Anything else redoes the whole
//! pass. Recorded by the view cache as it applies each change.

use std::collections::{BTreeSet, HashMap};

use crate::api::{EgressTunnel, EipEpoch, EipPortBlocks, EipPortUse, PolicyOverCapacity};

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Dirty {
    /// Something other than pods, grants and agents' reports changed.
    pub global: bool,
    /// Nodes whose pods changed (a moved pod's old node and new one).
    pub pod_nodes: BTreeSet<String>,
    /// (gateway, address) of every grant or report that changed at some
    /// node: its old entry or its new one.
    pub addresses: BTreeSet<(String, String)>,
    /// Nodes whose grants in the view changed (a write of this controller
    /// put into the view, or another writer's): their grants are compared
    /// with the plan's again, beside those the pass itself changes.
    pub grant_nodes: BTreeSet<String>,
}

impl Dirty {
    /// Everything changed (a fresh list).
    pub fn everything() -> Self {
        Self {
            global: true,
            ..Self::default()
        }
    }

    /// Marks what differs between two versions of a node's tunnel: the
    /// addresses whose grant or report differs, and the whole pass when
    /// what the node reports makes statuses (see [`structural_reports`]).
    pub fn tunnel_change(&mut self, old: &EgressTunnel, new: &EgressTunnel) {
        self.global |= structural_reports(old) != structural_reports(new);
        if grants(old) != grants(new) {
            let node = new.metadata.name.as_deref().unwrap_or_default();
            self.grant_nodes.insert(node.to_string());
        }
        let (a, b) = (entries(old), entries(new));
        for (key, entry) in &a {
            if b.get(key) != Some(entry) {
                self.addresses
                    .insert((key.0.to_string(), key.1.to_string()));
            }
        }
        for key in b.keys().filter(|k| !a.contains_key(*k)) {
            self.addresses
                .insert((key.0.to_string(), key.1.to_string()));
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

/// What an agent reports that the controller's statuses are made of: a
/// node asking for a newer epoch moves the structure; one reporting a
/// policy over its datapath's capacity changes that policy's status.
fn structural_reports(t: &EgressTunnel) -> Option<(&Vec<EipEpoch>, &Vec<PolicyOverCapacity>)> {
    t.status
        .as_ref()
        .map(|s| (&s.awaiting_reconfirmation, &s.over_capacity))
}

/// A node's grants as its status holds them.
fn grants(t: &EgressTunnel) -> (u16, &[EipPortBlocks]) {
    t.status
        .as_ref()
        .map_or((0, &[][..]), |s| (s.port_block_size, &s.port_blocks[..]))
}

/// A node's grants and reports of one address (one each, unless the
/// status repeats an address).
type Entry<'a> = (Vec<&'a EipPortBlocks>, Vec<&'a EipPortUse>);

/// (gateway, address) -> the node's grants and reports of it.
fn entries(t: &EgressTunnel) -> HashMap<(&str, &str), Entry<'_>> {
    let mut out: HashMap<(&str, &str), Entry<'_>> = HashMap::new();
    let Some(s) = &t.status else { return out };
    for b in &s.port_blocks {
        let key = (b.gateway.as_str(), b.eip.as_str());
        out.entry(key).or_default().0.push(b);
    }
    for u in &s.port_use {
        let key = (u.gateway.as_str(), u.eip.as_str());
        out.entry(key).or_default().1.push(u);
    }
    out
}
