//! The controller's port-grant metrics, from the last written pass: blocks
//! granted and draining and ports in use per (EIP, node), free blocks per
//! EIP, and which grants a policy's quota or an exhausted EIP holds back.

use egress_control::controller::ports::PortFacts;
use prometheus_client::{
    metrics::{family::Family, gauge::Gauge},
    registry::Registry,
};

type Labels = Vec<(String, String)>;

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn family(reg: &mut Registry, name: &str, help: &str) -> Family<Labels, Gauge> {
    let f = Family::<Labels, Gauge>::default();
    reg.register(name, help, f.clone());
    f
}

/// Registers the port metrics of `p`.
pub fn register(reg: &mut Registry, p: &PortFacts) {
    let granted = family(
        reg,
        "port_blocks_granted",
        "Port blocks a worker holds of an EIP (draining ones included)",
    );
    let draining = family(
        reg,
        "port_blocks_draining",
        "Port blocks a worker is emptying before they return to the pool",
    );
    let ports = family(
        reg,
        "ports_granted",
        "Ports of an EIP a worker may choose new flows' ports in",
    );
    let in_use = family(
        reg,
        "ports_in_use",
        "Ports of an EIP in use on a worker, as its agent last reported",
    );
    let quota = family(
        reg,
        "port_quota_reached",
        "1 while a policy's spec.maxPortsPerNode keeps a worker below the blocks its use asks for",
    );
    let refused = family(
        reg,
        "port_blocks_exhausted",
        "1 while an EIP has no free block for the blocks a worker's use asks for",
    );
    for w in p.workers.iter().flat_map(|g| g.iter()) {
        let l = labels(&[("gateway", &w.gateway), ("eip", &w.eip), ("node", &w.node)]);
        granted.get_or_create(&l).set(i64::from(w.granted));
        draining.get_or_create(&l).set(i64::from(w.draining));
        let active = i64::from(w.granted - w.draining) * i64::from(w.block_size);
        ports.get_or_create(&l).set(active);
        in_use.get_or_create(&l).set(i64::from(w.in_use));
        refused.get_or_create(&l).set(i64::from(w.refused));
        if let Some(policy) = &w.quota_reached {
            let mut l = l.clone();
            l.push(("policy".into(), policy.clone()));
            quota.get_or_create(&l).set(1);
        }
    }
    let free = family(
        reg,
        "port_blocks_free",
        "Port blocks of an EIP no worker holds",
    );
    let total = family(reg, "port_blocks_total", "Port blocks of an EIP");
    for a in &p.addresses {
        let l = labels(&[("gateway", &a.gateway), ("eip", &a.eip)]);
        free.get_or_create(&l).set(i64::from(a.free));
        total.get_or_create(&l).set(i64::from(a.total));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use egress_control::controller::ports::{AddressFact, PortFact};

    #[test]
    fn each_grant_names_its_eip_and_node() {
        let p = PortFacts {
            workers: vec![vec![PortFact {
                gateway: "g".into(),
                eip: "10.0.0.1".into(),
                node: "w1".into(),
                granted: 3,
                draining: 1,
                in_use: 40,
                block_size: 64,
                quota_reached: Some("default/p".into()),
                refused: true,
            }]
            .into()],
            addresses: vec![AddressFact {
                gateway: "g".into(),
                eip: "10.0.0.1".into(),
                total: 1008,
                free: 0,
            }],
        };
        let mut reg = Registry::with_prefix("egress");
        register(&mut reg, &p);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &reg).unwrap();
        let l = "{gateway=\"g\",eip=\"10.0.0.1\",node=\"w1\"}";
        for line in [
            format!("egress_port_blocks_granted{l} 3"),
            format!("egress_port_blocks_draining{l} 1"),
            format!("egress_ports_granted{l} 128"),
            format!("egress_ports_in_use{l} 40"),
            format!("egress_port_blocks_exhausted{l} 1"),
            "egress_port_quota_reached{gateway=\"g\",eip=\"10.0.0.1\",node=\"w1\",policy=\"default/p\"} 1".into(),
            "egress_port_blocks_free{gateway=\"g\",eip=\"10.0.0.1\"} 0".into(),
        ] {
            assert!(text.lines().any(|t| t == line), "no {line} in\n{text}");
        }
    }
}
