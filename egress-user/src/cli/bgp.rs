//! BGP settings shared by the roles that run a speaker, and `egress bgp status`.

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    time::Duration,
};

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use egress_bgp::{
    gr::GrConfig,
    speaker::{PeerSpec, SpeakerConfig, Status},
};

/// `--bgp-*` flags.
#[derive(Debug, Clone, Args)]
pub struct BgpArgs {
    /// Our AS number (2- or 4-octet).
    #[arg(long = "bgp-asn", env = "EGRESS_BGP_ASN", default_value_t = 64512)]
    pub asn: u32,
    /// BGP identifier; defaults to the first IPv4 address of --bgp-listen.
    /// An IPv6 address stands for its last 32 bits (an IPv6-only pod's).
    #[arg(long = "bgp-router-id", env = "EGRESS_BGP_ROUTER_ID", value_parser = parse_router_id)]
    pub router_id: Option<Ipv4Addr>,
    /// Cluster id shared by every reflector of the cluster (RFC 4456); defaults to the router id.
    #[arg(long = "bgp-cluster-id", env = "EGRESS_BGP_CLUSTER_ID")]
    pub cluster_id: Option<Ipv4Addr>,
    /// Address and port to accept sessions on.
    #[arg(
        long = "bgp-listen",
        env = "EGRESS_BGP_LISTEN",
        default_value = "0.0.0.0:179"
    )]
    pub listen: SocketAddr,
    /// A neighbour: `ADDR,asn=N[,port=N][,client][,passive][,next-hop-self][,no-add-path]`.
    /// Non-clients are offered ADD-PATH Send unless `no-add-path`. Repeat for more.
    #[arg(long = "bgp-peer", value_parser = parse_peer)]
    pub peers: Vec<PeerSpec>,
    /// Hold time offered in OPEN, seconds (0, or 3 and more).
    #[arg(long = "bgp-hold-time", default_value_t = 90)]
    pub hold_time: u16,
    /// Keepalive interval, seconds; 0 means a third of the negotiated hold time.
    #[arg(long = "bgp-keepalive-time", default_value_t = 0)]
    pub keepalive_time: u16,
    /// TCP-MD5 password (RFC 2385) for every session without its own: the
    /// configured peers and the clients found in the datastore (the agents
    /// must be given the same one).
    #[arg(
        long = "bgp-password",
        env = "EGRESS_BGP_PASSWORD",
        hide_env_values = true
    )]
    pub password: Option<String>,
    /// Graceful restart time we ask peers to keep our routes for, seconds (RFC 4724); 0 turns GR off.
    #[arg(long = "bgp-graceful-restart-time", default_value_t = 120)]
    pub graceful_restart_time: u16,
    /// Long-lived graceful restart (RFC 9494): seconds peers keep our routes
    /// as LLGR_STALE (least preferred) after the restart time, up to
    /// 16777215; 0 turns it off. With --bgp-graceful-restart-time 0 peers go
    /// straight to long-lived stale.
    #[arg(long = "bgp-long-lived-stale-time", default_value_t = 0)]
    pub long_lived_stale_time: u32,
}

/// Parses `ADDR,asn=N[,port=N][,client][,passive][,next-hop-self][,add-path|,no-add-path]`.
/// Upstream (non-client) peers are offered ADD-PATH Send by default, so a
/// router with `maximum-paths` gets every gateway of an EIP; clients not,
/// unless `add-path` is given.
/// `--bgp-router-id`: an IPv4 address, or an IPv6 one for its last 32 bits.
pub fn parse_router_id(s: &str) -> Result<Ipv4Addr, String> {
    let addr: IpAddr = s
        .parse()
        .map_err(|_| format!("{s:?} is not an IP address"))?;
    let id = egress_bgp::types::router_id_from(addr);
    if id.is_unspecified() {
        return Err(format!(
            "{s}: a BGP identifier must not be zero (of an IPv6 address, its last 32 bits are used)"
        ));
    }
    Ok(id)
}

pub fn parse_peer(s: &str) -> Result<PeerSpec, String> {
    let mut parts = s.split(',');
    let addr: IpAddr = parts
        .next()
        .unwrap_or("")
        .parse()
        .map_err(|_| format!("peer {s:?}: the first field must be an IP address"))?;
    let mut asn = None;
    let mut spec = PeerSpec::new(addr, 0);
    let mut add_path = None;
    for part in parts {
        match part.split_once('=') {
            Some(("asn", v)) => {
                asn = Some(
                    v.parse()
                        .map_err(|_| format!("peer {s:?}: asn {v:?} is not a number"))?,
                )
            }
            Some(("port", v)) => {
                spec.port = v
                    .parse()
                    .map_err(|_| format!("peer {s:?}: port {v:?} is not a port"))?
            }
            None if part == "client" => spec.client = true,
            None if part == "passive" => spec.passive = true,
            None if part == "next-hop-self" => spec.next_hop_self = true,
            None if part == "add-path" => add_path = Some(true),
            None if part == "no-add-path" => add_path = Some(false),
            _ => {
                return Err(format!(
                "peer {s:?}: unknown option {part:?} (asn=, port=, client, passive, next-hop-self, add-path, no-add-path)"
            ))
            }
        }
    }
    spec.add_path_send = add_path.unwrap_or(!spec.client);
    spec.asn = asn.ok_or_else(|| format!("peer {s:?}: asn=N is required"))?;
    Ok(spec)
}

impl BgpArgs {
    /// The speaker configuration, or an error naming the flag that cannot work.
    pub fn speaker_config(&self, fallback_router_id: Option<Ipv4Addr>) -> Result<SpeakerConfig> {
        let router_id = match (self.router_id, self.listen.ip(), fallback_router_id) {
            (Some(id), _, _) => id,
            (None, IpAddr::V4(a), _) if !a.is_unspecified() => a,
            (None, _, Some(id)) => id,
            _ => {
                bail!("--bgp-router-id is required when --bgp-listen is a wildcard or IPv6 address")
            }
        };
        if self.hold_time == 1 || self.hold_time == 2 {
            bail!(
                "--bgp-hold-time {}: must be 0 or at least 3 seconds (RFC 4271 4.2)",
                self.hold_time
            );
        }
        let mut cfg = SpeakerConfig::new(self.asn, router_id);
        cfg.cluster_id = self.cluster_id;
        cfg.listen = Some(self.listen);
        cfg.hold_time = self.hold_time;
        cfg.keepalive_time = self.keepalive_time;
        cfg.connect_retry = Duration::from_secs(2);
        cfg.peers = self.peers.clone();
        // Also for peers added at run time (the clients from the datastore).
        cfg.default_password = self.password.clone();
        if self.long_lived_stale_time > 0x00ff_ffff {
            bail!(
                "--bgp-long-lived-stale-time {}: at most 16777215 seconds (24 bits in the capability)",
                self.long_lived_stale_time
            );
        }
        if self.graceful_restart_time == 0 && self.long_lived_stale_time == 0 {
            cfg.graceful_restart = None;
            cfg.restarting = false;
        } else {
            if self.graceful_restart_time > 4095 {
                bail!("--bgp-graceful-restart-time {}: at most 4095 seconds (12 bits in the capability)", self.graceful_restart_time);
            }
            cfg.graceful_restart = Some(GrConfig {
                restart_time: self.graceful_restart_time,
                llgr_stale_time: self.long_lived_stale_time,
                ..GrConfig::default()
            });
        }
        Ok(cfg)
    }
}

#[derive(Debug, Subcommand)]
pub enum BgpCommand {
    /// Sessions, their states and prefix counts of a running speaker.
    Status {
        /// The admin endpoint of the process running the speaker.
        #[arg(long, default_value = "127.0.0.1:9464")]
        admin_addr: SocketAddr,
        #[arg(long)]
        json: bool,
    },
}

pub async fn run(cmd: BgpCommand) -> Result<()> {
    match cmd {
        BgpCommand::Status { admin_addr, json } => {
            let body = crate::admin::get(admin_addr, "/bgp/status").await?;
            if json {
                println!("{body}");
                return Ok(());
            }
            let status: serde_json::Value =
                serde_json::from_str(&body).context("decoding /bgp/status")?;
            print!("{}", format_status(&status));
            Ok(())
        }
    }
}

/// The status as the table operators read.
pub fn format_status(s: &serde_json::Value) -> String {
    let mut out = format!(
        "AS {}  router id {}  cluster id {}  best routes {}{}\n",
        s["local_asn"],
        s["router_id"].as_str().unwrap_or("?"),
        s["cluster_id"].as_str().unwrap_or("?"),
        s["best_routes"],
        if s["deferring"] == true {
            "  (deferring selection after restart)"
        } else {
            ""
        }
    );
    out.push_str(&format!(
        "{:<40} {:>10} {:<7} {:<12} {:>8} {:>8} {:>6}\n",
        "PEER", "AS", "CLIENT", "STATE", "RCVD", "SENT", "STALE"
    ));
    for p in s["peers"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "{:<40} {:>10} {:<7} {:<12} {:>8} {:>8} {:>6}\n",
            p["address"].as_str().unwrap_or("?"),
            p["asn"].to_string(),
            if p["client"] == true { "yes" } else { "no" },
            p["state"].as_str().unwrap_or("?"),
            p["received"].to_string(),
            p["advertised"].to_string(),
            p["stale"].to_string()
        ));
    }
    for p in s["peers"].as_array().into_iter().flatten() {
        let shared: Vec<&str> = p["bgp_id_shared_with"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|o| o.as_str())
            .collect();
        if !shared.is_empty() {
            out.push_str(&format!(
                "warning: {} has BGP identifier {}, as {} has: routes reflected between them are dropped as looped\n",
                p["address"].as_str().unwrap_or("?"),
                p["bgp_id"].as_str().unwrap_or("?"),
                shared.join(", ")
            ));
        }
    }
    out
}

/// Serializable status for the admin endpoint.
pub fn status_json(status: &Status) -> serde_json::Value {
    serde_json::to_value(status).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_table_warns_of_a_shared_bgp_identifier() {
        let peer = |a: &str, other: &str| {
            serde_json::json!({"address": a, "asn": 64512, "client": true, "state": "Established",
                "received": 0, "advertised": 0, "stale": 0, "bgp_id": "0.0.0.7",
                "bgp_id_shared_with": [other]})
        };
        let s = serde_json::json!({"local_asn": 64512, "router_id": "10.0.0.9", "cluster_id": "10.0.0.9",
            "deferring": false, "best_routes": 0,
            "peers": [peer("fd00:1::7", "fd00:2::7"), peer("fd00:2::7", "fd00:1::7")]});
        let table = format_status(&s);
        let warnings: Vec<&str> = table
            .lines()
            .filter(|l| l.starts_with("warning:"))
            .collect();
        assert_eq!(warnings.len(), 2, "{table}");
        assert!(
            warnings[0].contains("fd00:1::7 has BGP identifier 0.0.0.7, as fd00:2::7 has"),
            "{table}"
        );
    }

    #[test]
    fn status_table_has_one_aligned_row_per_peer() {
        let s = serde_json::json!({"local_asn": 64512, "router_id": "10.0.0.9", "cluster_id": "10.0.0.9",
            "deferring": false, "best_routes": 3, "peers": [
            {"address": "10.0.0.1", "asn": 64512, "client": true, "state": "Established", "received": 2, "advertised": 1, "stale": 0}]});
        let table = format_status(&s);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 3, "{table}");
        assert!(
            lines[2].starts_with("10.0.0.1 ") && lines[2].contains("Established"),
            "{table}"
        );
        assert_eq!(
            lines[1].find("STATE"),
            lines[2].find("Established"),
            "columns misaligned:\n{table}"
        );
    }

    #[test]
    fn peer_with_all_options_parses() {
        let p = parse_peer("10.0.0.1,asn=65001,port=1179,client,passive,next-hop-self").unwrap();
        assert_eq!(p.address, "10.0.0.1".parse::<IpAddr>().unwrap());
        assert_eq!(
            (p.asn, p.port, p.client, p.passive, p.next_hop_self),
            (65001, 1179, true, true, true)
        );
    }

    #[test]
    fn upstream_peers_get_add_path_send_by_default_and_clients_do_not() {
        let send = |s: &str| parse_peer(s).unwrap().add_path_send;
        assert!(send("10.0.0.1,asn=65001"));
        assert!(!send("10.0.0.1,asn=65001,no-add-path"));
        assert!(!send("10.0.0.1,asn=65000,client"));
        assert!(send("10.0.0.1,asn=65000,client,add-path"));
    }

    #[test]
    fn peer_errors_name_the_field() {
        assert!(parse_peer("nope,asn=1").unwrap_err().contains("IP address"));
        assert!(parse_peer("10.0.0.1")
            .unwrap_err()
            .contains("asn=N is required"));
        assert!(parse_peer("10.0.0.1,asn=x")
            .unwrap_err()
            .contains("asn \"x\""));
        assert!(parse_peer("10.0.0.1,asn=1,bogus")
            .unwrap_err()
            .contains("unknown option \"bogus\""));
    }

    fn args() -> BgpArgs {
        BgpArgs {
            asn: 64512,
            router_id: None,
            cluster_id: None,
            listen: "10.0.0.9:179".parse().unwrap(),
            peers: vec![],
            hold_time: 90,
            keepalive_time: 0,
            password: None,
            graceful_restart_time: 120,
            long_lived_stale_time: 0,
        }
    }

    #[test]
    fn long_lived_stale_time_turns_llgr_on_even_without_restart_time() {
        let gr = |restart, llgr| {
            BgpArgs {
                graceful_restart_time: restart,
                long_lived_stale_time: llgr,
                ..args()
            }
            .speaker_config(None)
            .map(|c| {
                c.graceful_restart
                    .map(|g| (g.restart_time, g.llgr_stale_time))
            })
        };
        assert_eq!(gr(120, 0).unwrap(), Some((120, 0)));
        assert_eq!(gr(120, 3600).unwrap(), Some((120, 3600)));
        assert_eq!(gr(0, 3600).unwrap(), Some((0, 3600)));
        assert_eq!(gr(0, 0).unwrap(), None);
        assert!(gr(120, 1 << 24)
            .unwrap_err()
            .to_string()
            .contains("--bgp-long-lived-stale-time"));
    }

    #[test]
    fn the_password_covers_configured_peers_and_datastore_clients() {
        let mut own = parse_peer("10.0.0.2,asn=65000").unwrap();
        own.password = Some("their-own".into());
        let a = BgpArgs {
            password: Some("cluster".into()),
            peers: vec![own, parse_peer("10.0.0.3,asn=65000").unwrap()],
            ..args()
        };
        let cfg = a.speaker_config(None).unwrap();
        // Speaker::start gives peers without a key (and every peer added
        // later, such as the agents) the default one.
        assert_eq!(cfg.default_password.as_deref(), Some("cluster"));
        assert_eq!(cfg.peers[0].password.as_deref(), Some("their-own"));
        assert!(args()
            .speaker_config(None)
            .unwrap()
            .default_password
            .is_none());
    }

    #[test]
    fn a_router_id_may_be_given_as_an_ipv6_address() {
        assert_eq!(parse_router_id("10.0.0.9"), Ok(Ipv4Addr::new(10, 0, 0, 9)));
        assert_eq!(
            parse_router_id("fd00:10::a0b:c0d"),
            Ok(Ipv4Addr::new(10, 11, 12, 13))
        );
        for bad in ["fd00:10::", "0.0.0.0", "router"] {
            assert!(parse_router_id(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn router_id_defaults_to_the_listen_address_and_bad_values_are_named() {
        assert_eq!(
            args().speaker_config(None).unwrap().router_id,
            "10.0.0.9".parse::<Ipv4Addr>().unwrap()
        );
        let wildcard = BgpArgs {
            listen: "0.0.0.0:179".parse().unwrap(),
            ..args()
        };
        assert!(wildcard
            .speaker_config(None)
            .unwrap_err()
            .to_string()
            .contains("--bgp-router-id"));
        let hold = BgpArgs {
            hold_time: 2,
            ..args()
        };
        assert!(hold
            .speaker_config(None)
            .unwrap_err()
            .to_string()
            .contains("--bgp-hold-time"));
        let gr = BgpArgs {
            graceful_restart_time: 5000,
            ..args()
        };
        assert!(gr
            .speaker_config(None)
            .unwrap_err()
            .to_string()
            .contains("4095"));
        let no_gr = BgpArgs {
            graceful_restart_time: 0,
            ..args()
        };
        assert!(no_gr
            .speaker_config(None)
            .unwrap()
            .graceful_restart
            .is_none());
    }
}
