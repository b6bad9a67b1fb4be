//! `egress delete KIND NAME`.

use clap::Args;
use egress_control::datastore::{typed, Kind};

use super::datastore::DatastoreArgs;

#[derive(Debug, Args)]
pub struct DeleteArgs {
    /// Kind: egressgateway (egw), egresspolicy (egp), egressclusterpolicy
    /// (egcp), egresstunnel (egt), node, pod, namespace.
    pub kind: String,
    pub name: String,
    #[arg(short = 'n', long, default_value = "default")]
    pub namespace: String,
    #[command(flatten)]
    pub datastore: DatastoreArgs,
}

pub fn parse_kind(s: &str) -> anyhow::Result<Kind> {
    Kind::parse(s).ok_or_else(|| {
        anyhow::anyhow!(
            "unknown kind {s:?}; one of: {}",
            Kind::ALL
                .iter()
                .map(|k| k.plural())
                .collect::<Vec<_>>()
                .join(", ")
        )
    })
}

pub async fn run(args: DeleteArgs) -> anyhow::Result<()> {
    let kind = parse_kind(&args.kind)?;
    let key = typed::key(kind, &args.namespace, &args.name);
    let ds = super::datastore::connect(&args.datastore, "egress-system").await?;
    ds.delete(kind, &key, None).await?;
    println!("{}/{key} deleted", kind.name().to_ascii_lowercase());
    Ok(())
}
