//! Many numbered UDP flows at once (one socket, so one source port, per
//! flow) and a sink that keeps each flow apart by its source address and
//! port: which flows lost what, and each flow's largest gap. A scenario
//! that spreads flows over several gateways tells from this which flows a
//! failure touched.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{SocketAddr, UdpSocket},
    time::{Duration, Instant},
};

use super::{nothing_yet, running, GapMeter};

/// `flows` sockets, each sending a numbered datagram every `interval`.
pub fn source(
    target: SocketAddr,
    flows: usize,
    interval: Duration,
    deadline: Option<Instant>,
) -> std::io::Result<serde_json::Value> {
    let bind = super::any_port_for(target);
    let socks = (0..flows)
        .map(|_| UdpSocket::bind(bind))
        .collect::<std::io::Result<Vec<_>>>()?;
    let ports = socks
        .iter()
        .map(|s| s.local_addr().map(|a| a.port()))
        .collect::<std::io::Result<Vec<_>>>()?;
    println!("ready ports={ports:?}");
    let (mut seq, mut send_errors) = (0u64, 0u64);
    let mut next = Instant::now();
    while running(deadline) {
        let mut msg = [0u8; 64];
        msg[..8].copy_from_slice(&seq.to_be_bytes());
        for s in &socks {
            // A failed send (no route for a moment) is counted; the flow goes on.
            if s.send_to(&msg, target).is_err() {
                send_errors += 1;
            }
        }
        seq += 1;
        next += interval;
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
    Ok(serde_json::json!({
        "role": "udp-flows", "flows": flows, "sent_per_flow": seq,
        "send_errors": send_errors, "ports": ports,
    }))
}

/// One flow as the sink saw it.
struct Flow {
    gaps: GapMeter,
    seqs: BTreeSet<u64>,
}

/// Receives every flow on `listen`; reports each by source. With `echo`,
/// sends every datagram back to where it came from (the sources do not
/// read them: they are there so that replies flow, one flow each way).
pub fn sink(
    listen: SocketAddr,
    echo: bool,
    deadline: Option<Instant>,
) -> std::io::Result<serde_json::Value> {
    let sock = UdpSocket::bind(listen)?;
    sock.set_read_timeout(Some(Duration::from_millis(20)))?;
    println!("ready addr={}", sock.local_addr()?);
    let mut flows: BTreeMap<SocketAddr, Flow> = BTreeMap::new();
    let mut buf = [0u8; 2048];
    while running(deadline) {
        match sock.recv_from(&mut buf) {
            Ok((n, from)) if n >= 8 => {
                let f = flows.entry(from).or_insert_with(|| Flow {
                    gaps: GapMeter::new(),
                    seqs: BTreeSet::new(),
                });
                f.gaps.arrived(Instant::now());
                f.seqs
                    .insert(u64::from_be_bytes(buf[..8].try_into().unwrap()));
                if echo {
                    let _ = sock.send_to(&buf[..n], from);
                }
            }
            Ok(_) => {}
            Err(e) if nothing_yet(&e) => {}
            Err(e) => return Err(e),
        }
    }
    let report: Vec<serde_json::Value> = flows
        .iter()
        .map(|(from, f)| {
            let (first, last) = (
                f.seqs.first().copied().unwrap_or(0),
                f.seqs.last().copied().unwrap_or(0),
            );
            serde_json::json!({
                "source": from.ip().to_string(), "port": from.port(),
                "received": f.seqs.len(), "lost": last - first + 1 - f.seqs.len() as u64,
                "first_seq": first, "last_seq": last,
                "max_gap_ms": f.gaps.max_ms(),
            })
        })
        .collect();
    Ok(serde_json::json!({ "role": "udp-flows-sink", "flows": report }))
}
