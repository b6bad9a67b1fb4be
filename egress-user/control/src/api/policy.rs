use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{Condition, LabelSelector};

/// Priority of a policy that sets none. Lower numbers win on overlap.
pub const DEFAULT_PRIORITY: i64 = 1000;

/// Which pods of one namespace leave through which gateway, to which
/// destinations, with which EIP.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "egressgateway.egress.dev",
    version = "v1beta1",
    kind = "EgressPolicy",
    plural = "egresspolicies",
    shortname = "egp",
    category = "egress",
    namespaced,
    status = "EgressPolicyStatus",
    derive = "PartialEq",
    derive = "Default",
    printcolumn = r#"{"name":"Gateway","type":"string","jsonPath":".spec.egressGatewayName"}"#,
    printcolumn = r#"{"name":"IPv4","type":"string","jsonPath":".status.eip.ipv4"}"#,
    printcolumn = r#"{"name":"IPv6","type":"string","jsonPath":".status.eip.ipv6"}"#,
    printcolumn = r#"{"name":"Node","type":"string","jsonPath":".status.node"}"#,
    printcolumn = r#"{"name":"Nodes","type":"string","jsonPath":".status.nodes"}"#,
    printcolumn = r#"{"name":"Priority","type":"integer","jsonPath":".spec.priority"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct EgressPolicySpec {
    /// Empty: the gateway with `clusterDefault: true`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub egress_gateway_name: String,
    #[serde(default, rename = "egressIP")]
    pub egress_ip: EgressIp,
    #[serde(default)]
    pub applied_to: AppliedTo,
    /// Destinations this policy covers; empty means everything outside the
    /// cluster CIDRs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dest_subnet: Vec<String>,
    /// Destinations that never take the gateway even when `destSubnet` covers them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub excluded_subnet: Vec<String>,
    /// Lower wins when policies overlap; equal priority: the older object
    /// wins. Unset means 1000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i64>,
    /// Most ports of the EIP one node may hold for this policy's pods
    /// (rounded up to whole port blocks). Unset: the controller's
    /// `--max-ports-per-node`. Where several policies use the same EIP on a
    /// node, the node may hold the largest of their caps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_ports_per_node: Option<u32>,
}

/// Same as [`EgressPolicySpec`] for pods of any namespace picked by `namespaceSelector`.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "egressgateway.egress.dev",
    version = "v1beta1",
    kind = "EgressClusterPolicy",
    plural = "egressclusterpolicies",
    shortname = "egcp",
    category = "egress",
    status = "EgressPolicyStatus",
    derive = "PartialEq",
    derive = "Default",
    printcolumn = r#"{"name":"Gateway","type":"string","jsonPath":".spec.egressGatewayName"}"#,
    printcolumn = r#"{"name":"IPv4","type":"string","jsonPath":".status.eip.ipv4"}"#,
    printcolumn = r#"{"name":"IPv6","type":"string","jsonPath":".status.eip.ipv6"}"#,
    printcolumn = r#"{"name":"Node","type":"string","jsonPath":".status.node"}"#,
    printcolumn = r#"{"name":"Nodes","type":"string","jsonPath":".status.nodes"}"#,
    printcolumn = r#"{"name":"Priority","type":"integer","jsonPath":".spec.priority"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct EgressClusterPolicySpec {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub egress_gateway_name: String,
    #[serde(default, rename = "egressIP")]
    pub egress_ip: EgressIp,
    #[serde(default)]
    pub applied_to: ClusterAppliedTo,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dest_subnet: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub excluded_subnet: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i64>,
    /// Most ports of the EIP one node may hold for this policy's pods
    /// (rounded up to whole port blocks). Unset: the controller's
    /// `--max-ports-per-node`. Where several policies use the same EIP on a
    /// node, the node may hold the largest of their caps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_ports_per_node: Option<u32>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EgressIp {
    /// An explicit EIP from the gateway's IPv4 pool.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ipv4: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ipv6: String,
    /// Leave with the gateway node's own address instead of an EIP.
    #[serde(rename = "useNodeIP", default)]
    pub use_node_ip: bool,
    #[serde(default)]
    pub allocator_policy: AllocatorPolicy,
}

/// `default`: the gateway's default EIP; `rr`: the pool's addresses in turn.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum AllocatorPolicy {
    #[default]
    #[serde(rename = "default")]
    Default,
    #[serde(rename = "rr")]
    Rr,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AppliedTo {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_selector: Option<LabelSelector>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pod_subnet: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterAppliedTo {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_selector: Option<LabelSelector>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pod_subnet: Vec<String>,
    /// Namespaces whose pods this policy covers; unset means all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EgressPolicyStatus {
    #[serde(default)]
    pub eip: PolicyEip,
    /// The gateway node that carries this policy's traffic (ActiveStandby).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub node: String,
    /// The gateway nodes that all carry it at once (ActiveActive), sorted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PolicyEip {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ipv4: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ipv6: String,
}
