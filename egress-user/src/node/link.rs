//! A netlink link message reduced to the facts the agent decides on.

use rtnetlink::packet_route::link::{
    InfoData, InfoKind, InfoVxlan, LinkAttribute, LinkFlags, LinkInfo, LinkMessage,
};

/// What the agent needs to know about one network device.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ObservedLink {
    pub index: u32,
    pub name: String,
    /// `veth`, `vxlan`, `bridge`... empty for devices without a kind (lo, physical).
    pub kind: String,
    pub up: bool,
    pub mtu: u32,
    /// Hardware address, for Ethernet-like devices.
    pub mac: Option<[u8; 6]>,
    /// Set when the device's peer lives in another network namespace (a pod's veth).
    pub peer_netns_id: Option<i32>,
    pub vxlan: Option<ObservedVxlan>,
}

/// The VXLAN attributes that matter for the tunnel.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ObservedVxlan {
    pub external: bool,
    pub port: u16,
    /// Takes IPv6 VXLAN packets whose UDP checksum is zero (`udp6zerocsumrx`).
    pub zero_csum6_rx: bool,
}

impl ObservedLink {
    pub fn from_message(msg: &LinkMessage) -> Self {
        let mut link = ObservedLink {
            index: msg.header.index,
            up: msg.header.flags.contains(LinkFlags::Up),
            ..Default::default()
        };
        for attr in &msg.attributes {
            match attr {
                LinkAttribute::IfName(n) => link.name = n.clone(),
                LinkAttribute::Mtu(m) => link.mtu = *m,
                LinkAttribute::Address(a) if a.len() == 6 => {
                    link.mac = a.as_slice().try_into().ok()
                }
                LinkAttribute::LinkNetNsId(id) => link.peer_netns_id = Some(*id),
                LinkAttribute::LinkInfo(infos) => read_link_info(infos, &mut link),
                _ => {}
            }
        }
        link
    }

    /// A pod's host-side veth: its peer is in another namespace.
    pub fn is_pod_veth(&self) -> bool {
        self.kind == "veth" && self.peer_netns_id.is_some()
    }
}

fn read_link_info(infos: &[LinkInfo], link: &mut ObservedLink) {
    for info in infos {
        match info {
            LinkInfo::Kind(kind) => {
                link.kind = match kind {
                    InfoKind::Veth => "veth".into(),
                    InfoKind::Vxlan => "vxlan".into(),
                    InfoKind::Bridge => "bridge".into(),
                    other => format!("{other:?}").to_lowercase(),
                }
            }
            LinkInfo::Data(InfoData::Vxlan(attrs)) => {
                let mut vx = ObservedVxlan::default();
                for a in attrs {
                    match a {
                        InfoVxlan::CollectMetadata(on) => vx.external = *on,
                        InfoVxlan::Port(p) => vx.port = *p,
                        InfoVxlan::UDPZeroCsumRX(on) => vx.zero_csum6_rx = *on,
                        _ => {}
                    }
                }
                link.vxlan = Some(vx);
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_veth_with_a_peer_namespace_is_a_pod_veth() {
        let l = ObservedLink {
            kind: "veth".into(),
            peer_netns_id: Some(3),
            ..Default::default()
        };
        assert!(l.is_pod_veth());
    }

    #[test]
    fn a_veth_whose_peer_is_local_is_not() {
        let l = ObservedLink {
            kind: "veth".into(),
            peer_netns_id: None,
            ..Default::default()
        };
        assert!(!l.is_pod_veth());
        let b = ObservedLink {
            kind: "bridge".into(),
            peer_netns_id: Some(1),
            ..Default::default()
        };
        assert!(!b.is_pod_veth());
    }
}
