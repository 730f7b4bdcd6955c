//! "Save environment as image" in a cluster: the web app writes an ImageBuild for the ImageBuild
//! reconciler (`labforge image-builds`), follows its status as the same [`SaveStatus`] the
//! embedded mode publishes, and lists the succeeded ones as the namespace's saved images. The web
//! app holds no registry credentials and runs nothing in the notebook.

use crate::model::{SERVER_TYPE_ANNOTATION, SavedImage, ServerType};
use crate::saves::{SaveStatus, Saves, StartSaveError, save_tag};
use crate::unavailable::Unavailable;
use futures::StreamExt;
use kube::api::{ListParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use labforge_crds::Notebook;
use labforge_crds::imagebuild::{ImageBuild, ImageBuildPhase, ImageBuildSpec, ImageBuildStatus};
use std::collections::BTreeMap;
use tokio::sync::watch;

/// Label naming the notebook an ImageBuild saves, to list one notebook's saves.
pub const NOTEBOOK_LABEL: &str = "labforge.dev/notebook";

pub struct ImageBuildSaves {
    client: kube::Client,
    /// Saved images are pushed as `<registry>/<namespace>/<notebook>:<tag>`.
    registry: String,
}

impl ImageBuildSaves {
    pub fn new(client: kube::Client, registry: String) -> Self {
        Self {
            client,
            registry: registry.trim_end_matches('/').to_owned(),
        }
    }
}

/// An ImageBuild's status as the UI follows a save.
pub fn save_status(build: &ImageBuild) -> SaveStatus {
    let status = build.status.clone().unwrap_or_default();
    let progress = status.progress.clone().unwrap_or_default();
    let count = |n: i64| u64::try_from(n).unwrap_or(0);
    let phase = match status.phase {
        ImageBuildPhase::Pending => "queued".to_owned(),
        ImageBuildPhase::Running if progress.stage == "starting" => "queued".to_owned(),
        ImageBuildPhase::Running => progress.stage.clone(),
        ImageBuildPhase::Succeeded => "done".to_owned(),
        ImageBuildPhase::Failed => "failed".to_owned(),
    };
    SaveStatus {
        id: build.name_any(),
        namespace: build.namespace().unwrap_or_default(),
        notebook: build.spec.notebook.clone(),
        target: build.spec.target_image.clone(),
        entries_scanned: count(progress.files_scanned),
        files_changed: count(progress.files_changed),
        files_deleted: count(progress.files_deleted),
        bytes_written: count(progress.bytes_written),
        bytes_total: count(progress.bytes_total),
        layer_bytes: status
            .layer_size
            .map_or_else(|| count(progress.bytes_uploaded), count),
        digest: status.image_digest.clone(),
        error: (status.phase == ImageBuildPhase::Failed)
            .then(|| status.message.clone().unwrap_or_else(|| "failed".into())),
        phase,
        ..SaveStatus::default()
    }
}

/// A succeeded ImageBuild as a saved image; `None` for any other, and for one that changed
/// nothing (it names the base's content, as the embedded mode does not record either).
pub fn saved_image(build: &ImageBuild) -> Option<SavedImage> {
    let status: &ImageBuildStatus = build.status.as_ref()?;
    if status.phase != ImageBuildPhase::Succeeded || status.layer_digest.is_none() {
        return None;
    }
    Some(SavedImage {
        image: build.spec.target_image.clone(),
        digest: status.image_digest.clone()?,
        notebook: build.spec.notebook.clone(),
        namespace: build.namespace().unwrap_or_default(),
        base: status.base_image.clone().unwrap_or_default(),
        server_type: build
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(SERVER_TYPE_ANNOTATION))
            .map(|value| ServerType::from_annotation(Some(value))),
        layer_bytes: status
            .layer_size
            .and_then(|n| u64::try_from(n).ok())
            .unwrap_or(0),
        files_changed: 0,
        files_deleted: 0,
        created: status
            .completion_time
            .as_ref()
            .map(|t| t.0.to_string())
            .unwrap_or_default(),
        summary: None,
        shared_with: shared_with(build),
    })
}

/// Annotation of a succeeded ImageBuild: the namespaces its image is shared with,
/// comma-separated.
pub const SHARED_WITH_ANNOTATION: &str = "labforge.dev/shared-with";

fn shared_with(build: &ImageBuild) -> Vec<String> {
    build
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(SHARED_WITH_ANNOTATION))
        .map(|list| {
            list.split(',')
                .map(str::trim)
                .filter(|ns| !ns.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// Shares the image of `namespace`'s succeeded ImageBuild that pushed `image` with exactly
/// `with`, in its annotation; `None` when no such build succeeded.
pub async fn share(
    client: &kube::Client,
    namespace: &str,
    image: &str,
    with: &[String],
) -> Result<Option<SavedImage>, kube::Error> {
    let builds: Api<ImageBuild> = Api::namespaced(client.clone(), namespace);
    let list = builds.list(&ListParams::default()).await?;
    let Some(build) = list
        .items
        .iter()
        .find(|b| b.spec.target_image == image && saved_image(b).is_some())
    else {
        return Ok(None);
    };
    let value = (!with.is_empty()).then(|| with.join(","));
    let patch = serde_json::json!({
        "metadata": { "annotations": { SHARED_WITH_ANNOTATION: value } }
    });
    let patched = builds
        .patch(
            &build.name_any(),
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await?;
    Ok(saved_image(&patched))
}

/// Every namespace's saved images (succeeded ImageBuilds).
async fn all_saved_images(client: &kube::Client) -> Result<Vec<SavedImage>, kube::Error> {
    let builds: Api<ImageBuild> = Api::all(client.clone());
    match builds.list(&ListParams::default()).await {
        Ok(list) => Ok(list.items.iter().filter_map(saved_image).collect()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(Vec::new()),
        Err(err) => Err(err),
    }
}

/// The namespaces with a saved image of manifest digest `digest`.
pub async fn namespaces_with_digest(
    client: &kube::Client,
    digest: &str,
) -> Result<Vec<String>, kube::Error> {
    Ok(all_saved_images(client)
        .await?
        .into_iter()
        .filter(|i| i.digest == digest)
        .map(|i| i.namespace)
        .collect())
}

/// Images of other namespaces' succeeded ImageBuilds shared with `namespace`, newest first.
pub async fn images_shared_with(
    client: &kube::Client,
    namespace: &str,
) -> Result<Vec<SavedImage>, kube::Error> {
    let mut images: Vec<SavedImage> = all_saved_images(client)
        .await?
        .into_iter()
        .filter(|i| i.namespace != namespace && i.shared_with.iter().any(|ns| ns == namespace))
        .collect();
    images.sort_by(|a, b| b.created.cmp(&a.created));
    Ok(images)
}

/// The namespace's saved images, oldest first.
pub async fn saved_images(
    client: &kube::Client,
    namespace: &str,
) -> Result<Vec<SavedImage>, kube::Error> {
    let builds: Api<ImageBuild> = Api::namespaced(client.clone(), namespace);
    let list = match builds.list(&ListParams::default()).await {
        Ok(list) => list,
        // A cluster without the ImageBuild CRD has no saved images, and still serves notebooks.
        Err(kube::Error::Api(status)) if status.code == 404 => return Ok(Vec::new()),
        Err(err) => return Err(err),
    };
    let mut images: Vec<SavedImage> = list.items.iter().filter_map(saved_image).collect();
    images.sort_by(|a, b| a.created.cmp(&b.created));
    Ok(images)
}

#[async_trait::async_trait]
impl Saves for ImageBuildSaves {
    async fn start(
        &self,
        namespace: &str,
        name: &str,
        tag: Option<&str>,
    ) -> Result<SaveStatus, StartSaveError> {
        let key = format!("{namespace}/{name}");
        let tag = save_tag(tag, jiff::Timestamp::now())?;
        let unavailable = |err: kube::Error| -> StartSaveError {
            Unavailable::new("the Kubernetes API", err).into()
        };
        let notebook = Api::<Notebook>::namespaced(self.client.clone(), namespace)
            .get_opt(name)
            .await
            .map_err(unavailable)?
            .filter(|nb| !nb.is_stopped())
            .ok_or_else(|| StartSaveError::NotRunning(key.clone()))?;
        let builds: Api<ImageBuild> = Api::namespaced(self.client.clone(), namespace);
        let selector = format!("{NOTEBOOK_LABEL}={name}");
        let busy = builds
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(unavailable)?
            .items
            .iter()
            .any(|b| {
                !matches!(
                    b.status.as_ref().map(|s| s.phase),
                    Some(ImageBuildPhase::Succeeded | ImageBuildPhase::Failed)
                )
            });
        if busy {
            return Err(StartSaveError::Busy(key));
        }
        let mut build = ImageBuild::new(
            "",
            ImageBuildSpec {
                notebook: name.to_owned(),
                target_image: format!("{}/{namespace}/{name}:{tag}", self.registry),
                compression: None,
            },
        );
        build.metadata.name = None;
        // The notebook's name may be up to 63 characters: the API server adds 5 to the prefix.
        let prefix: String = format!("{name}-save-").chars().take(57).collect();
        build.metadata.generate_name = Some(prefix);
        build.metadata.labels = Some(BTreeMap::from([(NOTEBOOK_LABEL.into(), name.into())]));
        // The saved image is offered for the server the notebook runs.
        if let Some(server_type) = notebook.annotation(SERVER_TYPE_ANNOTATION) {
            build.metadata.annotations = Some(BTreeMap::from([(
                SERVER_TYPE_ANNOTATION.into(),
                server_type.into(),
            )]));
        }
        // Deleting the notebook deletes its builds (the saved images stay in the registry).
        if let Some(uid) = notebook.metadata.uid.clone() {
            build.metadata.owner_references = Some(vec![
                k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                    api_version: "kubeflow.org/v1".into(),
                    kind: "Notebook".into(),
                    name: name.to_owned(),
                    uid,
                    ..Default::default()
                },
            ]);
        }
        let created = builds
            .create(&PostParams::default(), &build)
            .await
            .map_err(unavailable)?;
        Ok(save_status(&created))
    }

    async fn delete_image(
        &self,
        _namespace: &str,
        image: &str,
    ) -> Result<(), crate::saves::DeleteImageError> {
        // The registry's credentials are the ImageBuild reconciler's, not the web app's.
        Err(crate::saves::DeleteImageError::Unsupported(format!(
            "in a cluster, {image} is deleted in its registry by whoever administers it; the web app holds no registry credentials"
        )))
    }

    async fn follow(&self, namespace: &str, id: &str) -> Option<watch::Receiver<SaveStatus>> {
        let builds: Api<ImageBuild> = Api::namespaced(self.client.clone(), namespace);
        let build = match builds.get_opt(id).await {
            Ok(build) => build?,
            Err(err) => {
                tracing::warn!(error = %err, "reading ImageBuild {namespace}/{id}");
                return None;
            }
        };
        let (sender, receiver) = watch::channel(save_status(&build));
        if sender.borrow().finished() {
            return Some(receiver);
        }
        let config = watcher::Config::default().fields(&format!("metadata.name={id}"));
        tokio::spawn(async move {
            let mut updates = watcher(builds, config)
                .default_backoff()
                .applied_objects()
                .boxed();
            loop {
                tokio::select! {
                    // Nobody follows any more.
                    () = sender.closed() => return,
                    update = updates.next() => match update {
                        Some(Ok(build)) => {
                            let status = save_status(&build);
                            let finished = status.finished();
                            if sender.send(status).is_err() || finished {
                                return;
                            }
                        }
                        Some(Err(err)) => tracing::debug!(error = %err, "following an ImageBuild"),
                        None => return,
                    },
                }
            }
        });
        Some(receiver)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn build(status: serde_json::Value) -> ImageBuild {
        serde_json::from_value(json!({
            "apiVersion": "labforge.dev/v1alpha1",
            "kind": "ImageBuild",
            "metadata": {"name": "lab-save-x1", "namespace": "alice"},
            "spec": {"notebook": "lab", "targetImage": "registry.example.com/alice/lab:v1"},
            "status": status,
        }))
        .unwrap()
    }

    #[test]
    fn an_image_build_reads_as_the_save_the_ui_follows() {
        let running = save_status(&build(json!({"phase": "Running", "progress": {
            "stage": "writing", "filesScanned": 1200, "bytesWritten": 4096, "bytesUploaded": 0
        }})));
        assert_eq!(running.phase, "writing");
        assert_eq!(
            (running.entries_scanned, running.bytes_written),
            (1200, 4096)
        );
        assert!(!running.finished());
        let done = save_status(&build(json!({"phase": "Succeeded",
            "imageDigest": "sha256:abc", "layerDigest": "sha256:def", "layerSize": 512,
            "completionTime": "2026-11-22T07:00:00Z", "baseImage": "jupyter@sha256:0"})));
        assert_eq!(done.phase, "done");
        assert_eq!(done.digest.as_deref(), Some("sha256:abc"));
        assert_eq!(done.layer_bytes, 512);
        let failed = save_status(&build(
            json!({"phase": "Failed", "message": "registry down"}),
        ));
        assert_eq!(failed.phase, "failed");
        assert_eq!(failed.error.as_deref(), Some("registry down"));

        let image = saved_image(&build(json!({"phase": "Succeeded",
            "imageDigest": "sha256:abc", "layerDigest": "sha256:def", "layerSize": 512,
            "completionTime": "2026-11-22T07:00:00Z", "baseImage": "jupyter@sha256:0"})))
        .unwrap();
        assert_eq!(image.image, "registry.example.com/alice/lab:v1");
        assert_eq!(
            (image.base.as_str(), image.layer_bytes),
            ("jupyter@sha256:0", 512)
        );
        assert!(saved_image(&build(json!({"phase": "Failed"}))).is_none());
        let unchanged = build(json!({"phase": "Succeeded", "imageDigest": "sha256:abc"}));
        assert!(
            saved_image(&unchanged).is_none(),
            "nothing changed, nothing saved"
        );
    }
}
