//! Backups of the embedded mode and restoring them (`labforge-backup` does the work).

use clap::{Args, Subcommand};
use std::path::PathBuf;

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct BackupArgs {
    #[command(subcommand)]
    pub command: Option<BackupCommand>,
    /// Where snapshots go: a directory, or s3://bucket/prefix (credentials from
    /// AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY).
    #[arg(required = true)]
    pub dest: Option<String>,
    /// Keep the newest N snapshots (this one included) and remove the others.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub keep: Option<u64>,
    #[arg(long, env = "LABFORGE_DATA", default_value = "/var/lib/labforge")]
    pub data_dir: PathBuf,
    /// The engine holding the volumes when labforge is not running (a running one names its own).
    #[arg(long, default_value = "podman")]
    pub engine: PathBuf,
    #[command(flatten)]
    pub s3: BackupS3Args,
    /// Print no progress.
    #[arg(long)]
    pub quiet: bool,
}

#[derive(Debug, Subcommand)]
pub enum BackupCommand {
    /// The snapshots DEST holds, oldest first.
    List {
        dest: String,
        #[command(flatten)]
        s3: BackupS3Args,
        /// Print them as JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
pub struct BackupS3Args {
    /// S3 endpoint URL (an S3-compatible server); AWS when absent.
    #[arg(long, env = "AWS_ENDPOINT_URL")]
    pub s3_endpoint: Option<String>,
    /// S3 region.
    #[arg(long, env = "AWS_REGION", default_value = "us-east-1")]
    pub s3_region: String,
}

#[derive(Debug, Args)]
pub struct RestoreArgs {
    /// The backup: a directory or s3://bucket/prefix.
    pub dest: String,
    /// The snapshot to restore (an id of `labforge backup list`); the newest by default.
    #[arg(long)]
    pub snapshot: Option<String>,
    #[arg(long, env = "LABFORGE_DATA", default_value = "/var/lib/labforge")]
    pub data_dir: PathBuf,
    /// The engine the volumes are made in.
    #[arg(long, default_value = "podman")]
    pub engine: PathBuf,
    /// Leave the volumes the engine still has as they are (this machine lost its data dir
    /// alone); without it, a volume that is there refuses the restore.
    #[arg(long)]
    pub keep_existing_volumes: bool,
    #[command(flatten)]
    pub s3: BackupS3Args,
}
