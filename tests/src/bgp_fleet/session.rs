//! One fleet client's life: connect from its own address, OPEN, announce
//! its routes at its generation once Established, keep the reflector's
//! routes in its [`Table`], report what the fleet waits for; reconnect when
//! the session is lost (keeping the routes as stale if the reflector does
//! graceful restart) or when told to flap.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc::UnboundedReceiver;

use super::table::Table;
use super::wire::{self, Prefix4};
use super::{Cmd, Event, Shared};

pub(super) struct Client {
    pub(super) idx: usize,
    pub(super) addr: Ipv4Addr,
    pub(super) prefixes: Vec<Prefix4>,
    pub(super) shared: Arc<Shared>,
    pub(super) cmds: UnboundedReceiver<Cmd>,
}

/// How a connection ended.
enum End {
    Lost(String),
    Flap(u32),
    Stop,
}

/// Pause between connection attempts while the reflector is not listening.
const CONNECT_RETRY: Duration = Duration::from_millis(100);

impl Client {
    pub(super) async fn run(mut self) {
        let mut table = Table::new(self.idx, &self.shared);
        let mut generation = 0;
        loop {
            let Some(s) = self.connect().await else {
                return;
            };
            match self.session(s, &mut table, generation).await {
                End::Stop => return,
                End::Flap(g) => {
                    generation = g;
                    table.clear();
                }
                End::Lost(why) => self.report(Event::Down {
                    client: self.idx,
                    why,
                }),
            }
        }
    }

    fn report(&self, e: Event) {
        let _ = self.shared.events.lock().expect("events").send(e);
    }

    async fn connect(&mut self) -> Option<TcpStream> {
        let to = self.shared.reflector;
        loop {
            let sock = tokio::net::TcpSocket::new_v4().ok()?;
            let _ = sock.set_nodelay(true);
            sock.bind(SocketAddr::new(self.addr.into(), 0)).ok()?;
            tokio::select! {
                r = sock.connect(to) => if let Ok(s) = r { return Some(s) },
                c = self.cmds.recv() => if matches!(c, None | Some(Cmd::Stop)) { return None },
            }
            tokio::select! {
                _ = tokio::time::sleep(CONNECT_RETRY) => {}
                c = self.cmds.recv() => if matches!(c, None | Some(Cmd::Stop)) { return None },
            }
        }
    }

    async fn session(&mut self, mut s: TcpStream, table: &mut Table, generation: u32) -> End {
        let sh = self.shared.clone();
        let open = wire::open(sh.asn, self.addr, sh.restart_time);
        if let Err(e) = s.write_all(&open).await {
            return End::Lost(format!("sending OPEN: {e}"));
        }
        let mut st = Conn {
            established: false,
            peer_gr: false,
            reported: None,
        };
        let mut buf: Vec<u8> = Vec::with_capacity(1 << 16);
        let mut chunk = vec![0u8; 1 << 16];
        let mut keepalive = tokio::time::interval(Duration::from_secs(30));
        let end = loop {
            tokio::select! {
                c = self.cmds.recv() => match c {
                    None | Some(Cmd::Stop) => break End::Stop,
                    Some(Cmd::Flap(g)) => {
                        let _ = s.write_all(&wire::cease()).await;
                        break End::Flap(g);
                    }
                },
                _ = keepalive.tick() => {
                    if s.write_all(&wire::keepalive()).await.is_err() {
                        break End::Lost("sending KEEPALIVE".into());
                    }
                }
                r = s.read(&mut chunk) => {
                    let n = match r {
                        Ok(0) => break End::Lost("connection closed".into()),
                        Ok(n) => n,
                        Err(e) => break End::Lost(format!("read: {e}")),
                    };
                    buf.extend_from_slice(&chunk[..n]);
                    let at = Instant::now();
                    match self.messages(&mut buf, &mut s, table, &mut st, generation, at).await {
                        Ok(()) => {}
                        Err(why) => break End::Lost(why),
                    }
                }
            }
        };
        // A connection that never got to Established changes nothing: the
        // routes of the last session stay as they were (stale, if it had
        // graceful restart).
        if let (End::Lost(_), true) = (&end, st.established) {
            if st.peer_gr {
                table.mark_stale();
            } else {
                let n = table.clear();
                self.shared.removed.fetch_add(n, Ordering::SeqCst);
            }
        }
        end
    }

    /// Handles the whole messages in `buf` and drops them from it.
    async fn messages(
        &self,
        buf: &mut Vec<u8>,
        s: &mut TcpStream,
        table: &mut Table,
        st: &mut Conn,
        generation: u32,
        at: Instant,
    ) -> Result<(), String> {
        let mut off = 0;
        while let Some((kind, body, len)) = wire::next_message(&buf[off..])? {
            match kind {
                wire::OPEN => {
                    st.peer_gr = wire::open_has_graceful_restart(body);
                    s.write_all(&wire::keepalive())
                        .await
                        .map_err(|e| format!("sending KEEPALIVE: {e}"))?;
                }
                wire::KEEPALIVE if !st.established => {
                    st.established = true;
                    self.report(Event::Established {
                        client: self.idx,
                        at,
                    });
                    let m = wire::announce(&self.prefixes, self.addr, generation);
                    s.write_all(&m)
                        .await
                        .map_err(|e| format!("sending routes: {e}"))?;
                }
                wire::UPDATE => self.update(body, table, at)?,
                wire::NOTIFICATION => {
                    let code = (body.first().copied(), body.get(1).copied());
                    return Err(format!("NOTIFICATION {code:?}"));
                }
                _ => {}
            }
            off += len;
        }
        buf.drain(..off);
        let (ok, epoch) = table.consistent(&self.shared);
        if ok && st.reported != Some(epoch) {
            st.reported = Some(epoch);
            self.report(Event::Consistent {
                client: self.idx,
                epoch,
                at,
            });
        }
        Ok(())
    }

    fn update(&self, body: &[u8], table: &mut Table, at: Instant) -> Result<(), String> {
        let sh = &*self.shared;
        let u = wire::parse_update(body).ok_or("malformed UPDATE")?;
        if u.end_of_rib {
            let stale_left = table.purge_stale(sh);
            self.report(Event::EndOfRib {
                client: self.idx,
                at,
                stale_left,
            });
            return Ok(());
        }
        for p in &u.withdrawn {
            if let Some(&r) = sh.routes.get(p) {
                if table.withdraw(sh, r) && sh.owner[r] != self.idx {
                    sh.removed.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
        for p in &u.announced {
            if let Some(&r) = sh.routes.get(p) {
                table.announce(sh, r, u.med);
            }
        }
        Ok(())
    }
}

/// What one connection has seen.
struct Conn {
    established: bool,
    /// The reflector's OPEN carries graceful restart.
    peer_gr: bool,
    /// The last epoch reported consistent on this connection.
    reported: Option<u32>,
}
