//! `tcp-open TARGET COUNT [RETRY_S]`: opens up to COUNT TCP connections to
//! TARGET one after another, each echoing 8 bytes, and holds them open
//! until the end; reports how many opened, how many were refused (and how
//! fast: a refusal by ICMP is immediate, a dropped SYN would time out) and
//! the errors seen. With RETRY_S, a refused connection is tried again (for
//! up to RETRY_S seconds in all) instead of counted: while its worker's
//! grant grows. At the end every open connection exchanges 8 bytes again.

use std::{
    collections::BTreeMap,
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    time::{Duration, Instant},
};

/// What one attempt came to.
fn attempt(target: SocketAddr) -> Result<TcpStream, std::io::Error> {
    let mut s = TcpStream::connect_timeout(&target, Duration::from_secs(3))?;
    s.set_read_timeout(Some(Duration::from_secs(3)))?;
    s.write_all(b"12345678")?;
    let mut buf = [0u8; 8];
    s.read_exact(&mut buf)?;
    Ok(s)
}

pub fn run(
    target: SocketAddr,
    count: usize,
    retry: Duration,
    deadline: Option<Instant>,
) -> serde_json::Value {
    println!("ready");
    let retry_until = Instant::now() + retry;
    let mut retries = 0u64;
    let mut open = Vec::new();
    let mut errors: BTreeMap<String, u64> = BTreeMap::new();
    let mut slowest_refusal_ms = 0f64;
    let mut slowest_open_ms = 0f64;
    let began = Instant::now();
    for _ in 0..count {
        let t = Instant::now();
        let mut r = attempt(target);
        while r.is_err() && Instant::now() < retry_until && super::running(deadline) {
            retries += 1;
            std::thread::sleep(Duration::from_millis(50));
            r = attempt(target);
        }
        match r {
            Ok(s) => {
                slowest_open_ms = slowest_open_ms.max(t.elapsed().as_secs_f64() * 1e3);
                open.push(s)
            }
            Err(e) => {
                let ms = t.elapsed().as_secs_f64() * 1e3;
                slowest_refusal_ms = slowest_refusal_ms.max(ms);
                *errors.entry(format!("{:?}", e.kind())).or_default() += 1;
            }
        }
    }
    println!("opened {}", open.len());
    let opened_ms = began.elapsed().as_secs_f64() * 1e3;
    while super::running(deadline) {
        std::thread::sleep(Duration::from_millis(20));
    }
    // Every connection sends first, then every echo is read: the echo
    // servers poll thousands of sockets, and one round trip at a time
    // would wait a poll round each.
    let sent: Vec<bool> = open
        .iter_mut()
        .map(|s| s.write_all(b"abcdefgh").is_ok())
        .collect();
    let mut echoed = 0u64;
    for (s, ok) in open.iter_mut().zip(sent) {
        let mut buf = [0u8; 8];
        if ok && s.read_exact(&mut buf).is_ok() && &buf == b"abcdefgh" {
            echoed += 1;
        }
    }
    serde_json::json!({
        "role": "tcp-open",
        "opened": open.len(),
        "refused": errors.values().sum::<u64>(),
        "retries": retries,
        "echoed_again": echoed,
        "errors": errors,
        "slowest_refusal_ms": slowest_refusal_ms,
        "slowest_open_ms": slowest_open_ms,
        "opened_ms": opened_ms,
    })
}
