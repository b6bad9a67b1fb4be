//! Speakers talking to each other over loopback TCP.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use tokio::sync::mpsc::UnboundedReceiver;
use tokio::time::timeout;

use super::*;
use crate::codec::{CodecOptions, Message, Open};
use crate::gr::GrConfig;

mod add_path;
mod slow_peer;

const ASN: u32 = 65000;

fn lo(n: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, n))
}

fn p(s: &str) -> Prefix {
    s.parse().unwrap()
}

fn config(n: u8, restarting: bool) -> SpeakerConfig {
    let mut c = SpeakerConfig::new(ASN, Ipv4Addr::new(10, 0, 0, n));
    c.listen = Some(SocketAddr::new(lo(n), 0));
    c.hold_time = 9;
    c.connect_retry = Duration::from_millis(300);
    c.restarting = restarting;
    c.graceful_restart = Some(GrConfig {
        restart_time: 30,
        stale_time: Duration::from_secs(30),
        deferral_time: Duration::from_secs(20),
        forwarding_preserved: true,
        llgr_stale_time: 0,
    });
    c
}

/// `config` with long-lived graceful restart (30 s) after the given
/// restart time, and no deferral so End-of-RIB is not waited for.
fn long_lived_gr(mut c: SpeakerConfig, restart_time: u16) -> SpeakerConfig {
    c.graceful_restart = Some(GrConfig {
        restart_time,
        deferral_time: Duration::ZERO,
        llgr_stale_time: 30,
        ..GrConfig::default()
    });
    c
}

/// The reflector's side of a client at 127.0.0.<n>: a passive
/// route-reflector client, waiting for it to connect.
fn passive_client(n: u8) -> PeerSpec {
    let mut peer = PeerSpec::new(lo(n), ASN);
    peer.client = true;
    peer.passive = true;
    peer
}

/// A client's side of its session: connects to the reflector listening at `rr`.
fn upstream(rr: SocketAddr) -> PeerSpec {
    let mut peer = PeerSpec::new(rr.ip(), ASN);
    peer.port = rr.port();
    peer
}

/// A reflector at 127.0.0.<n> with passive clients at the given addresses.
async fn reflector(n: u8, clients: &[u8]) -> Speaker {
    let mut c = config(n, false);
    c.cluster_id = Some(Ipv4Addr::new(1, 1, 1, 1));
    c.peers.extend(clients.iter().map(|&m| passive_client(m)));
    Speaker::start(c).await.unwrap()
}

/// A client at 127.0.0.<n> connecting to the reflector.
async fn client(n: u8, rr: &Speaker, restarting: bool) -> Speaker {
    let mut c = config(n, restarting);
    c.peers.push(upstream(rr.handle().listen_addr().unwrap()));
    Speaker::start(c).await.unwrap()
}

async fn next_change(rx: &mut UnboundedReceiver<BestChange>) -> BestChange {
    timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("no best-route change within 10 s")
        .expect("speaker stopped")
}

/// Polls status until `f` holds (the status is the event here).
async fn wait_status(h: &SpeakerHandle, what: &str, f: impl Fn(&Status) -> bool) -> Status {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let s = h.status().await.unwrap();
        if f(&s) {
            return s;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}: {s:#?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn peer_state(s: &Status, addr: IpAddr) -> Option<&PeerStatus> {
    s.peers.iter().find(|p| p.address == addr)
}

#[tokio::test]
async fn client_announcement_reaches_the_reflector_and_withdrawal_follows() {
    let rr = reflector(11, &[12]).await;
    let mut changes = rr.handle().subscribe().await.unwrap();
    let c = client(12, &rr, false).await;
    c.handle()
        .announce(p("192.0.2.10/32"), lo(12))
        .await
        .unwrap();
    assert_eq!(
        next_change(&mut changes).await,
        BestChange::Set {
            prefix: p("192.0.2.10/32"),
            next_hop: lo(12),
            from: Some(lo(12)),
            local_pref: Some(100),
        }
    );
    let s = rr.handle().status().await.unwrap();
    let peer = peer_state(&s, lo(12)).unwrap();
    assert_eq!((peer.state, peer.received), (State::Established, 1));
    serde_json::to_string(&s).expect("status serializes");

    c.handle().withdraw(p("192.0.2.10/32")).await.unwrap();
    assert_eq!(
        next_change(&mut changes).await,
        BestChange::Removed {
            prefix: p("192.0.2.10/32")
        }
    );
    c.shutdown().await;
    rr.shutdown().await;
}

#[tokio::test]
async fn reflector_passes_one_clients_route_to_another_with_rr_attributes() {
    let rr = reflector(21, &[22, 23]).await;
    let a = client(22, &rr, false).await;
    let b = client(23, &rr, false).await;
    let mut at_b = b.handle().subscribe().await.unwrap();
    a.handle()
        .announce(p("10.244.1.0/24"), lo(22))
        .await
        .unwrap();
    assert_eq!(
        next_change(&mut at_b).await,
        BestChange::Set {
            prefix: p("10.244.1.0/24"),
            next_hop: lo(22),
            from: Some(lo(21)),
            local_pref: Some(100),
        }
    );
    for s in [a, b, rr] {
        s.shutdown().await;
    }
}

#[tokio::test]
async fn ipv6_prefix_is_carried() {
    let rr = reflector(31, &[32]).await;
    let mut changes = rr.handle().subscribe().await.unwrap();
    let c = client(32, &rr, false).await;
    let nh: IpAddr = "2001:db8::32".parse().unwrap();
    c.handle()
        .announce(p("2001:db8:10::/64"), nh)
        .await
        .unwrap();
    assert_eq!(
        next_change(&mut changes).await,
        BestChange::Set {
            prefix: p("2001:db8:10::/64"),
            next_hop: nh,
            from: Some(lo(32)),
            local_pref: Some(100),
        }
    );
    c.shutdown().await;
    rr.shutdown().await;
}

#[tokio::test]
async fn helper_keeps_a_crashed_peers_routes_until_its_end_of_rib() {
    let rr = reflector(41, &[42]).await;
    let h = rr.handle();
    let mut changes = h.subscribe().await.unwrap();
    let c = client(42, &rr, false).await;
    c.handle()
        .announce(p("192.0.2.10/32"), lo(42))
        .await
        .unwrap();
    c.handle()
        .announce(p("192.0.2.11/32"), lo(42))
        .await
        .unwrap();
    next_change(&mut changes).await;
    next_change(&mut changes).await;

    // Crash: no NOTIFICATION, the TCP connection just dies.
    c.abort();
    let s = wait_status(&h, "routes kept as stale", |s| {
        peer_state(s, lo(42)).is_some_and(|p| p.state != State::Established && p.stale == 2)
    })
    .await;
    assert_eq!(s.best_routes, 2, "nothing removed while the peer restarts");

    // It comes back restarting, re-announces only one of its routes, and
    // sends End-of-RIB: the other one goes, the re-announced one stays.
    let c = client(42, &rr, true).await;
    c.handle()
        .announce(p("192.0.2.10/32"), lo(42))
        .await
        .unwrap();
    assert_eq!(
        next_change(&mut changes).await,
        BestChange::Removed {
            prefix: p("192.0.2.11/32")
        }
    );
    let s = wait_status(&h, "no stale routes left", |s| {
        peer_state(s, lo(42)).is_some_and(|p| p.stale == 0 && p.received == 1)
    })
    .await;
    assert_eq!(s.best_routes, 1);
    assert!(
        changes.try_recv().is_err(),
        "192.0.2.10/32 never left the table"
    );
    c.shutdown().await;
    rr.shutdown().await;
}

#[tokio::test]
async fn cease_with_n_bit_keeps_routes_but_hard_reset_removes_them() {
    let rr = reflector(51, &[52]).await;
    let h = rr.handle();
    let mut changes = h.subscribe().await.unwrap();
    let c = client(52, &rr, false).await;
    c.handle()
        .announce(p("192.0.2.10/32"), lo(52))
        .await
        .unwrap();
    next_change(&mut changes).await;
    // Administrative shutdown: both sides set the N bit, so it is graceful.
    c.shutdown().await;
    wait_status(&h, "stale after Cease", |s| {
        peer_state(s, lo(52)).is_some_and(|p| p.stale == 1 && p.state != State::Established)
    })
    .await;
    assert!(changes.try_recv().is_err());

    // The client comes back; the reflector then removes it from its
    // configuration with a Hard Reset: the client drops the reflector's
    // routes at once.
    let c = client(52, &rr, false).await;
    rr.handle().announce(p("10.0.0.0/8"), lo(51)).await.unwrap();
    let mut at_client = c.handle().subscribe().await.unwrap();
    loop {
        if let BestChange::Set { prefix, .. } = next_change(&mut at_client).await {
            if prefix == p("10.0.0.0/8") {
                break;
            }
        }
    }
    h.remove_peer(lo(52)).await.unwrap();
    assert_eq!(
        next_change(&mut at_client).await,
        BestChange::Removed {
            prefix: p("10.0.0.0/8")
        }
    );
    c.shutdown().await;
    rr.shutdown().await;
}

#[tokio::test]
async fn subscribe_starts_with_the_current_table_and_sees_each_change_once() {
    let rr = reflector(61, &[]).await;
    let h = rr.handle();
    let mut early = h.subscribe().await.unwrap();
    h.announce(p("10.244.0.0/24"), lo(61)).await.unwrap();
    // Subscribing right after the announcement: the change is in the
    // snapshot of the new subscriber, and reaches the early one once.
    let mut late = h.subscribe().await.unwrap();
    let set = BestChange::Set {
        prefix: p("10.244.0.0/24"),
        next_hop: lo(61),
        from: None,
        local_pref: Some(100),
    };
    assert_eq!(next_change(&mut late).await, set);
    assert_eq!(next_change(&mut early).await, set);
    h.announce_many(vec![
        (p("10.245.0.0/24"), lo(61)),
        (p("10.245.1.0/24"), lo(61)),
    ])
    .await
    .unwrap();
    for rx in [&mut early, &mut late] {
        let mut got = [next_change(rx).await, next_change(rx).await];
        got.sort_by_key(|c| format!("{c:?}"));
        assert!(matches!(&got[0], BestChange::Set { prefix, .. } if *prefix == p("10.245.0.0/24")));
        assert!(matches!(&got[1], BestChange::Set { prefix, .. } if *prefix == p("10.245.1.0/24")));
        assert!(rx.try_recv().is_err(), "nothing twice");
    }
    rr.shutdown().await;
}

#[tokio::test]
async fn peer_added_at_run_time_comes_up() {
    let rr = reflector(71, &[]).await;
    rr.handle().add_peer(passive_client(72)).await.unwrap();
    let c = client(72, &rr, false).await;
    wait_status(&rr.handle(), "session up", |s| {
        peer_state(s, lo(72)).is_some_and(|p| p.state == State::Established)
    })
    .await;
    rr.handle().remove_peer(lo(72)).await.unwrap();
    wait_status(&rr.handle(), "peer gone", |s| s.peers.is_empty()).await;
    c.shutdown().await;
    rr.shutdown().await;
}

#[tokio::test]
async fn both_sides_active_settle_on_one_session() {
    let mut a = config(81, false);
    let mut b = config(82, false);
    // Fixed ports so that each side can connect to the other.
    a.listen = Some(SocketAddr::new(lo(81), 17981));
    b.listen = Some(SocketAddr::new(lo(82), 17982));
    let mut pa = PeerSpec::new(lo(82), ASN);
    pa.port = 17982;
    let mut pb = PeerSpec::new(lo(81), ASN);
    pb.port = 17981;
    a.peers.push(pa);
    b.peers.push(pb);
    let a = Speaker::start(a).await.unwrap();
    let b = Speaker::start(b).await.unwrap();
    let mut at_b = b.handle().subscribe().await.unwrap();
    a.handle()
        .announce(p("192.0.2.1/32"), lo(81))
        .await
        .unwrap();
    assert!(matches!(
        next_change(&mut at_b).await,
        BestChange::Set { .. }
    ));
    wait_status(&a.handle(), "established", |s| {
        s.peers[0].state == State::Established
    })
    .await;
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test]
async fn bad_hold_time_is_refused() {
    let mut c = config(90, true);
    c.hold_time = 2;
    assert!(matches!(
        Speaker::start(c).await,
        Err(SpeakerError::Config(_))
    ));
}

/// Reads one message from a raw connection.
async fn read_message(s: &mut tokio::net::TcpStream, buf: &mut bytes::BytesMut) -> Message {
    use tokio::io::AsyncReadExt;
    loop {
        if let Some(frame) = crate::codec::split_frame(buf).unwrap() {
            return Message::decode(&frame, CodecOptions::default()).unwrap();
        }
        let n = timeout(Duration::from_secs(10), s.read_buf(buf))
            .await
            .expect("peer silent")
            .unwrap();
        assert!(n > 0, "connection closed before a message");
    }
}

#[tokio::test]
async fn garbage_from_a_peer_gets_a_notification_not_a_panic() {
    use tokio::io::AsyncWriteExt;
    let rr = reflector(91, &[92]).await;
    let target = rr.handle().listen_addr().unwrap();
    // Each case: bytes sent after a correct OPEN/KEEPALIVE exchange, and
    // the NOTIFICATION (code, subcode) expected back.
    let mut bad_marker = Message::Keepalive
        .to_bytes(CodecOptions::default())
        .unwrap()
        .to_vec();
    bad_marker[0] = 0;
    let update_bad_nlri = {
        let mut v = vec![0xff; 16];
        v.extend_from_slice(&[0, 28, 2, 0, 0, 0, 0, 33, 10, 0, 0, 0]);
        v
    };
    let cases: Vec<(Vec<u8>, (u8, u8))> = vec![
        (bad_marker, (1, 1)),
        (
            {
                let mut v = vec![0xff; 16];
                v.extend_from_slice(&[0, 19, 9]);
                v
            },
            (1, 3),
        ),
        (update_bad_nlri, (3, 10)),
    ];
    for (garbage, want) in cases {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(SocketAddr::new(lo(92), 0)).unwrap();
        let mut s = socket.connect(target).await.unwrap();
        let mut buf = bytes::BytesMut::new();
        let open = Open::new(ASN, 9, Ipv4Addr::new(10, 0, 0, 92), vec![]);
        s.write_all(
            &Message::Open(open)
                .to_bytes(CodecOptions::default())
                .unwrap(),
        )
        .await
        .unwrap();
        assert!(matches!(
            read_message(&mut s, &mut buf).await,
            Message::Open(_)
        ));
        s.write_all(
            &Message::Keepalive
                .to_bytes(CodecOptions::default())
                .unwrap(),
        )
        .await
        .unwrap();
        assert_eq!(read_message(&mut s, &mut buf).await, Message::Keepalive);
        s.write_all(&garbage).await.unwrap();
        // The reflector may send its End-of-RIB first.
        let n = loop {
            match read_message(&mut s, &mut buf).await {
                Message::Notification(n) => break n,
                Message::Update(_) | Message::Keepalive => continue,
                m => panic!("unexpected {m:?}"),
            }
        };
        assert_eq!((n.code, n.subcode), want);
        wait_status(&rr.handle(), "session down", |st| {
            peer_state(st, lo(92)).is_some_and(|p| p.state != State::Established)
        })
        .await;
    }
    // Still serving: a proper client comes up afterwards.
    let c = client(92, &rr, false).await;
    wait_status(&rr.handle(), "session up again", |st| {
        peer_state(st, lo(92)).is_some_and(|p| p.state == State::Established)
    })
    .await;
    c.shutdown().await;
    rr.shutdown().await;
}

#[tokio::test]
async fn routes_outlive_the_restart_time_as_long_lived_stale() {
    let mut rc = long_lived_gr(config(101, false), 1);
    rc.peers.push(passive_client(102));
    let rr = Speaker::start(rc).await.unwrap();
    let h = rr.handle();
    let mut changes = h.subscribe().await.unwrap();
    let mut cc = long_lived_gr(config(102, false), 1);
    cc.peers.push(upstream(rr.handle().listen_addr().unwrap()));
    let c = Speaker::start(cc).await.unwrap();
    c.handle()
        .announce(p("192.0.2.10/32"), lo(102))
        .await
        .unwrap();
    next_change(&mut changes).await;
    c.abort();
    // Past the 1 s restart time the route is still there, long-lived.
    let s = wait_status(&h, "long-lived stale", |s| {
        peer_state(s, lo(102)).is_some_and(|p| p.graceful_restart.starts_with("LongLivedStale"))
    })
    .await;
    assert_eq!(s.best_routes, 1);
    assert!(changes.try_recv().is_err(), "the route never left");
    rr.shutdown().await;
}

/// RFC 9494 as the restarting side, long-lived only (restart time 0): when
/// the speaker goes away without a word, the helper keeps its route as
/// long-lived stale at once; when it comes back (restarting, R bit) and
/// sends its table and End-of-RIB, the route is fresh again, and it never
/// left the helper's table.
#[tokio::test]
async fn restarting_side_with_only_long_lived_gr_keeps_its_route_at_the_helper() {
    let mut rc = long_lived_gr(config(131, false), 0);
    rc.peers.push(passive_client(132));
    let rr = Speaker::start(rc).await.unwrap();
    let h = rr.handle();
    let mut changes = h.subscribe().await.unwrap();
    let a = h.listen_addr().unwrap();
    let start_client = |restarting: bool| {
        let mut cc = long_lived_gr(config(132, restarting), 0);
        cc.peers.push(upstream(a));
        Speaker::start(cc)
    };
    let c = start_client(false).await.unwrap();
    c.handle()
        .announce(p("192.0.2.10/32"), lo(132))
        .await
        .unwrap();
    next_change(&mut changes).await;
    c.abort();
    wait_status(&h, "long-lived stale at once", |s| {
        peer_state(s, lo(132)).is_some_and(|p| p.graceful_restart.starts_with("LongLivedStale"))
    })
    .await;
    let c = start_client(true).await.unwrap();
    c.handle()
        .announce(p("192.0.2.10/32"), lo(132))
        .await
        .unwrap();
    let s = wait_status(&h, "fresh again after End-of-RIB", |s| {
        peer_state(s, lo(132))
            .is_some_and(|p| p.state == State::Established && p.stale == 0 && p.received == 1)
    })
    .await;
    assert_eq!(s.best_routes, 1);
    assert!(changes.try_recv().is_err(), "the route never left");
    c.shutdown().await;
    rr.shutdown().await;
}

#[tokio::test]
async fn tcp_md5_password_must_match() {
    let mut rc = config(111, false);
    for (n, pw) in [(112u8, "right"), (113, "right")] {
        let mut peer = passive_client(n);
        peer.password = Some(pw.into());
        rc.peers.push(peer);
    }
    let rr = Speaker::start(rc).await.unwrap();
    let a = rr.handle().listen_addr().unwrap();
    let start_client = |n: u8, pw: &str| {
        let mut c = config(n, false);
        let mut up = upstream(a);
        up.password = Some(pw.into());
        c.peers.push(up);
        Speaker::start(c)
    };
    let good = start_client(112, "right").await.unwrap();
    let bad = start_client(113, "wrong").await.unwrap();
    wait_status(&rr.handle(), "session with the right key", |s| {
        peer_state(s, lo(112)).is_some_and(|p| p.state == State::Established)
    })
    .await;
    // The kernel drops the segments signed with the wrong key: that
    // session cannot come up (checked over two connect retries).
    tokio::time::sleep(Duration::from_millis(700)).await;
    let s = rr.handle().status().await.unwrap();
    assert_ne!(peer_state(&s, lo(113)).unwrap().state, State::Established);
    let s = bad.handle().status().await.unwrap();
    assert_ne!(s.peers[0].state, State::Established);
    for sp in [good, bad, rr] {
        sp.shutdown().await;
    }
}

/// The default key covers peers added at run time (a reflector's clients
/// from the datastore): it is set on the listener for each one as it is
/// added, and removed again with the peer.
#[tokio::test]
async fn default_password_covers_peers_added_at_run_time() {
    let mut rc = config(121, false);
    rc.default_password = Some("cluster-key".into());
    let rr = Speaker::start(rc).await.unwrap();
    let a = rr.handle().listen_addr().unwrap();
    for n in [122u8, 123, 124] {
        rr.handle().add_peer(passive_client(n)).await.unwrap();
    }
    let start_client = |n: u8, pw: Option<&str>| {
        let mut c = config(n, false);
        c.default_password = pw.map(Into::into);
        c.peers.push(upstream(a));
        Speaker::start(c)
    };
    let good = start_client(122, Some("cluster-key")).await.unwrap();
    let wrong = start_client(123, Some("other-key")).await.unwrap();
    let unsigned = start_client(124, None).await.unwrap();
    wait_status(&rr.handle(), "session with the right key", |s| {
        peer_state(s, lo(122)).is_some_and(|p| p.state == State::Established)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    let s = rr.handle().status().await.unwrap();
    for n in [123, 124] {
        assert_ne!(
            peer_state(&s, lo(n)).unwrap().state,
            State::Established,
            "127.0.0.{n} came up without the key"
        );
    }
    for c in [&wrong, &unsigned] {
        assert_ne!(
            c.handle().status().await.unwrap().peers[0].state,
            State::Established
        );
    }
    // Removed and added again without a key of its own: the default applies again.
    rr.handle().remove_peer(lo(124)).await.unwrap();
    rr.handle().add_peer(passive_client(124)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    let s = rr.handle().status().await.unwrap();
    assert_ne!(peer_state(&s, lo(124)).unwrap().state, State::Established);
    for sp in [good, wrong, unsigned, rr] {
        sp.shutdown().await;
    }
}

/// A hand-driven peer: OPEN with the given capabilities, KEEPALIVEs, and
/// then whatever the test writes.
async fn raw_peer(
    target: SocketAddr,
    me: u8,
    caps: Vec<crate::codec::Capability>,
) -> (tokio::net::TcpStream, bytes::BytesMut) {
    use tokio::io::AsyncWriteExt;
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(lo(me), 0)).unwrap();
    let mut s = socket.connect(target).await.unwrap();
    let mut buf = bytes::BytesMut::new();
    let open = Open::new(ASN, 9, Ipv4Addr::new(10, 0, 0, me), caps);
    let opts = CodecOptions::default();
    s.write_all(&Message::Open(open).to_bytes(opts).unwrap())
        .await
        .unwrap();
    assert!(matches!(
        read_message(&mut s, &mut buf).await,
        Message::Open(_)
    ));
    s.write_all(&Message::Keepalive.to_bytes(opts).unwrap())
        .await
        .unwrap();
    assert_eq!(read_message(&mut s, &mut buf).await, Message::Keepalive);
    (s, buf)
}

/// Reads until `f` returns Some, skipping KEEPALIVEs.
async fn read_until<T>(
    s: &mut tokio::net::TcpStream,
    buf: &mut bytes::BytesMut,
    mut f: impl FnMut(&Message) -> Option<T>,
) -> T {
    loop {
        let m = read_message(s, buf).await;
        if let Some(t) = f(&m) {
            return t;
        }
    }
}

#[tokio::test]
async fn enhanced_route_refresh_both_ways() {
    use crate::codec::{Capability, RouteRefresh, RouteRefreshSubtype, Update};
    use tokio::io::AsyncWriteExt;
    let rr = reflector(121, &[122]).await;
    let h = rr.handle();
    h.announce(p("10.0.0.0/8"), lo(121)).await.unwrap();
    let v4 = crate::types::Family::Ipv4Unicast;
    let caps = vec![
        Capability::Multiprotocol(v4.into()),
        Capability::RouteRefresh,
        Capability::EnhancedRouteRefresh,
    ];
    let (mut s, mut buf) = raw_peer(h.listen_addr().unwrap(), 122, caps).await;
    let opts = CodecOptions::default();
    // Initial table, then End-of-RIB.
    read_until(&mut s, &mut buf, |m| match m {
        Message::Update(u) if u.end_of_rib_family() == Some(v4) => Some(()),
        _ => None,
    })
    .await;

    // We ask for a refresh: BoRR, the table again, EoRR (RFC 7313).
    let ask = RouteRefresh {
        afi_safi: v4.into(),
        subtype: RouteRefreshSubtype::Request,
    };
    s.write_all(&Message::RouteRefresh(ask).to_bytes(opts).unwrap())
        .await
        .unwrap();
    let mut seen = Vec::new();
    read_until(&mut s, &mut buf, |m| {
        match m {
            Message::RouteRefresh(r) => seen.push(format!("{:?}", r.subtype)),
            Message::Update(u) if u.nlri.contains(&p("10.0.0.0/8")) => seen.push("table".into()),
            _ => {}
        }
        (seen.last().map(String::as_str) == Some("EndRefresh")).then_some(())
    })
    .await;
    assert_eq!(seen, vec!["BeginRefresh", "table", "EndRefresh"]);

    // The peer refreshes us: BoRR, one of its two routes again, EoRR; the
    // other one goes.
    let announce = |prefix: &str| {
        let mut u = Update {
            nlri: vec![p(prefix)],
            ..Update::default()
        };
        u.attrs.origin = Some(crate::types::Origin::Igp);
        u.attrs.next_hop = Some(Ipv4Addr::new(127, 0, 0, 122));
        Message::Update(u).to_bytes(opts).unwrap()
    };
    s.write_all(&announce("192.0.2.1/32")).await.unwrap();
    s.write_all(&announce("192.0.2.2/32")).await.unwrap();
    wait_status(&h, "two routes from the peer", |st| {
        peer_state(st, lo(122)).is_some_and(|p| p.received == 2)
    })
    .await;
    let rr_msg = |subtype| {
        Message::RouteRefresh(RouteRefresh {
            afi_safi: v4.into(),
            subtype,
        })
        .to_bytes(opts)
        .unwrap()
    };
    s.write_all(&rr_msg(RouteRefreshSubtype::BeginRefresh))
        .await
        .unwrap();
    s.write_all(&announce("192.0.2.1/32")).await.unwrap();
    s.write_all(&rr_msg(RouteRefreshSubtype::EndRefresh))
        .await
        .unwrap();
    wait_status(&h, "the route not re-sent is gone", |st| {
        peer_state(st, lo(122)).is_some_and(|p| p.received == 1 && p.stale == 0)
    })
    .await;
    rr.shutdown().await;
}

/// RFC 8950 over an IPv6 session (both ends on ::1, told apart by port)
/// and an IPv4 one: an IPv4 route via an IPv6 next hop arrives as it was
/// announced.
#[tokio::test]
async fn ipv4_route_via_an_ipv6_next_hop_over_either_session_family() {
    let v6_lo = IpAddr::V6(std::net::Ipv6Addr::LOCALHOST);
    let nh: IpAddr = "fd00:100::12".parse().unwrap();
    let mut rr_cfg = config(41, false);
    rr_cfg.listen = Some(SocketAddr::new(v6_lo, 0));
    rr_cfg.peers.push(PeerSpec {
        client: true,
        passive: true,
        ..PeerSpec::new(v6_lo, ASN)
    });
    let rr = Speaker::start(rr_cfg).await.unwrap();
    let mut c_cfg = config(42, false);
    c_cfg.listen = None;
    c_cfg
        .peers
        .push(upstream(rr.handle().listen_addr().unwrap()));
    let c = Speaker::start(c_cfg).await.unwrap();
    let rr4 = reflector(43, &[44]).await;
    let c4 = client(44, &rr4, false).await;
    for (rr, c, from, prefix) in [
        (&rr, &c, v6_lo, "10.244.2.0/24"),
        (&rr4, &c4, lo(44), "10.244.4.0/24"),
    ] {
        let mut changes = rr.handle().subscribe().await.unwrap();
        c.handle().announce(p(prefix), nh).await.unwrap();
        assert_eq!(
            next_change(&mut changes).await,
            BestChange::Set {
                prefix: p(prefix),
                next_hop: nh,
                from: Some(from),
                local_pref: Some(100),
            }
        );
    }
    for s in [c, rr, c4, rr4] {
        s.shutdown().await;
    }
}

/// Two clients with one BGP identifier (as two agents on an IPv6 underlay
/// whose addresses end in the same 32 bits): the reflector names each to
/// the other in its status; a third with its own identifier is not named.
#[tokio::test]
async fn reflector_names_clients_that_share_a_bgp_identifier() {
    let rr = reflector(41, &[42, 43, 44]).await;
    let rr_addr = rr.handle().listen_addr().unwrap();
    let mut clients = Vec::new();
    for (n, id) in [(42, 7), (43, 7), (44, 8)] {
        let mut c = config(n, false);
        c.router_id = Ipv4Addr::new(0, 0, 0, id);
        c.peers.push(upstream(rr_addr));
        clients.push(Speaker::start(c).await.unwrap());
    }
    let s = wait_status(&rr.handle(), "three clients up", |s| {
        s.peers.iter().all(|p| p.state == State::Established)
    })
    .await;
    let shared = |n| peer_state(&s, lo(n)).unwrap().bgp_id_shared_with.clone();
    assert_eq!(shared(42), vec![lo(43)]);
    assert_eq!(shared(43), vec![lo(42)]);
    assert!(shared(44).is_empty());
    assert_eq!(
        peer_state(&s, lo(44)).unwrap().bgp_id,
        Some(Ipv4Addr::new(0, 0, 0, 8))
    );
    for c in clients {
        c.shutdown().await;
    }
    rr.shutdown().await;
}
