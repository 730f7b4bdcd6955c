//! `labforge backup list DEST` and `--keep N`: the snapshots a destination holds, and removing
//! the oldest with the objects no remaining snapshot names.

use crate::BackupError;
use crate::destination::Destination;
use crate::restore::read_snapshot;
use std::collections::HashSet;

/// One snapshot as `labforge backup list` shows it.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotInfo {
    pub id: String,
    pub created: String,
    pub files: usize,
    pub volumes: usize,
    pub bytes: u64,
    pub added_bytes: u64,
}

/// The snapshots in `dest`, oldest first.
pub async fn list(dest: &Destination) -> Result<Vec<SnapshotInfo>, BackupError> {
    let ids = dest
        .snapshot_ids()
        .await
        .map_err(|source| BackupError::Destination {
            dest: dest.to_string(),
            source,
        })?;
    let mut found = Vec::new();
    for id in ids {
        let snapshot = read_snapshot(dest, Some(&id)).await?;
        found.push(SnapshotInfo {
            files: snapshot.files(),
            volumes: snapshot.volumes.len(),
            id: snapshot.id,
            created: snapshot.created,
            bytes: snapshot.bytes,
            added_bytes: snapshot.added_bytes,
        });
    }
    Ok(found)
}

/// Keeps the newest `keep` snapshots (at least one) and the objects they name; returns the
/// snapshots removed. Manifests go first: a pruning cut short leaves unnamed objects, never a
/// snapshot without its objects.
pub async fn prune(dest: &Destination, keep: usize) -> Result<Vec<String>, BackupError> {
    let at_dest = |source| BackupError::Destination {
        dest: dest.to_string(),
        source,
    };
    let _lock = dest.lock().map_err(at_dest)?;
    let ids = dest.snapshot_ids().await.map_err(at_dest)?;
    let keep = keep.max(1);
    let removed: Vec<String> = ids[..ids.len().saturating_sub(keep)].to_vec();
    let mut named = HashSet::new();
    for id in &ids[removed.len()..] {
        let snapshot = read_snapshot(dest, Some(id)).await?;
        named.extend(snapshot.digests().map(str::to_owned));
    }
    for id in &removed {
        dest.delete_snapshot(id).await.map_err(at_dest)?;
    }
    for hex in dest.object_digests().await.map_err(at_dest)? {
        if !named.contains(&hex) {
            dest.delete_object(&hex).await.map_err(at_dest)?;
        }
    }
    Ok(removed)
}
