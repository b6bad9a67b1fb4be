//! `egress pod add|del`: pod records for clusters without Kubernetes.

use std::collections::BTreeMap;

use clap::{Args, Subcommand};
use egress_control::api::PodRecord;
use egress_control::datastore::{typed, Kind};

use super::datastore::DatastoreArgs;

#[derive(Debug, Subcommand)]
pub enum PodCommand {
    /// Register (or replace) a pod.
    Add(PodAddArgs),
    /// Remove a pod.
    Del(PodDelArgs),
}

#[derive(Debug, Args)]
pub struct PodAddArgs {
    pub name: String,
    #[arg(short = 'n', long, default_value = "default")]
    pub namespace: String,
    /// Labels, `k=v`, repeated or comma separated.
    #[arg(short = 'l', long = "labels", value_delimiter = ',')]
    pub labels: Vec<String>,
    /// The node the pod runs on.
    #[arg(long)]
    pub node: String,
    /// The pod's addresses, repeated or comma separated.
    #[arg(long = "ip", value_delimiter = ',', required = true)]
    pub ips: Vec<String>,
    #[command(flatten)]
    pub datastore: DatastoreArgs,
}

#[derive(Debug, Args)]
pub struct PodDelArgs {
    pub name: String,
    #[arg(short = 'n', long, default_value = "default")]
    pub namespace: String,
    #[command(flatten)]
    pub datastore: DatastoreArgs,
}

/// Parses `k=v` labels, naming the bad one.
pub fn parse_labels(list: &[String]) -> anyhow::Result<BTreeMap<String, String>> {
    list.iter()
        .filter(|s| !s.is_empty())
        .map(|s| match s.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
            _ => anyhow::bail!("--labels: {s:?} is not key=value"),
        })
        .collect()
}

pub async fn run(cmd: PodCommand) -> anyhow::Result<()> {
    match cmd {
        PodCommand::Add(a) => {
            for ip in &a.ips {
                ip.parse::<std::net::IpAddr>()
                    .map_err(|_| anyhow::anyhow!("--ip: {ip:?} is not an IP address"))?;
            }
            let rec = PodRecord {
                name: a.name,
                namespace: a.namespace,
                labels: parse_labels(&a.labels)?,
                node: a.node,
                ips: a.ips,
            };
            let ds = super::datastore::connect(&a.datastore, "egress-system").await?;
            typed::apply(ds.as_ref(), Kind::Pod, typed::pod_object(&rec)).await?;
            println!(
                "pod/{}/{} registered on {}",
                rec.namespace, rec.name, rec.node
            );
        }
        PodCommand::Del(d) => {
            let ds = super::datastore::connect(&d.datastore, "egress-system").await?;
            ds.delete(
                Kind::Pod,
                &typed::key(Kind::Pod, &d.namespace, &d.name),
                None,
            )
            .await?;
            println!("pod/{}/{} deleted", d.namespace, d.name);
        }
    }
    Ok(())
}
