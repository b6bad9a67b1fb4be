//! Which family the tunnel runs over (`--underlay`), and the endpoint the
//! node uses on it. Pure: the agent reads the routes and addresses, this
//! decides.

use std::net::IpAddr;

use super::uplink_addr::{first_ipv4, node_ipv6, LinkAddress};

/// `--underlay`: the tunnel's outer family, the same on every node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum UnderlayChoice {
    /// VXLAN over IPv4 (what every earlier release did).
    #[default]
    Ipv4,
    /// VXLAN over IPv6.
    Ipv6,
    /// The family of the node's default route (IPv4 when it has both).
    Auto,
}

/// The main table's default routes, by family.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DefaultRoutes {
    pub v4: bool,
    pub v6: bool,
}

/// The default routes `auto` may follow: only a family the uplink also
/// has an address of (an IPv6-only node may route IPv4 by IPv6 next hops,
/// `ip -4 route add default via inet6 ...`, and still has no IPv4
/// endpoint to offer).
pub fn usable(routes: DefaultRoutes, addrs: &[LinkAddress]) -> DefaultRoutes {
    DefaultRoutes {
        v4: routes.v4 && first_ipv4(addrs).is_some(),
        v6: routes.v6 && node_ipv6(addrs).is_some(),
    }
}

/// Whether the underlay is IPv6. A `--tunnel-ip` of the other family than
/// an explicit `--underlay` cannot work and is refused.
pub fn is_ipv6(
    choice: UnderlayChoice,
    given: Option<IpAddr>,
    routes: DefaultRoutes,
) -> Result<bool, String> {
    let v6 = match (choice, given) {
        (UnderlayChoice::Ipv4, _) => false,
        (UnderlayChoice::Ipv6, _) => true,
        (UnderlayChoice::Auto, Some(ip)) => ip.is_ipv6(),
        (UnderlayChoice::Auto, None) if routes.v4 => false,
        (UnderlayChoice::Auto, None) if routes.v6 => true,
        (UnderlayChoice::Auto, None) => {
            return Err(
                "--underlay auto: the node has no default route in the main table to take the family from; set --underlay ipv4 or ipv6".into(),
            )
        }
    };
    match given {
        Some(ip) if ip.is_ipv6() != v6 => Err(format!(
            "--tunnel-ip {ip} is not an {} address, and --underlay {} is",
            family(v6),
            if v6 { "ipv6" } else { "ipv4" }
        )),
        _ => Ok(v6),
    }
}

/// The node's tunnel endpoint: `--tunnel-ip`, else the uplink's first
/// IPv4 address, or its first stable global IPv6 address.
pub fn endpoint(
    v6: bool,
    given: Option<IpAddr>,
    addrs: &[LinkAddress],
    uplink: &str,
) -> Result<IpAddr, String> {
    if let Some(ip) = given {
        return Ok(ip);
    }
    let found = if v6 {
        node_ipv6(addrs).map(IpAddr::V6)
    } else {
        first_ipv4(addrs).map(IpAddr::V4)
    };
    found.ok_or_else(|| {
        format!(
            "uplink {uplink} has no {} address for the tunnel; set --tunnel-ip",
            family(v6)
        )
    })
}

/// Bytes the tunnel adds in front of an inner IP packet: outer IP, UDP,
/// VXLAN and the inner Ethernet header.
pub fn overhead(v6: bool) -> u32 {
    if v6 {
        70
    } else {
        50
    }
}

fn family(v6: bool) -> &'static str {
    if v6 {
        "IPv6"
    } else {
        "IPv4"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rtnetlink::packet_route::address::{AddressFlags, AddressScope};

    fn addr(s: &str) -> LinkAddress {
        LinkAddress {
            addr: s.parse().unwrap(),
            scope: AddressScope::Universe,
            flags: AddressFlags::empty(),
        }
    }

    const BOTH: DefaultRoutes = DefaultRoutes { v4: true, v6: true };
    const V6_ONLY: DefaultRoutes = DefaultRoutes {
        v4: false,
        v6: true,
    };

    #[test]
    fn auto_takes_the_default_routes_family_and_prefers_ipv4() {
        use UnderlayChoice::*;
        assert_eq!(is_ipv6(Auto, None, BOTH), Ok(false));
        assert_eq!(is_ipv6(Auto, None, V6_ONLY), Ok(true));
        assert!(is_ipv6(Auto, None, DefaultRoutes::default())
            .unwrap_err()
            .contains("--underlay"));
        assert_eq!(
            is_ipv6(Auto, Some("fd00::1".parse().unwrap()), BOTH),
            Ok(true)
        );
        assert_eq!(is_ipv6(Ipv6, None, DefaultRoutes::default()), Ok(true));
        assert_eq!(is_ipv6(Ipv4, None, V6_ONLY), Ok(false));
    }

    #[test]
    fn auto_follows_no_default_route_of_a_family_without_an_address() {
        let v6_only = [addr("fe80::1"), addr("fd00:10::7")];
        assert_eq!(usable(BOTH, &v6_only), V6_ONLY);
        assert_eq!(
            is_ipv6(UnderlayChoice::Auto, None, usable(BOTH, &v6_only)),
            Ok(true)
        );
        let dual = [addr("10.0.0.7"), addr("fd00:10::7")];
        assert_eq!(usable(BOTH, &dual), BOTH);
    }

    #[test]
    fn a_tunnel_ip_of_the_other_family_is_refused_naming_both_flags() {
        let e = is_ipv6(
            UnderlayChoice::Ipv6,
            Some("10.0.0.1".parse().unwrap()),
            BOTH,
        )
        .unwrap_err();
        assert!(
            e.contains("--tunnel-ip 10.0.0.1") && e.contains("--underlay ipv6"),
            "{e}"
        );
        assert!(is_ipv6(UnderlayChoice::Ipv4, Some("fd00::1".parse().unwrap()), BOTH).is_err());
    }

    #[test]
    fn the_endpoint_is_the_uplinks_address_of_the_family() {
        let addrs = [addr("fe80::1"), addr("10.0.0.7"), addr("fd00:10::7")];
        assert_eq!(
            endpoint(false, None, &addrs, "eth0"),
            Ok("10.0.0.7".parse().unwrap())
        );
        assert_eq!(
            endpoint(true, None, &addrs, "eth0"),
            Ok("fd00:10::7".parse().unwrap())
        );
        let e = endpoint(true, None, &addrs[..2], "eth0").unwrap_err();
        assert!(
            e.contains("no IPv6 address") && e.contains("--tunnel-ip"),
            "{e}"
        );
        assert_eq!(overhead(true) - overhead(false), 20);
    }
}
