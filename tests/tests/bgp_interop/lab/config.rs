use std::net::SocketAddr;

use anyhow::Result;
use serde_json::{json, Value};

use super::{bird_proto, Kind, Router};
use crate::{ASN, CLUSTER};

impl Router {
    pub(super) fn write_config(&self) -> Result<()> {
        let c = &self.cfg;
        match self.kind {
            Kind::Ours => {
                let peers: Vec<Value> = c
                    .neighbors
                    .iter()
                    .map(|n| {
                        let own = if self.late_peers { None } else { self.password };
                        json!({"address": n.addr.to_string(), "asn": ASN, "client": n.client,
                            "password": own, "add_path_send": n.add_path})
                    })
                    .collect();
                let (peers, late_peers) = if self.late_peers {
                    (Vec::new(), peers)
                } else {
                    (peers, Vec::new())
                };
                let announce: Vec<Value> = c
                    .announce
                    .iter()
                    .map(|p| json!([p, c.me.to_string()]))
                    .collect();
                let doc = json!({
                    "asn": ASN, "router_id": c.router_id.to_string(), "cluster_id": c.cluster_id,
                    "listen": SocketAddr::new(c.me, 179).to_string(), "hold_time": 9, "restart_time": 30,
                    "restarting": true, "deferral_time": 15, "connect_retry_ms": 500,
                    "peers": peers, "announce": announce, "print_routes": false,
                    "late_peers": late_peers,
                    "default_password": if self.late_peers { self.password } else { None },
                    "status_file": self.dir.file("status.json"),
                    "command_file": self.dir.file("commands"),
                });
                std::fs::write(self.dir.file("speaker.json"), doc.to_string())?;
            }
            Kind::Frr => {
                let mut s = format!(
                    "frr defaults datacenter\nhostname r{me}\nrouter bgp {ASN}\n bgp router-id {me}\n \
                     no bgp ebgp-requires-policy\n no bgp network import-check\n bgp graceful-restart\n \
                     bgp graceful-restart restart-time 30\n bgp graceful-restart preserve-fw-state\n",
                    me = c.router_id
                );
                if let Some(id) = c.cluster_id {
                    s += &format!(" bgp cluster-id {id}\n");
                }
                for n in &c.neighbors {
                    s += &format!(
                        " neighbor {a} remote-as {ASN}\n neighbor {a} timers 3 9\n neighbor {a} timers connect 1\n",
                        a = n.addr
                    );
                    if let Some(pw) = self.password {
                        s += &format!(" neighbor {} password {pw}\n", n.addr);
                    }
                    // FRR offers RFC 8950 on its own only to unnumbered
                    // (link-local) neighbours.
                    if n.addr.is_ipv6() && n.ext_next_hop {
                        s += &format!(" neighbor {} capability extended-nexthop\n", n.addr);
                    }
                }
                s += " address-family ipv4 unicast\n";
                for n in &c.neighbors {
                    if n.addr.is_ipv6() {
                        s += &format!("  neighbor {} activate\n", n.addr);
                    }
                    if n.client {
                        s += &format!("  neighbor {} route-reflector-client\n", n.addr);
                    }
                }
                for p in c.announce.iter().filter(|p| !p.contains(':')) {
                    s += &format!("  network {p}\n");
                }
                s += " exit-address-family\n address-family ipv6 unicast\n";
                for n in &c.neighbors {
                    s += &format!("  neighbor {} activate\n", n.addr);
                    if n.client {
                        s += &format!("  neighbor {} route-reflector-client\n", n.addr);
                    }
                }
                for p in c.announce.iter().filter(|p| p.contains(':')) {
                    s += &format!("  network {p}\n");
                }
                s += " exit-address-family\n";
                std::fs::write(self.dir.file("bgpd.conf"), s)?;
            }
            Kind::Bird => {
                let (v6, v4): (Vec<&String>, Vec<&String>) =
                    c.announce.iter().partition(|p| p.contains(':'));
                let mut s = format!(
                    "router id {};\nprotocol device {{ }}\nprotocol static {{ ipv4;\n",
                    c.router_id
                );
                for p in v4 {
                    s += &format!("  route {p} blackhole;\n");
                }
                s += "}\n";
                if !v6.is_empty() {
                    s += "protocol static { ipv6;\n";
                    for p in v6 {
                        s += &format!("  route {p} blackhole;\n");
                    }
                    s += "}\n";
                }
                for n in &c.neighbors {
                    let rr = match (n.client, c.cluster_id) {
                        (true, Some(id)) => format!("  rr client;\n  rr cluster id {id};\n"),
                        (true, None) => "  rr client;\n".to_string(),
                        _ => String::new(),
                    };
                    let pw = self
                        .password
                        .map(|p| format!("  password \"{p}\";\n"))
                        .unwrap_or_default();
                    // Over IPv6, IPv4 routes need RFC 8950. Once the ipv4
                    // channel has it negotiated, BIRD takes the session's
                    // IPv6 source address as that channel's `next hop
                    // address` (the default; without it, the interface's
                    // IPv4 address), so its own routes go out by its IPv6
                    // address without `next hop self` or an explicit
                    // address. An IPv6 session carries IPv6 unicast too.
                    let export = "export where source ~ [RTS_STATIC, RTS_BGP];";
                    let (enh, v6_channel) = match (n.addr.is_ipv6(), n.ext_next_hop) {
                        (false, _) => ("", String::new()),
                        (true, on) => (
                            if on { " extended next hop on;" } else { "" },
                            format!("  ipv6 {{ import all; {export} }};\n"),
                        ),
                    };
                    s += &format!(
                        "protocol bgp {name} {{\n{pw}  local {me} as {ASN};\n  neighbor {a} as {ASN};\n  direct;\n  \
                         hold time 9;\n  keepalive time 3;\n  connect retry time 1;\n  graceful restart on;\n  \
                         graceful restart time 30;\n{rr}  ipv4 {{{enh} import all; {export} }};\n{v6_channel}}}\n",
                        name = bird_proto(n.addr),
                        me = c.me,
                        a = n.addr
                    );
                }
                std::fs::write(self.dir.file("bird.conf"), s)?;
            }
            Kind::Gobgp => {
                let mut s = format!(
                    "[global.config]\n  as = {ASN}\n  router-id = \"{id}\"\n  local-address-list = [\"{me}\"]\n",
                    id = c.router_id,
                    me = c.me
                );
                for n in &c.neighbors {
                    s += &format!(
                        "[[neighbors]]\n  [neighbors.config]\n    neighbor-address = \"{a}\"\n    peer-as = {ASN}\n{auth}  \
                         [neighbors.timers.config]\n    hold-time = 9\n    keepalive-interval = 3\n    connect-retry = 1\n  \
                         [neighbors.graceful-restart.config]\n    enabled = true\n    restart-time = 30\n",
                        a = n.addr,
                        auth = self
                            .password
                            .map(|p| format!("    auth-password = \"{p}\"\n"))
                            .unwrap_or_default()
                    );
                    if n.client {
                        s += &format!(
                            "  [neighbors.route-reflector.config]\n    route-reflector-client = true\n    \
                             route-reflector-cluster-id = \"{}\"\n",
                            c.cluster_id.unwrap_or(CLUSTER)
                        );
                    }
                    // GoBGP 3.10 offers the extended next hop capability
                    // for IPv4 unicast by itself, and announces its own
                    // IPv4 routes by the session's local address, an IPv6
                    // one here, in MP_REACH_NLRI. An IPv6 session carries
                    // IPv6 unicast too.
                    let families: &[&str] = if n.addr.is_ipv6() {
                        &["ipv4-unicast", "ipv6-unicast"]
                    } else {
                        &["ipv4-unicast"]
                    };
                    for f in families {
                        s += &format!(
                            "  [[neighbors.afi-safis]]\n    [neighbors.afi-safis.config]\n      afi-safi-name = \"{f}\"\n    \
                             [neighbors.afi-safis.mp-graceful-restart.config]\n      enabled = true\n"
                        );
                    }
                }
                std::fs::write(self.dir.file("gobgp.toml"), s)?;
            }
        }
        Ok(())
    }
}
