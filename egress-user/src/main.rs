use clap::Parser;
use egress_user::cli::{self, Cli, Command};

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    cli::init_tracing(cli.log_json);
    // Errors read as one line with their causes, never as a backtrace.
    if let Err(e) = dispatch(cli.command).await {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

async fn dispatch(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Agent(args) => cli::agent::run(*args).await,
        Command::Inspect(args) => cli::inspect::run(args),
        Command::Controller(args) => cli::controller::run(args).await,
        Command::Crd(args) => cli::crd::run(args),
        Command::Apply(args) => cli::apply::run(args).await,
        Command::Get(args) => cli::get::run(args).await,
        Command::Delete(args) => cli::delete::run(args).await,
        Command::Pod(cmd) => cli::pod::run(cmd).await,
        Command::Reflector(args) => cli::reflector::run(args).await,
        Command::Bgp(cmd) => cli::bgp::run(cmd).await,
    }
}
