//! A watch through an etcd member that loses its quorum ends with an error
//! (the etcd backend asks for `require_leader`), so the agents and the
//! controller list again through another member instead of keeping a view
//! that silently stops changing. Real etcd: three members in a namespace of
//! their own; the other two are stopped (SIGSTOP), so the third stays
//! reachable with no leader.

use std::time::Duration;

use anyhow::{Context, Result};
use egress_control::datastore::{etcd::EtcdDatastore, Datastore, Kind};
use egress_tests::{etcd::EtcdServer, Netns};
use futures::StreamExt;

const MEMBERS: [&str; 3] = ["127.0.0.11", "127.0.0.12", "127.0.0.13"];

#[test]
#[ignore = "needs root: a network namespace, etcd"]
fn a_watch_through_a_member_without_quorum_ends_with_an_error() -> Result<()> {
    let ns = Netns::new("etcdq")?;
    ns.ip(&["link", "set", "lo", "up"])?;
    let members = EtcdServer::cluster_in(ns.name(), &MEMBERS)?;
    let others: Vec<u32> = members[..2].iter().map(EtcdServer::pid).collect();
    let isolated = MEMBERS[2];
    let outcome = ns
        .enter(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(async move {
                let ds =
                    EtcdDatastore::connect(&[format!("http://{isolated}:2379")], "/egress").await?;
                let (_, rev) = ds.list(Kind::EgressGateway).await?;
                let mut watch = ds.watch(Kind::EgressGateway, rev).await?;
                // The other two members stop (as if cut off): the third is alive
                // and reachable, but has no leader and no quorum.
                for pid in &others {
                    // SAFETY: plain kill(2) on a child process of this test.
                    anyhow::ensure!(
                        unsafe { libc::kill(*pid as i32, libc::SIGSTOP) } == 0,
                        "stopping etcd member {pid}"
                    );
                }
                // etcd cancels a leader-requiring stream after about three
                // election timeouts (1 s each by default) without a leader.
                let next = tokio::time::timeout(Duration::from_secs(30), watch.next()).await;
                Ok(match next {
                    Err(_) => "still open after 30 s".to_string(),
                    Ok(None) => "ended".to_string(),
                    Ok(Some(Err(e))) => format!("error: {e}"),
                    Ok(Some(Ok(ev))) => format!("an event: {ev:?}"),
                })
            })
        })
        .context("watching through the member left alone")?;
    assert!(
        outcome == "ended" || outcome.starts_with("error"),
        "the watch through a member without quorum: {outcome}"
    );
    eprintln!("watch through the member left alone: {outcome}");
    Ok(())
}
