//! One dual-stack probe socket (what the controller binds) keeps sessions
//! with IPv4 and IPv6 peers at once, in a namespace of its own.

use std::{net::SocketAddr, time::Duration};

use egress_failover::{
    probe::{SessionConfig, SessionEvent},
    prober::{Prober, ProberConfig},
};
use egress_tests::Netns;

fn config(bind: &str, passive: bool) -> ProberConfig {
    ProberConfig {
        bind: bind.parse().unwrap(),
        session: SessionConfig {
            desired_min_tx_ms: 50,
            required_min_rx_ms: 50,
            detect_multiplier: 3,
        },
        accept_unknown_peers: passive,
    }
}

#[test]
#[ignore = "needs root: creates a network namespace"]
fn a_dual_stack_prober_brings_up_ipv4_and_ipv6_sessions() -> anyhow::Result<()> {
    let ns = Netns::new("prb")?;
    let up: Vec<SocketAddr> = ns.enter(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
            .block_on(async {
                let (asker, mut events) = Prober::start(config("[::]:0", false)).await?;
                let (v4, _e4) = Prober::start(config("127.0.0.1:0", true)).await?;
                let (v6, _e6) = Prober::start(config("[::1]:0", true)).await?;
                let peers = [v4.local_addr(), v6.local_addr()];
                for p in peers {
                    asker.add_peer(p);
                }
                let mut up = Vec::new();
                while up.len() < 2 {
                    let ev = tokio::time::timeout(Duration::from_secs(10), events.recv())
                        .await
                        .map_err(|_| anyhow::anyhow!("sessions up so far: {up:?}"))?
                        .ok_or_else(|| anyhow::anyhow!("prober stopped"))?;
                    anyhow::ensure!(ev.event == SessionEvent::SessionUp, "unexpected {ev:?}");
                    up.push(ev.peer);
                }
                up.sort();
                Ok::<_, anyhow::Error>(up)
            })
    })?;
    // Reported under the addresses they were added with: the IPv4 peer's
    // answers arrive IPv4-mapped on the dual-stack socket.
    assert_eq!(up.len(), 2);
    assert!(up[0].is_ipv4() && up[0].ip().is_loopback(), "{up:?}");
    assert!(up[1].is_ipv6() && up[1].ip().is_loopback(), "{up:?}");
    Ok(())
}
