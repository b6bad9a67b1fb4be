//! On an IPv6 underlay the maps' 4-byte endpoint fields hold indexes into
//! `TUNNEL_ENDPOINTS`; `egress inspect` shows the addresses they stand for.

use std::{collections::BTreeMap, net::Ipv6Addr, path::Path};

use egress_common::endpoints::{index_of, TunnelEndpoint};
use serde_json::Value;

/// The snapshot's keys that hold a tunnel endpoint field.
const ENDPOINT_KEYS: [&str; 4] = [
    "node_tunnel_ip",
    "gateway_tunnel_ip",
    "worker_tunnel_ip",
    "tunnel_ip",
];

/// Rewrites, wherever `snapshot` holds an endpoint field (printed as the
/// four bytes it is), the index into the address `table` gives it; an
/// index without an address becomes "" (no endpoint).
pub fn name_endpoints(snapshot: &mut Value, table: &BTreeMap<u32, Ipv6Addr>) {
    match snapshot {
        Value::Object(m) => {
            for (k, v) in m.iter_mut() {
                match v {
                    Value::String(s) if ENDPOINT_KEYS.contains(&k.as_str()) => {
                        if let Ok(field) = s.parse::<std::net::Ipv4Addr>() {
                            let named = table.get(&index_of(field.octets()));
                            *s = named.map(|a| a.to_string()).unwrap_or_default();
                        }
                    }
                    _ => name_endpoints(v, table),
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|v| name_endpoints(v, table)),
        _ => {}
    }
}

/// The pinned `TUNNEL_ENDPOINTS`: index -> address, used entries only.
pub fn read_table(pin_dir: &Path) -> anyhow::Result<BTreeMap<u32, Ipv6Addr>> {
    let pin = pin_dir.join(egress_common::maps::TUNNEL_ENDPOINTS);
    let data = aya::maps::MapData::from_pin(&pin)?;
    let a: aya::maps::Array<_, TunnelEndpoint> =
        aya::maps::Array::try_from(aya::maps::Map::from_map_data(data)?)?;
    let mut out = BTreeMap::new();
    for (i, e) in a.iter().enumerate() {
        let e = e?;
        if e.addr != [0; 16] {
            out.insert(i as u32, Ipv6Addr::from(e.addr));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use egress_common::endpoints::field_of;
    use serde_json::json;

    #[test]
    fn indexes_become_the_addresses_they_stand_for() {
        let shown = |i: u32| std::net::Ipv4Addr::from(field_of(i)).to_string();
        let table = BTreeMap::from([
            (1, "fd00::3".parse().unwrap()),
            (7, "fd00::4".parse().unwrap()),
        ]);
        let mut snap = json!({
            "config": {"node_tunnel_ip": shown(1), "vni": 7},
            "routes": [{"eip": "10.0.0.200", "tunnel_ip": shown(7)}],
            "reply_steering": [{"worker_tunnel_ip": shown(9)}],
        });
        name_endpoints(&mut snap, &table);
        assert_eq!(snap["config"]["node_tunnel_ip"], "fd00::3");
        assert_eq!(snap["config"]["vni"], 7);
        assert_eq!(snap["routes"][0]["tunnel_ip"], "fd00::4");
        assert_eq!(
            snap["routes"][0]["eip"], "10.0.0.200",
            "not an endpoint field"
        );
        assert_eq!(
            snap["reply_steering"][0]["worker_tunnel_ip"], "",
            "no address: none"
        );
    }
}
