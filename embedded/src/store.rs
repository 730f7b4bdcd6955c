//! The embedded mode's stand-in for the Kubernetes API: Notebook objects kept as JSON files under
//! the data dir, with resource versions and change notifications, so the runtime reconciles and
//! the UI follows the same objects a cluster would hold.
//!
//! One file per object, written to a temporary file and renamed, so a crash leaves the old or the
//! new object, never half of one. Saved-image records are kept the same way, one file per
//! namespace, and so are each notebook's newest events (capped, as Kubernetes expires them too).

use labforge_crds::notebook::Notebook;
use labforge_web::backend::{Backend, BackendError, Change, NotebookChange};
use labforge_web::model::{NotebookEvent, SavedImage};
use labforge_web::unavailable::Unavailable;
use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use tokio::sync::broadcast;

/// Events kept per notebook.
const EVENTS_KEPT: usize = 100;
/// How many of the newest events a new one is compared with, to count it as their repeat.
const EVENTS_COALESCED: usize = 5;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("notebook {namespace}/{name} already exists")]
    AlreadyExists { namespace: String, name: String },
    #[error("notebook {namespace}/{name} not found")]
    NotFound { namespace: String, name: String },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path}: {source}")]
    Corrupt {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

type Key = (String, String);

#[derive(Default)]
struct State {
    version: u64,
    notebooks: BTreeMap<Key, Notebook>,
    saved: BTreeMap<String, Vec<SavedImage>>,
    events: BTreeMap<Key, VecDeque<NotebookEvent>>,
}

pub struct Store {
    dir: PathBuf,
    state: Mutex<State>,
    changes: broadcast::Sender<Change>,
}

fn io_error(path: &Path) -> impl FnOnce(io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.to_owned(),
        source,
    }
}

fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(io_error(parent))?;
    }
    let temporary = path.with_extension("json.tmp");
    std::fs::write(&temporary, bytes).map_err(io_error(&temporary))?;
    std::fs::rename(&temporary, path).map_err(io_error(path))
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, StoreError> {
    let bytes = std::fs::read(path).map_err(io_error(path))?;
    serde_json::from_slice(&bytes).map_err(|source| StoreError::Corrupt {
        path: path.to_owned(),
        source,
    })
}

fn json_files(dir: &Path) -> Result<Vec<PathBuf>, StoreError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_error(dir)(e)),
    };
    let mut files = Vec::new();
    for entry in entries {
        let path = entry.map_err(io_error(dir))?.path();
        if path.extension().is_some_and(|e| e == "json") {
            files.push(path);
        }
    }
    Ok(files)
}

impl Store {
    /// Opens (or creates) the store under `dir`, reading every object kept there.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        let mut state = State::default();
        let notebooks_dir = dir.join("notebooks");
        std::fs::create_dir_all(&notebooks_dir).map_err(io_error(&notebooks_dir))?;
        for namespace_dir in std::fs::read_dir(&notebooks_dir).map_err(io_error(&notebooks_dir))? {
            let namespace_dir = namespace_dir.map_err(io_error(&notebooks_dir))?.path();
            for file in json_files(&namespace_dir)? {
                let notebook: Notebook = read_json(&file)?;
                let version = notebook
                    .metadata
                    .resource_version
                    .as_deref()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                state.version = state.version.max(version);
                if let (Some(ns), Some(name)) = (
                    notebook.metadata.namespace.clone(),
                    notebook.metadata.name.clone(),
                ) {
                    state.notebooks.insert((ns, name), notebook);
                }
            }
        }
        let events_dir = dir.join("events");
        if let Ok(namespaces) = std::fs::read_dir(&events_dir) {
            for namespace_dir in namespaces.flatten() {
                let ns = namespace_dir.file_name().to_string_lossy().into_owned();
                for file in json_files(&namespace_dir.path())? {
                    let events: VecDeque<NotebookEvent> = read_json(&file)?;
                    if let Some(name) = file.file_stem().and_then(|s| s.to_str()) {
                        state.events.insert((ns.clone(), name.to_owned()), events);
                    }
                }
            }
        }
        for file in json_files(&dir.join("saved-images"))? {
            let images: Vec<SavedImage> = read_json(&file)?;
            if let Some(ns) = file.file_stem().and_then(|s| s.to_str()) {
                state.saved.insert(ns.to_owned(), images);
            }
        }
        let (changes, _) = broadcast::channel(1024);
        Ok(Self {
            dir: dir.to_owned(),
            state: Mutex::new(state),
            changes,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock leaves consistent data: every write is one assignment.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn notebook_path(&self, namespace: &str, name: &str) -> PathBuf {
        self.dir
            .join("notebooks")
            .join(namespace)
            .join(format!("{name}.json"))
    }

    fn events_path(&self, namespace: &str, name: &str) -> PathBuf {
        self.dir
            .join("events")
            .join(namespace)
            .join(format!("{name}.json"))
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Change> {
        self.changes.subscribe()
    }

    fn notify(&self, change: Change) {
        // Nobody listening is fine.
        let _ = self.changes.send(change);
    }

    /// Tells the namespace's watchers that its notebooks' resource use was sampled again.
    pub fn notify_usage(&self, namespace: &str) {
        self.notify(Change::Usage {
            namespace: namespace.to_owned(),
        });
    }

    /// Notebooks of `namespace`, or of every namespace.
    pub fn list(&self, namespace: Option<&str>) -> Vec<Notebook> {
        let state = self.lock();
        state
            .notebooks
            .iter()
            .filter(|((ns, _), _)| namespace.is_none_or(|want| want == ns))
            .map(|(_, nb)| nb.clone())
            .collect()
    }

    pub fn get(&self, namespace: &str, name: &str) -> Option<Notebook> {
        self.lock()
            .notebooks
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned()
    }

    /// Stores a new notebook, giving it a uid, creation time and resource version.
    pub fn create(&self, mut notebook: Notebook) -> Result<Notebook, StoreError> {
        let namespace = notebook.metadata.namespace.clone().unwrap_or_default();
        let name = notebook.metadata.name.clone().unwrap_or_default();
        let mut state = self.lock();
        let key = (namespace.clone(), name.clone());
        if state.notebooks.contains_key(&key) {
            return Err(StoreError::AlreadyExists { namespace, name });
        }
        state.version += 1;
        let mut uid = [0u8; 16];
        let _ = getrandom::fill(&mut uid);
        notebook.metadata.uid = Some(hex::encode(uid));
        notebook.metadata.resource_version = Some(state.version.to_string());
        // Whole seconds, as Kubernetes stores them (and as the JSON file keeps them).
        let now = jiff::Timestamp::from_second(jiff::Timestamp::now().as_second())
            .unwrap_or_else(|_| jiff::Timestamp::now());
        notebook.metadata.creation_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now));
        notebook.metadata.generation = Some(1);
        let bytes = serde_json::to_vec_pretty(&notebook).unwrap_or_default();
        write_atomically(&self.notebook_path(&namespace, &name), &bytes)?;
        state.notebooks.insert(key, notebook.clone());
        drop(state);
        self.notify(Change::Notebook { namespace, name });
        Ok(notebook)
    }

    /// Changes a notebook with `change`; written and announced only when it changed anything.
    pub fn update(
        &self,
        namespace: &str,
        name: &str,
        change: impl FnOnce(&mut Notebook),
    ) -> Result<Notebook, StoreError> {
        let mut state = self.lock();
        let key = (namespace.to_owned(), name.to_owned());
        let current = state
            .notebooks
            .get(&key)
            .ok_or_else(|| StoreError::NotFound {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
            })?;
        let mut updated = current.clone();
        change(&mut updated);
        if &updated == current {
            return Ok(updated);
        }
        if updated.spec != current.spec {
            updated.metadata.generation = Some(current.metadata.generation.unwrap_or(1) + 1);
        }
        let status_only = updated.spec == current.spec && updated.metadata == current.metadata;
        state.version += 1;
        updated.metadata.resource_version = Some(state.version.to_string());
        let bytes = serde_json::to_vec_pretty(&updated).unwrap_or_default();
        write_atomically(&self.notebook_path(namespace, name), &bytes)?;
        state.notebooks.insert(key, updated.clone());
        drop(state);
        let (namespace, name) = (namespace.to_owned(), name.to_owned());
        self.notify(if status_only {
            Change::Status { namespace, name }
        } else {
            Change::Notebook { namespace, name }
        });
        Ok(updated)
    }

    pub fn delete(&self, namespace: &str, name: &str) -> Result<Notebook, StoreError> {
        let mut state = self.lock();
        let key = (namespace.to_owned(), name.to_owned());
        let Some(notebook) = state.notebooks.get(&key).cloned() else {
            return Err(StoreError::NotFound {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
            });
        };
        let path = self.notebook_path(namespace, name);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_error(&path)(e)),
        }
        state.notebooks.remove(&key);
        state.events.remove(&key);
        let _ = std::fs::remove_file(self.events_path(namespace, name));
        state.version += 1;
        drop(state);
        self.notify(Change::Notebook {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        });
        Ok(notebook)
    }

    /// Records an event; the same reason and message as the newest one only refreshes its time.
    pub fn record_event(
        &self,
        namespace: &str,
        name: &str,
        kind: &str,
        reason: &str,
        message: &str,
    ) {
        let mut state = self.lock();
        let key = (namespace.to_owned(), name.to_owned());
        let events = state.events.entry(key).or_default();
        let time = jiff::Timestamp::now().to_string();
        // A repeat of one of the last few (a retry loop alternates a handful of events) is
        // counted and moved to the end, as Kubernetes aggregates events, rather than listed again.
        let recent = events.len().saturating_sub(EVENTS_COALESCED);
        let repeat = (recent..events.len())
            .rev()
            .find(|&i| events[i].reason == reason && events[i].message == message)
            .and_then(|i| events.remove(i));
        let event = match repeat {
            Some(earlier) => NotebookEvent {
                time,
                count: earlier.count.saturating_add(1),
                ..earlier
            },
            None => NotebookEvent {
                kind: kind.to_owned(),
                reason: reason.to_owned(),
                message: message.to_owned(),
                time,
                count: 1,
            },
        };
        events.push_back(event);
        if events.len() > EVENTS_KEPT {
            events.pop_front();
        }
        let bytes = serde_json::to_vec(&*events).unwrap_or_default();
        // Events are a record for people: one lost to a full disk must not fail the work it tells of.
        if let Err(err) = write_atomically(&self.events_path(namespace, name), &bytes) {
            tracing::warn!(error = %err, "recording an event");
        }
        drop(state);
        self.notify(Change::Event {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        });
    }

    pub fn events(&self, namespace: &str, name: &str) -> Vec<NotebookEvent> {
        self.lock()
            .events
            .get(&(namespace.to_owned(), name.to_owned()))
            .map(|e| e.iter().cloned().collect())
            .unwrap_or_default()
    }

    pub fn add_saved_image(&self, image: SavedImage) -> Result<(), StoreError> {
        let namespace = image.namespace.clone();
        self.change_saved_images(&namespace, |images| images.push(image))
    }

    /// Forgets a saved image (pruned from its registry).
    pub fn remove_saved_image(&self, namespace: &str, image: &str) -> Result<(), StoreError> {
        self.change_saved_images(namespace, |images| images.retain(|i| i.image != image))
    }

    /// Changes the saved-image records of `namespace`: written, then kept, then announced.
    fn change_saved_images(
        &self,
        namespace: &str,
        change: impl FnOnce(&mut Vec<SavedImage>),
    ) -> Result<(), StoreError> {
        let mut state = self.lock();
        let mut images = state.saved.get(namespace).cloned().unwrap_or_default();
        change(&mut images);
        let path = self
            .dir
            .join("saved-images")
            .join(format!("{namespace}.json"));
        write_atomically(
            &path,
            &serde_json::to_vec_pretty(&images).unwrap_or_default(),
        )?;
        state.saved.insert(namespace.to_owned(), images);
        drop(state);
        self.notify(Change::SavedImages {
            namespace: namespace.to_owned(),
        });
        Ok(())
    }

    /// Shares `image`, saved in `namespace`, with exactly `with`; `None` when there is no such
    /// saved image.
    pub fn share_saved_image(
        &self,
        namespace: &str,
        image: &str,
        with: &[String],
    ) -> Result<Option<SavedImage>, StoreError> {
        // No such image: nothing is written, and nothing announced.
        let known = self
            .lock()
            .saved
            .get(namespace)
            .is_some_and(|images| images.iter().any(|i| i.image == image));
        if !known {
            return Ok(None);
        }
        let mut shared = None;
        self.change_saved_images(namespace, |images| {
            if let Some(saved) = images.iter_mut().find(|i| i.image == image) {
                saved.shared_with = with.to_vec();
                shared = Some(saved.clone());
            }
        })?;
        Ok(shared)
    }

    /// Images other namespaces saved and shared with `namespace`, newest first.
    pub fn images_shared_with(&self, namespace: &str) -> Vec<SavedImage> {
        let mut shared: Vec<SavedImage> = self
            .lock()
            .saved
            .iter()
            .filter(|(owner, _)| owner.as_str() != namespace)
            .flat_map(|(_, images)| images)
            .filter(|image| image.shared_with.iter().any(|ns| ns == namespace))
            .cloned()
            .collect();
        shared.sort_by(|a, b| b.created.cmp(&a.created));
        shared
    }

    /// Saved images of every namespace.
    pub fn all_saved_images(&self) -> Vec<SavedImage> {
        self.lock().saved.values().flatten().cloned().collect()
    }

    /// Saved images of `namespace`, newest first.
    pub fn saved_images(&self, namespace: &str) -> Vec<SavedImage> {
        let mut images = self
            .lock()
            .saved
            .get(namespace)
            .cloned()
            .unwrap_or_default();
        images.reverse();
        images
    }
}

/// Where namespace `namespace`'s quota is kept in the store at `store_dir`. Read at every check,
/// so that `labforge namespace quota` takes effect on a running labforge at once.
fn quota_path(store_dir: &Path, namespace: &str) -> PathBuf {
    store_dir.join("quotas").join(format!("{namespace}.json"))
}

/// Namespace `namespace`'s quota in the store at `store_dir`, when one is set.
pub fn read_quota(
    store_dir: &Path,
    namespace: &str,
) -> Result<Option<labforge_web::quota::Quota>, StoreError> {
    let path = quota_path(store_dir, namespace);
    match read_json(&path) {
        Ok(quota) => Ok(Some(quota)),
        Err(StoreError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(err),
    }
}

/// Sets namespace `namespace`'s quota in the store at `store_dir`, or with `None` removes it.
pub fn write_quota(
    store_dir: &Path,
    namespace: &str,
    quota: Option<&labforge_web::quota::Quota>,
) -> Result<(), StoreError> {
    let path = quota_path(store_dir, namespace);
    match quota {
        Some(quota) => {
            write_atomically(&path, &serde_json::to_vec_pretty(quota).unwrap_or_default())
        }
        None => match std::fs::remove_file(&path) {
            Err(err) if err.kind() != io::ErrorKind::NotFound => Err(io_error(&path)(err)),
            _ => Ok(()),
        },
    }
}

impl From<StoreError> for BackendError {
    fn from(err: StoreError) -> Self {
        match err {
            StoreError::AlreadyExists { namespace, name } => {
                Self::AlreadyExists { namespace, name }
            }
            StoreError::NotFound { namespace, name } => Self::NotFound { namespace, name },
            StoreError::Io { path, source } => {
                Unavailable::new(path.display().to_string(), source).into()
            }
            StoreError::Corrupt { path, source } => {
                Unavailable::new(path.display().to_string(), source).into()
            }
        }
    }
}

/// The store is the embedded mode's [`Backend`].
#[async_trait::async_trait]
impl Backend for Store {
    async fn list(&self, namespace: Option<&str>) -> Result<Vec<Notebook>, BackendError> {
        Ok(Store::list(self, namespace))
    }
    async fn get(&self, namespace: &str, name: &str) -> Result<Option<Notebook>, BackendError> {
        Ok(Store::get(self, namespace, name))
    }
    async fn create(&self, notebook: Notebook) -> Result<Notebook, BackendError> {
        Ok(Store::create(self, notebook)?)
    }
    async fn update(
        &self,
        namespace: &str,
        name: &str,
        change: NotebookChange<'_>,
    ) -> Result<Notebook, BackendError> {
        Ok(Store::update(self, namespace, name, |nb| change(nb))?)
    }
    async fn delete(&self, namespace: &str, name: &str) -> Result<(), BackendError> {
        Store::delete(self, namespace, name)?;
        Ok(())
    }
    async fn events(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Vec<NotebookEvent>, BackendError> {
        Ok(Store::events(self, namespace, name))
    }
    async fn record_event(
        &self,
        namespace: &str,
        name: &str,
        kind: &str,
        reason: &str,
        message: &str,
    ) {
        Store::record_event(self, namespace, name, kind, reason, message);
    }
    async fn saved_images(&self, namespace: &str) -> Result<Vec<SavedImage>, BackendError> {
        Ok(Store::saved_images(self, namespace))
    }
    async fn share_saved_image(
        &self,
        namespace: &str,
        image: &str,
        with: &[String],
    ) -> Result<Option<SavedImage>, BackendError> {
        Ok(Store::share_saved_image(self, namespace, image, with)?)
    }
    async fn images_shared_with(&self, namespace: &str) -> Result<Vec<SavedImage>, BackendError> {
        Ok(Store::images_shared_with(self, namespace))
    }

    async fn quota(
        &self,
        namespace: &str,
    ) -> Result<Option<labforge_web::quota::Quota>, BackendError> {
        Ok(read_quota(&self.dir, namespace)?)
    }

    async fn set_quota(
        &self,
        namespace: &str,
        quota: Option<labforge_web::quota::Quota>,
    ) -> Result<(), BackendError> {
        Ok(write_quota(&self.dir, namespace, quota.as_ref())?)
    }
    async fn saved_image_namespaces_with_digest(
        &self,
        digest: &str,
    ) -> Result<Vec<String>, BackendError> {
        Ok(self
            .all_saved_images()
            .into_iter()
            .filter(|i| i.digest == digest)
            .map(|i| i.namespace)
            .collect())
    }
    fn changes(&self) -> broadcast::Receiver<Change> {
        self.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use labforge_crds::notebook::NotebookSpec;

    fn notebook(ns: &str, name: &str) -> Notebook {
        let mut nb = Notebook::new(name, NotebookSpec::default());
        nb.metadata.namespace = Some(ns.into());
        nb
    }

    #[test]
    fn a_retry_loops_events_are_counted_not_listed_again() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        store.record_event("alice", "lab", "Normal", "Created", "made");
        for _ in 0..3 {
            store.record_event("alice", "lab", "Normal", "Pulling", "pulling x");
            store.record_event("alice", "lab", "Warning", "ErrImagePull", "cannot pull x");
        }
        let seen = |store: &Store| -> Vec<(String, u32)> {
            store
                .events("alice", "lab")
                .into_iter()
                .map(|e| (e.reason, e.count))
                .collect()
        };
        let want = vec![
            ("Created".to_owned(), 1),
            ("Pulling".to_owned(), 3),
            ("ErrImagePull".to_owned(), 3),
        ];
        assert_eq!(seen(&store), want);
        // The same reason with another message is another event; the count survives a reopen.
        store.record_event("alice", "lab", "Normal", "Pulling", "pulling y");
        let reopened = Store::open(dir.path()).unwrap();
        assert_eq!(seen(&reopened).len(), 4);
        assert_eq!(seen(&reopened)[..3], want[..]);
    }

    #[test]
    fn objects_survive_a_reopen_with_their_versions() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let mut changes = store.subscribe();
        let created = store.create(notebook("alice", "lab")).unwrap();
        assert_eq!(created.metadata.resource_version.as_deref(), Some("1"));
        assert!(matches!(
            store.create(notebook("alice", "lab")),
            Err(StoreError::AlreadyExists { .. })
        ));
        let updated = store
            .update("alice", "lab", |nb| {
                nb.metadata.labels = Some([("a".into(), "b".into())].into())
            })
            .unwrap();
        assert_eq!(updated.metadata.resource_version.as_deref(), Some("2"));
        // An update that changes nothing is not written and not announced.
        let same = store.update("alice", "lab", |_| {}).unwrap();
        assert_eq!(same.metadata.resource_version.as_deref(), Some("2"));
        assert!(changes.try_recv().is_ok());
        assert!(changes.try_recv().is_ok());
        assert!(changes.try_recv().is_err());
        // A status written by the runtime is announced as such, so the runtime does not wake on it.
        let reported = store
            .update("alice", "lab", |nb| nb.status = Some(Default::default()))
            .unwrap();
        assert_eq!(
            changes.try_recv().unwrap(),
            Change::Status {
                namespace: "alice".into(),
                name: "lab".into()
            }
        );
        let updated = reported;

        let reopened = Store::open(dir.path()).unwrap();
        assert_eq!(reopened.get("alice", "lab"), Some(updated));
        let next = reopened.create(notebook("bob", "lab")).unwrap();
        assert_eq!(next.metadata.resource_version.as_deref(), Some("4"));
        reopened.delete("alice", "lab").unwrap();

        // Saved images: newest first, removable, kept across a reopen.
        let image = |tag: &str| SavedImage {
            image: format!("registry.local/alice/lab:{tag}"),
            digest: format!("sha256:{tag}"),
            notebook: "lab".into(),
            namespace: "alice".into(),
            base: String::new(),
            server_type: Some(labforge_web::model::ServerType::Jupyter),
            layer_bytes: 1,
            files_changed: 1,
            files_deleted: 0,
            created: String::new(),
            summary: None,
            shared_with: Vec::new(),
        };
        reopened.add_saved_image(image("v1")).unwrap();
        reopened.add_saved_image(image("v2")).unwrap();
        reopened.add_saved_image(image("v3")).unwrap();
        reopened
            .remove_saved_image("alice", "registry.local/alice/lab:v2")
            .unwrap();
        let tags: Vec<String> = Store::open(dir.path())
            .unwrap()
            .saved_images("alice")
            .into_iter()
            .map(|i| i.digest)
            .collect();
        assert_eq!(tags, ["sha256:v3", "sha256:v1"]);

        // Shared with another namespace, kept across a reopen; an image that is not there (or a
        // namespace without saves) is no one's to share, and nothing is written for it.
        let bob = vec!["bob".to_owned()];
        let shared = reopened
            .share_saved_image("alice", "registry.local/alice/lab:v3", &bob)
            .unwrap()
            .unwrap();
        assert_eq!(shared.shared_with, bob);
        let again = Store::open(dir.path()).unwrap();
        assert_eq!(
            again.images_shared_with("bob")[0].image,
            "registry.local/alice/lab:v3"
        );
        assert!(
            again.images_shared_with("alice").is_empty(),
            "not with its own namespace"
        );
        for (namespace, image) in [
            ("alice", "registry.local/alice/lab:v2"),
            ("carol", "registry.local/carol/lab:v1"),
        ] {
            assert_eq!(
                again.share_saved_image(namespace, image, &bob).unwrap(),
                None
            );
        }
        assert!(!dir.path().join("saved-images").join("carol.json").exists());
        assert!(
            Store::open(dir.path())
                .unwrap()
                .get("alice", "lab")
                .is_none()
        );
    }
}
