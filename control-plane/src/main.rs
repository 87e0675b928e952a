//! `sluice-cp`: parses settings, builds the control plane, runs it until
//! SIGINT/SIGTERM; or runs one of the maintenance subcommands.

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use sluice_control_plane::app::{self, App};
use sluice_control_plane::pki::{self, CertsCommand};
use sluice_control_plane::secrets::SecretBox;
use sluice_control_plane::settings::Settings;
use sluice_control_plane::tokens::{Role, check_token_name};

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
    /// Named admin tokens with a role (`admin` or `read-only`); only their
    /// digests are stored. The same as `/v1/tokens`, straight on the database.
    #[command(subcommand)]
    Tokens(TokensCommand),
    /// Re-seal every secret in the database (certificate keys, JWT secrets,
    /// the API-key HMAC key, every stored snapshot) with a new secret key, in
    /// one transaction. The current key (`--secret-key` or the key file)
    /// opens them until it commits; then restart every control plane with
    /// the new key.
    RotateSecretKey {
        /// The new 32-byte key, hex or base64 (`openssl rand -hex 32`).
        #[arg(long, env = "SLUICE_NEW_SECRET_KEY", hide_env_values = true)]
        new_key: String,
    },
}

#[derive(Subcommand)]
enum TokensCommand {
    /// Create a token and print it: the only time it is shown.
    Create {
        /// Shown in the history as the author of the token's writes.
        name: String,
        #[arg(long, value_enum, default_value = "read-only")]
        role: Role,
    },
    /// List the named tokens (never the tokens themselves).
    List,
    /// Revoke a token: every control plane on the database refuses it from now on.
    Revoke { name: String },
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
        Some(Command::RotateSecretKey { new_key }) => rotate_secret_key(&cli.settings, &new_key).await,
        Some(Command::Tokens(command)) => tokens(&cli.settings, command).await,
    }
}

async fn tokens(settings: &Settings, command: TokensCommand) -> anyhow::Result<()> {
    let store = app::open_store(settings).await?;
    let result = match command {
        TokensCommand::Create { name, role } => {
            check_token_name(&name).map_err(|e| anyhow::anyhow!("token name {name:?}: {e}"))?;
            let (token, _) = store
                .create_admin_token(&name, role, "sluice-cp tokens")
                .await?
                .with_context(|| format!("a token named `{name}` already exists"))?;
            eprintln!("created the {} token `{name}`; it is shown once, only its digest is stored:", role.as_str());
            println!("{token}");
            Ok(())
        }
        TokensCommand::List => {
            println!("{:<24} {:<10} {:<26} CREATED BY", "NAME", "ROLE", "CREATED");
            for token in store.list_admin_tokens().await? {
                let created = chrono::DateTime::from_timestamp_millis(token.created_at)
                    .map_or_else(String::new, |t| t.to_rfc3339());
                println!("{:<24} {:<10} {:<26} {}", token.name, token.role.as_str(), created, token.created_by);
            }
            Ok(())
        }
        TokensCommand::Revoke { name } => {
            anyhow::ensure!(store.revoke_admin_token(&name).await?, "no token named `{name}`");
            println!("revoked `{name}`");
            Ok(())
        }
    };
    store.close().await;
    result
}

async fn rotate_secret_key(settings: &Settings, new_key: &str) -> anyhow::Result<()> {
    let new = SecretBox::from_key_material(new_key).context("--new-key")?;
    if settings.secret_key.is_none() && !settings.secret_key_file.exists() {
        anyhow::bail!(
            "no current secret key: give it with --secret-key, or point --secret-key-file at the key file ({} does not exist)",
            settings.secret_key_file.display()
        );
    }
    let store = app::open_store(settings).await?;
    anyhow::ensure!(store.secrets().key_id() != new.key_id(), "the new key is the current key");
    let rotated = store.rotate_secret_key(&new).await.context("re-sealing with the new key")?;
    store.close().await;
    println!(
        "re-sealed {} resources and {} snapshots with the new key (key id {})",
        rotated.resources,
        rotated.snapshots,
        new.key_id()
    );
    if settings.secret_key.is_none() {
        SecretBox::replace_key_file(&settings.secret_key_file, new_key).with_context(|| {
            format!(
                "the database uses the new key now, but writing it to {} failed: keep the new key",
                settings.secret_key_file.display()
            )
        })?;
        println!("wrote the new key to {}", settings.secret_key_file.display());
    } else {
        println!("set SLUICE_SECRET_KEY (or --secret-key) to the new key wherever the old one was used");
    }
    println!(
        "restart every control plane with the new key: until then they keep serving, but refuse writes. \
         Keep the old key with the database backups made before now: they need it."
    );
    Ok(())
}
