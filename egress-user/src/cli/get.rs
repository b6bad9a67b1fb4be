//! `egress get KIND [NAME] [-o yaml|json]`, and `egress get events`.

use clap::{Args, ValueEnum};
use egress_control::datastore::{typed, Kind, Stored};
use serde_json::Value;

use super::datastore::DatastoreArgs;
use super::delete::parse_kind;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    Yaml,
    Json,
}

#[derive(Debug, Args)]
pub struct GetArgs {
    /// Kind (egw, egp, egcp, egt, node, pod, namespace) or `events`.
    pub kind: String,
    pub name: Option<String>,
    #[arg(short = 'o', long, value_enum, default_value = "table")]
    pub output: Output,
    #[arg(short = 'n', long, default_value = "default")]
    pub namespace: String,
    /// Every namespace.
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,
    #[command(flatten)]
    pub datastore: DatastoreArgs,
}

fn s(v: &Value, p: &str) -> String {
    match v.pointer(p) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => String::new(),
        Some(x) => x.to_string(),
    }
}

fn columns(kind: Kind) -> &'static [(&'static str, &'static str)] {
    match kind {
        Kind::EgressGateway => &[
            ("DEFAULTV4", "/spec/ippools/ipv4DefaultEIP"),
            ("V4FREE", "/status/ipUsage/ipv4Free"),
            ("V4TOTAL", "/status/ipUsage/ipv4Total"),
            ("DEFAULTV6", "/spec/ippools/ipv6DefaultEIP"),
            ("V6FREE", "/status/ipUsage/ipv6Free"),
            ("V6TOTAL", "/status/ipUsage/ipv6Total"),
            ("EPOCH", "/status/epoch"),
            ("MODE", "/spec/mode"),
        ],
        Kind::EgressPolicy | Kind::EgressClusterPolicy => &[
            ("GATEWAY", "/spec/egressGatewayName"),
            ("IPV4", "/status/eip/ipv4"),
            ("IPV6", "/status/eip/ipv6"),
            ("NODE", "/status/node"),
            ("NODES", "/status/nodes"),
            ("PRIORITY", "/spec/priority"),
        ],
        Kind::EgressTunnel => &[
            ("TUNNELV4", "/status/tunnel/ipv4"),
            ("MAC", "/status/tunnel/mac"),
            ("PHASE", "/status/phase"),
            // Filled from the heartbeats themselves (Leases, etcd keys):
            // `status.lastHeartbeatTime` changes only with the phase.
            ("HEARTBEAT", HEARTBEAT_COLUMN),
        ],
        Kind::Node => &[
            ("READY", "/spec/ready"),
            ("ADDRESSES", "/spec/addresses"),
            ("LABELS", "/metadata/labels"),
        ],
        Kind::Pod => &[
            ("NODE", "/spec/nodeName"),
            ("IPS", "/spec/ips"),
            ("LABELS", "/metadata/labels"),
        ],
        Kind::Namespace => &[("LABELS", "/metadata/labels")],
    }
}

/// Where the table reads an EgressTunnel's last heartbeat from (see
/// [`with_heartbeats`]).
const HEARTBEAT_COLUMN: &str = "/heartbeat";

/// EgressTunnels with each node's last heartbeat renewal at
/// [`HEARTBEAT_COLUMN`]; a node that never renewed (not gateway-eligible:
/// only gateway candidates heartbeat) gets `-`.
fn with_heartbeats(
    items: &[Stored],
    beats: &[egress_control::datastore::Heartbeat],
) -> Vec<Stored> {
    items
        .iter()
        .map(|it| {
            let mut it = it.clone();
            let renewed = beats
                .iter()
                .find(|b| b.node == it.key.name)
                .map_or_else(|| "-".to_owned(), |b| b.renew_time.clone());
            if let Value::Object(o) = &mut it.value {
                o.insert(HEARTBEAT_COLUMN[1..].to_owned(), Value::String(renewed));
            }
            it
        })
        .collect()
}

fn print_table(kind: Kind, items: &[Stored]) {
    let ns = kind.namespaced();
    let mut rows: Vec<Vec<String>> = vec![];
    let mut head: Vec<String> = vec![];
    if ns {
        head.push("NAMESPACE".into());
    }
    head.push("NAME".into());
    head.extend(columns(kind).iter().map(|(h, _)| h.to_string()));
    rows.push(head);
    for it in items {
        let mut r = vec![];
        if ns {
            r.push(it.key.namespace.clone());
        }
        r.push(it.key.name.clone());
        r.extend(columns(kind).iter().map(|(_, p)| s(&it.value, p)));
        rows.push(r);
    }
    print_rows(&rows);
}

fn print_rows(rows: &[Vec<String>]) {
    let n = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..n)
        .map(|i| {
            rows.iter()
                .map(|r| r.get(i).map_or(0, |c| c.len()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    for r in rows {
        let line: Vec<String> = r
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<w$}", w = widths[i]))
            .collect();
        println!("{}", line.join("   ").trim_end());
    }
}

pub async fn run(args: GetArgs) -> anyhow::Result<()> {
    let ds = super::datastore::connect(&args.datastore, "egress-system").await?;
    if args.kind == "events" || args.kind == "event" || args.kind == "ev" {
        let evs = ds.events().await?;
        match args.output {
            Output::Json => println!("{}", serde_json::to_string_pretty(&evs)?),
            Output::Yaml => print!("{}", serde_yaml::to_string(&evs)?),
            Output::Table => {
                let mut rows = vec![vec![
                    "TIME".into(),
                    "TYPE".into(),
                    "REASON".into(),
                    "OBJECT".into(),
                    "MESSAGE".into(),
                ]];
                for e in evs {
                    rows.push(vec![
                        e.time,
                        e.type_,
                        e.reason,
                        format!("{}/{}", e.kind.name().to_ascii_lowercase(), e.key),
                        e.message,
                    ]);
                }
                print_rows(&rows);
            }
        }
        return Ok(());
    }
    let kind = parse_kind(&args.kind)?;
    let items: Vec<Stored> = match &args.name {
        Some(name) => {
            let key = typed::key(kind, &args.namespace, name);
            match ds.get(kind, &key).await? {
                Some(s) => vec![s],
                None => anyhow::bail!("{}/{key} not found", kind.name().to_ascii_lowercase()),
            }
        }
        None => {
            let mut v = ds.list(kind).await?.0;
            if kind.namespaced() && !args.all_namespaces {
                v.retain(|s| s.key.namespace == args.namespace);
            }
            v.sort_by(|a, b| a.key.cmp(&b.key));
            v
        }
    };
    let values: Vec<&Value> = items.iter().map(|s| &s.value).collect();
    match (args.output, args.name.is_some()) {
        (Output::Table, _) if kind == Kind::EgressTunnel => {
            print_table(kind, &with_heartbeats(&items, &ds.heartbeats().await?))
        }
        (Output::Table, _) => print_table(kind, &items),
        (Output::Json, true) => println!("{}", serde_json::to_string_pretty(values[0])?),
        (Output::Yaml, true) => print!("{}", serde_yaml::to_string(values[0])?),
        (Output::Json, false) => println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({"items": values}))?
        ),
        (Output::Yaml, false) => {
            for v in values {
                print!("---\n{}", serde_yaml::to_string(v)?);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use egress_control::datastore::{Heartbeat, ObjectKey};

    #[test]
    fn the_heartbeat_column_shows_the_last_renewal_or_a_dash() {
        let tunnel = |name: &str| Stored {
            kind: Kind::EgressTunnel,
            key: ObjectKey::cluster(name),
            value: serde_json::json!({"status": {"phase": "Ready", "lastHeartbeatTime": "old"}}),
            revision: 1,
        };
        let beats = [Heartbeat {
            node: "g1".into(),
            counter: 7,
            renew_time: "2026-12-01T21:00:00Z".into(),
        }];
        let rows = with_heartbeats(&[tunnel("g1"), tunnel("w1")], &beats);
        assert_eq!(s(&rows[0].value, HEARTBEAT_COLUMN), "2026-12-01T21:00:00Z");
        assert_eq!(s(&rows[1].value, HEARTBEAT_COLUMN), "-");
    }
}
