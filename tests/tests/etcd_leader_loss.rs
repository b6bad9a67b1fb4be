//! A watch through an etcd member that loses its quorum ends with an error
//! (the etcd backend asks for `require_leader`), so the agents and the
//! controller list again through another member instead of keeping a view
//! that silently stops changing. Real etcd: three members in a namespace of
//! their own; the other two are stopped (SIGSTOP), so the third stays
//! reachable with no leader.

use std::time::Duration;

use anyhow::{Context, Result};
use egress_control::{
    api::API_VERSION,
    datastore::{etcd::EtcdDatastore, Datastore, Event, Kind, StatusPatch},
};
use egress_tests::{etcd::EtcdServer, Netns};
use futures::StreamExt;
use serde_json::json;

const MEMBERS: [&str; 3] = ["127.0.0.11", "127.0.0.12", "127.0.0.13"];

#[test]
#[ignore = "needs root: a network namespace, etcd"]
fn a_watch_through_a_member_without_quorum_ends_with_an_error() -> Result<()> {
    let ns = Netns::new("etcdq")?;
    ns.ip(&["link", "set", "lo", "up"])?;
    let members = EtcdServer::cluster_in(&MEMBERS.map(|ip| (ns.name(), ip)))?;
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

/// Three members, each in its own namespace on one bridge; the client
/// (with all three endpoints, as `--etcd-endpoints` would name them) in
/// the bridge's namespace. Once the third member is cut off from its peers
/// and has no leader, every list, new watch, heartbeat renewal, leader
/// renewal and write through the client must still succeed: a request the
/// balancer sends to that member fails at once ("no leader", before etcd
/// handles it), and the backend tries it again.
#[test]
#[ignore = "needs root: network namespaces, etcd"]
fn lists_succeed_while_one_of_three_members_is_cut_off() -> Result<()> {
    let hub = Netns::new("ehub")?;
    hub.bridge("br0")?;
    hub.addr("br0", "10.77.0.1/24")?;
    let ips = ["10.77.0.11", "10.77.0.12", "10.77.0.13"];
    let mut nss = Vec::new();
    for (i, ip) in ips.iter().enumerate() {
        let ns = Netns::new(&format!("em{i}"))?;
        let port = format!("em{i}");
        egress_tests::link_veth(&ns, "eth0", &hub, &port)?;
        hub.ip(&["link", "set", &port, "master", "br0"])?;
        ns.addr("eth0", &format!("{ip}/24"))?;
        nss.push(ns);
    }
    let members: Vec<(&str, &str)> = nss.iter().map(Netns::name).zip(ips).collect();
    let _members = EtcdServer::cluster_in(&members)?;

    // The third member loses its peers (their traffic on 2380, both ways).
    for port in ["--dport", "--sport"] {
        nss[2].exec(&[
            "iptables", "-A", "INPUT", "-p", "tcp", port, "2380", "-j", "DROP",
        ])?;
    }
    let endpoints: Vec<String> = ips.iter().map(|ip| format!("http://{ip}:2379")).collect();
    let third = endpoints[2].clone();
    let failures = hub.enter(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(async move {
            // Wait until the third says it has no leader.
            let alone = EtcdDatastore::connect(&[third], "/egress").await?;
            let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
            loop {
                match alone.list(Kind::EgressGateway).await {
                    Err(e) if e.to_string().contains("no leader") => break,
                    _ if tokio::time::Instant::now() > deadline => {
                        anyhow::bail!("the cut-off member still has a leader after 30 s")
                    }
                    _ => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
            let ds = EtcdDatastore::connect(&endpoints, "/egress").await?;
            let mut failures = Vec::new();
            let mut rev = 0;
            for _ in 0..40 {
                match ds.list(Kind::EgressGateway).await {
                    Ok((_, r)) => rev = r,
                    Err(e) => failures.push(format!("list: {e}")),
                }
            }
            // Watches are opened the same way (the cut-off member refuses
            // them at once).
            let mut watches = Vec::new();
            for _ in 0..20 {
                match ds.watch(Kind::EgressGateway, rev).await {
                    Ok(w) => watches.push(w),
                    Err(e) => failures.push(format!("watch: {e}")),
                }
            }
            // Heartbeat renewals and the leader's renewals are the same
            // however often they are sent, and are tried again too: a
            // member without quorum must not fence a gateway or cost the
            // controller its term.
            for _ in 0..20 {
                if let Err(e) = ds.renew_heartbeat("g1", Duration::from_secs(15)).await {
                    failures.push(format!("heartbeat: {e}"));
                }
            }
            let lead = loop {
                // Campaigning itself is retried by the controller's loop.
                if let Ok(Some(l)) = ds.try_acquire("e", "c0", Duration::from_secs(15)).await {
                    break l;
                }
            };
            for _ in 0..20 {
                if let Err(e) = ds.renew_leadership(&lead).await {
                    failures.push(format!("leadership: {e}"));
                }
            }
            // Writes: the cut-off member refuses them before handling them
            // ("no leader"), so they are sent again too.
            failures.extend(writes(&ds).await);
            Ok(failures)
        })
    })?;
    assert!(
        failures.is_empty(),
        "{} of 40 lists, 20 watches, 20 heartbeats, 20 leader renewals and 100 writes failed: {:?}",
        failures.len(),
        failures.first()
    );
    Ok(())
}

/// Twenty of each write the controller and the agents make: creates,
/// updates, status writes, events and deletes; the failures.
async fn writes(ds: &EtcdDatastore) -> Vec<String> {
    let mut failures = Vec::new();
    let object = |i: usize| {
        json!({
            "apiVersion": API_VERSION, "kind": "EgressGateway",
            "metadata": { "name": format!("w{i}") },
            "spec": { "ippools": { "ipv4": [format!("198.51.100.{i}")] } },
        })
    };
    for i in 0..20 {
        let created = match ds.create(Kind::EgressGateway, object(i)).await {
            Ok(s) => s,
            Err(e) => {
                failures.push(format!("create: {e}"));
                continue;
            }
        };
        let mut changed = object(i);
        changed["spec"]["clusterDefault"] = json!(false);
        let updated = match ds
            .update(Kind::EgressGateway, changed, created.revision)
            .await
        {
            Ok(s) => s,
            Err(e) => {
                failures.push(format!("update: {e}"));
                continue;
            }
        };
        let patch = StatusPatch {
            manager: "test".into(),
            owned: vec!["epoch".into()],
            status: json!({ "epoch": i }),
        };
        let status = ds
            .write_status(Kind::EgressGateway, &updated.key, &patch)
            .await;
        if let Err(e) = &status {
            failures.push(format!("status: {e}"));
        }
        let event = Event::normal(Kind::EgressGateway, updated.key.clone(), "Test", "written");
        if let Err(e) = ds.record_event(event).await {
            failures.push(format!("event: {e}"));
        }
        let revision = status.map_or(updated.revision, |s| s.revision);
        if let Err(e) = ds
            .delete(Kind::EgressGateway, &updated.key, Some(revision))
            .await
        {
            failures.push(format!("delete: {e}"));
        }
    }
    failures
}
