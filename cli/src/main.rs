//! `sluice`: the all-in-one command. `sluice standalone` runs a control plane
//! and one data plane in one process; the other subcommands are the admin CLI
//! talking to a control plane's REST API.

mod admin_client;
mod commands;
mod standalone;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use sluice_control_plane::pki;

#[derive(Parser)]
#[command(name = "sluice", version, about = "Sluice API gateway: all-in-one server and admin CLI")]
struct Cli {
    /// Admin API of the control plane.
    #[arg(long, global = true, env = "SLUICE_ADMIN_URL", default_value = "http://127.0.0.1:9080")]
    admin_url: String,
    /// PEM CA bundle the admin API's certificate must chain to, for an
    /// `https://` admin URL with a private CA (default: the system's CAs).
    #[arg(long, global = true, env = "SLUICE_ADMIN_CA")]
    admin_ca: Option<PathBuf>,
    /// Bearer token of the admin API. It may start with `-` (one in 64
    /// generated tokens does).
    #[arg(long, global = true, env = "SLUICE_ADMIN_TOKEN", hide_env_values = true, allow_hyphen_values = true)]
    admin_token: Option<String>,
    /// Output format of the admin commands.
    #[arg(long, short, global = true, value_enum, default_value_t = Output::Table)]
    output: Output,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    Json,
}

// Parsed once per process, so the size difference between variants costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Run a control plane (SQLite by default) and one data plane in this process.
    Standalone(standalone::StandaloneArgs),
    /// Make the gateway's configuration match a YAML or JSON file.
    Apply {
        #[arg(short, long)]
        file: PathBuf,
        /// Show what would change without changing anything.
        #[arg(long)]
        dry_run: bool,
    },
    /// Print the whole configuration as YAML (or JSON with `-o json`).
    Export,
    /// Show the connected data planes, the version each runs, NACKs and stale nodes.
    Status,
    /// Make a new snapshot whose configuration equals an earlier version.
    Rollback { version: u64 },
    /// List the newest snapshots (the versions `rollback` takes).
    History {
        /// How many snapshots to show.
        #[arg(long, default_value_t = 20)]
        limit: u32,
    },
    /// Check a config file offline, without a control plane.
    Validate {
        #[arg(short, long)]
        file: PathBuf,
    },
    /// Certificates for TLS between the control plane and the data planes.
    #[command(subcommand)]
    Certs(pki::CertsCommand),
}

#[tokio::main]
async fn main() -> ExitCode {
    match run(Cli::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let client = || admin_client::AdminClient::new(&cli.admin_url, cli.admin_token.as_deref(), cli.admin_ca.as_deref());
    match cli.command {
        Command::Standalone(args) => standalone::run(args).await,
        Command::Apply { file, dry_run } => commands::apply(&client()?, &file, dry_run, cli.output).await,
        Command::Export => commands::export(&client()?, cli.output).await,
        Command::Status => commands::status(&client()?, cli.output).await,
        Command::Rollback { version } => commands::rollback(&client()?, version, cli.output).await,
        Command::History { limit } => commands::history(&client()?, limit, cli.output).await,
        Command::Validate { file } => commands::validate(&file),
        Command::Certs(command) => {
            for path in pki::run(&command)?.0 {
                println!("wrote {}", path.display());
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Generated tokens are URL-safe base64, so one in 64 starts with `-`.
    #[test]
    fn a_token_may_start_with_a_hyphen() {
        let cli = Cli::try_parse_from(["sluice", "--admin-token", "-iX_9", "apply", "-f", "config.yaml"]).unwrap();
        assert_eq!(cli.admin_token.as_deref(), Some("-iX_9"));
        assert!(matches!(cli.command, Command::Apply { .. }));
    }
}
