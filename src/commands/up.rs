//! `labforge up`, everything on one machine, and `labforge status` about it.

use crate::cli::UsageError;
use crate::cli::env_var;
use crate::cli::up::{UpArgs, default_agent, notebook_domain, up_app_host};
use crate::commands::stop_signal;
use crate::commands::web::spawner_config;
use indicatif::HumanBytes;
use std::path::Path;
use std::process::ExitCode;

/// `labforge status`: as a person reads it, or as JSON.
pub(crate) fn status(data_dir: &Path, engine: &Path, json: bool) -> anyhow::Result<ExitCode> {
    let status = labforge_embedded::status::read(data_dir, engine)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&status)?);
    } else {
        print!("{}", StatusText(&status));
    }
    Ok(ExitCode::SUCCESS)
}

/// `labforge status` as an admin reads it.
pub(crate) struct StatusText<'a>(&'a labforge_embedded::status::Status);

impl std::fmt::Display for StatusText<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "Data dir:      {} (format {})",
            self.0.data_dir.display(),
            self.0.format
        )?;
        match &self.0.running {
            Some(running) => {
                writeln!(
                    f,
                    "Instance:      running, pid {}, since {}",
                    running.pid,
                    running.started.strftime("%Y-%m-%d %H:%M UTC")
                )?;
                writeln!(f, "URL:           {}", running.url)?;
                let whose = if running.local_registry {
                    "labforge's own, blobs in the data dir"
                } else {
                    "configured"
                };
                writeln!(f, "Registry:      {} ({whose})", running.registry)?;
            }
            None => writeln!(f, "Instance:      not running")?,
        }
        writeln!(
            f,
            "Users:         {} ({} admin)",
            self.0.users, self.0.admins
        )?;
        let total: usize = self.0.notebooks.values().sum();
        let by_state: Vec<String> = self
            .0
            .notebooks
            .iter()
            .map(|(state, count)| format!("{count} {state}"))
            .collect();
        if by_state.is_empty() {
            writeln!(f, "Notebooks:     none")?;
        } else {
            writeln!(f, "Notebooks:     {total}: {}", by_state.join(", "))?;
        }
        writeln!(
            f,
            "Saved images:  {}, {} of layers",
            self.0.saved_images,
            HumanBytes(self.0.saved_layer_bytes)
        )?;
        writeln!(
            f,
            "Disk:          data dir {} (registry {}, cache {})",
            HumanBytes(self.0.disk.data_dir),
            HumanBytes(self.0.disk.registry),
            HumanBytes(self.0.disk.cache)
        )?;
        match &self.0.engine_error {
            None => {
                let parts: Vec<String> = self
                    .0
                    .engine_storage
                    .iter()
                    .map(|line| {
                        let size = line.size.parse::<u64>().map_or_else(
                            |_| line.size.clone(),
                            |bytes| HumanBytes(bytes).to_string(),
                        );
                        format!("{} {size} ({})", line.kind.to_lowercase(), line.count)
                    })
                    .collect();
                writeln!(f, "Engine:        {}", parts.join(", "))?;
            }
            Some(why) => writeln!(f, "Engine:        unknown: {why}")?,
        }
        match &self.0.last_backup {
            Some(last) => writeln!(
                f,
                "Last backup:   {} to {} (snapshot {}, {}, {} added)",
                last.finished,
                last.destination,
                last.snapshot,
                HumanBytes(last.bytes),
                HumanBytes(last.added_bytes)
            ),
            None => writeln!(f, "Last backup:   none (labforge backup DEST)"),
        }
    }
}

pub(crate) async fn run(args: &UpArgs) -> anyhow::Result<ExitCode> {
    let culling = labforge_notebook_controller::culler::CullingConfig::from_env(env_var)
        .map_err(|e| UsageError(e.into()))?;
    let spawner = spawner_config(args.spawner_config.as_deref())?;
    let agent = args.agent.clone().or_else(default_agent);
    if agent.is_none() {
        tracing::warn!("no save agent found (run `make agent` or pass --agent): saves will fail");
    }
    let mut running = labforge_embedded::up::start(labforge_embedded::up::UpOptions {
        data_dir: args.data_dir.clone(),
        listen: args.listen,
        engine: args.engine.clone(),
        registry: args.registry.clone(),
        registry_listen: args.registry_listen,
        registry_program: args.registry_program.clone(),
        insecure_registries: args.insecure_registries.clone(),
        agent,
        spawner,
        cache: None,
        culling,
        notebook_domain: notebook_domain(args)?,
        app_host: up_app_host(args)?,
        tls: args.tls(),
        metrics_listen: args.metrics_listen,
        concurrent_starts: args.concurrent_starts.map(usize::from),
        cdi_dirs: labforge_embedded::gpus::CDI_DIRS
            .iter()
            .map(Into::into)
            .collect(),
    })
    .await?;
    println!();
    println!("  labforge is running: {}", running.url);
    match &running.created_admin {
        Some((name, password)) => {
            println!("  Sign in as {name} with password {password}  (shown only now)")
        }
        None => println!(
            "  Sign in with your user; a forgotten password: labforge user reset <name> --data-dir {}",
            args.data_dir.display()
        ),
    }
    if let Some(certificate) = &running.self_signed {
        println!(
            "  TLS: self-signed certificate {} ({}); SHA-256 fingerprint:\n    {}",
            certificate.files.cert.display(),
            if certificate.made {
                "made now"
            } else {
                "kept from before"
            },
            certificate.fingerprint
        );
    }
    if let Some(metrics) = &running.metrics_url {
        println!("  Metrics: {metrics}");
    }
    println!(
        "  Registry: http://{}   Data: {}",
        running.registry,
        args.data_dir.display()
    );
    println!(
        "  Ctrl-C stops labforge; running notebooks keep running and are adopted at the next start."
    );
    println!();
    tokio::select! {
        ended = running.wait() => Err(ended.into()),
        () = stop_signal() => {
            tracing::info!("stopping");
            drop(running);
            Ok(ExitCode::SUCCESS)
        }
    }
}
