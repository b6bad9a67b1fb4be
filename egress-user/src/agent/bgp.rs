//! The agent as a BGP speaker: it peers with every reflector, announces its
//! pod CIDRs and the EIPs it may announce right now (next hop: its tunnel
//! address), withdraws an EIP the moment it loses it, and keeps the routes
//! it learns for the operator and the datapath.

use super::routes::Learned;
use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr},
    sync::{Arc, Mutex},
};

use anyhow::{Context, Result};
use egress_bgp::{
    rib::BestChange,
    speaker::{PeerSpec, Speaker, SpeakerConfig, SpeakerHandle},
    types::Prefix,
};
use egress_control::api::NodeRecord;
use ipnet::IpNet;

/// The BGP identifier of a node without `--bgp-router-id`: its IPv4 tunnel
/// address, or on an IPv6 underlay the last 32 bits of its IPv6 one (give
/// the flag where those do not tell the nodes apart: two clients of one
/// reflector with the same identifier drop each other's routes as looped).
pub fn default_router_id(tunnel_ip: IpAddr) -> Ipv4Addr {
    egress_bgp::types::router_id_from(tunnel_ip)
}

/// Where the agent's speaker connects.
#[derive(Clone, Debug)]
pub struct AgentBgpConfig {
    pub asn: u32,
    /// None: [`default_router_id`].
    pub router_id: Option<Ipv4Addr>,
    pub reflectors: Vec<(IpAddr, u16)>,
    pub hold_time: u16,
    pub graceful_restart_time: u16,
    /// TCP-MD5 (RFC 2385) key of the sessions with the reflectors.
    pub password: Option<String>,
}

/// The pod CIDRs this node announces: the `--pod-cidr` flags, or, without
/// them, the ones the datastore knows for the node (a Kubernetes Node's
/// `spec.podCIDRs`, which is how the chart's DaemonSet learns them).
/// Entries that are not CIDRs are skipped (validation reports them).
pub fn node_pod_cidrs(flags: &[IpNet], nodes: &[NodeRecord], node: &str) -> Vec<IpNet> {
    if !flags.is_empty() {
        return flags.to_vec();
    }
    nodes
        .iter()
        .filter(|n| n.name == node)
        .flat_map(|n| &n.pod_cidrs)
        .filter_map(|c| c.parse().ok())
        .collect()
}

/// What the agent should announce: its pod CIDRs and the EIPs it may
/// announce now, all with its tunnel address as next hop.
pub fn wanted_routes(
    pod_cidrs: &[IpNet],
    eips: &BTreeMap<IpAddr, u64>,
    next_hop: IpAddr,
) -> BTreeMap<Prefix, Route> {
    // An MP_REACH next hop must be of the prefix's family: IPv6 prefixes get
    // the IPv4-mapped form of an IPv4 tunnel address (RFC 4798).
    let for_family = |v6: bool| match (v6, next_hop) {
        (true, IpAddr::V4(a)) => IpAddr::V6(a.to_ipv6_mapped()),
        _ => next_hop,
    };
    let mut out = BTreeMap::new();
    for c in pod_cidrs {
        if let Ok(p) = Prefix::new(c.network(), c.prefix_len()) {
            let next_hop = for_family(c.network().is_ipv6());
            out.insert(
                p,
                Route {
                    next_hop,
                    local_pref: BASE_LOCAL_PREF,
                },
            );
        }
    }
    for (eip, epoch) in eips {
        let len = if eip.is_ipv4() { 32 } else { 128 };
        if let Ok(p) = Prefix::new(*eip, len) {
            let next_hop = for_family(eip.is_ipv6());
            out.insert(
                p,
                Route {
                    next_hop,
                    local_pref: eip_local_pref(*epoch),
                },
            );
        }
    }
    out
}

/// LOCAL_PREF of ordinary announcements (the BGP default).
pub const BASE_LOCAL_PREF: u32 = 100;

/// An EIP's LOCAL_PREF grows with its assignment's epoch, so the newest
/// owner's route wins at every router even while the old owner's route is
/// still held (a dead gateway's session lingers until its hold time, and
/// graceful restart keeps its routes as stale after that).
pub fn eip_local_pref(epoch: u64) -> u32 {
    BASE_LOCAL_PREF.saturating_add(u32::try_from(epoch).unwrap_or(u32::MAX))
}

/// One announcement: where to, and how much it is preferred.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Route {
    pub next_hop: IpAddr,
    pub local_pref: u32,
}

/// The difference between what is announced and what should be.
pub fn route_diff(
    have: &BTreeMap<Prefix, Route>,
    want: &BTreeMap<Prefix, Route>,
) -> (Vec<(Prefix, Route)>, Vec<Prefix>) {
    let announce = want
        .iter()
        .filter(|(p, nh)| have.get(p) != Some(nh))
        .map(|(p, nh)| (*p, *nh))
        .collect();
    let withdraw = have
        .keys()
        .filter(|p| !want.contains_key(p))
        .copied()
        .collect();
    (announce, withdraw)
}

/// The reflector addresses the agent peers with: those of its tunnel
/// endpoint's family. A reflector knows a node as a client by the first
/// address it registered, its tunnel endpoint (see `reflector_clients`); a
/// session from an address of the other family would never come up.
pub fn session_family(all: &[(IpAddr, u16)], ipv6_underlay: bool) -> Result<Vec<(IpAddr, u16)>> {
    let same: Vec<_> = all
        .iter()
        .filter(|(a, _)| a.is_ipv6() == ipv6_underlay)
        .copied()
        .collect();
    let family = if ipv6_underlay { "IPv6" } else { "IPv4" };
    anyhow::ensure!(
        !same.is_empty(),
        "--bgp-reflectors: none of {all:?} is an {family} address; on an {family} underlay \
         the reflectors know this node by its {family} tunnel endpoint"
    );
    Ok(same)
}

/// The agent's neighbours: the reflectors at `addrs`, with the cluster's
/// TCP-MD5 key.
pub fn reflector_peers(cfg: &AgentBgpConfig, addrs: &[(IpAddr, u16)]) -> Vec<PeerSpec> {
    addrs
        .iter()
        .map(|(addr, port)| PeerSpec {
            port: *port,
            password: cfg.password.clone(),
            ..PeerSpec::new(*addr, cfg.asn)
        })
        .collect()
}

pub struct AgentBgp {
    handle: SpeakerHandle,
    _speaker: Speaker,
    announced: BTreeMap<Prefix, Route>,
    learned: Arc<Mutex<BTreeMap<Prefix, Learned>>>,
    /// Woken on every change of `learned` (the agent reconciles ROUTES).
    learned_changed: Arc<tokio::sync::Notify>,
}

impl AgentBgp {
    pub async fn start(cfg: &AgentBgpConfig, tunnel_ip: IpAddr) -> Result<Self> {
        let router_id = cfg
            .router_id
            .unwrap_or_else(|| default_router_id(tunnel_ip));
        anyhow::ensure!(
            !router_id.is_unspecified(),
            "--bgp-router-id is needed: the tunnel endpoint {tunnel_ip} gives no usable BGP identifier \
             (its last 32 bits are zero)"
        );
        let mut sc = SpeakerConfig::new(cfg.asn, router_id);
        // Agents only connect out: they never take port 179 on the host.
        sc.listen = None;
        sc.hold_time = cfg.hold_time;
        // A reflector learns a new node from the datastore a moment after the
        // agent starts: retry soon rather than after the usual 5 s.
        sc.connect_retry = std::time::Duration::from_secs(1);
        sc.graceful_restart = if cfg.graceful_restart_time == 0 {
            None
        } else {
            Some(egress_bgp::gr::GrConfig {
                restart_time: cfg.graceful_restart_time,
                ..Default::default()
            })
        };
        sc.restarting = sc.graceful_restart.is_some();
        let reflectors = session_family(&cfg.reflectors, tunnel_ip.is_ipv6())?;
        sc.peers = reflector_peers(cfg, &reflectors);
        let speaker = Speaker::start(sc)
            .await
            .context("starting the agent's BGP speaker")?;
        let handle = speaker.handle();
        let learned = Arc::new(Mutex::new(BTreeMap::new()));
        let mut changes = handle.subscribe().await?;
        let sink = learned.clone();
        let learned_changed = Arc::new(tokio::sync::Notify::new());
        let wake = learned_changed.clone();
        tokio::spawn(async move {
            while let Some(ch) = changes.recv().await {
                {
                    let mut table = sink.lock().unwrap();
                    match ch {
                        // Our own announcements come back with `from: None`; keep only learned ones.
                        BestChange::Set {
                            prefix,
                            next_hop,
                            from: Some(_),
                            local_pref,
                        } => {
                            table.insert(
                                prefix,
                                Learned {
                                    next_hop,
                                    local_pref,
                                },
                            );
                        }
                        BestChange::Set { prefix, .. } | BestChange::Removed { prefix } => {
                            table.remove(&prefix);
                        }
                    }
                }
                wake.notify_one();
            }
        });
        Ok(Self {
            handle,
            _speaker: speaker,
            announced: BTreeMap::new(),
            learned,
            learned_changed,
        })
    }

    /// Announces and withdraws until the speaker carries exactly `want`.
    pub async fn sync(&mut self, want: &BTreeMap<Prefix, Route>) -> Result<()> {
        let (announce, withdraw) = route_diff(&self.announced, want);
        for p in withdraw {
            self.handle.withdraw(p).await?;
            self.announced.remove(&p);
            tracing::info!(prefix = %p, "BGP: withdrawn");
        }
        for (p, r) in announce {
            self.handle
                .announce_with_local_pref(p, r.next_hop, r.local_pref)
                .await?;
            self.announced.insert(p, r);
            tracing::info!(prefix = %p, next_hop = %r.next_hop, local_pref = r.local_pref, "BGP: announced");
        }
        Ok(())
    }

    /// Routes learned from the reflectors (prefix -> next hop), kept current
    /// by the speaker's change stream.
    pub fn learned(&self) -> Arc<Mutex<BTreeMap<Prefix, Learned>>> {
        self.learned.clone()
    }

    /// Notified whenever the learned routes change.
    pub fn learned_changed(&self) -> Arc<tokio::sync::Notify> {
        self.learned_changed.clone()
    }

    pub fn handle(&self) -> &SpeakerHandle {
        &self.handle
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Prefix {
        s.parse().unwrap()
    }

    const NH: &str = "10.10.0.3";

    fn nh() -> IpAddr {
        NH.parse().unwrap()
    }

    #[test]
    fn pod_cidrs_come_from_the_flags_else_from_the_node_record() {
        let node = |name: &str, cidrs: &[&str]| NodeRecord {
            name: name.into(),
            pod_cidrs: cidrs.iter().map(|c| c.to_string()).collect(),
            ..Default::default()
        };
        let nodes = [
            node("w1", &["10.244.1.0/24", "fd00:244:1::/64", "not-a-cidr"]),
            node("w2", &["10.244.2.0/24"]),
        ];
        let from_record: Vec<String> = node_pod_cidrs(&[], &nodes, "w1")
            .iter()
            .map(|c| c.to_string())
            .collect();
        assert_eq!(from_record, ["10.244.1.0/24", "fd00:244:1::/64"]);
        let flag: IpNet = "10.9.0.0/24".parse().unwrap();
        assert_eq!(node_pod_cidrs(&[flag], &nodes, "w1"), [flag]);
        assert!(node_pod_cidrs(&[], &nodes, "w3").is_empty());
    }

    #[test]
    fn pod_cidrs_and_eips_are_announced_via_the_node() {
        let eips = BTreeMap::from([
            ("10.10.0.200".parse().unwrap(), 7),
            ("fd00:10::200".parse().unwrap(), 7),
        ]);
        let w = wanted_routes(&["10.244.3.0/24".parse().unwrap()], &eips, nh());
        assert_eq!(w.len(), 3);
        assert_eq!(w[&p("10.10.0.200/32")].next_hop, nh());
        let mapped: IpAddr = "::ffff:10.10.0.3".parse().unwrap();
        assert_eq!(
            w[&p("fd00:10::200/128")].next_hop,
            mapped,
            "IPv6 routes need an IPv6 next hop"
        );
        assert_eq!(
            w[&p("10.244.3.0/24")],
            Route {
                next_hop: nh(),
                local_pref: BASE_LOCAL_PREF
            }
        );
    }

    #[test]
    fn every_reflector_session_carries_the_password() {
        let mut cfg = AgentBgpConfig {
            asn: 64512,
            router_id: None,
            reflectors: vec![
                ("10.10.0.250".parse().unwrap(), 179),
                ("10.10.0.251".parse().unwrap(), 1179),
            ],
            hold_time: 90,
            graceful_restart_time: 120,
            password: Some("s3cret".into()),
        };
        let peers = reflector_peers(&cfg, &cfg.reflectors);
        assert_eq!(peers.len(), 2);
        assert!(peers
            .iter()
            .all(|p| p.password.as_deref() == Some("s3cret")));
        assert_eq!(peers[1].port, 1179);
        cfg.password = None;
        assert!(reflector_peers(&cfg, &cfg.reflectors)
            .iter()
            .all(|p| p.password.is_none()));
    }

    #[test]
    fn reflectors_are_peered_in_the_underlay_family() {
        let r = |s: &str| (s.parse().unwrap(), 179);
        let both = [r("fd00:10::254"), r("10.10.0.254")];
        assert_eq!(session_family(&both, false).unwrap(), [r("10.10.0.254")]);
        assert_eq!(session_family(&both, true).unwrap(), [r("fd00:10::254")]);
        let err = session_family(&[r("10.10.0.254")], true).unwrap_err();
        assert!(err.to_string().contains("IPv6 address"), "{err}");
    }

    #[test]
    fn the_router_id_comes_from_the_tunnel_endpoint() {
        assert_eq!(default_router_id(nh()), NH.parse::<Ipv4Addr>().unwrap());
        let v6: IpAddr = "fd00:100::a0b:c0d".parse().unwrap();
        assert_eq!(default_router_id(v6), Ipv4Addr::new(10, 11, 12, 13));
    }

    #[test]
    fn pod_cidrs_and_eips_over_ipv6_keep_the_ipv6_next_hop() {
        let v6: IpAddr = "fd00:100::3".parse().unwrap();
        let eips = BTreeMap::from([("10.10.0.200".parse().unwrap(), 7)]);
        let w = wanted_routes(&["10.244.3.0/24".parse().unwrap()], &eips, v6);
        // IPv4 routes via the IPv6 endpoint: sent by RFC 8950.
        assert!(w.values().all(|r| r.next_hop == v6), "{w:?}");
    }

    #[test]
    fn a_newer_epoch_is_preferred() {
        assert!(eip_local_pref(8) > eip_local_pref(7));
        assert!(eip_local_pref(0) >= BASE_LOCAL_PREF);
        assert_eq!(
            eip_local_pref(u64::MAX),
            u32::MAX,
            "saturates, never wraps to a low preference"
        );
    }

    #[test]
    fn losing_an_eip_withdraws_it_and_nothing_else() {
        let cidrs = ["10.244.3.0/24".parse().unwrap()];
        let before = wanted_routes(
            &cidrs,
            &BTreeMap::from([("10.10.0.200".parse().unwrap(), 1)]),
            nh(),
        );
        let after = wanted_routes(&cidrs, &BTreeMap::new(), nh());
        let (announce, withdraw) = route_diff(&before, &after);
        assert!(announce.is_empty());
        assert_eq!(withdraw, vec![p("10.10.0.200/32")]);
        let (announce, withdraw) = route_diff(&after, &before);
        assert_eq!(announce.len(), 1);
        assert!(withdraw.is_empty());
    }

    #[test]
    fn a_changed_epoch_is_announced_again() {
        let have = wanted_routes(
            &[],
            &BTreeMap::from([("10.10.0.200".parse().unwrap(), 1)]),
            nh(),
        );
        let want = wanted_routes(
            &[],
            &BTreeMap::from([("10.10.0.200".parse().unwrap(), 2)]),
            nh(),
        );
        let (announce, withdraw) = route_diff(&have, &want);
        assert_eq!(
            announce,
            vec![(
                p("10.10.0.200/32"),
                Route {
                    next_hop: nh(),
                    local_pref: eip_local_pref(2)
                }
            )]
        );
        assert!(withdraw.is_empty());
    }
}
