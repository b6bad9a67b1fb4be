use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// One per node: the node's tunnel endpoint, the EIPs it asks to have
/// reconfirmed and the policies it could not apply, written by its agent
/// (`tunnel`, `awaitingReconfirmation`, `overCapacity`);
/// its health and the port blocks it holds as a worker, written by the
/// controller (`phase`, `lastHeartbeatTime`, `portBlocks`,
/// `portBlockSize`).
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "egressgateway.egress.dev",
    version = "v1beta1",
    kind = "EgressTunnel",
    plural = "egresstunnels",
    shortname = "egt",
    category = "egress",
    status = "EgressTunnelStatus",
    derive = "PartialEq",
    derive = "Default",
    printcolumn = r#"{"name":"TunnelV4","type":"string","jsonPath":".status.tunnel.ipv4"}"#,
    printcolumn = r#"{"name":"TunnelV6","type":"string","jsonPath":".status.tunnel.ipv6"}"#,
    printcolumn = r#"{"name":"MAC","type":"string","jsonPath":".status.tunnel.mac"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Heartbeat","type":"date","jsonPath":".status.lastHeartbeatTime"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct EgressTunnelSpec {}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EgressTunnelStatus {
    #[serde(default)]
    pub tunnel: TunnelInfo,
    #[serde(default)]
    pub phase: TunnelPhase,
    /// RFC 3339 time of the last heartbeat the controller saw.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_heartbeat_time: Option<String>,
    /// Port blocks this node holds as a worker, per EIP (this project's
    /// addition). One small record per node, written by the controller
    /// only when its grants change; agents read every node's to steer
    /// replies.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub port_blocks: Vec<EipPortBlocks>,
    /// Ports per block of `portBlocks` (0 when the controller has not
    /// granted any).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub port_block_size: u16,
    /// EIPs assigned to this node that its agent withholds: it fenced
    /// itself (its heartbeat renewals failed for `fence_after`) while
    /// holding them at this epoch, and it announces them again only under
    /// a newer one. Written by the agent once its renewals succeed again;
    /// the controller answers with a new epoch (on this node while it is
    /// Ready). Without it, a node silent for longer than its fence but
    /// shorter than the eviction timeout would never be evicted and its
    /// EIPs would stay dark.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub awaiting_reconfirmation: Vec<EipEpoch>,
    /// Policies selecting pods on this node that its agent could not
    /// apply because they exceed a map limit of the node's datapath (their
    /// traffic there is dropped instead). Written by the agent under its own
    /// field manager; the controller turns it into the policies' conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub over_capacity: Vec<PolicyOverCapacity>,
    /// How much of each EIP's granted ports this node uses, and the
    /// draining blocks it has emptied. Written by the agent under its own
    /// field manager; the controller grants more blocks ahead of need and
    /// takes back emptied ones (see docs/architecture.md, "Port blocks").
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub port_use: Vec<EipPortUse>,
}

/// One EIP's use on a node, as its agent last reported it.
#[derive(
    Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct EipPortUse {
    pub gateway: String,
    pub eip: String,
    /// Live NAT entries translating to this EIP (ports in use).
    #[serde(default)]
    pub in_use: u32,
    /// Draining blocks (see `EipPortBlocks.draining`) that no live NAT
    /// entry of this node uses, and have not for the agent's quarantine
    /// period: the controller may give them to another node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub released: Vec<u16>,
}

/// One policy an agent left out of its maps, and the limit it exceeds.
#[derive(
    Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct PolicyOverCapacity {
    /// `EgressPolicy` or `EgressClusterPolicy`.
    pub kind: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    pub name: String,
    /// `policySlots`, `destinationCIDRs`, `sourcePods` or `eips`.
    pub limit: String,
    /// What the policy needs: its prefixes, or the node's policy count.
    pub count: u64,
    /// What the datapath holds.
    pub max: u64,
}

/// One EIP assignment as the agent holds it: the address and its epoch.
#[derive(
    Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct EipEpoch {
    pub eip: String,
    pub epoch: u64,
}

fn is_zero(v: &u16) -> bool {
    *v == 0
}

/// The port blocks of one EIP held by the node. Block `i` is the ports
/// `i*size .. (i+1)*size-1`.
#[derive(
    Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct EipPortBlocks {
    /// The EgressGateway whose pool (or gateway node) the address is of.
    pub gateway: String,
    pub eip: String,
    /// Every block the node holds, the draining ones included: the
    /// gateways steer replies to all of them.
    pub blocks: Vec<u16>,
    /// Blocks of `blocks` the controller takes back: the node chooses no
    /// new flow's port in them and reports them in `portUse.released`
    /// once no NAT entry uses them; only then do they leave `blocks`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub draining: Vec<u16>,
    /// The node needs more blocks of this address than are free: with no
    /// block at all, its new flows are refused at once (ICMP
    /// administratively prohibited to the pod).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub exhausted: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TunnelInfo {
    /// Underlay address other nodes send VXLAN packets to.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ipv4: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ipv6: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mac: String,
    #[serde(default)]
    pub parent: Parent,
}

/// The underlay interface the tunnel rides on.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Parent {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ipv4: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ipv6: String,
}

/// The phases the controller's heartbeat monitor decides (one enum for
/// the API and the failover model).
pub use egress_failover::TunnelPhase;
