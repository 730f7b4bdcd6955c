//! Command-line arguments (clap structs that only parse) and their conversion into library options.

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use labforge_builder::commit::{CommitOptions, CommitProgress, commit_tree};
use labforge_builder::image::RuntimeConfig;
use labforge_builder::layer::Compression;
use labforge_builder::registry::RegistryOptions;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Exit code for bad configuration (sysexits' EX_USAGE), used before any work starts.
const EXIT_USAGE: u8 = 64;

#[derive(Debug, Parser)]
#[command(
    name = "labforge",
    version,
    about = "Notebook and online dev-environment manager"
)]
pub struct Cli {
    /// Log filter (tracing EnvFilter syntax), e.g. `info` or `labforge_builder=debug`.
    #[arg(long, global = true, env = "LABFORGE_LOG", default_value = "warn")]
    pub log: String,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Build images without a container daemon.
    #[command(subcommand)]
    Build(BuildCommand),
}

#[derive(Debug, Subcommand)]
pub enum BuildCommand {
    /// Commit a directory tree as an image and push it to a registry.
    ///
    /// The whole tree becomes the image's only layer.
    Commit(CommitArgs),
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum CompressionArg {
    Zstd,
    Gzip,
}

#[derive(Debug, Args)]
pub struct CommitArgs {
    /// Directory whose contents become the image's root filesystem.
    #[arg(long)]
    pub root: PathBuf,
    /// Image reference to push, e.g. `registry.example.com/team/env:v1`.
    #[arg(long)]
    pub target: String,
    /// Layer compression.
    #[arg(long, value_enum, default_value = "zstd")]
    pub compression: CompressionArg,
    /// Compression level (zstd 1-22, default 3; gzip 0-9, default 6).
    #[arg(long)]
    pub level: Option<i32>,
    /// Registry (`host[:port]`) to reach over plain HTTP; repeatable.
    #[arg(long = "insecure-registry")]
    pub insecure_registries: Vec<String>,
    /// Registry user name (the password comes from LABFORGE_REGISTRY_PASSWORD).
    #[arg(long, env = "LABFORGE_REGISTRY_USER")]
    pub registry_user: Option<String>,
    #[arg(long, env = "LABFORGE_REGISTRY_PASSWORD", hide = true)]
    pub registry_password: Option<String>,
    /// Image user (`uid[:gid]` or name).
    #[arg(long)]
    pub user: Option<String>,
    /// Image command; repeat for each argument.
    #[arg(long = "cmd")]
    pub cmd: Vec<String>,
    /// Directory for the staged layer (default: the system temp dir).
    #[arg(long)]
    pub scratch_dir: Option<PathBuf>,
    /// Print no progress bar.
    #[arg(long)]
    pub quiet: bool,
}

impl TryFrom<&CommitArgs> for CommitOptions {
    type Error = anyhow::Error;

    fn try_from(args: &CommitArgs) -> anyhow::Result<Self> {
        let compression = match (args.compression, args.level) {
            (CompressionArg::Zstd, None) => Compression::default(),
            (CompressionArg::Zstd, Some(level @ 1..=22)) => Compression::Zstd { level },
            (CompressionArg::Gzip, None) => Compression::Gzip { level: 6 },
            (CompressionArg::Gzip, Some(level @ 0..=9)) => Compression::Gzip {
                level: level.unsigned_abs(),
            },
            (kind, Some(level)) => {
                anyhow::bail!("--level {level} is out of range for {kind:?} compression")
            }
        };
        let credentials = match (&args.registry_user, &args.registry_password) {
            (Some(user), Some(password)) => Some((user.clone(), password.clone())),
            (None, None) => None,
            (Some(_), None) => {
                anyhow::bail!("--registry-user needs LABFORGE_REGISTRY_PASSWORD in the environment")
            }
            (None, Some(_)) => {
                anyhow::bail!("LABFORGE_REGISTRY_PASSWORD is set but --registry-user is not")
            }
        };
        Ok(CommitOptions {
            compression,
            registry: RegistryOptions {
                insecure: args.insecure_registries.clone(),
                credentials,
            },
            runtime: RuntimeConfig {
                user: args.user.clone(),
                cmd: args.cmd.clone(),
                ..Default::default()
            },
            scratch_dir: args.scratch_dir.clone().unwrap_or_else(std::env::temp_dir),
        })
    }
}

pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Build(BuildCommand::Commit(args)) => build_commit(&args).await,
    }
}

async fn build_commit(args: &CommitArgs) -> anyhow::Result<ExitCode> {
    let options = match CommitOptions::try_from(args) {
        Ok(options) => options,
        Err(err) => {
            eprintln!("labforge: error: {err:#}");
            return Ok(ExitCode::from(EXIT_USAGE));
        }
    };
    let bar = if args.quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new_spinner()
    };
    bar.set_style(
        ProgressStyle::with_template("{spinner} {elapsed:>4} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    bar.enable_steady_tick(Duration::from_millis(120));
    let reporter = bar.clone();
    let committed = commit_tree(&args.root, &args.target, &options, move |p| match p {
        CommitProgress::Writing { entries, bytes } => reporter.set_message(format!(
            "writing layer: {entries} files, {}",
            indicatif::HumanBytes(bytes)
        )),
        CommitProgress::Uploading { layer_bytes } => reporter.set_message(format!(
            "uploading layer ({})",
            indicatif::HumanBytes(layer_bytes)
        )),
    })
    .await
    .with_context(|| format!("committing {} to {}", args.root.display(), args.target));
    bar.finish_and_clear();
    let committed = committed?;
    println!(
        "pushed {}@{} (layer {}, {} files, {})",
        committed.image.reference,
        committed.image.manifest_digest,
        committed.layer.digest,
        committed.layer.entries,
        indicatif::HumanBytes(committed.layer.size)
    );
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> CommitArgs {
        let mut argv = vec![
            "labforge", "build", "commit", "--root", "/r", "--target", "h/i:t",
        ];
        argv.extend_from_slice(args);
        match Cli::try_parse_from(argv).unwrap().command {
            Command::Build(BuildCommand::Commit(args)) => args,
        }
    }

    #[test]
    fn defaults_are_zstd_level_3_and_anonymous() {
        let options = CommitOptions::try_from(&parse(&[])).unwrap();
        assert_eq!(options.compression, Compression::Zstd { level: 3 });
        assert!(options.registry.credentials.is_none());
    }

    #[test]
    fn out_of_range_level_is_refused_with_the_flag_named() {
        let err = CommitOptions::try_from(&parse(&["--compression", "gzip", "--level", "12"]))
            .unwrap_err();
        assert!(err.to_string().contains("--level 12"), "{err}");
        let ok =
            CommitOptions::try_from(&parse(&["--compression", "gzip", "--level", "1"])).unwrap();
        assert_eq!(ok.compression, Compression::Gzip { level: 1 });
    }

    #[test]
    fn user_without_password_is_refused() {
        let mut args = parse(&[]);
        args.registry_user = Some("alice".into());
        args.registry_password = None;
        let err = CommitOptions::try_from(&args).unwrap_err();
        assert!(
            err.to_string().contains("LABFORGE_REGISTRY_PASSWORD"),
            "{err}"
        );
    }
}
