//! Backups of the embedded mode and restoring them, with progress (`labforge-backup` does the work).

use crate::cli::backup::{BackupArgs, BackupCommand, BackupS3Args, RestoreArgs};
use crate::cli::build::s3_cache;
use crate::cli::{Secret, env_var};
use indicatif::HumanBytes;
use indicatif::{ProgressBar, ProgressStyle};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// A backup destination as given on the command line: `s3://…` or a directory.
pub(crate) fn backup_destination(
    text: &str,
    s3: &BackupS3Args,
) -> anyhow::Result<labforge_backup::destination::Destination> {
    use labforge_backup::destination::Destination;
    if text.starts_with("s3://") {
        let credentials = env_var("AWS_ACCESS_KEY_ID")
            .zip(env_var("AWS_SECRET_ACCESS_KEY"))
            .map(Secret);
        let cache = s3_cache(
            "the backup destination",
            text,
            s3.s3_endpoint.clone(),
            s3.s3_region.clone(),
            credentials,
        )?;
        return Ok(Destination::s3(
            cache,
            text.trim_end_matches('/').to_owned(),
        ));
    }
    let path = PathBuf::from(text);
    if path.is_file() {
        anyhow::bail!(
            "{text} is a file; backups are directories or s3://bucket/prefix (a .tar.zst of an \
             earlier labforge is the data dir's state: extract it into an empty data dir with \
             tar --zstd -xf {text} -C DATA_DIR)"
        );
    }
    Ok(Destination::dir(path))
}

/// The engine whose volumes a backup reads: the running instance's, else `engine`.
pub(crate) fn backup_engine(data_dir: &Path, engine: &Path) -> labforge_backup::volumes::Podman {
    let running = labforge_embedded::up::RunningRecord::of_running(data_dir);
    labforge_backup::volumes::Podman {
        program: running.map_or_else(|| engine.to_owned(), |r| r.engine),
    }
}

/// A spinner naming the part being backed up and the bytes read so far.
pub(crate) struct BackupProgress {
    bar: ProgressBar,
    read: std::sync::atomic::AtomicU64,
}

impl labforge_backup::Progress for BackupProgress {
    fn part(&self, what: &str) {
        self.bar.set_prefix(what.to_owned());
        self.tick();
    }

    fn read(&self, bytes: u64) {
        self.read
            .fetch_add(bytes, std::sync::atomic::Ordering::Relaxed);
        self.tick();
    }
}

impl BackupProgress {
    fn tick(&self) {
        let read = self.read.load(std::sync::atomic::Ordering::Relaxed);
        self.bar.set_message(format!("{} read", HumanBytes(read)));
    }
}

pub(crate) async fn run(args: BackupArgs) -> anyhow::Result<ExitCode> {
    if let Some(BackupCommand::List { dest, s3, json }) = args.command {
        let dest = backup_destination(&dest, &s3)?;
        let snapshots = labforge_backup::list(&dest).await?;
        if json {
            println!("{}", serde_json::to_string_pretty(&snapshots)?);
        } else if snapshots.is_empty() {
            println!("{dest} holds no snapshot");
        } else {
            println!(
                "{:<20} {:<28} {:>8} {:>7} {:>10} {:>10}",
                "SNAPSHOT", "TAKEN", "FILES", "VOLUMES", "SIZE", "ADDED"
            );
            for s in &snapshots {
                println!(
                    "{:<20} {:<28} {:>8} {:>7} {:>10} {:>10}",
                    s.id,
                    s.created,
                    s.files,
                    s.volumes,
                    HumanBytes(s.bytes).to_string(),
                    HumanBytes(s.added_bytes).to_string()
                );
            }
        }
        return Ok(ExitCode::SUCCESS);
    }
    let Some(text) = args.dest.as_deref() else {
        anyhow::bail!("labforge backup: name the destination: a directory or s3://bucket/prefix");
    };
    let dest = backup_destination(text, &args.s3)?;
    let volumes = backup_engine(&args.data_dir, &args.engine);
    let bar = if args.quiet || !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        ProgressBar::hidden()
    } else {
        ProgressBar::new_spinner()
    };
    bar.set_style(
        ProgressStyle::with_template("{spinner} {elapsed:>4} {prefix}: {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    bar.enable_steady_tick(std::time::Duration::from_millis(200));
    let progress = BackupProgress {
        bar,
        read: std::sync::atomic::AtomicU64::new(0),
    };
    let options = labforge_backup::BackupOptions {
        data_dir: &args.data_dir,
        dest: &dest,
        volumes: &volumes,
        keep: args.keep.map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
    };
    let result = labforge_backup::backup(&options, &progress).await;
    progress.bar.finish_and_clear();
    let summary = result?;
    println!(
        "Snapshot {} of {} in {dest}: {} files, {} volumes, {}; added {} ({} objects).",
        summary.id,
        args.data_dir.display(),
        summary.files,
        summary.volumes,
        HumanBytes(summary.bytes),
        HumanBytes(summary.added_bytes),
        summary.added_objects
    );
    if !summary.pruned.is_empty() {
        println!(
            "Removed {} older snapshot(s): {}",
            summary.pruned.len(),
            summary.pruned.join(", ")
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn restore(args: &RestoreArgs) -> anyhow::Result<ExitCode> {
    let dest = backup_destination(&args.dest, &args.s3)?;
    let volumes = labforge_backup::volumes::Podman {
        program: args.engine.clone(),
    };
    let summary = labforge_backup::restore(&labforge_backup::RestoreOptions {
        dest: &dest,
        snapshot: args.snapshot.as_deref(),
        data_dir: &args.data_dir,
        volumes: &volumes,
        keep_existing_volumes: args.keep_existing_volumes,
    })
    .await?;
    if !summary.kept_volumes.is_empty() {
        println!(
            "Kept the engine's own volumes: {}",
            summary.kept_volumes.join(", ")
        );
    }
    println!(
        "Restored snapshot {} ({} files, {} volumes, {}; data format {}) into {}; start labforge up on it.",
        summary.id,
        summary.files,
        summary.volumes,
        HumanBytes(summary.bytes),
        summary.data_format,
        args.data_dir.display()
    );
    Ok(ExitCode::SUCCESS)
}
