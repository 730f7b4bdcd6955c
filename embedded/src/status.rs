//! `labforge status`: an embedded instance at a glance, for its admin on the command line. Read
//! from the data dir (whether labforge runs or not) and the container engine.

use crate::data_dir::{DataDirError, Found, check_format};
use crate::store::Store;
use crate::up::RunningRecord;
use labforge_web::users::Users;
use serde::Serialize;
use std::collections::{BTreeMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    #[error(transparent)]
    Format(#[from] DataDirError),
    #[error(transparent)]
    Users(#[from] labforge_web::users::UserError),
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
}

/// What `labforge status` shows.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    pub data_dir: PathBuf,
    pub format: u32,
    /// The instance serving this data dir, if one runs.
    pub running: Option<RunningRecord>,
    pub users: usize,
    pub admins: usize,
    /// Notebooks per state (`ready`, `stopped`, …), every state that has one.
    pub notebooks: BTreeMap<String, usize>,
    pub saved_images: usize,
    /// What saves added to the registry: their layers (the images they sit on are shared).
    pub saved_layer_bytes: u64,
    pub disk: DiskUse,
    /// The engine's own storage (`<engine> system df`).
    pub engine_storage: Vec<EngineUse>,
    /// Why the engine's storage could not be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub engine_error: Option<String>,
    /// The last backup `labforge backup` made of this data dir.
    pub last_backup: Option<crate::data_dir::BackupRecord>,
}

/// Bytes allocated on disk under the data dir (each hard-linked file counted once).
#[derive(Debug, Default, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct DiskUse {
    pub data_dir: u64,
    /// The local registry's blobs (`registry/`).
    pub registry: u64,
    /// The save cache (`cache/`).
    pub cache: u64,
}

/// One line of `<engine> system df`: images, containers or volumes.
#[derive(Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct EngineUse {
    pub kind: String,
    pub count: String,
    /// Bytes (podman) or the engine's own text (docker prints `1.2GB`).
    pub size: String,
}

/// Reads the status of data dir `dir`, asking `engine` for its storage when nothing runs there
/// (a running instance names its own engine).
pub fn read(dir: &Path, engine: &Path) -> Result<Status, StatusError> {
    let format = match check_format(dir)? {
        Found::Fresh => {
            return Err(DataDirError::NoData {
                dir: dir.to_owned(),
            }
            .into());
        }
        Found::Current => crate::data_dir::FORMAT,
        Found::Older(format) => format,
    };
    let running = RunningRecord::of_running(dir);
    let users = Users::open(dir)?.list();
    // Opened only when there, because opening makes its directories.
    let store = match dir.join("store").is_dir() {
        true => Some(Store::open(&dir.join("store"))?),
        false => None,
    };
    let mut notebooks = BTreeMap::new();
    for notebook in store.iter().flat_map(|store| store.list(None)) {
        let (state, _) = labforge_web::api::state_of(&notebook);
        let name = serde_json::to_value(state)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        *notebooks.entry(name).or_insert(0) += 1;
    }
    let saved: Vec<_> = store
        .iter()
        .flat_map(|store| store.all_saved_images())
        .collect();
    let engine = running.as_ref().map_or(engine, |r| r.engine.as_path());
    let (engine_storage, engine_error) = match engine_storage(engine) {
        Ok(lines) => (lines, None),
        Err(why) => (Vec::new(), Some(why)),
    };
    Ok(Status {
        data_dir: dir.to_owned(),
        format,
        users: users.len(),
        admins: users.iter().filter(|u| u.admin).count(),
        notebooks,
        saved_images: saved.len(),
        saved_layer_bytes: saved.iter().map(|image| image.layer_bytes).sum(),
        disk: disk_use(dir),
        engine_storage,
        engine_error,
        last_backup: crate::data_dir::last_backup(dir),
        running,
    })
}

fn disk_use(dir: &Path) -> DiskUse {
    let mut seen = HashSet::new();
    let mut total = |path: &Path| allocated(path, &mut seen);
    // The parts first, so that a file linked into both is counted where it is first found.
    let registry = total(&dir.join("registry"));
    let cache = total(&dir.join("cache"));
    let rest = total(dir);
    DiskUse {
        data_dir: registry + cache + rest,
        registry,
        cache,
    }
}

/// Bytes allocated under `path`, leaving out files in `seen` (and adding those counted).
fn allocated(path: &Path, seen: &mut HashSet<(u64, u64)>) -> u64 {
    let mut bytes = 0;
    let mut pending = vec![path.to_owned()];
    while let Some(path) = pending.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if !seen.insert((meta.dev(), meta.ino())) {
            continue;
        }
        bytes += meta.blocks() * 512;
        if meta.is_dir()
            && let Ok(entries) = std::fs::read_dir(&path)
        {
            pending.extend(entries.flatten().map(|entry| entry.path()));
        }
    }
    bytes
}

/// `<engine> system df`, asked up to three times: podman fails it when a container it is
/// counting is removed meanwhile ("no such container"), which other users of the engine do at
/// any time.
fn engine_storage(engine: &Path) -> Result<Vec<EngineUse>, String> {
    let mut attempt = 1;
    loop {
        let output = std::process::Command::new(engine)
            .args(["system", "df", "--format", "{{json .}}"])
            .output()
            .map_err(|e| format!("{}: {e}", engine.display()))?;
        if output.status.success() {
            return Ok(parse_system_df(&String::from_utf8_lossy(&output.stdout)));
        }
        if attempt == 3 {
            return Err(format!(
                "{} system df: {}",
                engine.display(),
                String::from_utf8_lossy(&output.stderr).trim()
            ));
        }
        attempt += 1;
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
}

/// `system df --format '{{json .}}'`, one object per line: podman's numbers or docker's texts.
fn parse_system_df(text: &str) -> Vec<EngineUse> {
    let field = |line: &serde_json::Value, names: &[&str]| {
        names
            .iter()
            .find_map(|name| line.get(*name))
            .map(|value| match value {
                serde_json::Value::String(text) => text.clone(),
                other => other.to_string(),
            })
            .unwrap_or_default()
    };
    text.lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .map(|line| EngineUse {
            kind: field(&line, &["Type"]),
            count: field(&line, &["Total", "TotalCount"]),
            size: field(&line, &["Size"]),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn podman_and_docker_system_df_lines_are_read() {
        let podman = r#"{"Type":"Images","Total":3,"Active":1,"Size":1048576,"Reclaimable":0}
{"Type":"Local Volumes","Total":2,"Active":2,"Size":0,"Reclaimable":0}"#;
        assert_eq!(
            parse_system_df(podman),
            vec![
                EngineUse {
                    kind: "Images".into(),
                    count: "3".into(),
                    size: "1048576".into()
                },
                EngineUse {
                    kind: "Local Volumes".into(),
                    count: "2".into(),
                    size: "0".into()
                },
            ]
        );
        let docker =
            r#"{"Active":"1","Reclaimable":"0B","Size":"1.2GB","TotalCount":"4","Type":"Images"}"#;
        assert_eq!(
            parse_system_df(docker),
            vec![EngineUse {
                kind: "Images".into(),
                count: "4".into(),
                size: "1.2GB".into()
            }]
        );
    }

    #[test]
    fn a_file_linked_into_the_cache_is_counted_once() {
        let dir = tempfile::tempdir().unwrap();
        for sub in ["registry", "cache"] {
            std::fs::create_dir_all(dir.path().join(sub)).unwrap();
        }
        std::fs::write(dir.path().join("registry/blob"), vec![7u8; 64 * 1024]).unwrap();
        std::fs::hard_link(
            dir.path().join("registry/blob"),
            dir.path().join("cache/blob"),
        )
        .unwrap();
        let used = disk_use(dir.path());
        assert!(used.registry >= 64 * 1024, "{used:?}");
        assert!(
            used.cache < 64 * 1024,
            "the link is not counted again: {used:?}"
        );
        assert!(used.data_dir < 2 * 64 * 1024, "{used:?}");
    }
}
