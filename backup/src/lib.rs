//! Backups of an embedded labforge (`labforge backup`, `labforge restore`): what a new machine
//! needs to bring every user's work back, which is more than the data dir's state. A snapshot
//! holds the state (users, notebooks, records, keys), the local registry (the catalog's images
//! and every saved environment, blobs byte for byte so digests stay the same) and each notebook
//! namespace's volumes (workspaces and data volumes).
//!
//! Content is stored once, by digest, in a directory or under an S3 prefix
//! ([`destination`]): repeated backups add only what changed, and each is a dated snapshot
//! ([`manifest`]). Volumes are read through the engine ([`volumes`]) while notebooks run.

pub mod destination;
pub mod manifest;
mod object;
mod prune;
mod restore;
mod take;
pub mod volumes;

pub use prune::{SnapshotInfo, list, prune};
pub use restore::{RestoreOptions, RestoreSummary, restore};
pub use take::{BackupOptions, BackupSummary, Progress, backup};

use destination::DestinationError;
use volumes::VolumeError;

#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    #[error(transparent)]
    DataDir(#[from] labforge_embedded::data_dir::DataDirError),
    #[error(transparent)]
    Users(#[from] labforge_web::users::UserError),
    #[error("{}", path.display())]
    Io {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("volume {volume}")]
    Volume {
        volume: String,
        #[source]
        source: VolumeError,
    },
    #[error("listing the container engine's volumes")]
    VolumeList(#[source] VolumeError),
    #[error("{dest}")]
    Destination {
        dest: String,
        #[source]
        source: DestinationError,
    },
    #[error(
        "the backup to {dest} stopped and made no snapshot; the {kept} snapshot(s) already there are whole (labforge backup list {dest})"
    )]
    Interrupted {
        dest: String,
        kept: usize,
        #[source]
        source: DestinationError,
    },
    #[error("{dest} holds no snapshot {id}: labforge backup list {dest} lists those it holds")]
    NoSuchSnapshot { dest: String, id: String },
    #[error("{dest} holds no snapshot")]
    NoSnapshot { dest: String },
    #[error("snapshot {id}: its manifest is unreadable: {detail}")]
    Manifest { id: String, detail: String },
    #[error("snapshot {id} is corrupt: object {digest} ({what}) failed its digest: {why}")]
    Corrupt {
        id: String,
        digest: String,
        what: String,
        /// What it holds instead.
        why: String,
    },
    #[error("snapshot {id} is incomplete: object {digest} ({what}) is missing from {dest}")]
    Missing {
        id: String,
        digest: String,
        what: String,
        dest: String,
    },
    #[error("snapshot {id}: {what} is nothing a labforge backup holds")]
    Unexpected { id: String, what: String },
    #[error(
        "volume {0} already exists in the container engine: restore where it does not, keep the engine's copy (--keep-existing-volumes), or remove it first (podman volume rm {0})"
    )]
    VolumeExists(String),
    #[error("volume {volume}: {path:?} is not a UTF-8 name, which a backup cannot keep")]
    NotUtf8 { volume: String, path: String },
}

fn io_error(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> BackupError + '_ {
    move |source| BackupError::Io {
        path: path.to_owned(),
        source,
    }
}
