//! The node's VXLAN device, in external (collect_md) mode: the programs pick
//! the remote endpoint per packet with bpf_skb_set_tunnel_key, so one device
//! serves every gateway and worker.

use anyhow::{Context, Result};
use futures::TryStreamExt;
use rtnetlink::{Handle, LinkUnspec, LinkVxlan};

use super::link::ObservedLink;

/// The device the agent wants.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VxlanSpec {
    pub name: String,
    /// UDP destination port of the tunnel (the chart's feature.vxlan.port).
    pub port: u16,
    /// MTU of the device: the underlay MTU minus 50 bytes of VXLAN over
    /// IPv4, 70 over IPv6.
    pub mtu: u32,
    /// The underlay is IPv6: the device must take the zero UDP checksum
    /// of the programs' IPv6 outer headers (RFC 6935). Every device is
    /// made so; one made without it is replaced only when this is set.
    pub ipv6_underlay: bool,
}

/// What to do to reach the spec from what exists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VxlanAction {
    Create,
    /// A device of that name exists with other tunnel attributes (or is not
    /// VXLAN): replace it. Port and mode cannot change on a live device.
    Recreate {
        index: u32,
        why: String,
    },
    /// Right tunnel attributes; only the MTU or the up flag differ.
    Adjust {
        index: u32,
    },
    Keep,
}

/// Pure decision: compares the observed device (if any) with the spec.
pub fn plan(existing: Option<&ObservedLink>, want: &VxlanSpec) -> VxlanAction {
    let Some(link) = existing else {
        return VxlanAction::Create;
    };
    let why = match &link.vxlan {
        None => Some(format!(
            "{} is a {:?} device, not vxlan",
            link.name, link.kind
        )),
        Some(vx) if !vx.external => Some("not in external (collect_md) mode".to_owned()),
        Some(vx) if vx.port != want.port => {
            Some(format!("port {} instead of {}", vx.port, want.port))
        }
        Some(vx) if want.ipv6_underlay && !vx.zero_csum6_rx => {
            Some("refuses zero IPv6 UDP checksums (udp6zerocsumrx off)".to_owned())
        }
        Some(_) => None,
    };
    match why {
        Some(why) => VxlanAction::Recreate {
            index: link.index,
            why,
        },
        None if link.mtu != want.mtu || !link.up => VxlanAction::Adjust { index: link.index },
        None => VxlanAction::Keep,
    }
}

/// Looks a link up by name; `None` when it does not exist.
pub async fn find_link(handle: &Handle, name: &str) -> Result<Option<ObservedLink>> {
    let mut links = handle.link().get().match_name(name.to_owned()).execute();
    match links.try_next().await {
        Ok(Some(msg)) => Ok(Some(ObservedLink::from_message(&msg))),
        Ok(None) => Ok(None),
        // ENODEV: no such device.
        Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::ENODEV => Ok(None),
        Err(e) => Err(e).with_context(|| format!("looking up link {name}")),
    }
}

/// Brings the device to the spec and returns its ifindex.
pub async fn ensure(handle: &Handle, want: &VxlanSpec) -> Result<u32> {
    let existing = find_link(handle, &want.name).await?;
    match plan(existing.as_ref(), want) {
        VxlanAction::Keep => return Ok(existing.map(|l| l.index).unwrap_or_default()),
        VxlanAction::Adjust { index } => {
            handle
                .link()
                .set(LinkUnspec::new_with_index(index).mtu(want.mtu).up().build())
                .execute()
                .await
                .with_context(|| format!("setting mtu/up on {}", want.name))?;
            return Ok(index);
        }
        VxlanAction::Recreate { index, why } => {
            tracing::warn!(device = %want.name, %why, "replacing the tunnel device");
            handle
                .link()
                .del(index)
                .execute()
                .await
                .with_context(|| format!("deleting {}", want.name))?;
        }
        VxlanAction::Create => {}
    }
    // The VNI is carried per packet in external mode; the kernel still wants one here.
    let msg = LinkVxlan::new(&want.name, 0)
        .collect_metadata(true)
        .port(want.port)
        .learning(false)
        // IPv6 outer headers carry a zero UDP checksum, as IPv4 ones do.
        .udp_zero_csum6_rx(true)
        .udp_zero_csum6_tx(true)
        .mtu(want.mtu)
        .up()
        .build();
    handle.link().add(msg).execute().await.with_context(|| {
        format!(
            "creating vxlan device {} (port {}, external)",
            want.name, want.port
        )
    })?;
    find_link(handle, &want.name)
        .await?
        .map(|l| l.index)
        .with_context(|| format!("{} vanished right after it was created", want.name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::link::ObservedVxlan;

    fn spec() -> VxlanSpec {
        VxlanSpec {
            name: "egress.vxlan".into(),
            port: 4789,
            mtu: 1450,
            ipv6_underlay: false,
        }
    }

    fn vxlan(external: bool, port: u16, mtu: u32, up: bool) -> ObservedLink {
        ObservedLink {
            index: 7,
            name: "egress.vxlan".into(),
            kind: "vxlan".into(),
            up,
            mtu,
            mac: None,
            peer_netns_id: None,
            vxlan: Some(ObservedVxlan {
                external,
                port,
                zero_csum6_rx: false,
            }),
        }
    }

    #[test]
    fn missing_device_is_created() {
        assert_eq!(plan(None, &spec()), VxlanAction::Create);
    }

    #[test]
    fn matching_device_is_kept() {
        assert_eq!(
            plan(Some(&vxlan(true, 4789, 1450, true)), &spec()),
            VxlanAction::Keep
        );
    }

    #[test]
    fn wrong_port_or_mode_means_recreate() {
        assert!(matches!(
            plan(Some(&vxlan(true, 8472, 1450, true)), &spec()),
            VxlanAction::Recreate { .. }
        ));
        assert!(matches!(
            plan(Some(&vxlan(false, 4789, 1450, true)), &spec()),
            VxlanAction::Recreate { .. }
        ));
        let dummy = ObservedLink {
            index: 3,
            name: "egress.vxlan".into(),
            kind: "dummy".into(),
            ..Default::default()
        };
        assert!(matches!(
            plan(Some(&dummy), &spec()),
            VxlanAction::Recreate { index: 3, .. }
        ));
    }

    #[test]
    fn mtu_or_down_is_adjusted_in_place() {
        assert_eq!(
            plan(Some(&vxlan(true, 4789, 1500, true)), &spec()),
            VxlanAction::Adjust { index: 7 }
        );
        assert_eq!(
            plan(Some(&vxlan(true, 4789, 1450, false)), &spec()),
            VxlanAction::Adjust { index: 7 }
        );
    }

    #[test]
    fn an_ipv6_underlay_replaces_a_device_that_refuses_zero_checksums() {
        let old = vxlan(true, 4789, 1450, true);
        let v6 = VxlanSpec {
            ipv6_underlay: true,
            ..spec()
        };
        assert!(matches!(
            plan(Some(&old), &v6),
            VxlanAction::Recreate { index: 7, .. }
        ));
        // On an IPv4 underlay the same device is kept: no upgrade restarts it.
        assert_eq!(plan(Some(&old), &spec()), VxlanAction::Keep);
        let mut fit = old;
        fit.vxlan.as_mut().unwrap().zero_csum6_rx = true;
        assert_eq!(plan(Some(&fit), &v6), VxlanAction::Keep);
    }
}
