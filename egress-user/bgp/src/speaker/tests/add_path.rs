//! ADD-PATH over real sessions: the reflector offers Send to an upstream
//! peer configured for it (and to no client), and sends that peer both
//! clients' paths of one EIP, each under its own path id.

use std::collections::BTreeSet;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;
use crate::codec::{AddPathFamilies, AddPathFamily, Capability};
use crate::types::Family;

const EIP: &str = "192.0.2.10/32";

async fn read_with(
    s: &mut tokio::net::TcpStream,
    buf: &mut bytes::BytesMut,
    opts: CodecOptions,
) -> Message {
    loop {
        if let Some(frame) = crate::codec::split_frame(buf).unwrap() {
            return Message::decode(&frame, opts).unwrap();
        }
        let n = timeout(Duration::from_secs(10), s.read_buf(buf))
            .await
            .expect("reflector silent")
            .unwrap();
        assert!(n > 0, "connection closed");
    }
}

#[tokio::test]
async fn an_upstream_with_add_path_gets_both_clients_paths() {
    let mut c = config(141, false);
    c.cluster_id = Some(Ipv4Addr::new(1, 1, 1, 1));
    c.peers.extend([passive_client(142), passive_client(143)]);
    let mut up = PeerSpec::new(lo(144), ASN);
    up.passive = true;
    up.add_path_send = true;
    c.peers.push(up);
    let rr = Speaker::start(c).await.unwrap();
    let target = rr.handle().listen_addr().unwrap();

    // The upstream: IPv4 unicast, ADD-PATH Receive.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(lo(144), 0)).unwrap();
    let mut s = socket.connect(target).await.unwrap();
    let mut buf = bytes::BytesMut::new();
    let v4 = Family::Ipv4Unicast;
    let caps = vec![
        Capability::Multiprotocol(v4.into()),
        Capability::AddPath(vec![AddPathFamily::new(v4, false, true)]),
    ];
    let plain = CodecOptions::default();
    let open = Open::new(ASN, 9, Ipv4Addr::new(10, 0, 0, 144), caps);
    s.write_all(&Message::Open(open).to_bytes(plain).unwrap())
        .await
        .unwrap();
    let Message::Open(theirs) = read_with(&mut s, &mut buf, plain).await else {
        panic!("no OPEN")
    };
    assert!(
        !theirs.add_path().is_empty() && theirs.add_path().iter().all(|t| t.send && !t.receive),
        "Send only: {:?}",
        theirs.add_path()
    );
    s.write_all(&Message::Keepalive.to_bytes(plain).unwrap())
        .await
        .unwrap();

    let clients = [client(142, &rr, false).await, client(143, &rr, false).await];
    for (c, n) in clients.iter().zip([142, 143]) {
        c.handle().announce(p(EIP), lo(n)).await.unwrap();
    }
    // What the upstream reads carries path ids in IPv4 unicast.
    let opts = plain.with_add_path(AddPathFamilies::NONE.with(v4));
    let mut paths = BTreeSet::new();
    while paths.len() < 2 {
        if let Message::Update(u) = read_with(&mut s, &mut buf, opts).await {
            for (i, prefix) in u.nlri.iter().enumerate() {
                if *prefix == p(EIP) {
                    paths.insert((u.nlri_ids[i], u.attrs.next_hop.unwrap()));
                }
            }
        }
    }
    let want: BTreeSet<(u32, Ipv4Addr)> = [142, 143]
        .map(|n| {
            (
                u32::from(Ipv4Addr::new(127, 0, 0, n)),
                Ipv4Addr::new(127, 0, 0, n),
            )
        })
        .into_iter()
        .collect();
    assert_eq!(paths, want);
    for c in clients {
        c.shutdown().await;
    }
    rr.shutdown().await;
}
