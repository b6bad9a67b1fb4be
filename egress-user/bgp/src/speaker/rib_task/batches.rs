//! What the RIB task sends each session, and when: up to
//! `SpeakerConfig::output_ahead` octets ahead of what the session has written, so that an update group goes on
//! at its own pace while one member finishes writing, without waiting for
//! it; a member further behind leaves the group at once, and what waits
//! for it is its Adj-RIB-Out changes, one per prefix, not encoded messages.

use std::collections::HashMap;
use std::net::IpAddr;

use bytes::{Bytes, BytesMut};

use super::{PeerEntry, RibTask};
use crate::codec::{CodecOptions, Message, RouteRefresh, RouteRefreshSubtype, Update};
use crate::gr;
use crate::rib::{Outgoing, Readiness};
use crate::speaker::msg::SessionCmd;
use crate::speaker::SessionMap;
use crate::types::Family;

/// A batch handed to a session and not yet written.
#[derive(Clone, Copy, Debug)]
pub(super) struct Unwritten {
    batch: u64,
    pub(super) bytes: usize,
}

impl Unwritten {
    /// Whether the session's word that `batch` is written covers this one
    /// (batches are numbered in the order they are sent).
    pub(super) fn written_by(&self, batch: u64) -> bool {
        self.batch <= batch
    }
}

impl PeerEntry {
    fn readiness(&self, ahead: usize) -> Readiness {
        if self.unwritten.is_empty() {
            Readiness::Ready
        } else if self.unwritten.iter().map(|u| u.bytes).sum::<usize>() < ahead {
            Readiness::Writing
        } else {
            Readiness::Busy
        }
    }
}

impl RibTask {
    /// Sends queued Adj-RIB-Out changes, End-of-RIB after initial tables
    /// and refreshed tables, to the peers that have room for them.
    pub(super) fn flush(&mut self) {
        self.flush_best_changes();
        if self.rib.deferring() {
            return;
        }
        // A peer too far behind is skipped: its changes stay in the RIB
        // (one per prefix) until it has written enough.
        let ahead = self.cfg.output_ahead;
        let refresh: Vec<IpAddr> = self
            .peers
            .iter()
            .filter(|(_, p)| !p.refresh_due.is_empty() && p.readiness(ahead) == Readiness::Ready)
            .map(|(a, _)| *a)
            .collect();
        for addr in refresh {
            self.send_refresh(addr);
        }
        self.send_outgoing();
        // End-of-RIB for sessions whose initial table was empty.
        let due: Vec<IpAddr> = self
            .peers
            .iter()
            .filter(|(_, p)| p.eor_due && p.unwritten.is_empty())
            .map(|(a, _)| *a)
            .collect();
        for addr in due {
            let Some(p) = self.peers.get_mut(&addr) else {
                continue;
            };
            p.eor_due = false;
            let b = encode(&gr::end_of_rib_markers(&p.families), p.codec);
            self.send_batch(addr, vec![b]);
        }
    }

    fn send_outgoing(&mut self) {
        let ahead = self.cfg.output_ahead;
        // Readiness as it was before this round: a peer sent a list below
        // is not held back from its other lists of the same round.
        let behind: HashMap<IpAddr, Readiness> = self
            .peers
            .iter()
            .map(|(a, p)| (*a, p.readiness(ahead)))
            .filter(|(_, r)| *r != Readiness::Ready)
            .collect();
        let state = |a: IpAddr| behind.get(&a).copied().unwrap_or(Readiness::Ready);
        let RibTask {
            rib,
            peers,
            sessions,
            next_batch,
            ..
        } = self;
        let mut hand = Handover {
            peers,
            sessions,
            next_batch,
            first: Vec::new(),
        };
        // Each list is encoded and handed over before the next is packed.
        rib.take_outgoing_each(state, |o| hand.outgoing(o));
        // A peer may get several lists of one round: End-of-RIB goes after
        // the last.
        for addr in std::mem::take(&mut hand.first) {
            let Some(p) = hand.peers.get(&addr) else {
                continue;
            };
            let eor = encode(&gr::end_of_rib_markers(&p.families), p.codec);
            hand.batch(addr, vec![eor]);
        }
    }

    /// Hands encoded UPDATEs to a session and notes them as unwritten.
    fn send_batch(&mut self, addr: IpAddr, chunks: Vec<Bytes>) {
        Handover {
            peers: &mut self.peers,
            sessions: &self.sessions,
            next_batch: &mut self.next_batch,
            first: Vec::new(),
        }
        .batch(addr, chunks);
    }

    /// The refreshed table of a peer, between BoRR and EoRR markers when it
    /// does enhanced route refresh (RFC 7313).
    fn send_refresh(&mut self, peer: IpAddr) {
        let Some(p) = self.peers.get_mut(&peer) else {
            return;
        };
        let families = std::mem::take(&mut p.refresh_due);
        let (enhanced, codec) = (p.enhanced_refresh, p.codec);
        let marker = |family: Family, subtype| {
            Message::RouteRefresh(RouteRefresh {
                afi_safi: family.into(),
                subtype,
            })
        };
        let mut msgs = Vec::new();
        if enhanced {
            let begin = RouteRefreshSubtype::BeginRefresh;
            msgs.extend(families.iter().map(|f| marker(*f, begin)));
        }
        msgs.extend(self.rib.take_updates(peer).into_iter().map(Message::Update));
        if enhanced {
            let end = RouteRefreshSubtype::EndRefresh;
            msgs.extend(families.iter().map(|f| marker(*f, end)));
        }
        let mut buf = BytesMut::new();
        for m in &msgs {
            if let Err(e) = m.encode(codec, &mut buf) {
                tracing::warn!(%peer, error = %e, "message not sent");
            }
        }
        self.send_batch(peer, vec![buf.freeze()]);
    }
}

/// UPDATEs on the wire, one after the other.
fn encode<'a>(updates: impl IntoIterator<Item = &'a Update>, codec: CodecOptions) -> Bytes {
    let mut buf = BytesMut::new();
    for u in updates {
        if let Err(e) = Message::encode_update(u, codec, &mut buf) {
            tracing::warn!(error = %e, "UPDATE not sent");
        }
    }
    // The buffer grew by doubling; what sessions have not written yet is
    // most of the speaker's memory while many of them come up, so a buffer
    // much larger than its content is not kept.
    if buf.capacity() - buf.len() > buf.len() / 4 {
        return Bytes::copy_from_slice(&buf);
    }
    buf.freeze()
}

/// Whether an UPDATE belongs to a family negotiated with the peer.
fn carries(u: &Update, families: &[Family]) -> bool {
    let fam = u
        .mp_reach
        .as_ref()
        .map(|m| m.family)
        .or(u.mp_unreach.as_ref().map(|m| m.family))
        .unwrap_or(Family::Ipv4Unicast);
    families.contains(&fam)
}

/// What handing batches to sessions needs of the RIB task, borrowed
/// apart from its RIB, which packs them meanwhile.
struct Handover<'a> {
    peers: &'a mut HashMap<IpAddr, PeerEntry>,
    sessions: &'a SessionMap,
    next_batch: &'a mut u64,
    /// Peers sent their initial table this round, due End-of-RIB after it.
    first: Vec<IpAddr>,
}

impl Handover<'_> {
    /// Encodes one list once per distinct (codec, families) of its peers
    /// and sends the same bytes to all of them.
    fn outgoing(&mut self, o: Outgoing) {
        let mut encoded: Vec<(CodecOptions, Vec<Family>, Bytes)> = Vec::new();
        for addr in o.peers {
            let Some(p) = self.peers.get_mut(&addr) else {
                continue;
            };
            let bytes = match encoded
                .iter()
                .find(|(c, f, _)| *c == p.codec && *f == p.families)
            {
                Some((_, _, b)) => b.clone(),
                None => {
                    let b = encode(
                        o.updates.iter().filter(|u| carries(u, &p.families)),
                        p.codec,
                    );
                    encoded.push((p.codec, p.families.clone(), b.clone()));
                    b
                }
            };
            if std::mem::take(&mut p.eor_due) {
                self.first.push(addr);
            }
            self.batch(addr, vec![bytes]);
        }
    }

    fn batch(&mut self, addr: IpAddr, mut chunks: Vec<Bytes>) {
        chunks.retain(|c| !c.is_empty());
        let Some(p) = self.peers.get_mut(&addr) else {
            return;
        };
        if chunks.is_empty() {
            return;
        }
        *self.next_batch += 1;
        let batch = *self.next_batch;
        p.unwritten.push_back(Unwritten {
            batch,
            bytes: chunks.iter().map(Bytes::len).sum(),
        });
        let cmd = SessionCmd::SendEncoded {
            codec: p.codec,
            chunks,
            batch,
        };
        if let Some(s) = self.sessions.lock().expect("session map").get(&addr) {
            let _ = s.tx.send(cmd);
        }
    }
}
