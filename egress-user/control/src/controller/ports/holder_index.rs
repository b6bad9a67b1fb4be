//! Where each node's entries (grants and reports) of each address of each
//! gateway are in its EgressTunnel status, kept by the controller's view
//! cache as tunnels change. A partial pass reaches about fifty addresses
//! with some fifty holders each; finding their entries by reading every
//! node's hundred entries was a sixth of the controller's CPU per change
//! at a thousand nodes. Each position is into the status the view holds
//! now: the cache moves the index with every change of a tunnel.

use std::collections::{BTreeMap, HashMap};

use crate::api::EgressTunnel;
use crate::view::ClusterView;

/// A node's entries of one address: positions in its status's
/// `portUse` and `portBlocks`, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Entries {
    pub uses: Vec<usize>,
    pub blocks: Vec<usize>,
}

/// gateway -> address -> node -> its entries.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HolderIndex {
    by_gateway: HashMap<String, HashMap<String, BTreeMap<String, Entries>>>,
}

impl HolderIndex {
    /// The index of every tunnel of `view`.
    pub fn of(view: &ClusterView) -> Self {
        let mut ix = Self::default();
        for t in &view.tunnels {
            ix.add(t);
        }
        ix
    }

    /// Records `t`'s entries.
    pub fn add(&mut self, t: &EgressTunnel) {
        let (Some(node), Some(st)) = (t.metadata.name.as_deref(), t.status.as_ref()) else {
            return;
        };
        for (i, u) in st.port_use.iter().enumerate() {
            self.entries_mut(&u.gateway, &u.eip, node).uses.push(i);
        }
        for (i, b) in st.port_blocks.iter().enumerate() {
            self.entries_mut(&b.gateway, &b.eip, node).blocks.push(i);
        }
    }

    /// Forgets `t`'s entries (the tunnel as it was before a change).
    pub fn remove(&mut self, t: &EgressTunnel) {
        let (Some(node), Some(st)) = (t.metadata.name.as_deref(), t.status.as_ref()) else {
            return;
        };
        let uses = st.port_use.iter().map(|u| (&u.gateway, &u.eip));
        let blocks = st.port_blocks.iter().map(|b| (&b.gateway, &b.eip));
        for (gw, eip) in uses.chain(blocks) {
            let Some(addrs) = self.by_gateway.get_mut(gw.as_str()) else {
                continue;
            };
            if let Some(nodes) = addrs.get_mut(eip.as_str()) {
                nodes.remove(node);
                if nodes.is_empty() {
                    addrs.remove(eip.as_str());
                }
            }
            if addrs.is_empty() {
                self.by_gateway.remove(gw.as_str());
            }
        }
    }

    /// The nodes with entries of `addr` of gateway `gw`, and where they are.
    pub fn holders_of<'a>(
        &'a self,
        gw: &str,
        addr: &str,
    ) -> impl Iterator<Item = (&'a str, &'a Entries)> + 'a {
        self.by_gateway
            .get(gw)
            .and_then(|a| a.get(addr))
            .into_iter()
            .flatten()
            .map(|(n, e)| (n.as_str(), e))
    }

    fn entries_mut(&mut self, gw: &str, eip: &str, node: &str) -> &mut Entries {
        // No allocation for names already there (most of them, on a change).
        if !self.by_gateway.contains_key(gw) {
            self.by_gateway.insert(gw.to_string(), HashMap::new());
        }
        let addrs = self.by_gateway.get_mut(gw).expect("inserted above");
        if !addrs.contains_key(eip) {
            addrs.insert(eip.to_string(), BTreeMap::new());
        }
        let nodes = addrs.get_mut(eip).expect("inserted above");
        if !nodes.contains_key(node) {
            nodes.insert(node.to_string(), Entries::default());
        }
        nodes.get_mut(node).expect("inserted above")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{EgressTunnelStatus, EipPortBlocks, EipPortUse};

    fn tunnel(node: &str, blocks: &[&str], uses: &[&str]) -> EgressTunnel {
        let mut t = EgressTunnel::new(node, Default::default());
        t.status = Some(EgressTunnelStatus {
            port_blocks: blocks
                .iter()
                .map(|e| EipPortBlocks {
                    gateway: "g".into(),
                    eip: e.to_string(),
                    blocks: vec![1],
                    ..Default::default()
                })
                .collect(),
            port_use: uses
                .iter()
                .map(|e| EipPortUse {
                    gateway: "g".into(),
                    eip: e.to_string(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        });
        t
    }

    fn holders(ix: &HolderIndex, addr: &str) -> Vec<(String, Vec<usize>, Vec<usize>)> {
        ix.holders_of("g", addr)
            .map(|(n, e)| (n.to_string(), e.uses.clone(), e.blocks.clone()))
            .collect()
    }

    #[test]
    fn entries_are_indexed_where_they_are_and_a_change_moves_them() {
        let mut view = ClusterView {
            tunnels: vec![tunnel("w1", &["a", "b"], &["b"]), tunnel("w2", &["a"], &[])],
            ..Default::default()
        };
        let mut ix = HolderIndex::of(&view);
        let s = String::from;
        assert_eq!(
            holders(&ix, "a"),
            [(s("w1"), vec![], vec![0]), (s("w2"), vec![], vec![0])]
        );
        assert_eq!(holders(&ix, "b"), [(s("w1"), vec![0], vec![1])]);
        assert!(holders(&ix, "c").is_empty());
        // w1 gives a up and reports c instead: b's block moves to 0.
        let (old, new) = (view.tunnels[0].clone(), tunnel("w1", &["b"], &["b", "c"]));
        ix.remove(&old);
        ix.add(&new);
        assert_eq!(holders(&ix, "a"), [(s("w2"), vec![], vec![0])]);
        assert_eq!(holders(&ix, "b"), [(s("w1"), vec![0], vec![0])]);
        assert_eq!(holders(&ix, "c"), [(s("w1"), vec![1], vec![])]);
        view.tunnels[0] = new;
        assert_eq!(ix, HolderIndex::of(&view), "as if built again");
        ix.remove(&view.tunnels[1]);
        ix.remove(&view.tunnels[0]);
        assert_eq!(ix, HolderIndex::default(), "nothing left behind");
    }
}
