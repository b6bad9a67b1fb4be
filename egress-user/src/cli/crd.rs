//! `egress crd`: the CRDs generated from the API types, as YAML.

use clap::Args;

#[derive(Debug, Args)]
pub struct CrdArgs {}

pub fn run(_: CrdArgs) -> anyhow::Result<()> {
    print!("{}", egress_control::api::crds_yaml());
    Ok(())
}
