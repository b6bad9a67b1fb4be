//! The active-active scenarios' traffic: many UDP flows and several TCP
//! connections from the pod of each worker, which gateway each UDP flow
//! uses (from the workers' own NAT tables), and the per-flow verdicts.

use std::{
    collections::BTreeMap,
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use anyhow::Result;
use serde_json::{json, Value};

use super::{server, AA_EIP};
use crate::{
    cluster::Cluster,
    scenarios::{ms, say, stage::report_of, Bins, Options, Outcome},
    Proc,
};

const UDP_PORT: u16 = 6100;
const TCP_PORT: u16 = 6101;
const UDP_FLOWS_PER_POD: usize = 16;
const TCP_PER_POD: usize = 3;

/// Every worker's streams and the server's two sinks.
pub(super) struct AaTraffic {
    udp_sink: Proc,
    tcp_sink: Proc,
    udp: Vec<Proc>,
    tcp: Vec<Proc>,
}

impl AaTraffic {
    pub(super) fn start(cluster: &Cluster, bins: &Bins, opts: &Options) -> Result<Self> {
        let tb = bins.traffic.to_string_lossy().into_owned();
        let srv = &cluster.topo.server;
        let listen = format!("0.0.0.0:{UDP_PORT}");
        let udp_sink = srv.spawn_ready(&[&tb, "udp-flows-sink", &listen, "echo"])?;
        let tcp_sink = srv.spawn_ready(&[&tb, "tcp-sink", &format!("0.0.0.0:{TCP_PORT}")])?;
        let (mut udp, mut tcp) = (Vec::new(), Vec::new());
        let flows = UDP_FLOWS_PER_POD.to_string();
        let udp_every = opts.udp_interval_ms.to_string();
        let tcp_every = opts.tcp_interval_ms.to_string();
        for w in 0..super::WORKERS {
            let pod = &cluster.topo.nodes[w].pods[0].ns;
            udp.push(pod.spawn_ready(&[
                &tb,
                "udp-flows",
                &server(UDP_PORT),
                &flows,
                &udp_every,
            ])?);
            for _ in 0..TCP_PER_POD {
                tcp.push(pod.spawn_ready(&[&tb, "tcp-source", &server(TCP_PORT), &tcp_every])?);
            }
        }
        say(&format!(
            "traffic: {UDP_FLOWS_PER_POD} UDP flows and {TCP_PER_POD} TCP connections from each worker's pod"
        ));
        Ok(Self {
            udp_sink,
            tcp_sink,
            udp,
            tcp,
        })
    }

    /// Stops every stream (sources first), and returns what the sinks saw.
    pub(super) fn stop(self, opts: &Options) -> Result<FlowsReport> {
        let sent: Vec<u64> = self
            .udp
            .into_iter()
            .map(|p| Ok(report_of(p)?["sent_per_flow"].as_u64().unwrap_or(0)))
            .collect::<Result<_>>()?;
        let tcp: Vec<Value> = self.tcp.into_iter().map(report_of).collect::<Result<_>>()?;
        std::thread::sleep(Duration::from_millis(100));
        let sink = report_of(self.udp_sink)?;
        let tcp_sink = report_of(self.tcp_sink)?;
        Ok(FlowsReport {
            sent: sent.into_iter().min().unwrap_or(0),
            interval_ms: opts.udp_interval_ms,
            flows: sink["flows"].as_array().cloned().unwrap_or_default(),
            tcp,
            tcp_connections: tcp_sink["connections"].as_array().map_or(0, Vec::len),
        })
    }
}

/// What the sinks saw.
pub(super) struct FlowsReport {
    /// Datagrams each UDP flow sent (the least of the sources).
    sent: u64,
    interval_ms: u64,
    flows: Vec<Value>,
    tcp: Vec<Value>,
    tcp_connections: usize,
}

impl FlowsReport {
    /// A flow's largest silence: between two arrivals, or at the end.
    fn silence_ms(&self, f: &Value) -> f64 {
        let tail = self
            .sent
            .saturating_sub(f["last_seq"].as_u64().unwrap_or(0) + 1);
        f["max_gap_ms"]
            .as_f64()
            .unwrap_or(f64::MAX)
            .max((tail * self.interval_ms) as f64)
    }

    /// The verdicts: flows of the gateways that lived see at most two probe
    /// intervals of silence; those of `dead` recover within `dead_bound`;
    /// the server sees only the EIP; every TCP connection survives.
    pub(super) fn check(
        &self,
        out: &mut Outcome,
        gateway_of: &BTreeMap<u16, String>,
        dead: Option<&str>,
        dead_bound: Duration,
        opts: &Options,
        fault_at: Instant,
    ) {
        let (interval, mult) = opts
            .timers
            .probe
            .unwrap_or_else(crate::scenarios::default_probe);
        let no_loss_ms = 2.0 * interval as f64;
        let (mut lived, mut died) = (0.0f64, 0.0f64);
        let mut sources = std::collections::BTreeSet::new();
        for f in &self.flows {
            sources.insert(f["source"].as_str().unwrap_or("?").to_string());
            let port = f["port"].as_u64().unwrap_or(0) as u16;
            let s = self.silence_ms(f);
            match gateway_of.get(&port) {
                Some(g) if Some(g.as_str()) == dead => died = died.max(s),
                _ => lived = lived.max(s),
            }
        }
        out.gap_ms = Some(died.max(lived));
        out.extra
            .insert("surviving_flows_gap_ms".into(), json!(lived.round()));
        out.extra
            .insert("dead_gateway_flows_gap_ms".into(), json!(died.round()));
        // Issue 17's target for them: the probe detection time plus 100 ms.
        // The check below allows the harness's scheduling slack on top,
        // for loaded CI machines; this says whether the target itself held.
        let target = (interval * u64::from(mult) + 100) as f64;
        out.extra
            .insert("dead_gateway_flows_target_ms".into(), json!(target));
        out.extra.insert(
            "dead_gateway_flows_within_target".into(),
            json!(dead.is_some() && died <= target),
        );
        out.extra
            .insert("udp_flows".into(), json!(self.flows.len()));
        let want = super::WORKERS * UDP_FLOWS_PER_POD;
        out.check(
            self.flows.len() == want,
            format!("the server saw {} UDP flows, not {want}", self.flows.len()),
        );
        out.check(
            sources == [AA_EIP.to_string()].into(),
            format!("the server saw sources other than the EIP: {sources:?}"),
        );
        out.check(
            lived <= no_loss_ms,
            format!("a flow through a living gateway was silent {lived:.0} ms (> {no_loss_ms} ms)"),
        );
        let bound = ms(dead_bound) as f64;
        out.check(
            died <= bound,
            format!("a flow of the dead gateway was silent {died:.0} ms (> {bound} ms)"),
        );
        let survived = self.tcp.iter().filter(|t| t["survived"] == true).count();
        out.tcp_survived = survived == self.tcp.len() && self.tcp_connections == self.tcp.len();
        out.extra
            .insert("tcp_connections_survived".into(), json!(survived));
        out.check(
            out.tcp_survived,
            format!(
                "{survived} of {} TCP connections survived ({} seen by the server)",
                self.tcp.len(),
                self.tcp_connections
            ),
        );
        say(&format!(
            "flows: living gateways' largest silence {lived:.0} ms, the dead one's {died:.0} ms, \
             {} s after the fault",
            fault_at.elapsed().as_secs()
        ));
    }
}

/// EIP port -> gateway tunnel address, of every UDP flow to the server's
/// flow port, from the NAT tables of workers `0..workers`.
pub(super) fn gateway_of_flows(cluster: &Cluster, workers: usize) -> Result<BTreeMap<u16, String>> {
    use egress_common::nat::{NatEntry, NatKey};
    let mut out = BTreeMap::new();
    for w in 0..workers {
        // On an IPv6 underlay the entry holds the endpoint's index.
        let endpoints = match cluster.topo.ipv6_underlay {
            true => Some(endpoint_table(cluster.pin_dir(w))?),
            false => None,
        };
        let path = cluster.pin_dir(w).join(egress_common::maps::NAT_FWD);
        let data = aya::maps::MapData::from_pin(&path)?;
        let map: aya::maps::HashMap<_, NatKey, NatEntry> =
            aya::maps::HashMap::try_from(aya::maps::Map::LruHashMap(data))?;
        for r in map.iter() {
            let (k, e) = r?;
            if k.proto == 17 && k.dport == UDP_PORT {
                let field = e.ifindex.to_ne_bytes();
                let gw = match &endpoints {
                    Some(table) => table
                        .get(&egress_common::endpoints::index_of(field))
                        .map(|a| a.to_string())
                        .unwrap_or_default(),
                    None => Ipv4Addr::from(field).to_string(),
                };
                out.insert(e.port, gw);
            }
        }
    }
    Ok(out)
}

/// The pinned `TUNNEL_ENDPOINTS` of a worker: index -> address, used entries
/// only. (egress-user has the same reader, but this lib cannot depend on
/// egress-user: see tests/Cargo.toml.)
fn endpoint_table(pin_dir: &std::path::Path) -> Result<BTreeMap<u32, std::net::Ipv6Addr>> {
    use egress_common::endpoints::TunnelEndpoint;
    let data = aya::maps::MapData::from_pin(pin_dir.join(egress_common::maps::TUNNEL_ENDPOINTS))?;
    let table: aya::maps::Array<_, TunnelEndpoint> =
        aya::maps::Array::try_from(aya::maps::Map::from_map_data(data)?)?;
    let mut out = BTreeMap::new();
    for (i, e) in table.iter().enumerate() {
        let e = e?;
        if e.addr != [0; 16] {
            out.insert(i as u32, std::net::Ipv6Addr::from(e.addr));
        }
    }
    Ok(out)
}
