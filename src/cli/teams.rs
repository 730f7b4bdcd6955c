//! The embedded mode's users, namespaces, quotas and audit trail, read and changed in its data dir.

use clap::{Args, Subcommand};
use std::path::PathBuf;

#[derive(Debug, Subcommand)]
pub enum NamespaceCommand {
    /// Show or set what a namespace's running notebooks may hold at once; a running labforge
    /// applies it at the next create or start. Without limits, shows the quota.
    Quota(QuotaArgs),
    /// Add a team namespace owned by a user, who manages its members.
    Add {
        name: String,
        /// The user who owns it.
        #[arg(long)]
        owner: String,
        #[arg(long, env = "LABFORGE_DATA", default_value = "/var/lib/labforge")]
        data_dir: PathBuf,
    },
    /// List every namespace with its owner and members.
    List {
        #[arg(long, env = "LABFORGE_DATA", default_value = "/var/lib/labforge")]
        data_dir: PathBuf,
    },
    /// Add or remove a namespace's members; a running labforge applies it at once.
    #[command(subcommand)]
    Member(MemberCommand),
}

#[derive(Debug, Subcommand)]
pub enum MemberCommand {
    /// Let a user into a namespace: `edit` creates, starts, stops, deletes, saves and opens its
    /// notebooks; `view` lists them, their status, events and logs, and opens nothing.
    Add {
        namespace: String,
        user: String,
        #[arg(long, value_parser = ["edit", "view"])]
        role: String,
        #[arg(long, env = "LABFORGE_DATA", default_value = "/var/lib/labforge")]
        data_dir: PathBuf,
    },
    /// Take a user out of a namespace.
    Remove {
        namespace: String,
        user: String,
        #[arg(long, env = "LABFORGE_DATA", default_value = "/var/lib/labforge")]
        data_dir: PathBuf,
    },
}

#[derive(Debug, Args)]
pub struct QuotaArgs {
    /// The namespace (a user's is named after them).
    pub namespace: String,
    #[arg(long, env = "LABFORGE_DATA", default_value = "/var/lib/labforge")]
    pub data_dir: PathBuf,
    /// CPU cores, e.g. 4 or 500m.
    #[arg(long)]
    pub cpu: Option<String>,
    /// Memory, e.g. 16Gi.
    #[arg(long)]
    pub memory: Option<String>,
    #[arg(long)]
    pub gpus: Option<u32>,
    /// Notebooks running at once.
    #[arg(long)]
    pub notebooks: Option<u32>,
    /// Workspace and data volumes together, e.g. 100Gi: counted by the size each was made
    /// with, deleted notebooks' kept volumes included.
    #[arg(long)]
    pub storage: Option<String>,
    /// Remove the quota: the namespace's notebooks are limited only by the catalog.
    #[arg(long, conflicts_with_all = ["cpu", "memory", "gpus", "notebooks", "storage"])]
    pub clear: bool,
}

#[derive(Debug, Args)]
pub struct AuditArgs {
    #[arg(long, env = "LABFORGE_DATA", default_value = "/var/lib/labforge")]
    pub data_dir: PathBuf,
    /// Only what this user did (or tried to sign in as).
    #[arg(long)]
    pub user: Option<String>,
    /// Only what was done in this namespace.
    #[arg(long)]
    pub namespace: Option<String>,
    /// Only since this time: RFC 3339 (2026-01-31T09:00:00Z) or a span back from now (90m, 2h,
    /// 7d).
    #[arg(long)]
    pub since: Option<String>,
    /// At most the newest N records.
    #[arg(long, default_value_t = 1000)]
    pub limit: usize,
    /// One JSON object per line, as stored.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum UserCommand {
    /// Add a user (their namespace has their name); prints the generated password once.
    Add {
        name: String,
        #[arg(long)]
        admin: bool,
        #[arg(long, env = "LABFORGE_DATA", default_value = "/var/lib/labforge")]
        data_dir: std::path::PathBuf,
    },
    /// List users.
    List {
        #[arg(long, env = "LABFORGE_DATA", default_value = "/var/lib/labforge")]
        data_dir: std::path::PathBuf,
    },
    /// Give a user a new generated password, printed once.
    Reset {
        name: String,
        #[arg(long, env = "LABFORGE_DATA", default_value = "/var/lib/labforge")]
        data_dir: std::path::PathBuf,
    },
    /// Remove a user (their notebooks stay until an admin deletes them).
    Remove {
        name: String,
        #[arg(long, env = "LABFORGE_DATA", default_value = "/var/lib/labforge")]
        data_dir: std::path::PathBuf,
    },
}
