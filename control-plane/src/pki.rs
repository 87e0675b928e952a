//! `certs init` and `certs issue` (of `sluice-cp` and `sluice`): a private
//! certificate authority for the sync channel between the planes, the control
//! plane's server certificate and the data planes' client certificates, in
//! PEM files ready for `--grpc-tls-cert`, `--grpc-client-ca`,
//! `--control-plane-ca` and `--client-cert`. Keys are ECDSA P-256, written 0600.

use std::fs::OpenOptions;
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use chrono::{Datelike as _, Duration, Utc};
use clap::{Args, Subcommand};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

/// Names every control-plane certificate holds, so that data planes on the
/// same host (`sluice standalone`, tests, a single-host compose) verify it.
const LOOPBACK_NAMES: &[&str] = &["localhost", "127.0.0.1", "::1"];

#[derive(Debug, Subcommand)]
pub enum CertsCommand {
    /// Create a cluster CA, a control-plane certificate and one data-plane
    /// client certificate in `--dir`.
    Init(InitArgs),
    /// Issue another certificate from the CA in `--dir` (a data plane's by
    /// default, or with `--server` a control plane's, e.g. to renew it).
    Issue(IssueArgs),
}

#[derive(Debug, Args)]
pub struct InitArgs {
    /// Where the files are written (created if missing).
    #[arg(long, default_value = "sluice-certs")]
    pub dir: PathBuf,
    /// Where the CA's private key goes; default `--dir`. Keep it off the
    /// data-plane hosts: whoever holds it can mint certificates.
    #[arg(long)]
    pub ca_key_dir: Option<PathBuf>,
    /// A DNS name or IP address the data planes use to reach the control
    /// plane, beyond localhost; repeat for several.
    #[arg(long = "san")]
    pub sans: Vec<String>,
    /// Validity of the control-plane and data-plane certificates, in days
    /// (the CA's is ten times as long).
    #[arg(long, default_value_t = 365)]
    pub days: i64,
    /// If the CA already exists, leave every file as it is and succeed
    /// (for an init step that runs at each `docker compose up`).
    #[arg(long)]
    pub keep_existing: bool,
}

#[derive(Debug, Args)]
pub struct IssueArgs {
    /// The directory `certs init` wrote: the CA is read from it and the new
    /// files `NAME.pem` and `NAME-key.pem` are written to it.
    #[arg(long, default_value = "sluice-certs")]
    pub dir: PathBuf,
    /// The CA's private key; default `--dir`/ca-key.pem.
    #[arg(long)]
    pub ca_key: Option<PathBuf>,
    /// The certificate's common name and file name, e.g. `dp-eu-1`.
    #[arg(long)]
    pub name: String,
    /// A server certificate for a control plane instead of a client one.
    #[arg(long)]
    pub server: bool,
    /// A DNS name or IP address of a server certificate (repeatable).
    #[arg(long = "san")]
    pub sans: Vec<String>,
    #[arg(long, default_value_t = 365)]
    pub days: i64,
}

#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("{}: {source}", .path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{} already exists; pass --keep-existing to keep it, or choose another --dir", .0.display())]
    Exists(PathBuf),
    #[error("certificate generation failed: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("--name {0:?} must be letters, digits, '-', '_' or '.'")]
    BadName(String),
    #[error("--days must be between 1 and 3650")]
    BadDays,
}

/// What a command wrote, for printing.
pub struct Written(pub Vec<PathBuf>);

pub fn run(command: &CertsCommand) -> Result<Written, PkiError> {
    match command {
        CertsCommand::Init(args) => init(args),
        CertsCommand::Issue(args) => issue(args),
    }
}

fn init(args: &InitArgs) -> Result<Written, PkiError> {
    check_days(args.days)?;
    let ca_key_dir = args.ca_key_dir.as_deref().unwrap_or(&args.dir);
    let ca_cert_path = args.dir.join("ca.pem");
    if ca_cert_path.exists() {
        if args.keep_existing {
            return Ok(Written(Vec::new()));
        }
        return Err(PkiError::Exists(ca_cert_path));
    }
    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.distinguished_name = name("sluice cluster CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    validity(&mut ca_params, args.days * 10);
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca_params, ca_key);

    let mut written = Vec::new();
    written.push(write(&args.dir.join("ca.pem"), &ca_cert.pem(), false)?);
    written.push(write(&ca_key_dir.join("ca-key.pem"), &issuer.key().serialize_pem(), true)?);
    written.extend(leaf(&issuer, &args.dir, "control-plane", true, &args.sans, args.days)?);
    written.extend(leaf(&issuer, &args.dir, "data-plane", false, &[], args.days)?);
    Ok(Written(written))
}

fn issue(args: &IssueArgs) -> Result<Written, PkiError> {
    check_days(args.days)?;
    if args.name.is_empty() || !args.name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')) {
        return Err(PkiError::BadName(args.name.clone()));
    }
    let ca_cert_path = args.dir.join("ca.pem");
    let ca_key_path = args.ca_key.clone().unwrap_or_else(|| args.dir.join("ca-key.pem"));
    let ca_key = KeyPair::from_pem(&read(&ca_key_path)?)?;
    let issuer = Issuer::from_ca_cert_pem(&read(&ca_cert_path)?, ca_key)?;
    leaf(&issuer, &args.dir, &args.name, args.server, &args.sans, args.days).map(Written)
}

/// `NAME.pem` and `NAME-key.pem`, signed by the CA: a server certificate for
/// localhost and `sans`, or a client certificate named `NAME`.
fn leaf(
    issuer: &Issuer<'_, KeyPair>,
    dir: &Path,
    common_name: &str,
    server: bool,
    sans: &[String],
    days: i64,
) -> Result<Vec<PathBuf>, PkiError> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name = name(common_name);
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    if server {
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let names = LOOPBACK_NAMES.iter().map(|n| (*n).to_string()).chain(sans.iter().cloned());
        for name in names {
            let san = match name.parse() {
                Ok(ip) => SanType::IpAddress(ip),
                Err(_) => SanType::DnsName(name.try_into()?),
            };
            if !params.subject_alt_names.contains(&san) {
                params.subject_alt_names.push(san);
            }
        }
    } else {
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    }
    validity(&mut params, days);
    let cert = params.signed_by(&key, issuer)?;
    Ok(vec![
        write(&dir.join(format!("{common_name}.pem")), &cert.pem(), false)?,
        write(&dir.join(format!("{common_name}-key.pem")), &key.serialize_pem(), true)?,
    ])
}

fn name(common_name: &str) -> DistinguishedName {
    let mut name = DistinguishedName::new();
    name.push(DnType::OrganizationName, "sluice");
    name.push(DnType::CommonName, common_name);
    name
}

/// From yesterday (clocks of other hosts may lag) for `days`.
fn validity(params: &mut CertificateParams, days: i64) {
    let date = |at: chrono::DateTime<Utc>| {
        rcgen::date_time_ymd(at.year(), u8::try_from(at.month()).unwrap_or(1), u8::try_from(at.day()).unwrap_or(1))
    };
    params.not_before = date(Utc::now() - Duration::days(1));
    params.not_after = date(Utc::now() + Duration::days(days));
}

fn check_days(days: i64) -> Result<(), PkiError> {
    if (1..=3650).contains(&days) { Ok(()) } else { Err(PkiError::BadDays) }
}

fn read(path: &Path) -> Result<String, PkiError> {
    std::fs::read_to_string(path).map_err(|source| PkiError::Io { path: path.to_owned(), source })
}

/// Writes a new file (never over an existing one); private keys 0600.
fn write(path: &Path, text: &str, private: bool) -> Result<PathBuf, PkiError> {
    let io = |source| PkiError::Io { path: path.to_owned(), source };
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(io)?;
    }
    let mut file =
        OpenOptions::new().write(true).create_new(true).mode(if private { 0o600 } else { 0o644 }).open(path).map_err(
            |e| if e.kind() == std::io::ErrorKind::AlreadyExists { PkiError::Exists(path.to_owned()) } else { io(e) },
        )?;
    file.write_all(text.as_bytes()).map_err(io)?;
    file.sync_all().map_err(io)?;
    Ok(path.to_owned())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    #[test]
    fn init_then_issue_makes_a_chain_the_planes_accept() {
        let dir = tempfile::tempdir().unwrap();
        let init_args = InitArgs {
            dir: dir.path().into(),
            ca_key_dir: None,
            sans: vec!["cp.internal".into()],
            days: 30,
            keep_existing: false,
        };
        let written = init(&init_args).unwrap().0;
        assert_eq!(written.len(), 6);
        for file in ["ca-key.pem", "control-plane-key.pem", "data-plane-key.pem"] {
            let mode = std::fs::metadata(dir.path().join(file)).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{file}");
        }
        assert!(matches!(init(&init_args), Err(PkiError::Exists(_))));
        assert!(init(&InitArgs { keep_existing: true, ..init_args }).unwrap().0.is_empty());

        let issued = issue(&IssueArgs {
            dir: dir.path().into(),
            ca_key: None,
            name: "dp-2".into(),
            server: false,
            sans: vec![],
            days: 10,
        })
        .unwrap()
        .0;
        assert_eq!(issued, vec![dir.path().join("dp-2.pem"), dir.path().join("dp-2-key.pem")]);

        // The server certificate names localhost and the extra SAN, and both leaves chain to the CA.
        let pem = std::fs::read(dir.path().join("control-plane.pem")).unwrap();
        let (_, parsed) = x509_parser::pem::parse_x509_pem(&pem).unwrap();
        let cert = parsed.parse_x509().unwrap();
        let sans = cert.subject_alternative_name().unwrap().unwrap().value.general_names.len();
        assert_eq!(sans, 4, "localhost, 127.0.0.1, ::1, cp.internal");
        let roots = sluice_proto::tls::roots(&dir.path().join("ca.pem")).unwrap();
        assert_eq!(roots.len(), 1);
    }
}
