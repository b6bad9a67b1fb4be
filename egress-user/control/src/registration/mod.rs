//! The records an agent keeps about its own node: the node record (labels,
//! addresses, pod CIDRs; where the datastore keeps one, not on Kubernetes)
//! and its EgressTunnel (tunnel endpoint, MAC, parent interface). The
//! agent reports facts; the controller alone decides the tunnel's phase
//! (Ready, HeartbeatTimeout, ...) from them and from the heartbeats.

use std::net::{IpAddr, Ipv6Addr};

use anyhow::{Context, Result};
use serde_json::json;

use crate::{
    api::NodeRecord,
    datastore::{typed, Datastore, DatastoreError, Kind, ObjectKey, StatusPatch},
    view::ClusterView,
};

/// Field manager of the agent's registration (`status.tunnel`).
pub const MANAGER: &str = "egress-agent";
/// Field manager of the agent's `status.awaitingReconfirmation`. Its own
/// name: on Kubernetes a server-side apply removes the fields its manager
/// applied before and leaves out, so under [`MANAGER`] each of the two
/// writes deleted the other's field (the request wiped the registration,
/// the agent registered again and wiped the request, and a fenced gateway
/// was never reconfirmed).
pub const RECONFIRMATION_MANAGER: &str = "egress-agent-reconfirmation";

/// The agent's field manager for `status.overCapacity` of its EgressTunnel
/// (its own set of fields, as [`RECONFIRMATION_MANAGER`] has).
pub const CAPACITY_MANAGER: &str = "egress-agent-capacity";

/// What the agent says about itself.
#[derive(Clone, Debug)]
pub struct SelfDescription {
    pub node: NodeRecord,
    /// The tunnel endpoint; its family is the underlay's.
    pub tunnel_ip: IpAddr,
    /// The node's IPv6 address on the underlay, if it has one: a useNodeIP
    /// policy's IPv6 address (on an IPv6 underlay, the tunnel endpoint).
    pub ipv6: Option<Ipv6Addr>,
    pub mac: [u8; 6],
    pub parent: String,
}

pub fn mac_string(mac: &[u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Writes the node record (where the datastore keeps one: not on
/// Kubernetes) and the EgressTunnel's `status.tunnel` (never the phase: the
/// controller sets it once the tunnel is registered and, on a gateway
/// candidate, its heartbeat is seen).
pub async fn register(ds: &dyn Datastore, me: &SelfDescription) -> Result<()> {
    // On Kubernetes the Node is the kubelet's (and writing it is refused):
    // its addresses and labels are already there.
    if ds.writes_cluster_records() {
        typed::apply(ds, Kind::Node, typed::node_object(&me.node))
            .await
            .with_context(|| format!("registering node {}", me.node.name))?;
    }
    let key = ObjectKey::cluster(&me.node.name);
    if ds.get(Kind::EgressTunnel, &key).await?.is_none() {
        // On Kubernetes the tunnel is the controller's to create (one per
        // Node; the agent's RBAC has no `create`): asking would only be
        // refused, so the agent waits for it.
        if !ds.writes_cluster_records() {
            anyhow::bail!(
                "EgressTunnel {} does not exist yet: the controller creates one for every node",
                me.node.name
            );
        }
        let tunnel = json!({
            "apiVersion": crate::api::API_VERSION,
            "kind": "EgressTunnel",
            "metadata": { "name": me.node.name },
            "spec": {},
        });
        match ds.create(Kind::EgressTunnel, tunnel).await {
            Ok(_) | Err(DatastoreError::AlreadyExists { .. }) => {}
            Err(e) => return Err(e).context("creating the EgressTunnel"),
        }
    }
    let (ipv4, ipv6) = published_addresses(me);
    let status = json!({
        "tunnel": {
            "ipv4": ipv4,
            "ipv6": ipv6,
            "mac": mac_string(&me.mac),
            "parent": { "name": me.parent },
        },
    });
    ds.write_status(
        Kind::EgressTunnel,
        &key,
        &StatusPatch {
            manager: MANAGER.into(),
            owned: vec!["tunnel".into()],
            status,
        },
    )
    .await
    .context("writing the EgressTunnel status")?;
    Ok(())
}

/// What `status.tunnel` says of the node's addresses: on an IPv4 underlay
/// the tunnel endpoint as `ipv4` and the node's IPv6 address (if any) as
/// `ipv6`; on an IPv6 underlay the tunnel endpoint as `ipv6` and no `ipv4`,
/// so every reader takes the endpoint the tunnel uses.
pub fn published_addresses(me: &SelfDescription) -> (String, String) {
    match me.tunnel_ip {
        IpAddr::V4(v4) => (
            v4.to_string(),
            me.ipv6.map(|a| a.to_string()).unwrap_or_default(),
        ),
        IpAddr::V6(v6) => (String::new(), v6.to_string()),
    }
}

/// The node record's addresses: the tunnel endpoint, then the IPv6 address
/// (once: on an IPv6 underlay it is usually the endpoint).
pub fn node_addresses(tunnel_ip: IpAddr, ipv6: Option<Ipv6Addr>) -> Vec<String> {
    let mut out = vec![tunnel_ip];
    out.extend(ipv6.map(IpAddr::V6).filter(|a| *a != tunnel_ip));
    out.iter().map(|a| a.to_string()).collect()
}

/// Whether the datastore no longer holds what the agent registered: its
/// EgressTunnel (or, where the agent writes it, its node record) was
/// deleted, or the tunnel's registered fields differ (an operator's
/// mistake, a restore from backup). The agent then registers again instead
/// of running unregistered (no port blocks, no tunnel endpoint for peers)
/// until its next restart.
pub fn registration_lost(view: &ClusterView, me: &SelfDescription, writes_node: bool) -> bool {
    if writes_node && view.node(&me.node.name).is_none() {
        return true;
    }
    let Some(st) = view.tunnel(&me.node.name).and_then(|t| t.status.as_ref()) else {
        return true;
    };
    let t = &st.tunnel;
    let (ipv4, ipv6) = published_addresses(me);
    t.ipv4 != ipv4 || t.ipv6 != ipv6 || t.mac != mac_string(&me.mac) || t.parent.name != me.parent
}

#[cfg(test)]
pub(crate) mod tests;

/// Writes `field` of the status of `node`'s EgressTunnel as field manager
/// `manager`, which owns that field only; `what` names the write in the
/// error.
pub async fn write_tunnel_status_field(
    ds: &dyn Datastore,
    node: &str,
    manager: &str,
    field: &str,
    value: impl serde::Serialize,
    what: &'static str,
) -> Result<()> {
    ds.write_status(
        Kind::EgressTunnel,
        &ObjectKey::cluster(node),
        &StatusPatch {
            manager: manager.into(),
            owned: vec![field.into()],
            status: json!({ field: value }),
        },
    )
    .await
    .context(what)?;
    Ok(())
}

/// Writes the policies this node's datapath could not hold
/// (`status.overCapacity` of its EgressTunnel, under [`CAPACITY_MANAGER`]);
/// an empty list clears it. The controller turns it into the policies'
/// conditions.
pub async fn publish_over_capacity(
    ds: &dyn Datastore,
    node: &str,
    over: &[crate::api::PolicyOverCapacity],
) -> Result<()> {
    write_tunnel_status_field(
        ds,
        node,
        CAPACITY_MANAGER,
        OVER_CAPACITY,
        over,
        "writing the policies over capacity",
    )
    .await
}

/// The status field of [`publish_over_capacity`].
const OVER_CAPACITY: &str = "overCapacity";

/// The agent's field manager for `status.portUse` of its EgressTunnel.
pub const PORT_USE_MANAGER: &str = "egress-agent-port-use";

/// Writes how much of each EIP's granted ports this node uses and which
/// draining blocks it has emptied (`status.portUse`, under
/// [`PORT_USE_MANAGER`]). The controller grants and takes back blocks from it.
pub async fn publish_port_use(
    ds: &dyn Datastore,
    node: &str,
    usage: &[crate::api::EipPortUse],
) -> Result<()> {
    write_tunnel_status_field(
        ds,
        node,
        PORT_USE_MANAGER,
        PORT_USE,
        usage,
        "writing the port use",
    )
    .await
}

/// The status field of [`publish_port_use`].
const PORT_USE: &str = "portUse";
