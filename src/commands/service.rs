//! Installing `labforge up` as this machine's systemd service.

use crate::cli::UsageError;
use crate::cli::build::s3_cache;
use crate::cli::service::ServiceInstallArgs;
use crate::cli::up::{notebook_domain, up_app_host};
use crate::cli::{Secret, env_var};
use anyhow::Context as _;
use std::path::Path;
use std::process::ExitCode;

pub(crate) fn service_install(args: &ServiceInstallArgs) -> anyhow::Result<ExitCode> {
    let binary = std::env::current_exe()
        .and_then(|exe| exe.canonicalize())
        .context("finding this program's own path")?;
    // What `up` would refuse is refused now, not by a service failing at every restart.
    if let Some(dest) = &args.backup_to {
        if dest.starts_with("s3://") {
            s3_cache(
                "--backup-to",
                dest,
                None,
                "us-east-1".into(),
                Some(Secret((String::new(), String::new()))),
            )?;
        } else if !Path::new(dest).is_absolute() {
            anyhow::bail!(
                "--backup-to {dest:?}: give the directory as an absolute path (the timer runs from /)"
            );
        }
    }
    let domain = notebook_domain(&args.up)?;
    let app_host = up_app_host(&args.up)?;
    let app_host = app_host.as_deref().or(domain.as_deref());
    labforge_embedded::up::check_notebook_site(
        domain.as_deref(),
        app_host,
        args.up.tls().is_some(),
    )?;
    match args.up.tls() {
        Some(labforge_embedded::up::TlsSource::Files(files)) => {
            labforge_proxy::server::tls_acceptor(&files)?;
        }
        Some(labforge_embedded::up::TlsSource::SelfSigned) => {
            labforge_embedded::up::certificate_names(domain.as_deref(), app_host, args.up.listen)?;
        }
        None => {}
    }
    labforge_notebook_controller::culler::CullingConfig::from_env(env_var)
        .map_err(|e| UsageError(e.into()))?;
    let up_args = args.up.service_args()?;
    if !up_args.iter().any(|arg| arg == "--agent") {
        tracing::warn!("no save agent found (run `make agent` or pass --agent): saves will fail");
    }
    // `up` reads culling from the environment: the service gets the installer's.
    let environment: Vec<(String, String)> =
        ["ENABLE_CULLING", "CULL_IDLE_TIME", "IDLENESS_CHECK_PERIOD"]
            .into_iter()
            .filter_map(|name| env_var(name).map(|value| (name.to_owned(), value)))
            .collect();
    let unit = crate::service::unit_file(&binary, &up_args, &environment);
    let path = args.unit_dir.join(format!("{}.service", args.name));
    let temporary = args.unit_dir.join(format!(".{}.service.tmp", args.name));
    std::fs::write(&temporary, unit)
        .and_then(|()| std::fs::rename(&temporary, &path))
        .with_context(|| format!("writing {}", path.display()))?;
    println!("Wrote {}: it runs {} up.", path.display(), binary.display());
    if let Some(dest) = &args.backup_to {
        let (service, timer) = crate::service::backup_units(
            &binary,
            &args.up.data_dir,
            &crate::service::BackupSchedule {
                dest,
                keep: args.backup_keep,
                on_calendar: &args.backup_on,
                environment_file: &args.backup_environment_file,
            },
        );
        for (suffix, text) in [("service", service), ("timer", timer)] {
            let path = args.unit_dir.join(format!("{}-backup.{suffix}", args.name));
            let temporary = args
                .unit_dir
                .join(format!(".{}-backup.{suffix}.tmp", args.name));
            std::fs::write(&temporary, text)
                .and_then(|()| std::fs::rename(&temporary, &path))
                .with_context(|| format!("writing {}", path.display()))?;
            println!("Wrote {}", path.display());
        }
        if dest.starts_with("s3://") {
            println!(
                "Put AWS_ACCESS_KEY_ID=… and AWS_SECRET_ACCESS_KEY=… (and AWS_ENDPOINT_URL=… for an S3-compatible server) in {}, readable by root only.",
                args.backup_environment_file.display()
            );
        }
        println!(
            "Back up {} to {dest}, keeping {}:  systemctl daemon-reload && systemctl enable --now {}-backup.timer",
            args.backup_on, args.backup_keep, args.name
        );
    }
    // The first admin is made here, on the installer's terminal: made by the service, the
    // password would be printed into the system journal.
    std::fs::create_dir_all(&args.up.data_dir)
        .with_context(|| format!("creating {}", args.up.data_dir.display()))?;
    let fresh = labforge_embedded::data_dir::check_format(&args.up.data_dir)?
        == labforge_embedded::data_dir::Found::Fresh;
    let users = labforge_web::users::Users::open(&args.up.data_dir)?;
    if let Some((name, password)) = users.ensure_admin()? {
        println!("Sign in as {name} with password {password}  (shown only now)");
    }
    if fresh {
        // A new data dir is this labforge's format: nothing for the first start to migrate.
        labforge_embedded::data_dir::record_format(&args.up.data_dir)?;
    }
    println!(
        "Start it now and at every boot:  systemctl daemon-reload && systemctl enable --now {}",
        args.name
    );
    println!(
        "Its URL and certificate fingerprint:  journalctl -u {}",
        args.name
    );
    Ok(ExitCode::SUCCESS)
}
