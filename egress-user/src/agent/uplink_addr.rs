//! The addresses the agent registers for its node, read from the uplink:
//! the tunnel endpoint (IPv4) and the node's IPv6 address (a dual-stack
//! useNodeIP policy's IPv6 address).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use anyhow::Result;
use rtnetlink::packet_route::address::{AddressAttribute, AddressFlags, AddressScope};

/// One address of the uplink as netlink reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinkAddress {
    pub addr: IpAddr,
    pub scope: AddressScope,
    pub flags: AddressFlags,
}

/// Every address of `ifindex`, in the kernel's order.
pub async fn link_addresses(handle: &rtnetlink::Handle, ifindex: u32) -> Result<Vec<LinkAddress>> {
    let mut stream = handle
        .address()
        .get()
        .set_link_index_filter(ifindex)
        .execute();
    let mut out = Vec::new();
    while let Some(msg) = futures::TryStreamExt::try_next(&mut stream).await? {
        let mut addr = None;
        // The 32-bit flags attribute, when present, supersedes the header's 8 bits.
        let mut flags = AddressFlags::from_bits_retain(u32::from(msg.header.flags.bits()));
        for attr in &msg.attributes {
            match attr {
                AddressAttribute::Address(a) => addr = Some(*a),
                AddressAttribute::Flags(f) => flags = *f,
                _ => {}
            }
        }
        if let Some(addr) = addr {
            out.push(LinkAddress {
                addr,
                scope: msg.header.scope,
                flags,
            });
        }
    }
    Ok(out)
}

/// The tunnel endpoint: the first IPv4 address.
pub fn first_ipv4(addrs: &[LinkAddress]) -> Option<Ipv4Addr> {
    addrs.iter().find_map(|a| match a.addr {
        IpAddr::V4(v4) => Some(v4),
        IpAddr::V6(_) => None,
    })
}

/// The node's IPv6 address: the first global one that stays. Link-local
/// addresses are not reachable from outside the link; a temporary
/// (privacy) address is marked secondary and goes away; a deprecated one is
/// on its way out; one that failed duplicate detection is not the node's.
/// A tentative address (detection still running, as at boot) is taken: it
/// is the node's once detection ends.
pub fn node_ipv6(addrs: &[LinkAddress]) -> Option<Ipv6Addr> {
    let unstable = AddressFlags::Secondary | AddressFlags::Deprecated | AddressFlags::Dadfailed;
    addrs.iter().find_map(|a| match a.addr {
        IpAddr::V6(v6)
            if a.scope == AddressScope::Universe
                && unusable_as_node_address(&v6).is_none()
                && !a.flags.intersects(unstable) =>
        {
            Some(v6)
        }
        _ => None,
    })
}

/// Why `a` cannot be a node's IPv6 address that servers outside answer to
/// (`None`: it can).
pub fn unusable_as_node_address(a: &Ipv6Addr) -> Option<&'static str> {
    if a.is_unspecified() {
        Some("the unspecified address")
    } else if a.is_loopback() {
        Some("the loopback address")
    } else if a.is_multicast() {
        Some("a multicast address")
    } else if a.is_unicast_link_local() {
        Some("link-local (fe80::/10): not reachable from outside the link")
    } else if a.to_ipv4_mapped().is_some() {
        Some("an IPv4-mapped address")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(addr: &str, scope: AddressScope, flags: AddressFlags) -> LinkAddress {
        LinkAddress {
            addr: addr.parse().unwrap(),
            scope,
            flags,
        }
    }

    #[test]
    fn the_node_ipv6_is_the_first_global_address_that_stays() {
        let none = AddressFlags::empty();
        let addrs = [
            a("10.10.0.1", AddressScope::Universe, AddressFlags::Permanent),
            a("fe80::1", AddressScope::Link, AddressFlags::Permanent),
            a(
                "fd00:10::99",
                AddressScope::Universe,
                AddressFlags::Dadfailed,
            ),
            a(
                "2001:db8::a",
                AddressScope::Universe,
                AddressFlags::Secondary,
            ),
            a(
                "2001:db8::b",
                AddressScope::Universe,
                AddressFlags::Deprecated,
            ),
            a(
                "fd00:10::1",
                AddressScope::Universe,
                AddressFlags::Tentative,
            ),
            a("fd00:10::2", AddressScope::Universe, none),
        ];
        assert_eq!(node_ipv6(&addrs), Some("fd00:10::1".parse().unwrap()));
        assert_eq!(first_ipv4(&addrs), Some(Ipv4Addr::new(10, 10, 0, 1)));
        assert_eq!(node_ipv6(&addrs[..5]), None, "only unstable or link-local");
        assert_eq!(first_ipv4(&addrs[1..]), None);
    }

    #[test]
    fn only_global_unicast_addresses_can_be_the_node_address() {
        for bad in ["::", "::1", "ff02::1", "fe80::1", "::ffff:10.0.0.1"] {
            let a: Ipv6Addr = bad.parse().unwrap();
            assert!(unusable_as_node_address(&a).is_some(), "{bad}");
        }
        for good in ["2001:db8::1", "fd00:10::1"] {
            assert_eq!(unusable_as_node_address(&good.parse().unwrap()), None);
        }
    }
}
