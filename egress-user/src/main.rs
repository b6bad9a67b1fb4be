use clap::Parser;
use egress_user::cli::{self, Cli, Command};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    cli::init_tracing(cli.log_json);
    match cli.command {
        Command::Agent(args) => cli::agent::run(args).await,
        Command::Inspect(args) => cli::inspect::run(args),
        Command::Controller => anyhow::bail!("`egress controller` is not built yet (issue 4)"),
        Command::Reflector => anyhow::bail!("`egress reflector` is not built yet (issue 6)"),
    }
}
