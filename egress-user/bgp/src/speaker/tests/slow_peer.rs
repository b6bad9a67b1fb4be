//! A peer that stops reading its socket: the send hold timer (RFC 9687)
//! drops it, the other peers keep getting their updates on time, and what
//! waits for it stays bounded however much changes meanwhile.

use std::time::Instant;

use tokio::io::AsyncWriteExt;
use tokio::net::tcp::OwnedReadHalf;

use super::*;
use crate::codec::Capability;

/// The test's `output_ahead`: a few rounds' worth, so that the stuck peer
/// leaves its group after a few rounds rather than after a hundred.
const AHEAD: usize = 32 << 10;

/// Prefixes changed by each round of the churn.
const ROUTES: u32 = 2000;
/// Rounds of churn, at least; it goes on until the stuck peer is dropped.
const ROUNDS: usize = 10;
/// How much longer than the median round the slowest may take. A round
/// (2,000 prefixes through the reflector, debug build) takes 50-300 ms
/// depending on the machine's load; a group that waited for its stuck
/// member, as it did for 500 ms before leaving it behind, made one round
/// that much longer than the others.
const SLOWEST_OVER_MEDIAN: Duration = Duration::from_millis(400);

fn prefixes() -> Vec<Prefix> {
    (0..ROUTES)
        .map(|i| Prefix::new(IpAddr::V4(Ipv4Addr::from(0x0a80_0000 + i)), 32).unwrap())
        .collect()
}

/// A peer that completes the OPEN exchange, then sends a KEEPALIVE every
/// second (so its hold timer never runs out) and never reads again. Its
/// receive buffer is small, so the reflector's output backs up quickly.
async fn stuck_peer(target: SocketAddr, me: u8) -> OwnedReadHalf {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    socket.bind(SocketAddr::new(lo(me), 0)).unwrap();
    let mut s = socket.connect(target).await.unwrap();
    let opts = CodecOptions::default();
    let caps = vec![Capability::Multiprotocol(
        crate::types::Family::Ipv4Unicast.into(),
    )];
    let open = Open::new(ASN, 9, Ipv4Addr::new(10, 0, 0, me), caps);
    s.write_all(&Message::Open(open).to_bytes(opts).unwrap())
        .await
        .unwrap();
    let mut buf = bytes::BytesMut::new();
    assert!(matches!(
        read_message(&mut s, &mut buf).await,
        Message::Open(_)
    ));
    let (rd, mut wr) = s.into_split();
    let keepalive = Message::Keepalive.to_bytes(opts).unwrap();
    tokio::spawn(async move {
        while wr.write_all(&keepalive).await.is_ok() {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
    rd
}

/// Waits until the client's best route for `prefix` goes via `next_hop`.
async fn seen(rx: &mut UnboundedReceiver<BestChange>, prefix: Prefix, next_hop: IpAddr) {
    loop {
        if let BestChange::Set {
            prefix: p,
            next_hop: n,
            ..
        } = next_change(rx).await
        {
            if (p, n) == (prefix, next_hop) {
                return;
            }
        }
    }
}

fn established(s: &Status, addr: IpAddr) -> bool {
    peer_state(s, addr).is_some_and(|p| p.state == State::Established)
}

/// What one churn run saw.
struct Churn {
    rounds: usize,
    /// When the stuck peer's session went down, from the first round.
    dropped: Option<Duration>,
    /// The longest a round took to reach the other peer.
    slowest: Duration,
    median: Duration,
    most_pending: usize,
    most_unwritten: usize,
}

/// A reflector with a stuck peer (127.0.0.142) and a client (.143), and
/// rounds of churn moving every route to another next hop, each round
/// waited for at the client: `rounds` of them, or fewer when the stuck
/// peer is dropped first.
async fn churn(send_hold_time: Duration, rounds: usize) -> Churn {
    let mut c = config(141, false);
    c.cluster_id = Some(Ipv4Addr::new(1, 1, 1, 1));
    c.send_hold_time = send_hold_time;
    // Small socket buffers: the stuck peer's connection fills after a few
    // rounds instead of megabytes.
    c.socket_buffer = 16 << 10;
    c.output_ahead = AHEAD;
    for m in [142, 143] {
        let mut peer = PeerSpec::new(lo(m), ASN);
        peer.client = true;
        peer.passive = true;
        c.peers.push(peer);
    }
    let rr = Speaker::start(c).await.unwrap();
    let h = rr.handle();
    let _stuck = stuck_peer(h.listen_addr().unwrap(), 142).await;
    let good = client(143, &rr, false).await;
    let mut changes = good.handle().subscribe().await.unwrap();
    wait_status(&h, "both sessions up", |s| {
        established(s, lo(142)) && established(s, lo(143))
    })
    .await;

    let all = prefixes();
    let last = *all.last().unwrap();
    let start = Instant::now();
    let mut r = Churn {
        rounds: 0,
        dropped: None,
        slowest: Duration::ZERO,
        median: Duration::ZERO,
        most_pending: 0,
        most_unwritten: 0,
    };
    let mut took = Vec::new();
    while r.rounds < rounds {
        let nh = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1 + (r.rounds % 2) as u8));
        let t = Instant::now();
        h.announce_many(all.iter().map(|p| (*p, nh)).collect())
            .await
            .unwrap();
        seen(&mut changes, last, nh).await;
        r.slowest = r.slowest.max(t.elapsed());
        took.push(t.elapsed());
        r.rounds += 1;
        if !established(&h.status().await.unwrap(), lo(142)) {
            r.dropped = Some(start.elapsed());
            break;
        }
        let q = h.out_queue(lo(142)).await.unwrap().unwrap();
        r.most_pending = r.most_pending.max(q.pending_prefixes);
        r.most_unwritten = r.most_unwritten.max(q.unwritten_bytes);
        assert!(
            start.elapsed() < Duration::from_secs(8),
            "the stuck peer is still up after {} rounds: {q:?}",
            r.rounds
        );
    }
    took.sort();
    r.median = took[took.len() / 2];
    eprintln!(
        "{} rounds; stuck peer dropped after {:?}; slowest round {:?} (median {:?}); \
         most waiting: {} prefixes, {} octets",
        r.rounds, r.dropped, r.slowest, r.median, r.most_pending, r.most_unwritten
    );
    assert!(established(&h.status().await.unwrap(), lo(143)));
    good.shutdown().await;
    rr.shutdown().await;
    r
}

/// What waited for the stuck peer: at most one change per prefix and
/// [`AHEAD`] octets of encoded UPDATEs (about 5 octets a prefix) and one
/// more batch, not the batches the churn produced (40 rounds of 10 kB). The other peer's group never waited for the stuck
/// one: it left the group as soon as it was still writing a batch, so no
/// round took much longer than the others ([`SLOWEST_OVER_MEDIAN`]; waiting
/// for the stuck peer would
/// take the whole send hold time, or forever without one).
fn assert_bounded(r: &Churn) {
    assert!(
        r.slowest < r.median + SLOWEST_OVER_MEDIAN,
        "slowest round {:?}, median {:?}",
        r.slowest,
        r.median
    );
    assert!(
        r.most_pending <= ROUTES as usize,
        "{} pending",
        r.most_pending
    );
    assert!(
        r.most_unwritten > 0,
        "the stuck peer's output never backed up"
    );
    assert!(
        r.most_unwritten < AHEAD + (16 << 10),
        "{} octets waiting",
        r.most_unwritten
    );
}

#[tokio::test]
async fn peer_that_stops_reading_is_dropped_by_the_send_hold_timer() {
    let r = churn(Duration::from_secs(2), usize::MAX).await;
    // Dropped by the send hold timer (2 s), long before its hold timer
    // (9 s, which its KEEPALIVEs keep restarting anyway).
    let dropped = r.dropped.expect("dropped");
    assert!(
        dropped < Duration::from_secs(6),
        "dropped after {dropped:?}"
    );
    assert!(r.rounds >= ROUNDS, "dropped after only {} rounds", r.rounds);
    assert_bounded(&r);
}

#[tokio::test]
async fn stuck_peer_costs_one_change_per_prefix_however_long_the_churn() {
    // No send hold timer: the stuck peer stays up through all the rounds.
    let r = churn(Duration::ZERO, 4 * ROUNDS).await;
    assert_eq!((r.rounds, r.dropped), (4 * ROUNDS, None));
    assert_bounded(&r);
}
