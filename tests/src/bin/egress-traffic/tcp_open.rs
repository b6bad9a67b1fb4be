//! `tcp-open TARGET COUNT`: opens up to COUNT TCP connections to TARGET one
//! after another, each echoing 8 bytes, and holds them open until the end;
//! reports how many opened, how many were refused (and how fast: a refusal
//! by ICMP is immediate, a dropped SYN would time out) and the errors seen.

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

pub fn run(target: SocketAddr, count: usize, deadline: Option<Instant>) -> serde_json::Value {
    println!("ready");
    let mut open = Vec::new();
    let mut errors: BTreeMap<String, u64> = BTreeMap::new();
    let mut slowest_refusal_ms = 0f64;
    for _ in 0..count {
        let t = Instant::now();
        match attempt(target) {
            Ok(s) => open.push(s),
            Err(e) => {
                let ms = t.elapsed().as_secs_f64() * 1e3;
                slowest_refusal_ms = slowest_refusal_ms.max(ms);
                *errors.entry(format!("{:?}", e.kind())).or_default() += 1;
            }
        }
    }
    println!("opened {}", open.len());
    while super::running(deadline) {
        std::thread::sleep(Duration::from_millis(20));
    }
    serde_json::json!({
        "role": "tcp-open",
        "opened": open.len(),
        "refused": errors.values().sum::<u64>(),
        "errors": errors,
        "slowest_refusal_ms": slowest_refusal_ms,
    })
}
