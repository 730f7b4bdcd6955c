//! "Save environment as image" in the embedded mode: one save at a time per notebook, run by the
//! builder against the notebook's container (the agent inside scans; credentials stay here), with
//! its progress published for the UI to follow and the result recorded as a saved image.

use crate::runtime::container_name;
use crate::store::Store;
use labforge_builder::save::{SaveOptions, SaveProgress, save};
use labforge_builder::source::ChangeSource;
use labforge_crds::notebook::Notebook;
use labforge_messages::error_chain;
use labforge_web::model::{SERVER_TYPE_ANNOTATION, SavedImage, ServerType};
use labforge_web::saves::{DeleteImageError, SaveStatus, Saves, StartSaveError, save_tag};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use tokio::sync::watch;

/// The saves under way here, by id, each followed through its status channel.
pub struct SaveJobs {
    store: Arc<Store>,
    engine: PathBuf,
    registry: String,
    options: Arc<SaveOptions>,
    jobs: Mutex<HashMap<String, watch::Receiver<SaveStatus>>>,
    /// Saved images kept per notebook; 0 keeps all.
    keep: usize,
    http: reqwest::Client,
}

#[async_trait::async_trait]
impl Saves for SaveJobs {
    async fn start(
        &self,
        namespace: &str,
        name: &str,
        tag: Option<&str>,
    ) -> Result<SaveStatus, StartSaveError> {
        SaveJobs::start(self, namespace, name, tag)
    }
    async fn delete_image(&self, namespace: &str, image: &str) -> Result<(), DeleteImageError> {
        let record = self
            .store
            .saved_images(namespace)
            .into_iter()
            .find(|saved| saved.image == image)
            .ok_or_else(|| DeleteImageError::NotFound {
                namespace: namespace.to_owned(),
                image: image.to_owned(),
            })?;
        // By its tag or by its digest, in any namespace; only this namespace's notebook is named.
        let by_digest = format!(
            "{}@{}",
            image
                .rsplit_once(':')
                .map_or(image, |(repository, _)| repository),
            record.digest
        );
        if let Some(user) = self.store.list(None).iter().find(|notebook| {
            notebook
                .container()
                .and_then(|c| c.image.as_deref())
                .is_some_and(|runs| runs == image || runs == by_digest)
        }) {
            let notebook = match user.metadata.namespace.as_deref() {
                Some(ns) if ns == namespace => user.metadata.name.clone().unwrap_or_default(),
                _ => "in another namespace".to_owned(),
            };
            return Err(DeleteImageError::InUse {
                image: image.to_owned(),
                notebook,
            });
        }
        delete_manifest(&self.http, &self.options.registry.insecure, &record)
            .await
            .map_err(|reason| DeleteImageError::Registry {
                image: image.to_owned(),
                reason,
            })?;
        self.store
            .remove_saved_image(namespace, image)
            .map_err(|err| DeleteImageError::Registry {
                image: image.to_owned(),
                reason: format!("deleted from the registry, but not forgotten here: {err}"),
            })?;
        self.store.record_event(
            namespace,
            &record.notebook,
            "Normal",
            "ImageDeleted",
            &format!("saved image {image} deleted from its registry"),
        );
        Ok(())
    }

    async fn follow(&self, namespace: &str, id: &str) -> Option<watch::Receiver<SaveStatus>> {
        SaveJobs::follow(self, id).filter(|r| r.borrow().namespace == namespace)
    }
}

impl SaveJobs {
    pub fn new(
        store: Arc<Store>,
        engine: PathBuf,
        registry: String,
        options: SaveOptions,
        keep: usize,
    ) -> Self {
        Self {
            store,
            engine,
            registry,
            options: Arc::new(options),
            jobs: Mutex::default(),
            keep,
            http: reqwest::Client::new(),
        }
    }

    /// The image a save of `namespace/notebook` pushes to with `tag`.
    pub fn target(&self, namespace: &str, notebook: &str, tag: &str) -> String {
        format!("{}/{namespace}/{notebook}:{tag}", self.registry)
    }

    /// Follows save `id`.
    pub fn follow(&self, id: &str) -> Option<watch::Receiver<SaveStatus>> {
        self.jobs.lock().ok()?.get(id).cloned()
    }

    /// Starts saving `namespace/name`; returns the save's id at once.
    pub fn start(
        &self,
        namespace: &str,
        name: &str,
        tag: Option<&str>,
    ) -> Result<SaveStatus, StartSaveError> {
        let key = format!("{namespace}/{name}");
        let notebook = self
            .store
            .get(namespace, name)
            .filter(|nb| {
                !nb.is_stopped() && nb.status.as_ref().is_some_and(|s| s.ready_replicas > 0)
            })
            .ok_or_else(|| StartSaveError::NotRunning(key.clone()))?;
        let base = notebook
            .container()
            .and_then(|c| c.image.clone())
            .ok_or_else(|| StartSaveError::NotRunning(key.clone()))?;
        let now = jiff::Timestamp::now();
        let tag = save_tag(tag, now)?;
        let target = self.target(namespace, name, &tag);
        let id = format!("{namespace}.{name}.{}", now.as_millisecond());
        let status = SaveStatus {
            id: id.clone(),
            namespace: namespace.to_owned(),
            notebook: name.to_owned(),
            target: target.clone(),
            phase: "queued".into(),
            ..Default::default()
        };
        let (sender, receiver) = watch::channel(status.clone());
        {
            let mut jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
            let busy = jobs.values().any(|r| {
                r.borrow().namespace == namespace
                    && r.borrow().notebook == name
                    && !r.borrow().finished()
            });
            if busy {
                return Err(StartSaveError::Busy(key));
            }
            jobs.insert(id, receiver);
        }
        let sender = Arc::new(sender);
        let job = self.job(&notebook, &base, &target);
        tokio::spawn(async move {
            let report = sender.clone();
            let outcome = job.run(move |p| report.send_modify(|s| s.apply(p))).await;
            sender.send_modify(|s| match outcome {
                Ok(Some(record)) => {
                    s.phase = "done".into();
                    s.digest = Some(record.digest.clone());
                    s.layer_bytes = record.layer_bytes;
                    s.files_changed = record.files_changed;
                    s.files_deleted = record.files_deleted;
                    s.summary = record.summary.clone();
                }
                Ok(None) => {
                    // Directories' own entries may have changed; no file did.
                    s.phase = "unchanged".into();
                    s.files_changed = 0;
                    s.files_deleted = 0;
                }
                Err(message) => {
                    s.phase = "failed".into();
                    s.error = Some(message);
                }
            });
        });
        Ok(status)
    }

    fn job(&self, notebook: &Notebook, base: &str, target: &str) -> SaveJob {
        let namespace = notebook.metadata.namespace.as_deref().unwrap_or_default();
        let name = notebook.metadata.name.as_deref().unwrap_or_default();
        SaveJob {
            store: self.store.clone(),
            options: self.options.clone(),
            source: ChangeSource::Container {
                engine: self.engine.clone(),
                container: container_name(namespace, name),
                ignore: Vec::new(),
                verify_content: false,
            },
            namespace: namespace.to_owned(),
            notebook: name.to_owned(),
            base: base.to_owned(),
            server_type: ServerType::from_annotation(notebook.annotation(SERVER_TYPE_ANNOTATION)),
            target: target.to_owned(),
            keep: self.keep,
            http: self.http.clone(),
        }
    }

    /// Saves a notebook that is being stopped, when anything changed since the image it runs;
    /// returns the new image, or `None` when there was nothing to save.
    pub async fn save_before_stop(
        &self,
        notebook: &Notebook,
    ) -> Result<Option<SavedImage>, String> {
        let namespace = notebook.metadata.namespace.clone().unwrap_or_default();
        let name = notebook.metadata.name.clone().unwrap_or_default();
        let base = notebook
            .container()
            .and_then(|c| c.image.clone())
            .ok_or_else(|| "the notebook has no image".to_owned())?;
        let tag = format!("auto-{}", jiff::Timestamp::now().strftime("%Y%m%d-%H%M%S"));
        let target = self.target(&namespace, &name, &tag);
        self.job(notebook, &base, &target).run(|_| {}).await
    }
}

/// One save of one notebook's container.
struct SaveJob {
    store: Arc<Store>,
    options: Arc<SaveOptions>,
    source: ChangeSource,
    namespace: String,
    notebook: String,
    base: String,
    server_type: ServerType,
    target: String,
    keep: usize,
    http: reqwest::Client,
}

impl SaveJob {
    /// Saves, records the image and its event, applies retention; `None` when nothing changed
    /// (no image is made); the error is one line.
    async fn run(
        self,
        progress: impl Fn(SaveProgress) + Send + Sync + Clone + 'static,
    ) -> Result<Option<SavedImage>, String> {
        let (ns, nb) = (self.namespace.as_str(), self.notebook.as_str());
        let saved = save(
            &self.source,
            Some(&self.base),
            &self.target,
            &self.options,
            progress,
        )
        .await;
        // A save's indexes, package sets and compression buffers were allocated on blocking
        // threads, whose allocator arenas keep what they freed: give it back, or each save
        // leaves the server larger.
        let _ = tokio::task::spawn_blocking(labforge_heap::release_free_memory).await;
        match saved {
            Ok(saved) => {
                let Some(image) = saved.image.as_ref().filter(|_| saved.layer.is_some()) else {
                    self.store.record_event(
                        ns,
                        nb,
                        "Normal",
                        "NothingToSave",
                        "nothing changed since the image it runs: no image made",
                    );
                    return Ok(None);
                };
                let digest = image.manifest_digest.to_string();
                let layer_bytes = saved.layer.as_ref().map_or(0, |l| l.size);
                let record = SavedImage {
                    image: self.target.clone(),
                    digest: digest.clone(),
                    notebook: nb.to_owned(),
                    namespace: ns.to_owned(),
                    base: self.base.clone(),
                    server_type: Some(self.server_type),
                    layer_bytes,
                    // The summary's counts, which leave out directories (the scan's include
                    // every parent of a change), so that every number shown agrees.
                    files_changed: saved.summary.files.added + saved.summary.files.changed,
                    files_deleted: saved.summary.files.deleted,
                    created: jiff::Timestamp::now().to_string(),
                    summary: saved.layer.is_some().then(|| saved.summary.clone()),
                    shared_with: Vec::new(),
                };
                if saved.layer.is_some() {
                    if let Err(err) = self.store.add_saved_image(record.clone()) {
                        tracing::warn!(error = %err, "recording a saved image");
                    }
                    let changes: Vec<String> = saved
                        .summary
                        .package_lines()
                        .into_iter()
                        .map(|(ecosystem, line)| format!("{ecosystem}: {line}"))
                        .collect();
                    let changes = changes.join("; ");
                    self.store.record_event(
                        ns,
                        nb,
                        "Normal",
                        "Saved",
                        &format!(
                            "environment saved as {}@{digest} ({layer_bytes} bytes){}",
                            self.target,
                            if changes.is_empty() {
                                String::new()
                            } else {
                                format!(": {changes}")
                            }
                        ),
                    );
                    self.prune().await;
                }
                Ok(Some(record))
            }
            Err(err) => {
                let message = error_chain(&err);
                tracing::warn!(notebook = %format!("{ns}/{nb}"), error = %message, "save failed");
                self.store
                    .record_event(ns, nb, "Warning", "SaveFailed", &message);
                Err(message)
            }
        }
    }

    /// Keeps the newest `keep` images saved from this notebook: older ones are deleted from the
    /// registry and forgotten, except one that some notebook runs.
    async fn prune(&self) {
        if self.keep == 0 {
            return;
        }
        let in_use: Vec<String> = self
            .store
            .list(None)
            .iter()
            .filter_map(|nb| {
                nb.spec
                    .template
                    .spec
                    .as_ref()?
                    .containers
                    .first()?
                    .image
                    .clone()
            })
            .collect();
        let old = self
            .store
            .saved_images(&self.namespace)
            .into_iter()
            .filter(|i| i.notebook == self.notebook)
            .skip(self.keep);
        for image in old {
            if in_use.contains(&image.image) {
                continue;
            }
            match delete_manifest(&self.http, &self.options.registry.insecure, &image).await {
                Ok(()) => {
                    if let Err(err) = self.store.remove_saved_image(&self.namespace, &image.image) {
                        tracing::warn!(error = %err, "forgetting a pruned image");
                    }
                    self.store.record_event(
                        &self.namespace,
                        &self.notebook,
                        "Normal",
                        "Pruned",
                        &format!("deleted {} (keeping the newest {})", image.image, self.keep),
                    );
                }
                Err(message) => {
                    tracing::warn!(image = %image.image, error = %message, "pruning a saved image")
                }
            }
        }
    }
}

/// Deletes a saved image's manifest (by digest, which removes its tag) from its registry.
async fn delete_manifest(
    http: &reqwest::Client,
    insecure: &[String],
    image: &SavedImage,
) -> Result<(), String> {
    let reference =
        oci_client::Reference::try_from(image.image.as_str()).map_err(|e| e.to_string())?;
    let registry = reference.resolve_registry().to_owned();
    let scheme = if insecure.contains(&registry) {
        "http"
    } else {
        "https"
    };
    let url = format!(
        "{scheme}://{registry}/v2/{}/manifests/{}",
        reference.repository(),
        image.digest
    );
    let response = http.delete(&url).send().await.map_err(|e| e.to_string())?;
    match response.status().as_u16() {
        200..=299 | 404 => Ok(()),
        405 => Err(format!("{registry} does not allow deletes")),
        code => Err(format!("DELETE {url}: HTTP {code}")),
    }
}
