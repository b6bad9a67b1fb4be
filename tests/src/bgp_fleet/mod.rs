//! A fleet of minimal BGP clients of one route reflector, all in one
//! namespace and one thread (a tokio runtime of its own), each from its own
//! address: the cluster shape, where every node's agent is a client that
//! announces a pod CIDR and maybe a few EIPs, and learns everyone else's.
//!
//! Each route carries its owner's generation as MED, so "every client holds
//! every other client's routes" can be checked after churn too: a client is
//! consistent once it holds every other client's routes at the generation
//! they were last announced with. The fleet reports, per client, when its
//! session comes up, when it becomes consistent (per epoch: the fleet's
//! epoch moves on when clients flap), when End-of-RIB arrives (and how many
//! stale routes it removed), and counts the routes clients stopped holding
//! (withdrawn, or lost with a session that had no graceful restart).

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};

use crate::Netns;

mod session;
mod table;
pub mod wire;

pub use wire::Prefix4;

/// One client: its address (on the fleet's interface) and its routes.
#[derive(Clone, Debug)]
pub struct ClientSpec {
    pub addr: Ipv4Addr,
    pub prefixes: Vec<Prefix4>,
}

/// `n` clients shaped like a cluster's nodes: client `i` at
/// `10.99.(1 + i / 250).(1 + i % 250)`, announcing pod CIDR
/// `100.(64 + i / 256).(i % 256).0/24`; every tenth also `eips` EIP /32s in
/// 198.18.0.0/15.
pub fn cluster_clients(n: usize, eips: usize) -> Vec<ClientSpec> {
    let mut next_eip = 0u32;
    (0..n)
        .map(|i| {
            let addr = Ipv4Addr::new(10, 99, 1 + (i / 250) as u8, 1 + (i % 250) as u8);
            let mut prefixes = vec![(Ipv4Addr::new(100, 64 + (i / 256) as u8, i as u8, 0), 24)];
            if i % 10 == 0 {
                for _ in 0..eips {
                    prefixes.push((Ipv4Addr::from(0xc612_0000 + next_eip), 32));
                    next_eip += 1;
                }
            }
            ClientSpec { addr, prefixes }
        })
        .collect()
}

/// Joins the reflector's namespace `rr` and the fleet's `clients` with a
/// veth (`link`: the two ends' addresses, a /30) and routes the
/// reflector's address (on its `lo`) and 10.99.0.0/16 (the fleet's, on
/// the clients' `lo`) over it: each side holds one neighbour entry however
/// many clients there are (the kernel's ARP table holds 1,024 entries
/// for every namespace together).
pub fn routed_link(rr: &Netns, clients: &Netns, reflector: &str, link: (&str, &str)) -> Result<()> {
    crate::link_veth(rr, "eth0", clients, "eth0")?;
    rr.addr("eth0", &format!("{}/30", link.0))?;
    clients.addr("eth0", &format!("{}/30", link.1))?;
    rr.addr("lo", &format!("{reflector}/32"))?;
    clients.ip(&["link", "set", "lo", "up"])?;
    rr.ip(&["route", "add", "10.99.0.0/16", "via", link.1])?;
    clients.ip(&["route", "add", &format!("{reflector}/32"), "via", link.0])?;
    Ok(())
}

/// What the fleet reports, each with the instant of the read that showed it.
#[derive(Debug)]
pub enum Event {
    Established {
        client: usize,
        at: Instant,
    },
    /// Holds every other client's routes at their generation of `epoch`.
    Consistent {
        client: usize,
        epoch: u32,
        at: Instant,
    },
    /// End-of-RIB from the reflector; `stale_left`: routes kept from a lost
    /// session that it did not send again, now removed.
    EndOfRib {
        client: usize,
        at: Instant,
        stale_left: usize,
    },
    Down {
        client: usize,
        why: String,
    },
}

enum Cmd {
    /// Close the session (Cease) and open a new one announcing at this
    /// generation.
    Flap(u32),
    Stop,
}

/// What the clients share with the fleet.
struct Shared {
    asn: u32,
    reflector: SocketAddr,
    restart_time: Option<u16>,
    /// Every fleet route, by prefix, as an index.
    routes: HashMap<Prefix4, usize>,
    /// The client that announces each route.
    owner: Vec<usize>,
    /// Each client's generation.
    gens: Vec<AtomicU32>,
    /// Moves on whenever generations change.
    epoch: AtomicU32,
    /// Other clients' routes a client stopped holding: withdrawn, or gone
    /// with a session lost without graceful restart (not with a flap).
    removed: AtomicUsize,
    events: Mutex<mpsc::Sender<Event>>,
}

/// The fleet options.
pub struct FleetConfig {
    pub asn: u32,
    pub reflector: SocketAddr,
    /// Offer graceful restart with this restart time.
    pub restart_time: Option<u16>,
    pub clients: Vec<ClientSpec>,
}

pub struct Fleet {
    shared: Arc<Shared>,
    cmds: Vec<UnboundedSender<Cmd>>,
    events: mpsc::Receiver<Event>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Fleet {
    /// Puts every client's address on `dev` in `ns` (a /32) and starts them.
    pub fn start(ns: &Netns, dev: &str, cfg: FleetConfig) -> Result<Fleet> {
        let mut batch = String::new();
        for c in &cfg.clients {
            batch += &format!("address add {}/32 dev {dev}\n", c.addr);
        }
        let file = std::env::temp_dir().join(crate::unique_name("fleet-addrs"));
        std::fs::write(&file, batch)?;
        let added = ns.ip(&["-batch", &file.to_string_lossy()]);
        let _ = std::fs::remove_file(&file);
        added.context("adding the fleet's addresses")?;

        let mut routes = HashMap::new();
        let mut owner = Vec::new();
        for (i, c) in cfg.clients.iter().enumerate() {
            for p in &c.prefixes {
                if routes.insert(*p, owner.len()).is_some() {
                    bail!("{p:?} announced twice");
                }
                owner.push(i);
            }
        }
        let (tx, events) = mpsc::channel();
        let shared = Arc::new(Shared {
            asn: cfg.asn,
            reflector: cfg.reflector,
            restart_time: cfg.restart_time,
            routes,
            owner,
            gens: cfg.clients.iter().map(|_| AtomicU32::new(0)).collect(),
            epoch: AtomicU32::new(0),
            removed: AtomicUsize::new(0),
            events: Mutex::new(tx),
        });
        let mut cmds = Vec::new();
        let mut clients = Vec::new();
        for (idx, c) in cfg.clients.into_iter().enumerate() {
            let (ctx, crx) = unbounded_channel();
            cmds.push(ctx);
            clients.push(session::Client {
                idx,
                addr: c.addr,
                prefixes: c.prefixes,
                shared: shared.clone(),
                cmds: crx,
            });
        }
        let ns_file = std::fs::File::open(ns.path())?;
        let thread = std::thread::spawn(move || {
            use std::os::fd::AsRawFd;
            // SAFETY: a valid namespace fd; affects only this thread.
            if unsafe { libc::setns(ns_file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                eprintln!("fleet: setns: {}", std::io::Error::last_os_error());
                return;
            }
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let tasks: Vec<_> = clients.into_iter().map(|c| tokio::spawn(c.run())).collect();
                for t in tasks {
                    let _ = t.await;
                }
            });
        });
        Ok(Fleet {
            shared,
            cmds,
            events,
            thread: Some(thread),
        })
    }

    pub fn len(&self) -> usize {
        self.cmds.len()
    }

    pub fn is_empty(&self) -> bool {
        self.cmds.is_empty()
    }

    /// The next event, or None at `until`.
    pub fn next_event(&self, until: Instant) -> Option<Event> {
        self.events
            .recv_timeout(until.saturating_duration_since(Instant::now()))
            .ok()
    }

    /// Other clients' routes that clients stopped holding so far (see
    /// [`Shared`]), all clients together.
    pub fn removed(&self) -> usize {
        self.shared.removed.load(Ordering::SeqCst)
    }

    /// The current epoch (see [`Event::Consistent`]).
    pub fn epoch(&self) -> u32 {
        self.shared.epoch.load(Ordering::SeqCst)
    }

    /// Flaps `which` clients at once: each closes its session with a Cease
    /// and opens a new one, announcing its routes at a new generation.
    /// Returns the new epoch.
    pub fn flap(&self, which: &[usize]) -> u32 {
        for &i in which {
            self.shared.gens[i].fetch_add(1, Ordering::SeqCst);
        }
        let epoch = self.shared.epoch.fetch_add(1, Ordering::SeqCst) + 1;
        for &i in which {
            let g = self.shared.gens[i].load(Ordering::SeqCst);
            let _ = self.cmds[i].send(Cmd::Flap(g));
        }
        epoch
    }

    /// Waits until every client is consistent at `epoch` (and, while
    /// waiting, hands other events to `other`); returns when each became
    /// so, or the clients still missing at the deadline.
    pub fn wait_consistent(
        &self,
        epoch: u32,
        timeout: Duration,
        mut other: impl FnMut(&Event),
    ) -> Result<Vec<Instant>, Vec<usize>> {
        let until = Instant::now() + timeout;
        let mut done: Vec<Option<Instant>> = vec![None; self.len()];
        let mut left = self.len();
        while left > 0 {
            let Some(e) = self.next_event(until) else {
                return Err((0..done.len()).filter(|i| done[*i].is_none()).collect());
            };
            match e {
                Event::Consistent {
                    client,
                    epoch: e,
                    at,
                } if e == epoch => {
                    if done[client].replace(at).is_none() {
                        left -= 1;
                    }
                }
                e => other(&e),
            }
        }
        Ok(done.into_iter().flatten().collect())
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for c in &self.cmds {
            let _ = c.send(Cmd::Stop);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
