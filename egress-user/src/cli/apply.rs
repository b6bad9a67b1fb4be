//! `egress apply -f FILE.yaml [--dry-run]`: the YAML a user would give
//! kubectl, checked in full before anything is written.

use std::io::Read;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use egress_control::manifest::{self, ManifestError, Outcome};

use super::datastore::DatastoreArgs;

#[derive(Debug, Args)]
pub struct ApplyArgs {
    /// Manifest file; `-` reads standard input.
    #[arg(short = 'f', long = "filename")]
    pub file: PathBuf,
    /// Check and report, write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Namespace of namespaced objects that name none.
    #[arg(short = 'n', long, default_value = "default")]
    pub namespace: String,
    #[command(flatten)]
    pub datastore: DatastoreArgs,
}

pub async fn run(args: ApplyArgs) -> anyhow::Result<()> {
    let text = if args.file.as_os_str() == "-" {
        let mut s = String::new();
        std::io::stdin().read_to_string(&mut s)?;
        s
    } else {
        std::fs::read_to_string(&args.file)
            .with_context(|| format!("reading {}", args.file.display()))?
    };
    let ds = super::datastore::connect(&args.datastore, "egress-system").await?;
    let file = args.file.display();
    let done = match manifest::apply(ds.as_ref(), &text, &args.namespace, args.dry_run).await {
        Ok(done) => done,
        Err(ManifestError::Refused(problems)) => {
            // One line per problem, then the summary `main` prints.
            for p in &problems {
                eprintln!("{file}: {p}");
            }
            anyhow::bail!(
                "{file} was not applied: {} problem(s) (nothing was written)",
                problems.len()
            );
        }
        Err(e @ ManifestError::Empty) => anyhow::bail!("{file}: {e}; nothing was applied"),
        // A datastore that failed part way may hold the documents before.
        Err(e) => return Err(e).context(format!("{file} was not (fully) applied")),
    };
    for (doc, outcome) in done {
        let what = match outcome {
            Outcome::Created => "created",
            Outcome::Configured => "configured",
            Outcome::Unchanged => "unchanged",
        };
        let dry = if args.dry_run { " (dry run)" } else { "" };
        println!(
            "{}/{} {what}{dry}",
            doc.kind.name().to_ascii_lowercase(),
            doc.key
        );
    }
    Ok(())
}
