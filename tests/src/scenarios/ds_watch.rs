//! The datastore as the controller writes it, read straight from etcd's JSON
//! gateway every 20 ms (a thread inside the fabric namespace); and the
//! EgressGateway status as `egress get` shows it.

use std::{
    net::TcpStream,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use serde_json::{json, Value};

use super::{ms, say, Outcome};
use crate::cluster::{wait_until, Cluster, DatastoreServer};

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

fn b64_encode(data: &[u8]) -> String {
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(B64[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn b64_decode(s: &str) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in s.bytes().filter(|&c| c != b'=') {
        let v = B64.iter().position(|&x| x == c)? as u32;
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

/// The values under `prefix` in etcd (its v3 JSON gateway), parsed as JSON.
/// HTTP/1.0, so the answer is never chunked and ends with the connection.
fn etcd_range(endpoint: &str, prefix: &str) -> Option<Vec<Value>> {
    use std::io::{Read, Write};
    let mut end = prefix.as_bytes().to_vec();
    *end.last_mut()? += 1;
    let body =
        json!({"key": b64_encode(prefix.as_bytes()), "range_end": b64_encode(&end)}).to_string();
    let mut s =
        TcpStream::connect_timeout(&endpoint.parse().ok()?, Duration::from_millis(200)).ok()?;
    s.set_read_timeout(Some(Duration::from_millis(500))).ok()?;
    write!(
        s,
        "POST /v3/kv/range HTTP/1.0\r\nhost: {endpoint}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let v: Value = serde_json::from_str(out.split_once("\r\n\r\n")?.1).ok()?;
    let kvs = v["kvs"].as_array().cloned().unwrap_or_default();
    Some(
        kvs.iter()
            .filter_map(|kv| b64_decode(kv["value"].as_str()?))
            .filter_map(|raw| serde_json::from_slice(&raw).ok())
            .collect(),
    )
}

/// What the datastore said at one instant.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct DsState {
    /// node -> EgressTunnel phase.
    phases: Vec<(String, String)>,
    /// (EIP, node, epoch) in the EgressGateway statuses.
    assignments: Vec<(String, String, u64)>,
}

/// Polls the tunnels' phases and the EIP assignments.
pub(super) struct DsWatch {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    track: Arc<Mutex<Vec<(Instant, DsState)>>>,
}

impl DsState {
    /// From the EgressTunnel and EgressGateway objects.
    fn of(tunnels: &[Value], gateways: &[Value]) -> Self {
        let mut st = DsState::default();
        for o in tunnels {
            st.phases.push((
                o["metadata"]["name"].as_str().unwrap_or("").to_owned(),
                o["status"]["phase"].as_str().unwrap_or("").to_owned(),
            ));
        }
        for gw in gateways {
            for n in gw["status"]["nodeList"].as_array().into_iter().flatten() {
                let node = n["name"].as_str().unwrap_or("").to_owned();
                for e in n["eips"].as_array().into_iter().flatten() {
                    for fam in ["ipv4", "ipv6"] {
                        if let Some(ip) = e[fam].as_str().filter(|s| !s.is_empty()) {
                            st.assignments.push((
                                ip.to_owned(),
                                node.clone(),
                                e["epoch"].as_u64().unwrap_or(0),
                            ));
                        }
                    }
                }
            }
        }
        st.phases.sort();
        st.assignments.sort();
        st
    }
}

/// Reads the tunnels and gateways: etcd over its JSON gateway (from the
/// fabric namespace), or the API server's store.
enum Source {
    Etcd(String),
    Kubernetes(crate::kube_api::StoreReader),
}

impl Source {
    fn read(&self) -> Option<DsState> {
        match self {
            Source::Etcd(endpoint) => {
                let tunnels = etcd_range(endpoint, "/egress/objects/egresstunnels/")?;
                let gateways = etcd_range(endpoint, "/egress/objects/egressgateways/")?;
                Some(DsState::of(&tunnels, &gateways))
            }
            Source::Kubernetes(reader) => {
                let list = |plural: &str| {
                    let r = crate::kube_api::store::Resource::new(
                        "egressgateway.egress.dev/v1beta1",
                        plural,
                    );
                    reader.read(|s| {
                        s.list(&r, "", &Default::default())
                            .ok()
                            .map(|(items, _)| items)
                    })
                };
                Some(DsState::of(
                    &list("egresstunnels")?,
                    &list("egressgateways")?,
                ))
            }
        }
    }
}

impl DsWatch {
    pub(super) fn start(cluster: &Cluster) -> Result<Self> {
        let file = std::fs::File::open(cluster.topo.fabric.path())?;
        let source = match &cluster.datastore {
            DatastoreServer::Etcd(_) => {
                Source::Etcd(format!("{}:2379", cluster.topo.fabric_host()))
            }
            DatastoreServer::Kubernetes(k) => Source::Kubernetes(k.server.reader()),
        };
        let stop = Arc::new(AtomicBool::new(false));
        let track = Arc::new(Mutex::new(Vec::new()));
        let (stop2, track2) = (stop.clone(), track.clone());
        let thread = std::thread::spawn(move || {
            use std::os::fd::AsRawFd;
            // SAFETY: a valid namespace fd; affects only this thread.
            if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return;
            }
            let mut last: Option<DsState> = None;
            while !stop2.load(Ordering::Relaxed) {
                if let Some(st) = source.read() {
                    if last.as_ref() != Some(&st) {
                        track2.lock().unwrap().push((Instant::now(), st.clone()));
                        last = Some(st);
                    }
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        let w = Self {
            stop,
            thread: Some(thread),
            track,
        };
        wait_until(
            "the datastore watcher reads the datastore",
            Duration::from_secs(5),
            || Ok(!w.track.lock().unwrap().is_empty()),
        )?;
        Ok(w)
    }

    /// First instant after `from` when `node`'s tunnel left `Ready`.
    fn phase_left_ready(&self, node: &str, from: Instant) -> Option<(Instant, String)> {
        let t = self.track.lock().unwrap();
        t.iter().filter(|s| s.0 > from).find_map(|(at, st)| {
            st.phases
                .iter()
                .find(|(n, p)| n == node && p != "Ready")
                .map(|(_, p)| (*at, p.clone()))
        })
    }

    /// First instant after `from` when `eip` was assigned to another node than `node`.
    fn reassigned(&self, eip: &str, node: &str, from: Instant) -> Option<Instant> {
        let t = self.track.lock().unwrap();
        t.iter()
            .filter(|s| s.0 > from)
            .find(|(_, st)| {
                st.assignments
                    .iter()
                    .any(|(ip, n, _)| ip == eip && n != node)
            })
            .map(|s| s.0)
    }

    /// Every time a tunnel left `Ready` within [from, to): (when, node,
    /// the phase it went to).
    pub(super) fn left_ready_between(
        &self,
        from: Instant,
        to: Instant,
    ) -> Vec<(Instant, String, String)> {
        let t = self.track.lock().unwrap();
        let mut before: Option<&DsState> = t.iter().rev().find(|s| s.0 <= from).map(|s| &s.1);
        let mut found = Vec::new();
        for (at, st) in t.iter().filter(|s| s.0 > from && s.0 < to) {
            for (node, phase) in &st.phases {
                let was_ready =
                    before.is_some_and(|b| b.phases.iter().any(|(n, p)| n == node && p == "Ready"));
                if was_ready && phase != "Ready" {
                    found.push((*at, node.clone(), phase.clone()));
                }
            }
            before = Some(st);
        }
        found
    }

    /// EIPs ever seen assigned to two nodes at once.
    pub(super) fn duplicates(&self) -> Vec<String> {
        let t = self.track.lock().unwrap();
        let mut d: Vec<String> = t
            .iter()
            .flat_map(|(_, st)| duplicates(&st.assignments))
            .collect();
        d.sort();
        d.dedup();
        d
    }

    pub(super) fn finish(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for DsWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Adds the datastore's view of a move to `out`: when the old owner's tunnel
/// left Ready (`status_change_ms`, the controller's detection) and when the
/// EIP was assigned elsewhere (`reassigned_ms`).
pub(super) fn record_datastore(out: &mut Outcome, ds: &DsWatch, eip: &str, old: &str, t0: Instant) {
    let phase = ds.phase_left_ready(old, t0);
    let moved = ds.reassigned(eip, old, t0);
    if let Some((at, p)) = &phase {
        say(&format!(
            "datastore: {old}'s tunnel went {p} {} ms after the fault",
            ms(*at - t0)
        ));
    }
    if let Some(at) = moved {
        say(&format!(
            "datastore: the EIP assigned elsewhere {} ms after the fault",
            ms(at - t0)
        ));
    }
    out.extra.insert(
        "status_change_ms".into(),
        json!(phase.as_ref().map(|(at, _)| ms(*at - t0))),
    );
    out.extra
        .insert("status_phase".into(), json!(phase.map(|(_, p)| p)));
    out.extra
        .insert("reassigned_ms".into(), json!(moved.map(|at| ms(at - t0))));
    let dups = ds.duplicates();
    out.check(
        dups.is_empty(),
        format!("EIPs assigned to two nodes at once in the datastore: {dups:?}"),
    );
}

/// The EgressGateway "default" status: (EIP, node, epoch) per assignment.
pub(super) fn assignments(cluster: &Cluster) -> Result<Vec<(String, String, u64)>> {
    let out = cluster.egress(&["get", "egw", "default", "-o", "json"])?;
    let v: Value = serde_json::from_str(&out).context("egress get egw -o json")?;
    let mut list = Vec::new();
    for n in v["status"]["nodeList"].as_array().into_iter().flatten() {
        let node = n["name"].as_str().unwrap_or("").to_owned();
        for e in n["eips"].as_array().into_iter().flatten() {
            for fam in ["ipv4", "ipv6"] {
                if let Some(ip) = e[fam].as_str().filter(|s| !s.is_empty()) {
                    list.push((
                        ip.to_owned(),
                        node.clone(),
                        e["epoch"].as_u64().unwrap_or(0),
                    ));
                }
            }
        }
    }
    Ok(list)
}

/// EIPs that the datastore assigns to more than one node.
pub(super) fn duplicates(list: &[(String, String, u64)]) -> Vec<String> {
    let mut dup: Vec<String> = list
        .iter()
        .filter(|(ip, node, _)| list.iter().any(|(i2, n2, _)| i2 == ip && n2 != node))
        .map(|(ip, _, _)| ip.clone())
        .collect();
    dup.sort();
    dup.dedup();
    dup
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trip() {
        for s in ["", "a", "ab", "abc", "/egress/objects/egresstunnels/"] {
            assert_eq!(b64_decode(&b64_encode(s.as_bytes())).unwrap(), s.as_bytes());
        }
        assert_eq!(b64_encode(b"ab"), "YWI=");
    }

    #[test]
    #[ignore = "needs etcd"]
    fn etcd_range_reads_values() {
        let etcd = crate::etcd::EtcdServer::start().unwrap();
        let ep = etcd.endpoint().trim_start_matches("http://").to_owned();
        let v = etcd_range(&ep, "/egress/objects/egresstunnels/");
        assert_eq!(v, Some(vec![]));
        // A value large enough that HTTP/1.1 would have been chunked.
        let big = serde_json::json!({"metadata": {"name": "g1"}, "pad": "x".repeat(20000)});
        let put = serde_json::json!({
            "key": b64_encode(b"/egress/objects/egresstunnels/g1"),
            "value": b64_encode(big.to_string().as_bytes()),
        });
        crate::run(&[
            "curl",
            "-sf",
            "-X",
            "POST",
            &format!("http://{ep}/v3/kv/put"),
            "-d",
            &put.to_string(),
        ])
        .unwrap();
        let v = etcd_range(&ep, "/egress/objects/egresstunnels/").unwrap();
        assert_eq!(v, vec![big]);
    }
}
