//! `egress agent`: the node agent. With `--node-name` it runs the full agent
//! (datastore, maps, tunnel, announcements); with only `--count-iface` it
//! runs the packet-counting probe, which needs no datastore.

use std::{
    collections::BTreeMap,
    net::{Ipv4Addr, Ipv6Addr, SocketAddr},
    path::PathBuf,
    time::Duration,
};

use aya::programs::tc::TcAttachType;
use clap::Args;
use egress_common::maps::DEFAULT_PIN_DIR;
use egress_failover::timers::FailoverTimers;
use ipnet::IpNet;

use super::datastore::DatastoreArgs;
use crate::{
    agent::{bgp::AgentBgpConfig, AgentSettings},
    datapath::Datapath,
    node::vxlan::VxlanSpec,
    EBPF_OBJECT,
};

#[derive(Debug, Args)]
pub struct AgentArgs {
    /// bpffs folder where this node's maps and links are pinned.
    #[arg(long, default_value = DEFAULT_PIN_DIR, env = "EGRESS_PIN_DIR")]
    pub pin_dir: PathBuf,
    /// Entries of each NAT table (one per flow; forward and reverse tables
    /// alike). A table pinned with another size is kept until its pin is
    /// removed.
    #[arg(long, env = "EGRESS_NAT_TABLE_SIZE", default_value_t = egress_common::maps::NAT_TABLE_SIZE,
          value_parser = parse_nat_table_size)]
    pub nat_table_size: u32,
    /// Count the packets entering these interfaces (tc_count probe).
    #[arg(long = "count-iface")]
    pub count_ifaces: Vec<String>,
    /// This node's name (the downward API's spec.nodeName in the chart).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: Option<String>,
    /// A node label, `key=value`; repeat. Gateways select nodes by label.
    #[arg(long = "node-label", value_parser = parse_label)]
    pub node_labels: Vec<(String, String)>,
    /// The underlay interface (default: the one the IPv4 default route
    /// leaves by).
    #[arg(long, env = "EGRESS_UPLINK")]
    pub uplink: Option<String>,
    /// The family the tunnel runs over, the same on every node: `ipv4`,
    /// `ipv6`, or `auto` (the family of the node's default route, IPv4
    /// when it has both).
    #[arg(long, value_enum, default_value = "ipv4", env = "EGRESS_UNDERLAY")]
    pub underlay: crate::agent::underlay::UnderlayChoice,
    /// The tunnel endpoint address, of the underlay's family (default: the
    /// uplink's first address of that family).
    #[arg(long)]
    pub tunnel_ip: Option<std::net::IpAddr>,
    /// The node's IPv6 address, the IPv6 address of a dual-stack useNodeIP
    /// policy placed on this node (default: the uplink's first global IPv6
    /// address; none: such policies' IPv6 traffic is not translated here).
    #[arg(long, value_parser = parse_node_ipv6)]
    pub node_ipv6: Option<Ipv6Addr>,
    /// VXLAN device name.
    #[arg(long, default_value = "egress.vxlan")]
    pub vxlan_name: String,
    /// VXLAN network identifier.
    #[arg(long, default_value_t = 100)]
    pub vxlan_id: u32,
    /// VXLAN UDP port (the same on every node).
    #[arg(long, default_value_t = egress_common::config::DEFAULT_VXLAN_PORT)]
    pub vxlan_port: u16,
    /// MTU of the tunnel device; 0: the uplink's MTU minus 50 (VXLAN over
    /// IPv4) or 70 (over IPv6).
    #[arg(long, default_value_t = 0)]
    pub mtu: u32,
    /// This node's pod CIDRs (where the datastore does not know them).
    #[arg(long = "pod-cidr")]
    pub pod_cidrs: Vec<IpNet>,
    /// Service CIDRs: never sent to a gateway.
    #[arg(long = "service-cidr")]
    pub service_cidrs: Vec<IpNet>,
    /// Other CIDRs that must never go through a gateway.
    #[arg(long = "extra-cidr")]
    pub extra_cidrs: Vec<IpNet>,
    /// Heartbeat renewal period (spidernet's tunnelUpdatePeriod).
    #[arg(long, default_value = "5s")]
    pub tunnel_update_period: String,
    /// Controller check period (spidernet's tunnelMonitorPeriod); validated against the other two.
    #[arg(long, default_value = "5s")]
    pub tunnel_monitor_period: String,
    /// Time without heartbeat after which EIPs move (spidernet's eipEvictionTimeout).
    #[arg(long, default_value = "15s")]
    pub eip_eviction_timeout: String,
    /// How long a draining port block must stay free of NAT entries before
    /// the agent reports it released (the controller may then grant it to
    /// another node): late packets of closed flows must not reach the next
    /// holder. At least 2s (the report period), at most 1h.
    #[arg(long, default_value = "30s", value_parser = parse_quarantine)]
    pub port_release_quarantine: Duration,
    /// Do not answer ARP/NDP for owned EIPs (BGP mode only).
    #[arg(long)]
    pub no_l2_announce: bool,
    /// The gateway's reply path on the uplink: `auto` runs it in native
    /// XDP where the driver takes it (not on a veth), `native` tries XDP
    /// on any device, `off` keeps TC only. TC stays the fallback; /state
    /// says which was chosen and why.
    #[arg(long, value_enum, env = "EGRESS_UPLINK_XDP", default_value = "auto")]
    pub uplink_xdp: crate::datapath::uplink_xdp::UplinkXdpMode,
    /// Admin endpoint: /healthz, /readyz, /state.
    #[arg(long, env = "EGRESS_ADMIN_ADDR", default_value = "127.0.0.1:9465")]
    pub admin_addr: SocketAddr,
    #[command(flatten)]
    pub datastore: DatastoreArgs,
    /// Namespace of the heartbeat Leases (with --datastore kubernetes).
    #[arg(long, env = "POD_NAMESPACE", default_value = "egress-system")]
    pub lease_namespace: String,
    /// Serve /metrics, /healthz, /readyz and /state on 0.0.0.0:PORT (instead of --admin-addr).
    #[arg(long)]
    pub metrics_port: Option<u16>,
    /// Answer the controller's datapath probes (BFD-style, UDP) on the tunnel address.
    #[arg(long, action = clap::ArgAction::Set, default_value_t = true)]
    pub gateway_failover: bool,
    /// Probe interval in milliseconds (what this node asks its prober peers for).
    #[arg(long, default_value_t = egress_failover::probe::DEFAULT_PROBE_INTERVAL_MS)]
    pub probe_interval_ms: u32,
    /// Probes missed before a peer is declared down.
    #[arg(long, default_value_t = egress_failover::probe::DEFAULT_DETECT_MULTIPLIER)]
    pub probe_detect_multiplier: u8,
    /// UDP port of the probes.
    #[arg(long, default_value_t = egress_failover::prober::DEFAULT_PROBE_PORT)]
    pub probe_port: u16,
    #[command(flatten)]
    pub bgp: AgentBgpArgs,
}

/// `--bgp*` flags of the agent: it connects to the reflectors and never listens.
#[derive(Debug, Clone, Args)]
pub struct AgentBgpArgs {
    /// Run a BGP speaker (on with --bgp-reflectors).
    #[arg(long = "bgp", action = clap::ArgAction::Set, default_value_t = false)]
    pub enabled: bool,
    /// Reflectors: IPs or host names (all addresses of a name), comma separated.
    #[arg(long = "bgp-reflectors", value_delimiter = ',')]
    pub reflectors: Vec<String>,
    #[arg(long = "bgp-reflector-port", default_value_t = 179)]
    pub reflector_port: u16,
    #[arg(long = "bgp-asn", env = "EGRESS_BGP_ASN", default_value_t = 64512)]
    pub asn: u32,
    /// BGP identifier (default: the IPv4 tunnel address, or the last 32
    /// bits of the IPv6 one).
    #[arg(long = "bgp-router-id", value_parser = super::bgp::parse_router_id)]
    pub router_id: Option<Ipv4Addr>,
    #[arg(long = "bgp-hold-time", default_value_t = 90)]
    pub hold_time: u16,
    /// Accepted for symmetry with the reflector; 0 means a third of the hold time.
    #[arg(long = "bgp-keepalive-time", default_value_t = 0)]
    pub keepalive_time: u16,
    #[arg(long = "bgp-graceful-restart-time", default_value_t = 120)]
    pub graceful_restart_time: u16,
    /// TCP-MD5 password (RFC 2385) of the sessions with the reflectors; the
    /// reflectors' --bgp-password.
    #[arg(
        long = "bgp-password",
        env = "EGRESS_BGP_PASSWORD",
        hide_env_values = true
    )]
    pub password: Option<String>,
}

impl AgentBgpArgs {
    /// The speaker's settings, or None when BGP is off.
    pub async fn config(&self) -> anyhow::Result<Option<AgentBgpConfig>> {
        if !self.enabled && self.reflectors.is_empty() {
            return Ok(None);
        }
        anyhow::ensure!(
            !self.reflectors.is_empty(),
            "--bgp=true needs --bgp-reflectors"
        );
        let mut reflectors = Vec::new();
        for host in &self.reflectors {
            let addrs = tokio::net::lookup_host((host.as_str(), self.reflector_port))
                .await
                .map_err(|e| anyhow::anyhow!("--bgp-reflectors: cannot resolve {host:?}: {e}"))?;
            reflectors.extend(addrs.map(|a| (a.ip(), a.port())));
        }
        Ok(Some(AgentBgpConfig {
            asn: self.asn,
            router_id: self.router_id,
            reflectors,
            hold_time: self.hold_time,
            graceful_restart_time: self.graceful_restart_time,
            password: self.password.clone(),
        }))
    }
}

fn parse_node_ipv6(s: &str) -> Result<Ipv6Addr, String> {
    let a: Ipv6Addr = s
        .parse()
        .map_err(|_| format!("{s:?} is not an IPv6 address"))?;
    match crate::agent::uplink_addr::unusable_as_node_address(&a) {
        Some(why) => Err(format!("{a} is {why}")),
        None => Ok(a),
    }
}

fn parse_nat_table_size(s: &str) -> Result<u32, String> {
    use crate::datapath::loader::{NAT_TABLE_MAX, NAT_TABLE_MIN};
    let n: u32 = s
        .parse()
        .map_err(|_| format!("{s:?} is not a number of entries"))?;
    if !(NAT_TABLE_MIN..=NAT_TABLE_MAX).contains(&n) {
        return Err(format!(
            "{n} entries: the NAT table holds from {NAT_TABLE_MIN} to {NAT_TABLE_MAX} (one entry per flow)"
        ));
    }
    Ok(n)
}

fn parse_label(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| format!("--node-label {s:?}: expected key=value"))
}

pub async fn run(args: AgentArgs) -> anyhow::Result<()> {
    let Some(node) = args.node_name.clone() else {
        if args.count_ifaces.is_empty() {
            anyhow::bail!("--node-name (or NODE_NAME) is required to run the agent");
        }
        return run_count_probe(args).await;
    };
    let timers = FailoverTimers::parse(
        &args.tunnel_update_period,
        &args.tunnel_monitor_period,
        &args.eip_eviction_timeout,
    )?;
    let ds =
        super::datastore::connect_for_node(&args.datastore, &args.lease_namespace, &node).await?;
    anyhow::ensure!(
        (1..=255).contains(&args.probe_detect_multiplier) && args.probe_interval_ms >= 10,
        "--probe-interval-ms must be at least 10 and --probe-detect-multiplier from 1 to 255"
    );
    let settings = AgentSettings {
        node,
        labels: args.node_labels.iter().cloned().collect::<BTreeMap<_, _>>(),
        uplink: match &args.uplink {
            Some(name) => name.clone(),
            None => default_uplink().await?,
        },
        underlay: args.underlay,
        tunnel_ip: args.tunnel_ip,
        node_ipv6: args.node_ipv6,
        vxlan: VxlanSpec {
            name: args.vxlan_name.clone(),
            port: args.vxlan_port,
            mtu: args.mtu,
            ipv6_underlay: false, // decided with the uplink's routes at start
        },
        vni: args.vxlan_id,
        pod_cidrs: args.pod_cidrs.clone(),
        service_cidrs: args.service_cidrs.clone(),
        extra_cidrs: args.extra_cidrs.clone(),
        timers,
        l2_announce: !args.no_l2_announce,
        uplink_xdp: args.uplink_xdp,
        pin_dir: args.pin_dir.clone(),
        map_sizes: crate::datapath::MapSizes {
            nat_entries: args.nat_table_size,
        },
        admin_addr: match args.metrics_port {
            Some(port) => SocketAddr::from(([0, 0, 0, 0], port)),
            None => args.admin_addr,
        },
        probe: args.gateway_failover.then_some((
            egress_failover::probe::SessionConfig {
                desired_min_tx_ms: args.probe_interval_ms,
                required_min_rx_ms: args.probe_interval_ms,
                detect_multiplier: args.probe_detect_multiplier,
            },
            args.probe_port,
        )),
        resync: Duration::from_secs(30),
        port_release_quarantine: args.port_release_quarantine,
        bgp: args.bgp.config().await?,
    };
    crate::agent::run(settings, ds).await
}

/// `--port-release-quarantine`: a duration from the report period to an hour.
fn parse_quarantine(s: &str) -> Result<Duration, String> {
    let d = egress_failover::timers::parse_duration(s).map_err(|e| e.to_string())?;
    let least = crate::agent::port_use::PERIOD;
    if d < least || d > Duration::from_secs(3600) {
        return Err(format!(
            "{s}: must be from {least:?} (the period of the agent's port reports: a shorter quarantine would not be checked) to 1h"
        ));
    }
    Ok(d)
}

async fn run_count_probe(args: AgentArgs) -> anyhow::Result<()> {
    let mut datapath = Datapath::load(EBPF_OBJECT, &args.pin_dir)?;
    for iface in &args.count_ifaces {
        datapath.attach_tc("tc_count", iface, TcAttachType::Ingress)?;
        tracing::info!(iface, "tc_count attached");
    }
    // A line on stdout that supervisors and tests wait for instead of sleeping.
    println!("ready pin_dir={}", args.pin_dir.display());
    crate::signals::shutdown_signal().await;
    tracing::info!("agent stopping; pinned maps stay for the next start");
    Ok(())
}

/// The interface of the IPv4 default route, for a missing `--uplink`.
async fn default_uplink() -> anyhow::Result<String> {
    let (conn, handle, _) = rtnetlink::new_connection()?;
    let task = tokio::spawn(conn);
    let name = crate::node::route::default_route_interface(&handle).await;
    task.abort();
    let name = name?;
    tracing::info!(uplink = %name, "uplink: the interface of the default route");
    Ok(name)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_nat_table_size_is_bounded() {
        assert_eq!(super::parse_nat_table_size("65536"), Ok(65536));
        let small = super::parse_nat_table_size("100").unwrap_err();
        assert!(small.contains("from 1024"), "{small}");
        assert!(super::parse_nat_table_size("lots").is_err());
        assert!(super::parse_nat_table_size("16777217").is_err());
    }

    #[test]
    fn the_port_release_quarantine_is_bounded() {
        use std::time::Duration;
        assert_eq!(super::parse_quarantine("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(
            super::parse_quarantine("1m30s"),
            Ok(Duration::from_secs(90))
        );
        let short = super::parse_quarantine("500ms").unwrap_err();
        assert!(
            short.contains("500ms") && short.contains("port reports"),
            "{short}"
        );
        assert!(super::parse_quarantine("2h").is_err());
        assert!(super::parse_quarantine("soon").is_err());
    }
}
