//! Which interface is the underlay when the operator does not name one: the
//! output interface of the node's IPv4 default route (the main table's
//! lowest-metric one), as CNIs and kube-proxy pick the node address.

use anyhow::{Context, Result};
use rtnetlink::packet_route::route::{RouteAttribute, RouteMessage, RouteType};

/// Main routing table id.
const RT_TABLE_MAIN: u32 = 254;

/// The output interface of the best IPv4 default route among `routes`.
pub fn default_route_oif(routes: &[RouteMessage]) -> Option<u32> {
    routes
        .iter()
        .filter(|r| r.header.destination_prefix_length == 0 && r.header.kind == RouteType::Unicast)
        .filter_map(|r| {
            let mut table = u32::from(r.header.table);
            let (mut oif, mut metric) = (None, 0);
            for a in &r.attributes {
                match a {
                    RouteAttribute::Oif(i) => oif = Some(*i),
                    RouteAttribute::Priority(p) => metric = *p,
                    RouteAttribute::Table(t) => table = *t,
                    _ => {}
                }
            }
            (table == RT_TABLE_MAIN)
                .then_some(oif?)
                .map(|i| (metric, i))
        })
        .min()
        .map(|(_, i)| i)
}

/// The name of the interface the IPv4 default route leaves by.
pub async fn default_route_interface(handle: &rtnetlink::Handle) -> Result<String> {
    use futures::TryStreamExt;
    let req = rtnetlink::RouteMessageBuilder::<std::net::Ipv4Addr>::new().build();
    let routes: Vec<RouteMessage> = handle.route().get(req).execute().try_collect().await?;
    let index = default_route_oif(&routes)
        .context("no IPv4 default route in the main table to pick the uplink from; set --uplink")?;
    let mut links = handle.link().get().match_index(index).execute();
    let msg = links
        .try_next()
        .await?
        .with_context(|| format!("the default route's interface {index} vanished"))?;
    Ok(super::link::ObservedLink::from_message(&msg).name)
}

/// Which families have a default route in the main table (for
/// `--underlay auto`).
pub async fn default_route_families(
    handle: &rtnetlink::Handle,
) -> Result<crate::agent::underlay::DefaultRoutes> {
    use futures::TryStreamExt;
    let v4 = rtnetlink::RouteMessageBuilder::<std::net::Ipv4Addr>::new().build();
    let v6 = rtnetlink::RouteMessageBuilder::<std::net::Ipv6Addr>::new().build();
    let v4: Vec<RouteMessage> = handle.route().get(v4).execute().try_collect().await?;
    let v6: Vec<RouteMessage> = handle.route().get(v6).execute().try_collect().await?;
    Ok(crate::agent::underlay::DefaultRoutes {
        v4: default_route_oif(&v4).is_some(),
        v6: default_route_oif(&v6).is_some(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(prefix: u8, table: u32, oif: u32, metric: Option<u32>) -> RouteMessage {
        let mut r = RouteMessage::default();
        r.header.destination_prefix_length = prefix;
        r.header.kind = RouteType::Unicast;
        r.header.table = table.min(255) as u8;
        r.attributes.push(RouteAttribute::Table(table));
        r.attributes.push(RouteAttribute::Oif(oif));
        if let Some(m) = metric {
            r.attributes.push(RouteAttribute::Priority(m));
        }
        r
    }

    #[test]
    fn picks_the_main_tables_lowest_metric_default_route() {
        let cases = [
            (vec![route(0, 254, 2, None)], Some(2)),
            (
                vec![route(24, 254, 3, None), route(0, 254, 2, None)],
                Some(2),
            ),
            (
                vec![route(0, 254, 5, Some(600)), route(0, 254, 4, Some(100))],
                Some(4),
            ),
            // A policy-routing table's default route is not the node's.
            (
                vec![route(0, 100, 7, None), route(0, 254, 2, Some(10))],
                Some(2),
            ),
            (vec![route(0, 100, 7, None)], None),
            (vec![route(16, 254, 3, None)], None),
            (vec![], None),
        ];
        for (routes, want) in cases {
            assert_eq!(default_route_oif(&routes), want, "{routes:?}");
        }
    }

    #[test]
    fn blackhole_defaults_are_not_interfaces() {
        let mut r = route(0, 254, 9, None);
        r.header.kind = RouteType::BlackHole;
        assert_eq!(default_route_oif(&[r]), None);
    }
}
