//! `labforge restore DEST --data-dir DIR`: a snapshot back onto a machine, all or nothing.
//!
//! Everything is fetched and checked against its digest into a staging directory inside the
//! new data dir before anything is made: a corrupt or missing object stops the restore with the
//! object and the file it holds named, and nothing made. Then the volumes are made and filled
//! (removed again if one fails), and last the state and registry are moved into place.

use crate::destination::Destination;
use crate::manifest::{Entry, Kind, MANIFEST_FORMAT, Snapshot, is_snapshot_id};
use crate::object::fetch_verified;
use crate::volumes::Volumes;
use crate::{BackupError, io_error};
use labforge_embedded::data_dir::{self, REGISTRY_DIR};
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path};

pub struct RestoreOptions<'a> {
    pub dest: &'a Destination,
    /// The snapshot; the newest when `None`.
    pub snapshot: Option<&'a str>,
    pub data_dir: &'a Path,
    pub volumes: &'a dyn Volumes,
    /// Leave volumes the engine still has as they are (a machine that lost its data dir
    /// alone); without it such a volume refuses the restore.
    pub keep_existing_volumes: bool,
}

#[derive(Debug, Clone)]
pub struct RestoreSummary {
    pub id: String,
    pub files: usize,
    pub volumes: usize,
    /// Volumes left as the engine had them (`keep_existing_volumes`).
    pub kept_volumes: Vec<String>,
    pub bytes: u64,
    /// The data dir's format in the snapshot (migrated at the next start when older).
    pub data_format: u32,
}

/// Reads snapshot `id` (the newest when `None`) from `dest`.
pub(crate) async fn read_snapshot(
    dest: &Destination,
    id: Option<&str>,
) -> Result<Snapshot, BackupError> {
    let at_dest = |source| BackupError::Destination {
        dest: dest.to_string(),
        source,
    };
    let id = match id {
        Some(id) => {
            if !is_snapshot_id(id) {
                return Err(BackupError::NoSuchSnapshot {
                    dest: dest.to_string(),
                    id: id.to_owned(),
                });
            }
            id.to_owned()
        }
        None => dest
            .snapshot_ids()
            .await
            .map_err(at_dest)?
            .pop()
            .ok_or_else(|| BackupError::NoSnapshot {
                dest: dest.to_string(),
            })?,
    };
    let bytes = dest
        .get_snapshot(&id)
        .await
        .map_err(at_dest)?
        .ok_or_else(|| BackupError::NoSuchSnapshot {
            dest: dest.to_string(),
            id: id.clone(),
        })?;
    let snapshot: Snapshot = serde_json::from_slice(&bytes).map_err(|e| BackupError::Manifest {
        id: id.clone(),
        detail: e.to_string(),
    })?;
    if snapshot.format > MANIFEST_FORMAT {
        return Err(BackupError::Manifest {
            id,
            detail: format!(
                "written in manifest format {} by labforge {}; this labforge reads up to format {MANIFEST_FORMAT}",
                snapshot.format, snapshot.labforge
            ),
        });
    }
    Ok(snapshot)
}

pub async fn restore(options: &RestoreOptions<'_>) -> Result<RestoreSummary, BackupError> {
    data_dir::check_restorable(options.data_dir)?;
    let snapshot = read_snapshot(options.dest, options.snapshot).await?;
    let id = snapshot.id.clone();
    check_paths(&snapshot)?;
    let mut kept_volumes = Vec::new();
    for volume in &snapshot.volumes {
        let exists =
            options
                .volumes
                .exists(&volume.name)
                .map_err(|source| BackupError::Volume {
                    volume: volume.name.clone(),
                    source,
                })?;
        match (exists, options.keep_existing_volumes) {
            (true, true) => kept_volumes.push(volume.name.clone()),
            (true, false) => return Err(BackupError::VolumeExists(volume.name.clone())),
            (false, _) => {}
        }
    }

    std::fs::create_dir_all(options.data_dir).map_err(io_error(options.data_dir))?;
    let staging = options.data_dir.join(".restoring");
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(&staging).map_err(io_error(&staging))?;
    let result = stage_and_place(options, &snapshot, &kept_volumes, &staging).await;
    let _ = std::fs::remove_dir_all(&staging);
    result?;
    Ok(RestoreSummary {
        id,
        files: snapshot.files(),
        volumes: snapshot.volumes.len() - kept_volumes.len(),
        kept_volumes,
        bytes: snapshot.bytes,
        data_format: snapshot.data_format,
    })
}

async fn stage_and_place(
    options: &RestoreOptions<'_>,
    snapshot: &Snapshot,
    kept_volumes: &[String],
    staging: &Path,
) -> Result<(), BackupError> {
    let dest = options.dest;
    for entry in &snapshot.state {
        let target = staging.join(&entry.path);
        write_file(dest, &snapshot.id, entry, &entry.path, &target).await?;
    }
    for entry in &snapshot.registry {
        let target = staging.join(REGISTRY_DIR).join(&entry.path);
        let what = format!("{REGISTRY_DIR}/{}", entry.path);
        write_file(dest, &snapshot.id, entry, &what, &target).await?;
    }
    let volumes_dir = staging.join("volumes");
    std::fs::create_dir_all(&volumes_dir).map_err(io_error(&volumes_dir))?;
    let mut archives = Vec::new();
    for volume in snapshot
        .volumes
        .iter()
        .filter(|v| !kept_volumes.contains(&v.name))
    {
        let archive = volumes_dir.join(format!("{}.tar", volume.name));
        volume_archive(dest, &snapshot.id, volume, &archive, &volumes_dir).await?;
        archives.push((volume.name.as_str(), archive));
    }

    // Everything is here and checked: now the volumes, all or none.
    let mut made = Vec::new();
    for (name, archive) in &archives {
        if let Err(source) = options.volumes.import(name, archive) {
            // The one that failed may be half-made too.
            for name in made.iter().chain([name]) {
                let _ = options.volumes.remove(name);
            }
            return Err(BackupError::Volume {
                volume: (*name).to_owned(),
                source,
            });
        }
        made.push(*name);
    }
    if let Err(e) = data_dir::place_restored(staging, options.data_dir) {
        for name in made {
            let _ = options.volumes.remove(name);
        }
        return Err(e.into());
    }
    Ok(())
}

/// Writes the file `entry` describes at `target`.
async fn write_file(
    dest: &Destination,
    id: &str,
    entry: &Entry,
    what: &str,
    target: &Path,
) -> Result<(), BackupError> {
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent).map_err(io_error(parent))?;
    }
    content_to(dest, id, entry, what, target).await?;
    std::fs::set_permissions(target, std::fs::Permissions::from_mode(entry.mode & 0o777))
        .map_err(io_error(target))
}

/// The content of file `entry` into a new file at `target`, checked.
async fn content_to(
    dest: &Destination,
    id: &str,
    entry: &Entry,
    what: &str,
    target: &Path,
) -> Result<(), BackupError> {
    match (&entry.digest, entry.inline_bytes()) {
        (Some(hex), _) => fetch_verified(dest, id, hex, what, target).await,
        (None, Some(Ok(bytes))) => std::fs::write(target, bytes).map_err(io_error(target)),
        (None, Some(Err(e))) => Err(BackupError::Manifest {
            id: id.to_owned(),
            detail: format!("{what}: its inline content is not base64: {e}"),
        }),
        (None, None) if entry.size == 0 => std::fs::write(target, b"").map_err(io_error(target)),
        (None, None) => Err(BackupError::Manifest {
            id: id.to_owned(),
            detail: format!("{what}: no content for its {} bytes", entry.size),
        }),
    }
}

/// The tar `volume`'s entries make, for the engine to import.
async fn volume_archive(
    dest: &Destination,
    id: &str,
    volume: &crate::manifest::Volume,
    archive: &Path,
    scratch: &Path,
) -> Result<(), BackupError> {
    let file = std::fs::File::create(archive).map_err(io_error(archive))?;
    let mut tar = tar::Builder::new(std::io::BufWriter::new(file));
    let write_error = |e| io_error(archive)(e);
    let content = scratch.join("content");
    for entry in &volume.entries {
        // The volume's own root is the engine's to make (podman gives it to the container's
        // user at the first mount).
        if entry.path == "." {
            continue;
        }
        let mut header = tar::Header::new_gnu();
        header.set_mode(entry.mode);
        header.set_uid(entry.uid);
        header.set_gid(entry.gid);
        header.set_mtime(entry.mtime);
        let path = entry.path.clone();
        match entry.kind {
            Kind::File => {
                let what = format!("{} in volume {}", entry.path, volume.name);
                content_to(dest, id, entry, &what, &content).await?;
                let mut file = std::fs::File::open(&content).map_err(io_error(&content))?;
                let size = file.metadata().map_err(io_error(&content))?.len();
                header.set_entry_type(tar::EntryType::Regular);
                header.set_size(size);
                tar.append_data(&mut header, &path, &mut file)
                    .map_err(write_error)?;
            }
            Kind::Dir => {
                header.set_entry_type(tar::EntryType::Directory);
                header.set_size(0);
                tar.append_data(&mut header, &path, std::io::empty())
                    .map_err(write_error)?;
            }
            Kind::Symlink | Kind::Hardlink => {
                header.set_entry_type(if entry.kind == Kind::Symlink {
                    tar::EntryType::Symlink
                } else {
                    tar::EntryType::Link
                });
                header.set_size(0);
                let target = entry.target.as_deref().unwrap_or_default();
                tar.append_link(&mut header, &path, target)
                    .map_err(write_error)?;
            }
        }
    }
    let _ = std::fs::remove_file(&content);
    tar.into_inner()
        .map_err(write_error)?
        .into_inner()
        .map_err(|e| write_error(e.into_error()))?
        .sync_all()
        .map_err(write_error)
}

/// Refuses a manifest whose paths would write outside what a backup holds (one from a
/// destination someone else can write to).
fn check_paths(snapshot: &Snapshot) -> Result<(), BackupError> {
    let unexpected = |what: String| BackupError::Unexpected {
        id: snapshot.id.clone(),
        what,
    };
    let plain = |path: &str| {
        !path.is_empty()
            && Path::new(path)
                .components()
                .all(|c| matches!(c, Component::Normal(_)))
    };
    for entry in &snapshot.state {
        if !data_dir::is_state_path(Path::new(&entry.path)) || entry.kind != Kind::File {
            return Err(unexpected(entry.path.clone()));
        }
    }
    for entry in &snapshot.registry {
        if !plain(&entry.path) || entry.kind != Kind::File {
            return Err(unexpected(format!("{REGISTRY_DIR}/{}", entry.path)));
        }
    }
    for volume in &snapshot.volumes {
        let name_ok = volume.name.starts_with("labforge-")
            && volume
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
        if !name_ok {
            return Err(unexpected(format!("volume {:?}", volume.name)));
        }
        for entry in &volume.entries {
            let hardlink_ok =
                entry.kind != Kind::Hardlink || entry.target.as_deref().is_some_and(plain);
            if !(entry.path == "." || plain(&entry.path)) || !hardlink_ok {
                return Err(unexpected(format!(
                    "{:?} in volume {}",
                    entry.path, volume.name
                )));
            }
        }
    }
    Ok(())
}
