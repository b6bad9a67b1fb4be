//! Which kind of device the node reaches a local pod's address by, so that
//! a pod the worker program never sees (ipvlan, macvlan, netkit, SR-IOV) is
//! reported instead of silently leaving with its own address.
//!
//! The program runs on pod veths; a pod is behind one when the node routes
//! its address to a veth whose peer is in another namespace, or to a bridge
//! (whose ports are those veths).

use std::{collections::BTreeSet, net::IpAddr};

use futures::TryStreamExt;
use rtnetlink::packet_route::route::{RouteAttribute, RouteMessage};

use crate::node::link::ObservedLink;

/// How the node reaches a pod address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PodReach {
    /// A pod veth, or a bridge whose ports are pod veths: the program sees it.
    Veth,
    /// Another kind of device: the program never sees the pod's packets.
    Unsupported { device: String, kind: String },
    /// No route leaves by a device (an unknown address on this node).
    NoDevice,
}

/// The decision, on the route's output device.
pub fn classify(device: Option<&ObservedLink>) -> PodReach {
    let Some(d) = device else {
        return PodReach::NoDevice;
    };
    if d.is_pod_veth() || d.kind == "bridge" {
        return PodReach::Veth;
    }
    PodReach::Unsupported {
        device: d.name.clone(),
        kind: if d.kind.is_empty() {
            "no kind (a physical or loopback device)".into()
        } else {
            d.kind.clone()
        },
    }
}

/// Looks up how the node reaches `addr` (a route lookup, then its device).
pub async fn reach_of(handle: &rtnetlink::Handle, addr: IpAddr) -> anyhow::Result<PodReach> {
    let req = match addr {
        IpAddr::V4(a) => rtnetlink::RouteMessageBuilder::<std::net::Ipv4Addr>::new()
            .destination_prefix(a, 32)
            .build(),
        IpAddr::V6(a) => rtnetlink::RouteMessageBuilder::<std::net::Ipv6Addr>::new()
            .destination_prefix(a, 128)
            .build(),
    };
    let routes: Vec<RouteMessage> = match handle.route().get(req).execute().try_collect().await {
        Ok(r) => r,
        Err(rtnetlink::Error::NetlinkError(m)) if m.raw_code() == -libc::ENETUNREACH => {
            return Ok(PodReach::NoDevice)
        }
        Err(e) => return Err(e.into()),
    };
    let oif = routes
        .iter()
        .flat_map(|r| &r.attributes)
        .find_map(|a| match a {
            RouteAttribute::Oif(i) => Some(*i),
            _ => None,
        });
    let Some(oif) = oif else {
        return Ok(PodReach::NoDevice);
    };
    let msg = handle
        .link()
        .get()
        .match_index(oif)
        .execute()
        .try_next()
        .await?;
    Ok(classify(
        msg.map(|m| ObservedLink::from_message(&m)).as_ref(),
    ))
}

/// Remembers which pod addresses were looked at, so each is reported once.
#[derive(Default)]
pub struct PodReachCheck {
    seen: BTreeSet<IpAddr>,
}

impl PodReachCheck {
    /// Looks at the addresses of `pods` not looked at before and warns for
    /// each one the program cannot see.
    pub async fn check(&mut self, handle: &rtnetlink::Handle, pods: impl Iterator<Item = IpAddr>) {
        let new: Vec<IpAddr> = pods.filter(|a| !self.seen.contains(a)).collect();
        for addr in new {
            match reach_of(handle, addr).await {
                Ok(PodReach::Veth) => {}
                Ok(PodReach::Unsupported { device, kind }) => tracing::warn!(
                    pod = %addr, %device, %kind,
                    "pod address not behind a pod veth: the worker program never sees this pod's \
                     packets, so its policy traffic leaves with its own address (docs/deploy.md, \
                     \"Pod networks\")"
                ),
                Ok(PodReach::NoDevice) => tracing::warn!(
                    pod = %addr,
                    "pod address not behind a pod veth: no route to it on this node"
                ),
                // A failed lookup is tried again at the next change.
                Err(e) => {
                    tracing::debug!(pod = %addr, error = %e, "route lookup of a pod address failed");
                    continue;
                }
            }
            self.seen.insert(addr);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(name: &str, kind: &str, peer_elsewhere: bool) -> ObservedLink {
        ObservedLink {
            name: name.into(),
            kind: kind.into(),
            peer_netns_id: peer_elsewhere.then_some(3),
            ..Default::default()
        }
    }

    #[test]
    fn pod_veths_and_bridges_are_seen_other_devices_are_not() {
        assert_eq!(classify(Some(&link("cali1", "veth", true))), PodReach::Veth);
        assert_eq!(
            classify(Some(&link("cni0", "bridge", false))),
            PodReach::Veth
        );
        assert_eq!(classify(None), PodReach::NoDevice);
        for (name, kind) in [("ipvl0", "ipvlan"), ("nk0", "netkit"), ("mv0", "macvlan")] {
            assert_eq!(
                classify(Some(&link(name, kind, false))),
                PodReach::Unsupported {
                    device: name.into(),
                    kind: kind.into()
                }
            );
        }
        // A veth whose peer is in the node's own namespace is not a pod's.
        assert!(matches!(
            classify(Some(&link("v0", "veth", false))),
            PodReach::Unsupported { .. }
        ));
        // An SR-IOV VF or any physical device has no kind.
        assert!(matches!(
            classify(Some(&link("ens5f1v0", "", false))),
            PodReach::Unsupported { kind, .. } if kind.starts_with("no kind")
        ));
    }
}
