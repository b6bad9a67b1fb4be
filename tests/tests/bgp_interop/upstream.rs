use std::time::Duration;

use anyhow::Result;
use serde_json::Value;

use crate::lab::{ip, Kind, Lan, Router, RouterCfg};
use crate::{client_prefix, count_present, wait_until, CLUSTER};

/// Our reflector with two of our clients and `kind` as an upstream
/// non-client: the upstream receives every client route, reflected with
/// ORIGINATOR_ID/CLUSTER_LIST (checked for FRR and BIRD through their
/// detailed output); and `kind` announces a route our clients receive.
pub(crate) fn upstream_receives_every_route(kind: Kind) -> Result<()> {
    let mut lan = Lan::new()?;
    let rr = ip(1);
    let up = ip(254);
    let clients = [11u8, 12];
    let client_ips: Vec<_> = clients.iter().map(|c| ip(*c)).collect();
    let rr_cfg = RouterCfg::reflector(rr, &client_ips, &[up], vec![]);
    let upstream = lan.peer(kind, "up", up, &[rr], vec!["203.0.113.0/24".into()])?;
    let _rr = Router::start(Kind::Ours, lan.node("rr", rr)?, rr_cfg)?;
    let mut cs = Vec::new();
    for c in clients {
        cs.push(lan.peer(Kind::Ours, "c", ip(c), &[rr], vec![client_prefix(c)])?);
    }
    let want: Vec<String> = clients.iter().map(|c| client_prefix(*c)).collect();
    wait_until(
        "client routes at the upstream",
        Duration::from_secs(30),
        || Ok(count_present(&upstream, &want)? == want.len()),
    )?;
    match kind {
        Kind::Frr => {
            let v: Value = serde_json::from_str(
                &upstream.vtysh(&format!("show bgp ipv4 unicast {} json", want[0]))?,
            )?;
            let path = &v["paths"][0];
            assert_eq!(path["originatorId"], "10.99.0.11", "{v}");
            assert_eq!(path["clusterList"]["list"][0], CLUSTER, "{v}");
        }
        Kind::Bird => {
            let text = upstream.birdc(&["show", "route", &want[0], "all"])?;
            assert!(text.contains("BGP.originator_id: 10.99.0.11"), "{text}");
            assert!(
                text.contains(&format!("BGP.cluster_list: {CLUSTER}")),
                "{text}"
            );
        }
        _ => {}
    }
    for c in &cs {
        wait_until(
            "upstream route at our clients",
            Duration::from_secs(30),
            || Ok(c.routes()?.contains_key("203.0.113.0/24")),
        )?;
    }
    Ok(())
}
