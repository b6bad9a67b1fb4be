//! Short TCP connections, as clients of a request/response service open
//! them: connect, send a request, read the reply, close.
//!
//! - `crr-server LISTEN`: answers each connection's 64-byte request with a
//!   64-byte reply and closes first (as an HTTP/1.0 server does), so the
//!   TIME_WAIT state stays on the server; one accepting thread per CPU.
//! - `crr-client TARGET SECONDS [CONCURRENCY]`: CONCURRENCY threads (4 by
//!   default) open connections one after another for SECONDS; reports how
//!   many completed per second and why the others failed.

use std::{
    collections::BTreeMap,
    io::{Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

const MESSAGE: usize = 64;

pub fn server(listen: SocketAddr, deadline: Option<Instant>) -> std::io::Result<serde_json::Value> {
    let listener = TcpListener::bind(listen)?;
    let served = Arc::new(AtomicU64::new(0));
    println!("ready");
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            let l = listener.try_clone()?;
            let served = served.clone();
            Ok(std::thread::spawn(move || {
                while let Ok((mut s, _)) = l.accept() {
                    let mut req = [0u8; MESSAGE];
                    if s.read_exact(&mut req).is_ok() && s.write_all(&req).is_ok() {
                        served.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }))
        })
        .collect::<std::io::Result<_>>()?;
    while super::running(deadline) {
        std::thread::sleep(Duration::from_millis(50));
    }
    // The accepting threads block in accept(); the process exit ends them.
    drop(workers);
    Ok(serde_json::json!({
        "role": "crr-server",
        "served": served.load(Ordering::Relaxed),
    }))
}

pub fn client(
    target: SocketAddr,
    seconds: f64,
    concurrency: usize,
) -> std::io::Result<serde_json::Value> {
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    let completed = Arc::new(AtomicU64::new(0));
    let errors: Arc<Mutex<BTreeMap<String, u64>>> = Arc::default();
    let started = Instant::now();
    let threads: Vec<_> = (0..concurrency)
        .map(|_| {
            let (completed, errors) = (completed.clone(), errors.clone());
            std::thread::spawn(move || {
                while Instant::now() < end && super::running(None) {
                    match one(target) {
                        Ok(()) => {
                            completed.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => {
                            *errors
                                .lock()
                                .unwrap()
                                .entry(format!("{:?}", e.kind()))
                                .or_default() += 1;
                        }
                    }
                }
            })
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
    let secs = started.elapsed().as_secs_f64();
    let done = completed.load(Ordering::Relaxed);
    let errors = errors.lock().unwrap().clone();
    Ok(serde_json::json!({
        "role": "crr-client",
        "completed": done,
        "failed": errors.values().sum::<u64>(),
        "errors": errors,
        "seconds": secs,
        "per_second": done as f64 / secs,
    }))
}

/// One connection: connect, request, reply, close.
fn one(target: SocketAddr) -> std::io::Result<()> {
    let mut s = TcpStream::connect_timeout(&target, Duration::from_secs(1))?;
    s.set_read_timeout(Some(Duration::from_secs(1)))?;
    s.set_nodelay(true)?;
    let msg = [7u8; MESSAGE];
    s.write_all(&msg)?;
    let mut back = [0u8; MESSAGE];
    s.read_exact(&mut back)?;
    if back != msg {
        return Err(std::io::Error::other("reply differs from the request"));
    }
    Ok(())
}
