//! What one reconcile pass decides, as plain data: the statuses to write,
//! the events to record, the failovers and the port facts for metrics.
//! The async loop writes it; nothing here reads or writes a datastore.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::api::{
    EgressGatewayStatus, EgressPolicyStatus, EgressTunnelStatus, EipPortBlocks, TunnelPhase,
};
use crate::datastore::{Event, Kind, ObjectKey};

/// What the controller wants written.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    /// The statuses are shared with the controller's memo of a pass's
    /// structure (a pass that only redoes port blocks copies none of
    /// them); change them through [`Plan::gateways_mut`] and
    /// [`Plan::policies_mut`].
    pub gateways: Arc<BTreeMap<String, EgressGatewayStatus>>,
    pub policies: Arc<BTreeMap<(Kind, ObjectKey), EgressPolicyStatus>>,
    /// Port-block grants per node (the EgressTunnel status fields
    /// `portBlocks`, `portBlockSize`), for every node with an EgressTunnel:
    /// empty grants for a node that holds none. Each node's is shared with
    /// the controller's memo of the last pass (a partial pass copies only
    /// those of the nodes it changes).
    pub tunnels: BTreeMap<String, Arc<TunnelGrants>>,
    /// Nodes without an EgressTunnel: the controller creates one for each
    /// (on Kubernetes the agent may not; on etcd it may have done so first).
    pub new_tunnels: Vec<String>,
    pub events: Vec<Event>,
    /// The failovers this plan makes: EIPs leaving a node that can no
    /// longer hold them (each also has an `EipMoved` event).
    pub moves: Vec<EipMove>,
    /// Port grants per (address, worker), for metrics: one group per
    /// address, shared with the memo (a partial pass carries the groups of
    /// the addresses it does not reach, tens of thousands of facts at a
    /// thousand nodes, without copying them).
    pub ports: Vec<Arc<[PortFact]>>,
    /// Free blocks per address, for metrics.
    pub addresses: Vec<AddressFact>,
    /// In a pass that kept the last pass's grants (a partial one): the
    /// nodes whose grants may differ from the view's, those this pass
    /// changed and those whose grants in the view changed since the last
    /// pass. The others' are as the last pass found them written, and are
    /// not compared again (50,000 grants at a thousand nodes). `None`:
    /// compare every node's.
    pub grants_to_compare: GrantsToCompare,
}

/// [`Plan::grants_to_compare`]: how a plan was made, not what it decides,
/// so two plans that decide the same are equal whatever it holds.
#[derive(Clone, Debug, Default)]
pub struct GrantsToCompare(pub Option<BTreeSet<String>>);

impl PartialEq for GrantsToCompare {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for GrantsToCompare {}

impl Plan {
    /// Every (address, worker) fact.
    pub fn port_facts(&self) -> impl Iterator<Item = &PortFact> {
        self.ports.iter().flat_map(|g| g.iter())
    }

    /// A node's grants, to change them (counted among those to compare).
    pub fn grants_mut(&mut self, node: &str) -> Option<&mut TunnelGrants> {
        let t = self.tunnels.get_mut(node)?;
        if let Some(nodes) = &mut self.grants_to_compare.0 {
            if !nodes.contains(node) {
                nodes.insert(node.to_string());
            }
        }
        Some(Arc::make_mut(t))
    }

    pub fn gateways_mut(&mut self) -> &mut BTreeMap<String, EgressGatewayStatus> {
        Arc::make_mut(&mut self.gateways)
    }

    pub fn policies_mut(&mut self) -> &mut BTreeMap<(Kind, ObjectKey), EgressPolicyStatus> {
        Arc::make_mut(&mut self.policies)
    }
}

/// Why an EIP left its node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FailoverReason {
    /// The node's heartbeat stopped (tunnel `HeartbeatTimeout`).
    HeartbeatTimeout,
    /// The node's datapath probe failed (tunnel `Failed`).
    ProbeFailed,
    /// The node itself is not ready (tunnel `NodeNotReady`).
    NodeNotReady,
    /// The node is gone or no longer selected by the gateway.
    NodeRemoved,
    /// The node's tunnel is not (or no longer) registered (`Pending`, `Init`).
    TunnelNotReady,
}

impl FailoverReason {
    /// Every reason, in label order.
    pub const ALL: [FailoverReason; 5] = [
        Self::HeartbeatTimeout,
        Self::ProbeFailed,
        Self::NodeNotReady,
        Self::NodeRemoved,
        Self::TunnelNotReady,
    ];

    /// The reason of a move away from a node in `phase` (`selected`: the
    /// gateway still selects the node).
    pub fn of(phase: TunnelPhase, selected: bool) -> Self {
        match phase {
            _ if !selected => Self::NodeRemoved,
            TunnelPhase::HeartbeatTimeout => Self::HeartbeatTimeout,
            TunnelPhase::Failed => Self::ProbeFailed,
            TunnelPhase::NodeNotReady => Self::NodeNotReady,
            TunnelPhase::Pending | TunnelPhase::Init | TunnelPhase::Ready => Self::TunnelNotReady,
        }
    }

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::HeartbeatTimeout => "heartbeat_timeout",
            Self::ProbeFailed => "probe_failed",
            Self::NodeNotReady => "node_not_ready",
            Self::NodeRemoved => "node_removed",
            Self::TunnelNotReady => "tunnel_not_ready",
        }
    }
}

/// One EIP (or node-IP unit) moved from a node to another.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EipMove {
    pub gateway: String,
    /// What moved, as the events name it ("EIP 10.10.0.200").
    pub what: String,
    pub from: String,
    pub to: String,
    pub reason: FailoverReason,
}

/// The port blocks one node holds as a worker.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TunnelGrants {
    /// Ports per block; 0 when the node holds no block.
    pub port_block_size: u16,
    /// Sorted by gateway, then EIP.
    pub port_blocks: Vec<EipPortBlocks>,
}

impl TunnelGrants {
    /// Puts `grant` among the node's grants, in order (of gateway, then
    /// address: a node holds one grant per address).
    pub fn insert(&mut self, size: u16, grant: EipPortBlocks) {
        self.port_block_size = size;
        let at = self.port_blocks.partition_point(|g| *g < grant);
        self.port_blocks.insert(at, grant);
    }

    /// Takes away the node's grant of `eip` of gateway `gw`, if any. The
    /// grants are in order ([`TunnelGrants::insert`]): found by halving,
    /// not by comparing every grant's names (a pass removes the grants of
    /// each address it decides again, from each of its holders).
    pub fn remove(&mut self, gw: &str, eip: &str) {
        fn key(g: &EipPortBlocks) -> (&str, &str) {
            (g.gateway.as_str(), g.eip.as_str())
        }
        let from = self.port_blocks.partition_point(|g| key(g) < (gw, eip));
        let to = from + self.port_blocks[from..].partition_point(|g| key(g) == (gw, eip));
        self.port_blocks.drain(from..to);
        if self.port_blocks.is_empty() {
            self.port_block_size = 0;
        }
    }

    /// The grants as last written into a tunnel's status.
    pub fn of(status: Option<&EgressTunnelStatus>) -> Self {
        status
            .map(|s| Self {
                port_block_size: s.port_block_size,
                port_blocks: s.port_blocks.clone(),
            })
            .unwrap_or_default()
    }
}

/// One (address, worker) after the pass, for metrics. The names are shared
/// (tens of thousands of facts per pass at a thousand nodes, most of them
/// copied from the last pass).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PortFact {
    pub gateway: std::sync::Arc<str>,
    pub eip: std::sync::Arc<str>,
    pub node: std::sync::Arc<str>,
    /// Blocks held, the draining ones included.
    pub granted: u32,
    pub draining: u32,
    /// Ports in use as the agent reported.
    pub in_use: u32,
    /// Ports per block.
    pub block_size: u16,
    /// The headroom asks for more blocks than a policy's cap allows: the
    /// policy (the largest cap among those using the address there).
    pub quota_reached: Option<String>,
    /// No free block was left for the blocks the headroom asks for.
    pub refused: bool,
}

/// Free and total blocks of one address, for metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AddressFact {
    pub gateway: String,
    pub eip: String,
    pub total: u32,
    pub free: u32,
}

/// Every fact of a pass, for the metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PortFacts {
    /// By address (see [`Plan::ports`]).
    pub workers: Vec<Arc<[PortFact]>>,
    pub addresses: Vec<AddressFact>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(gw: &str, eip: &str, block: u16) -> EipPortBlocks {
        EipPortBlocks {
            gateway: gw.into(),
            eip: eip.into(),
            blocks: vec![block],
            ..Default::default()
        }
    }

    #[test]
    fn a_grant_is_removed_from_the_ordered_grants_and_nothing_else() {
        let mut g = TunnelGrants::default();
        for (gw, eip, b) in [
            ("b", "10.0.0.1", 1),
            ("a", "10.0.0.2", 2),
            ("a", "10.0.0.1", 3),
            ("b", "10.0.0.2", 4),
        ] {
            g.insert(64, grant(gw, eip, b));
        }
        g.remove("a", "10.0.0.2");
        g.remove("c", "10.0.0.1"); // not held: nothing changes
        let left: Vec<u16> = g.port_blocks.iter().map(|b| b.blocks[0]).collect();
        assert_eq!(left, [3, 1, 4]);
        assert_eq!(g.port_block_size, 64);
        for (gw, eip) in [("a", "10.0.0.1"), ("b", "10.0.0.1"), ("b", "10.0.0.2")] {
            g.remove(gw, eip);
        }
        assert!(g.port_blocks.is_empty());
        assert_eq!(g.port_block_size, 0);
    }
}
