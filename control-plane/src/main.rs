//! `sluice-cp`: parses settings, builds the control plane, runs it until
//! SIGINT/SIGTERM.

use clap::Parser;
use sluice_control_plane::app::App;
use sluice_control_plane::settings::Settings;

#[derive(Parser)]
#[command(name = "sluice-cp", version, about = "Sluice control plane: admin API and snapshot push")]
struct Cli {
    #[command(flatten)]
    settings: Settings,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    sluice_control_plane::app::init_tracing();
    let cli = Cli::parse();
    let app = App::build(cli.settings).await?;
    app.print_bound_addresses();
    app.run_until_stopped(sluice_control_plane::app::shutdown_signal()).await
}
