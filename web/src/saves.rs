//! "Save environment as image" as the API sees it: start a save, follow its progress, delete a
//! saved image. Where a save runs is the platform's: a job beside the notebook's container in
//! the embedded mode, an ImageBuild for the cluster's reconciler ([`crate::cluster::image_builds`]).

use labforge_builder::save::SaveProgress;
use labforge_builder::summary::ChangeSummary;
use serde::Serialize;
use tokio::sync::watch;

#[derive(Debug, thiserror::Error)]
pub enum StartSaveError {
    #[error("notebook {0} is not running: start it to save its environment")]
    NotRunning(String),
    #[error("a save of notebook {0} is already under way")]
    Busy(String),
    #[error("tag {0:?} is not valid: use letters, digits, '_', '.' and '-' (at most 128)")]
    BadTag(String),
    /// The cluster could not be asked or told (the API server's answer).
    #[error(transparent)]
    Unavailable(#[from] crate::unavailable::Unavailable),
}

/// Saves as the API starts and follows them: run beside the container (the embedded mode's
/// `SaveJobs`), or as ImageBuild objects for the cluster's reconciler ([`crate::cluster::image_builds::ImageBuildSaves`]).
#[async_trait::async_trait]
pub trait Saves: Send + Sync {
    /// Starts saving `namespace/name`; returns the save's first status (its id) at once.
    async fn start(
        &self,
        namespace: &str,
        name: &str,
        tag: Option<&str>,
    ) -> Result<SaveStatus, StartSaveError>;
    /// Follows save `id` of `namespace`; `None` when there is no such save.
    async fn follow(&self, namespace: &str, id: &str) -> Option<watch::Receiver<SaveStatus>>;
    /// Deletes `namespace`'s saved image `image` from its registry and forgets it; refused while
    /// a notebook runs on it.
    async fn delete_image(&self, namespace: &str, image: &str) -> Result<(), DeleteImageError>;
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DeleteImageError {
    #[error("{image} is not an image saved in {namespace}")]
    NotFound { namespace: String, image: String },
    #[error("a notebook ({notebook}) runs on {image}: delete it or move it to another image first")]
    InUse { image: String, notebook: String },
    #[error("deleting {image} from its registry: {reason}")]
    Registry { image: String, reason: String },
    /// What this platform cannot do.
    #[error("{0}")]
    Unsupported(String),
}

/// Where a save is, as the UI shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SaveStatus {
    pub id: String,
    pub namespace: String,
    pub notebook: String,
    pub target: String,
    /// queued, indexing, scanning, writing, uploading; then done, unchanged (nothing changed
    /// since the image the notebook runs: no image made) or failed.
    #[schema(inline, value_type = crate::openapi::SavePhase)]
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
    /// What the new layer changed, once done.
    #[schema(value_type = Option<crate::openapi::ChangeSummary>)]
    pub summary: Option<ChangeSummary>,
}

impl SaveStatus {
    /// Follows the builder's report of where a save is.
    pub fn apply(&mut self, progress: SaveProgress) {
        match progress {
            SaveProgress::Indexing { .. } => self.phase = "indexing".into(),
            SaveProgress::Scanning { entries } => {
                self.phase = "scanning".into();
                self.entries_scanned = entries;
            }
            SaveProgress::Scanned(header) => {
                self.entries_scanned = header.scanned;
                self.files_changed = header.changed;
                self.files_deleted = header.deleted;
                self.phase = "writing".into();
            }
            SaveProgress::Writing { bytes, total } => {
                self.phase = "writing".into();
                self.bytes_written = bytes;
                self.bytes_total = total;
            }
            SaveProgress::Uploading { layer_bytes } => {
                self.phase = "uploading".into();
                self.layer_bytes = layer_bytes;
            }
            SaveProgress::CacheUnavailable(why) => {
                self.warning = Some(format!("saved without the cache: {why}"));
            }
        }
    }

    pub fn finished(&self) -> bool {
        matches!(self.phase.as_str(), "done" | "unchanged" | "failed")
    }
}

/// The tag a save is pushed with: the user's, checked, or one from the time.
pub fn save_tag(tag: Option<&str>, now: jiff::Timestamp) -> Result<String, StartSaveError> {
    match tag.map(str::trim).filter(|t| !t.is_empty()) {
        Some(tag) if valid_tag(tag) => Ok(tag.to_owned()),
        Some(tag) => Err(StartSaveError::BadTag(tag.to_owned())),
        None => Ok(format!("saved-{}", now.strftime("%Y%m%d-%H%M%S"))),
    }
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
