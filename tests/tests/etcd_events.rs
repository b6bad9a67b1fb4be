//! Events on etcd (a real etcd): kept for at least an hour, and the events
//! of a minute share one lease instead of each granting its own (a lease
//! grant is a write to the cluster, and a cold start records thousands).

use anyhow::{Context, Result};
use egress_control::datastore::{etcd::EtcdDatastore, Datastore, Event, Kind, ObjectKey};
use egress_tests::etcd::EtcdServer;
use etcd_client::{Client, GetOptions, LeaseTimeToLiveOptions};

#[test]
fn events_of_a_minute_share_one_lease_of_over_an_hour() -> Result<()> {
    let etcd = EtcdServer::start()?;
    tokio::runtime::Runtime::new()?.block_on(async {
        let ds = EtcdDatastore::connect(&[etcd.endpoint()], "/egress").await?;
        for i in 0..5 {
            let e = Event::normal(
                Kind::EgressGateway,
                ObjectKey::cluster("g"),
                "Test",
                format!("event {i}"),
            );
            ds.record_event(e).await?;
        }
        assert_eq!(ds.events().await?.len(), 5);

        let mut raw = Client::connect([etcd.endpoint()], None).await?;
        let got = raw
            .get("/egress/events/", Some(GetOptions::new().with_prefix()))
            .await?;
        let leases: std::collections::BTreeSet<i64> =
            got.kvs().iter().map(|kv| kv.lease()).collect();
        assert_eq!(got.kvs().len(), 5);
        assert_eq!(leases.len(), 1, "one lease for all: {leases:?}");
        let lease = *leases.iter().next().context("a lease")?;
        assert_ne!(lease, 0, "events are attached to a lease");
        let ttl = raw
            .lease_time_to_live(lease, Some(LeaseTimeToLiveOptions::new()))
            .await?;
        assert!(
            ttl.ttl() >= 3600,
            "an event is kept at least an hour: {}",
            ttl.ttl()
        );
        Ok(())
    })
}
