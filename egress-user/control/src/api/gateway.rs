use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::LabelSelector;

/// A set of gateway nodes and the EIP pools they serve.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "egressgateway.egress.dev",
    version = "v1beta1",
    kind = "EgressGateway",
    plural = "egressgateways",
    shortname = "egw",
    category = "egress",
    status = "EgressGatewayStatus",
    derive = "PartialEq",
    derive = "Default",
    printcolumn = r#"{"name":"DefaultV4","type":"string","jsonPath":".spec.ippools.ipv4DefaultEIP"}"#,
    printcolumn = r#"{"name":"DefaultV6","type":"string","jsonPath":".spec.ippools.ipv6DefaultEIP"}"#,
    printcolumn = r#"{"name":"ClusterDefault","type":"boolean","jsonPath":".spec.clusterDefault"}"#,
    printcolumn = r#"{"name":"Mode","type":"string","jsonPath":".spec.mode"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct EgressGatewaySpec {
    #[serde(default)]
    pub ippools: Ippools,
    #[serde(default)]
    pub node_selector: NodeSelector,
    /// Policies that name no gateway use the one gateway with this set.
    #[serde(default)]
    pub cluster_default: bool,
    /// How many of the gateway's nodes serve an EIP at once.
    #[serde(default, skip_serializing_if = "GatewayMode::is_active_standby")]
    pub mode: GatewayMode,
}

/// `spec.mode` of an EgressGateway.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum GatewayMode {
    /// One Ready node holds each EIP and the others take over when it
    /// fails: the only mode in which a node answers ARP/NDP for an EIP.
    #[default]
    ActiveStandby,
    /// Every Ready node holds every EIP at once (BGP announcement only):
    /// the upstream router spreads replies over them by ECMP and workers
    /// spread their flows. A node's own address (useNodeIP) stays on one
    /// node.
    ActiveActive,
}

impl GatewayMode {
    pub fn is_active_standby(&self) -> bool {
        *self == Self::ActiveStandby
    }
}

/// EIP pools. Entries are single addresses, `first-last` ranges or CIDRs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Ippools {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ipv4: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ipv6: Vec<String>,
    #[serde(
        rename = "ipv4DefaultEIP",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub ipv4_default_eip: String,
    #[serde(
        rename = "ipv6DefaultEIP",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub ipv6_default_eip: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct NodeSelector {
    #[serde(default)]
    pub selector: LabelSelector,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EgressGatewayStatus {
    /// Every node the selector picks, with its tunnel phase and the EIPs it owns.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub node_list: Vec<GatewayNodeStatus>,
    #[serde(default, rename = "ipUsage")]
    pub ip_usage: IpUsage,
    /// Ports per block (0 before the controller first wrote the status).
    /// The blocks themselves live in each worker's EgressTunnel status
    /// (`portBlocks`), one small record per node.
    #[serde(default)]
    pub port_block_size: u16,
    /// The highest epoch handed out for this gateway so far; epochs only grow.
    #[serde(default)]
    pub epoch: u64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<super::Condition>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GatewayNodeStatus {
    pub name: String,
    /// The node's EgressTunnel phase (Ready, HeartbeatTimeout, ...).
    #[serde(default)]
    pub status: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub eips: Vec<EipStatus>,
}

/// One EIP (an IPv4 and/or IPv6 address, both empty for useNodeIP policies)
/// owned by a node, with the policies that use it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EipStatus {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ipv4: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ipv6: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub policies: Vec<PolicyRef>,
    /// Fencing token of this assignment: it grows every time the EIP moves.
    #[serde(default)]
    pub epoch: u64,
}

#[derive(
    Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
pub struct PolicyRef {
    pub name: String,
    /// Empty for an EgressClusterPolicy.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IpUsage {
    #[serde(default)]
    pub ipv4_total: u64,
    #[serde(default)]
    pub ipv4_free: u64,
    #[serde(default)]
    pub ipv6_total: u64,
    #[serde(default)]
    pub ipv6_free: u64,
}
