//! `sluice-cp`: parses settings, builds the control plane, runs it until
//! SIGINT/SIGTERM; or runs one of the maintenance subcommands.

use clap::{Parser, Subcommand};
use sluice_control_plane::app::App;
use sluice_control_plane::pki::{self, CertsCommand};
use sluice_control_plane::settings::Settings;

#[derive(Parser)]
#[command(name = "sluice-cp", version, about = "Sluice control plane: admin API and snapshot push")]
struct Cli {
    #[command(flatten)]
    settings: Settings,
    /// Without a subcommand, the control plane runs.
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Certificates for TLS between the control plane and the data planes.
    #[command(subcommand)]
    Certs(CertsCommand),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    sluice_control_plane::app::init_tracing();
    let cli = Cli::parse();
    match cli.command {
        None => {
            let app = App::build(cli.settings).await?;
            app.print_bound_addresses();
            app.run_until_stopped(sluice_control_plane::app::shutdown_signal()).await
        }
        Some(Command::Certs(command)) => {
            for path in pki::run(&command)?.0 {
                println!("wrote {}", path.display());
            }
            Ok(())
        }
    }
}
