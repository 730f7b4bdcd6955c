//! "Save environment as image" from the web app: one save at a time per notebook, run by the
//! builder against the notebook's container (the agent inside scans; credentials stay here), with
//! its progress published for the UI to follow and the result recorded as a saved image.

use crate::model::SavedImage;
use crate::runtime::container_name;
use crate::store::Store;
use labforge_builder::save::{SaveOptions, SaveProgress, save};
use labforge_builder::source::ChangeSource;
use serde::Serialize;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use tokio::sync::watch;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum StartSaveError {
    #[error("notebook {0} is not running: start it to save its environment")]
    NotRunning(String),
    #[error("a save of notebook {0} is already under way")]
    Busy(String),
    #[error("tag {0:?} is not valid: use letters, digits, '_', '.' and '-' (at most 128)")]
    BadTag(String),
}

/// Where a save is, as the UI shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SaveStatus {
    pub id: String,
    pub namespace: String,
    pub notebook: String,
    pub target: String,
    /// queued, indexing, scanning, writing, uploading, done, failed.
    pub phase: String,
    pub entries_scanned: u64,
    pub files_changed: u64,
    pub files_deleted: u64,
    pub bytes_written: u64,
    pub bytes_total: u64,
    pub layer_bytes: u64,
    pub digest: Option<String>,
    pub error: Option<String>,
    /// A note that does not fail the save (the cache was unavailable, say).
    pub warning: Option<String>,
}

impl SaveStatus {
    pub fn finished(&self) -> bool {
        self.phase == "done" || self.phase == "failed"
    }
}

pub struct SaveJobs {
    store: Arc<Store>,
    engine: PathBuf,
    registry: String,
    options: Arc<SaveOptions>,
    jobs: Mutex<HashMap<String, watch::Receiver<SaveStatus>>>,
}

fn valid_tag(tag: &str) -> bool {
    let mut chars = tag.chars();
    !tag.is_empty()
        && tag.len() <= 128
        && chars
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

impl SaveJobs {
    pub fn new(store: Arc<Store>, engine: PathBuf, registry: String, options: SaveOptions) -> Self {
        Self {
            store,
            engine,
            registry,
            options: Arc::new(options),
            jobs: Mutex::default(),
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
            .spec
            .template
            .spec
            .as_ref()
            .and_then(|s| s.containers.first())
            .and_then(|c| c.image.clone())
            .ok_or_else(|| StartSaveError::NotRunning(key.clone()))?;
        let now = jiff::Timestamp::now();
        let tag = match tag.map(str::trim).filter(|t| !t.is_empty()) {
            Some(tag) if valid_tag(tag) => tag.to_owned(),
            Some(tag) => return Err(StartSaveError::BadTag(tag.to_owned())),
            None => format!("saved-{}", now.strftime("%Y%m%d-%H%M%S")),
        };
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
        let source = ChangeSource::Container {
            engine: self.engine.clone(),
            container: container_name(namespace, name),
            ignore: Vec::new(),
            verify_content: false,
        };
        let options = self.options.clone();
        let store = self.store.clone();
        let sender = Arc::new(sender);
        let (ns, nb) = (namespace.to_owned(), name.to_owned());
        tokio::spawn(async move {
            let progress = {
                let sender = sender.clone();
                move |p: SaveProgress| {
                    sender.send_modify(|s| match p {
                        SaveProgress::Indexing { .. } => s.phase = "indexing".into(),
                        SaveProgress::Scanning { entries } => {
                            s.phase = "scanning".into();
                            s.entries_scanned = entries;
                        }
                        SaveProgress::Scanned(header) => {
                            s.entries_scanned = header.scanned;
                            s.files_changed = header.changed;
                            s.files_deleted = header.deleted;
                            s.phase = "writing".into();
                        }
                        SaveProgress::Writing { bytes, total } => {
                            s.phase = "writing".into();
                            s.bytes_written = bytes;
                            s.bytes_total = total;
                        }
                        SaveProgress::Uploading { layer_bytes } => {
                            s.phase = "uploading".into();
                            s.layer_bytes = layer_bytes;
                        }
                        SaveProgress::CacheUnavailable(why) => {
                            s.warning = Some(format!("saved without the cache: {why}"));
                        }
                    })
                }
            };
            match save(&source, Some(&base), &target, &options, progress).await {
                Ok(saved) => {
                    let digest = saved.image.manifest_digest.to_string();
                    let layer_bytes = saved.layer.as_ref().map_or(0, |l| l.size);
                    let record = SavedImage {
                        image: target.clone(),
                        digest: digest.clone(),
                        notebook: nb.clone(),
                        namespace: ns.clone(),
                        base: base.clone(),
                        layer_bytes,
                        files_changed: saved.header.changed,
                        files_deleted: saved.header.deleted,
                        created: jiff::Timestamp::now().to_string(),
                    };
                    if let Err(err) = store.add_saved_image(record) {
                        tracing::warn!(error = %err, "recording a saved image");
                    }
                    store.record_event(
                        &ns,
                        &nb,
                        "Normal",
                        "Saved",
                        &format!("environment saved as {target}@{digest} ({layer_bytes} bytes)"),
                    );
                    sender.send_modify(|s| {
                        s.phase = "done".into();
                        s.digest = Some(digest);
                        s.layer_bytes = layer_bytes;
                    });
                }
                Err(err) => {
                    let message = error_chain(&err);
                    tracing::warn!(notebook = %format!("{ns}/{nb}"), error = %message, "save failed");
                    store.record_event(&ns, &nb, "Warning", "SaveFailed", &message);
                    sender.send_modify(|s| {
                        s.phase = "failed".into();
                        s.error = Some(message);
                    });
                }
            }
        });
        Ok(status)
    }
}

/// An error and its causes, as one line.
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_follow_the_distribution_grammar() {
        assert!(valid_tag("saved-20261122-101010"));
        assert!(valid_tag("v1.2_3"));
        assert!(!valid_tag(""));
        assert!(!valid_tag("-x"));
        assert!(!valid_tag("a/b"));
        assert!(!valid_tag(&"a".repeat(129)));
    }
}
