//! The ImageBuild reconciler: "save this notebook's environment as an image" in a cluster.
//!
//! An ImageBuild names a Notebook and a target image. The reconciler finds the notebook's running
//! pod, execs the agent the pod's init container put there (through the API server, so nothing
//! privileged and no node access), and runs the same [`labforge_builder::save::save`] as
//! `labforge build commit`: it holds the registry and cache credentials, the notebook never sees
//! them. Progress is written to the ImageBuild's status about once a second; the end is an
//! Event and a final status (digest, layer, cache hit, or the error).
//!
//! A build is done once: Succeeded and Failed are final. A build found Running with no worker in
//! this process was cut off by a restart and is started again; that is safe because a save writes
//! its tag only after every blob is in.

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use labforge_builder::layer::Compression;
use labforge_builder::save::{CacheOutcome, SaveOptions, SaveProgress, Saved, save};
use labforge_builder::source::{AGENT_PATH, ChangeSource, PodContainer};
use labforge_crds::Notebook;
use labforge_crds::imagebuild::{
    ImageBuild, ImageBuildPhase, ImageBuildProgress, ImageBuildStatus, LayerCompression,
};
use labforge_messages::error_chain;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The field manager of the status this reconciler writes.
pub const FIELD_MANAGER: &str = "labforge-image-builds";

/// How often a running build's progress is written to its status.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("ImageBuild has no namespace")]
    MissingNamespace,
    #[error("reading {what}: {source}")]
    Read {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("writing the status of ImageBuild {name}: {source}")]
    Status {
        name: String,
        #[source]
        source: kube::Error,
    },
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// `succeeded` or `failed`.
    pub result: String,
}

/// What the reconciler exports in Prometheus format.
pub struct Metrics {
    pub finished: Family<ResultLabels, Counter>,
    pub running: Gauge,
    pub duration: Histogram,
}

impl Metrics {
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            finished: Family::default(),
            running: Gauge::default(),
            // 1 s to about 17 min.
            duration: Histogram::new(exponential_buckets(1.0, 2.0, 11)),
        };
        registry.register(
            "labforge_image_builds",
            "ImageBuilds finished, by result",
            metrics.finished.clone(),
        );
        registry.register(
            "labforge_image_builds_running",
            "ImageBuilds being saved by this process",
            metrics.running.clone(),
        );
        registry.register(
            "labforge_image_build_duration_seconds",
            "Time from start to the final status of an ImageBuild",
            metrics.duration.clone(),
        );
        metrics
    }

    fn count(&self, succeeded: bool) {
        let result = if succeeded { "succeeded" } else { "failed" };
        self.finished
            .get_or_create(&ResultLabels {
                result: result.into(),
            })
            .inc();
    }
}

/// What the reconciler shares between builds.
pub struct Context {
    pub client: Client,
    /// Registry, cache and scratch settings; each build sets its compression.
    pub save_options: SaveOptions,
    pub metrics: Metrics,
    recorder: Recorder,
    /// UIDs of the builds this process is running (saving, or waiting for a slot).
    running: Mutex<HashSet<String>>,
    /// Saves at once: each holds an image index and compression buffers in memory.
    slots: tokio::sync::Semaphore,
    /// When set, a build may only push to `<prefix>/<its namespace>/…`: the registry credentials
    /// here are not everybody's to use for any repository.
    pub target_prefix: Option<String>,
}

impl Context {
    /// `instance` names this process in the Events it records; `max_builds` saves run at once,
    /// the others wait their turn.
    pub fn new(
        client: Client,
        save_options: SaveOptions,
        instance: Option<String>,
        max_builds: usize,
        registry: &mut Registry,
    ) -> Self {
        let reporter = Reporter {
            controller: FIELD_MANAGER.into(),
            instance,
        };
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            save_options,
            metrics: Metrics::register(registry),
            running: Mutex::default(),
            slots: tokio::sync::Semaphore::new(max_builds.max(1)),
            target_prefix: None,
        }
    }

    /// Adds or removes a build this process runs; the gauge is the set's size.
    fn track(&self, uid: String, running: bool) {
        let mut set = self.running();
        if running {
            set.insert(uid);
        } else {
            set.remove(&uid);
        }
        self.metrics
            .running
            .set(i64::try_from(set.len()).unwrap_or(i64::MAX));
    }

    fn running(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.running
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Where a build saves from and to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SaveTarget {
    pub pod: String,
    pub container: String,
    /// The image the container runs, by digest when the kubelet reported one.
    pub base: String,
}

/// Decides what to save for `build`, given its Notebook and that notebook's pod; the error is
/// the message the failed build shows.
pub fn save_target(
    build: &ImageBuild,
    notebook: Option<&Notebook>,
    pod: Option<&Pod>,
) -> Result<SaveTarget, String> {
    let name = &build.spec.notebook;
    let notebook = notebook.ok_or_else(|| format!("notebook {name} does not exist"))?;
    if notebook.is_stopped() {
        return Err(format!(
            "notebook {name} is stopped: start it, then save its environment"
        ));
    }
    let container = notebook
        .container()
        .map(|c| c.name.clone())
        .ok_or_else(|| format!("notebook {name} has no container"))?;
    let pod_name = format!("{name}-0");
    let pod = pod.ok_or_else(|| format!("notebook {name} has no pod {pod_name} yet"))?;
    let phase = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Pending");
    if phase != "Running" {
        return Err(format!(
            "notebook {name} is not running (pod {pod_name} is {phase})"
        ));
    }
    let running = pod
        .spec
        .as_ref()
        .and_then(|s| s.containers.iter().find(|c| c.name == container))
        .ok_or_else(|| format!("pod {pod_name} has no container {container}"))?;
    let image = running
        .image
        .clone()
        .ok_or_else(|| format!("pod {pod_name} has no container {container}"))?;
    let agent_dir = std::path::Path::new(AGENT_PATH).parent();
    let has_agent = running
        .volume_mounts
        .iter()
        .flatten()
        .any(|m| Some(std::path::Path::new(&m.mount_path)) == agent_dir);
    if !has_agent {
        return Err(format!(
            "notebook {name} has no save agent: the controller adds it to notebooks started \
             after LABFORGE_AGENT_IMAGE is set (the labforge-save-agent ConfigMap); stop and \
             start the notebook once it is"
        ));
    }
    let image_id = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|statuses| statuses.iter().find(|s| s.name == container))
        .map(|s| s.image_id.clone())
        .unwrap_or_default();
    Ok(SaveTarget {
        pod: pod_name,
        container,
        base: pinned(&image, &image_id),
    })
}

/// Whether `build` may push where it asks, given the reconciler's `prefix`; the error is the
/// failed build's message.
pub fn target_allowed(build: &ImageBuild, prefix: Option<&str>) -> Result<(), String> {
    let Some(prefix) = prefix else {
        return Ok(());
    };
    let namespace = build.namespace().unwrap_or_default();
    let allowed = format!("{}/{namespace}/", prefix.trim_end_matches('/'));
    let target = &build.spec.target_image;
    if target.starts_with(&allowed) && target.len() > allowed.len() {
        Ok(())
    } else {
        Err(format!(
            "targetImage {target:?} is not under {allowed}: builds of namespace {namespace} push there"
        ))
    }
}

/// `image` pinned to the digest in the kubelet's `imageID` (`…@sha256:…`), so a tag moved since
/// the pod started does not change the base; `image` itself without one.
fn pinned(image: &str, image_id: &str) -> String {
    let Some((_, digest)) = image_id.rsplit_once('@') else {
        return image.to_owned();
    };
    if !digest.starts_with("sha256:") {
        return image.to_owned();
    }
    let without_digest = image.split_once('@').map_or(image, |(name, _)| name);
    // A tag is a ':' after the last '/' (a ':' before it is a registry port).
    let name = match without_digest.rsplit_once('/') {
        Some((path, last)) => match last.split_once(':') {
            Some((repository, _tag)) => format!("{path}/{repository}"),
            None => without_digest.to_owned(),
        },
        None => without_digest
            .split_once(':')
            .map_or(without_digest, |(n, _)| n)
            .to_owned(),
    };
    format!("{name}@{digest}")
}

/// The status of a build that ended.
pub fn finished_status(
    started: Option<Time>,
    base: Option<&str>,
    result: &Result<Saved, String>,
    now: jiff::Timestamp,
) -> ImageBuildStatus {
    match result {
        Ok(saved) => ImageBuildStatus {
            phase: ImageBuildPhase::Succeeded,
            progress: None,
            base_image: base.map(str::to_owned),
            image_digest: saved
                .image
                .as_ref()
                .map(|image| image.manifest_digest.to_string()),
            layer_digest: saved.layer.as_ref().map(|l| l.digest.to_string()),
            layer_size: saved
                .layer
                .as_ref()
                .map(|l| i64::try_from(l.size).unwrap_or(i64::MAX)),
            cache_hit: Some(saved.cache == CacheOutcome::Hit),
            start_time: started,
            completion_time: Some(Time(now)),
            message: Some(match (&saved.image, &saved.cache) {
                (None, _) => "nothing changed since the base: no image pushed".to_owned(),
                (Some(image), CacheOutcome::Unavailable(why)) => format!(
                    "saved {} (files {}); the cache was unavailable: {why}",
                    image.reference,
                    saved.summary.files.compact()
                ),
                (Some(image), _) => format!(
                    "saved {} (files {})",
                    image.reference,
                    saved.summary.files.compact()
                ),
            }),
        },
        Err(message) => ImageBuildStatus {
            phase: ImageBuildPhase::Failed,
            base_image: base.map(str::to_owned),
            start_time: started,
            completion_time: Some(Time(now)),
            message: Some(message.clone()),
            ..ImageBuildStatus::default()
        },
    }
}

/// A save's progress as the status shows it.
fn progress_of(progress: &SaveProgress, last: &ImageBuildProgress) -> ImageBuildProgress {
    let mut next = last.clone();
    match progress {
        SaveProgress::Indexing { .. } => next.stage = "indexing".into(),
        SaveProgress::Scanning { entries } => {
            next.stage = "scanning".into();
            next.files_scanned = i64::try_from(*entries).unwrap_or(i64::MAX);
        }
        SaveProgress::Scanned(header) => {
            let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
            next.stage = "writing".into();
            next.files_scanned = count(header.scanned);
            next.files_changed = count(header.changed);
            next.files_deleted = count(header.deleted);
            next.bytes_total = count(header.content_bytes);
        }
        SaveProgress::Writing { bytes, .. } => {
            next.stage = "writing".into();
            next.bytes_written = i64::try_from(*bytes).unwrap_or(i64::MAX);
        }
        SaveProgress::Uploading { layer_bytes } => {
            next.stage = "uploading".into();
            next.bytes_uploaded = i64::try_from(*layer_bytes).unwrap_or(i64::MAX);
        }
        SaveProgress::CacheUnavailable(_) => {}
    }
    next
}

pub async fn reconcile(build: Arc<ImageBuild>, ctx: Arc<Context>) -> Result<Action, Error> {
    let namespace = build.namespace().ok_or(Error::MissingNamespace)?;
    let status = build.status.clone().unwrap_or_default();
    if matches!(
        status.phase,
        ImageBuildPhase::Succeeded | ImageBuildPhase::Failed
    ) {
        return Ok(Action::await_change());
    }
    let uid = build.uid().unwrap_or_default();
    if ctx.running().contains(&uid) {
        return Ok(Action::await_change());
    }
    if status.phase == ImageBuildPhase::Running {
        // Running with no worker here: cut off by a restart, or finished a moment ago and the
        // cache has not seen it yet. The API server knows which.
        let name = build.name_any();
        let fresh = Api::<ImageBuild>::namespaced(ctx.client.clone(), &namespace)
            .get_opt(&name)
            .await
            .map_err(|source| Error::Read {
                what: format!("ImageBuild {namespace}/{name}"),
                source,
            })?;
        let phase = fresh.and_then(|b| b.status).map(|s| s.phase);
        if phase != Some(ImageBuildPhase::Running) || ctx.running().contains(&uid) {
            return Ok(Action::await_change());
        }
    }
    let notebook_name = &build.spec.notebook;
    let notebook = Api::<Notebook>::namespaced(ctx.client.clone(), &namespace)
        .get_opt(notebook_name)
        .await
        .map_err(|source| Error::Read {
            what: format!("Notebook {namespace}/{notebook_name}"),
            source,
        })?;
    let pod = match &notebook {
        Some(_) => Api::<Pod>::namespaced(ctx.client.clone(), &namespace)
            .get_opt(&format!("{notebook_name}-0"))
            .await
            .map_err(|source| Error::Read {
                what: format!("Pod {namespace}/{notebook_name}-0"),
                source,
            })?,
        None => None,
    };
    let restarted = status.phase == ImageBuildPhase::Running;
    let target = target_allowed(&build, ctx.target_prefix.as_deref())
        .and_then(|()| save_target(&build, notebook.as_ref(), pod.as_ref()));
    match target {
        Err(message) => {
            let failed = finished_status(
                status.start_time,
                None,
                &Err(message.clone()),
                jiff::Timestamp::now(),
            );
            write_status(&ctx, &build, &failed).await?;
            ctx.metrics.count(false);
            publish(&ctx, &build, EventType::Warning, "SaveFailed", message).await;
        }
        Ok(target) => {
            let running = ImageBuildStatus {
                phase: ImageBuildPhase::Running,
                progress: Some(ImageBuildProgress {
                    stage: "starting".into(),
                    ..ImageBuildProgress::default()
                }),
                base_image: Some(target.base.clone()),
                start_time: Some(Time(jiff::Timestamp::now())),
                message: Some(if restarted {
                    format!(
                        "saving {} again: the builder restarted while saving",
                        target.base
                    )
                } else {
                    format!("saving on {}", target.base)
                }),
                ..ImageBuildStatus::default()
            };
            write_status(&ctx, &build, &running).await?;
            ctx.track(uid, true);
            tokio::spawn(run_build(build, target, running.start_time, ctx));
        }
    }
    Ok(Action::await_change())
}

/// Runs one save to its end and writes how it ended.
async fn run_build(
    build: Arc<ImageBuild>,
    target: SaveTarget,
    started: Option<Time>,
    ctx: Arc<Context>,
) {
    let namespace = build.namespace().unwrap_or_default();
    // Never closed, so acquiring fails only if the semaphore were: then run without a slot.
    let _slot = ctx.slots.acquire().await.ok();
    let clock = Instant::now();
    let (report, mut reports) = tokio::sync::watch::channel(ImageBuildProgress {
        stage: "starting".into(),
        ..ImageBuildProgress::default()
    });
    let publisher = {
        let (ctx, build) = (ctx.clone(), build.clone());
        tokio::spawn(async move {
            while reports.changed().await.is_ok() {
                let progress = reports.borrow_and_update().clone();
                let patch = serde_json::json!({"status": {"progress": progress}});
                if let Err(err) = status_patch(&ctx, &build, &patch).await {
                    tracing::warn!(error = %err, "writing progress");
                }
                tokio::time::sleep(PROGRESS_EVERY).await;
            }
        })
    };
    let source = ChangeSource::Pod {
        pod: PodContainer {
            client: ctx.client.clone(),
            namespace: namespace.clone(),
            pod: target.pod.clone(),
            container: target.container.clone(),
        },
        ignore: Vec::new(),
        verify_content: false,
    };
    let options = SaveOptions {
        compression: match build.spec.compression {
            Some(LayerCompression::Gzip) => Compression::Gzip { level: 6 },
            Some(LayerCompression::Zstd) | None => ctx.save_options.compression,
        },
        created_by: format!(
            "labforge ImageBuild {namespace}/{} of notebook {}",
            build.name_any(),
            build.spec.notebook
        ),
        ..ctx.save_options.clone()
    };
    let on_progress = move |progress: SaveProgress| {
        report.send_modify(|last| *last = progress_of(&progress, last));
    };
    let result = save(
        &source,
        Some(&target.base),
        &build.spec.target_image,
        &options,
        on_progress,
    )
    .await
    .map_err(|err| error_chain(&err));
    // The save dropped its progress sender: the publisher writes what it has and ends, before the
    // final status, which it must not follow.
    let mut publisher = publisher;
    if tokio::time::timeout(PROGRESS_EVERY * 5, &mut publisher)
        .await
        .is_err()
    {
        publisher.abort();
    }
    let status = finished_status(started, Some(&target.base), &result, jiff::Timestamp::now());
    match &result {
        Ok(saved) => {
            let digest = saved
                .image
                .as_ref()
                .map(|image| image.manifest_digest.to_string());
            tracing::info!(build = %build.name_any(), digest = digest.as_deref().unwrap_or("none"), "saved");
            let note = status.message.clone().unwrap_or_default();
            publish(&ctx, &build, EventType::Normal, "Saved", note).await;
        }
        Err(message) => {
            tracing::warn!(build = %build.name_any(), error = %message, "save failed");
            publish(
                &ctx,
                &build,
                EventType::Warning,
                "SaveFailed",
                message.clone(),
            )
            .await;
        }
    }
    // Retried a few times: a lost final status would leave the build Running until a restart.
    for attempt in 1..=5 {
        match write_status(&ctx, &build, &status).await {
            Ok(()) => break,
            Err(err) => {
                tracing::warn!(error = %err, attempt, "writing the final status");
                tokio::time::sleep(Duration::from_secs(attempt)).await;
            }
        }
    }
    ctx.track(build.uid().unwrap_or_default(), false);
    ctx.metrics.duration.observe(clock.elapsed().as_secs_f64());
    ctx.metrics.count(result.is_ok());
}

async fn write_status(
    ctx: &Context,
    build: &ImageBuild,
    status: &ImageBuildStatus,
) -> Result<(), Error> {
    // A merge patch keeps fields it does not name: name every one, so nothing of an earlier
    // phase (the progress of a finished build) lingers.
    let mut value = serde_json::to_value(status).unwrap_or_default();
    if let Some(fields) = value.as_object_mut() {
        for field in [
            "progress",
            "baseImage",
            "imageDigest",
            "layerDigest",
            "layerSize",
            "cacheHit",
            "startTime",
            "completionTime",
            "message",
        ] {
            fields.entry(field).or_insert(serde_json::Value::Null);
        }
    }
    status_patch(ctx, build, &serde_json::json!({ "status": value })).await
}

async fn status_patch(
    ctx: &Context,
    build: &ImageBuild,
    patch: &serde_json::Value,
) -> Result<(), Error> {
    let namespace = build.namespace().ok_or(Error::MissingNamespace)?;
    let name = build.name_any();
    Api::<ImageBuild>::namespaced(ctx.client.clone(), &namespace)
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .map(|_| ())
        .map_err(|source| Error::Status { name, source })
}

async fn publish(ctx: &Context, build: &ImageBuild, type_: EventType, reason: &str, note: String) {
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: "Save".into(),
        secondary: None,
    };
    if let Err(err) = ctx.recorder.publish(&event, &build.object_ref(&())).await {
        tracing::warn!(error = %err, "publishing an event");
    }
}

/// Retries a failed reconcile after a pause (reads and status writes are the only failures).
pub fn error_policy(_build: Arc<ImageBuild>, error: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(error = %error, "reconcile failed");
    Action::requeue(Duration::from_secs(5))
}

/// Runs the reconciler until the process is asked to stop.
pub async fn run(ctx: Arc<Context>) {
    let builds: Api<ImageBuild> = Api::all(ctx.client.clone());
    Controller::new(builds, watcher::Config::default())
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|_| async {})
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn notebook(stopped: bool) -> Notebook {
        let mut annotations = serde_json::Map::new();
        if stopped {
            annotations.insert(
                "kubeflow-resource-stopped".into(),
                "2026-01-01T00:00:00Z".into(),
            );
        }
        serde_json::from_value(json!({
            "apiVersion": "kubeflow.org/v1",
            "kind": "Notebook",
            "metadata": {"name": "lab", "namespace": "alice", "annotations": annotations},
            "spec": {"template": {"spec": {"containers": [{"name": "lab", "image": "jupyter:v1"}]}}},
        }))
        .unwrap()
    }

    fn pod(phase: &str, image_id: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "lab-0", "namespace": "alice"},
            "spec": {"containers": [
                {"name": "sidecar", "image": "proxy:1"},
                {"name": "lab", "image": "registry.example.com:5000/team/jupyter:v1",
                 "volumeMounts": [{"name": "labforge-agent", "mountPath": "/.labforge/agent"}]},
            ]},
            "status": {"phase": phase, "containerStatuses": [{
                "name": "lab", "image": "jupyter:v1", "imageID": image_id, "ready": true,
                "restartCount": 0
            }]},
        }))
        .unwrap()
    }

    fn build() -> ImageBuild {
        ImageBuild::new(
            "save",
            labforge_crds::imagebuild::ImageBuildSpec {
                notebook: "lab".into(),
                target_image: "registry.example.com/alice/lab:saved".into(),
                compression: None,
            },
        )
    }

    #[test]
    fn the_running_notebook_container_is_saved_on_the_image_it_runs() {
        let digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        let target = save_target(
            &build(),
            Some(&notebook(false)),
            Some(&pod(
                "Running",
                &format!("registry.example.com:5000/team/jupyter@{digest}"),
            )),
        )
        .unwrap();
        assert_eq!(
            target,
            SaveTarget {
                pod: "lab-0".into(),
                container: "lab".into(),
                base: format!("registry.example.com:5000/team/jupyter@{digest}"),
            }
        );
        let unpinned = save_target(&build(), Some(&notebook(false)), Some(&pod("Running", "")));
        assert_eq!(
            unpinned.unwrap().base,
            "registry.example.com:5000/team/jupyter:v1"
        );
    }

    #[test]
    fn a_build_that_cannot_start_says_why() {
        let missing = save_target(&build(), None, None).unwrap_err();
        assert_eq!(missing, "notebook lab does not exist");
        let stopped = save_target(&build(), Some(&notebook(true)), None).unwrap_err();
        assert!(stopped.starts_with("notebook lab is stopped"), "{stopped}");
        let no_pod = save_target(&build(), Some(&notebook(false)), None).unwrap_err();
        assert_eq!(no_pod, "notebook lab has no pod lab-0 yet");
        let pending =
            save_target(&build(), Some(&notebook(false)), Some(&pod("Pending", ""))).unwrap_err();
        assert_eq!(
            pending,
            "notebook lab is not running (pod lab-0 is Pending)"
        );
        let mut without_agent = pod("Running", "");
        if let Some(spec) = without_agent.spec.as_mut() {
            spec.containers[1].volume_mounts = None;
        }
        let no_agent =
            save_target(&build(), Some(&notebook(false)), Some(&without_agent)).unwrap_err();
        assert!(
            no_agent.starts_with("notebook lab has no save agent"),
            "{no_agent}"
        );
    }

    #[test]
    fn builds_push_only_under_their_namespace_when_a_prefix_is_set() {
        let mut build = build();
        build.metadata.namespace = Some("alice".into());
        assert_eq!(target_allowed(&build, None), Ok(()));
        let prefix = Some("registry.example.com/");
        build.spec.target_image = "registry.example.com/alice/lab:v1".into();
        assert_eq!(target_allowed(&build, prefix), Ok(()));
        for elsewhere in [
            "registry.example.com/bob/lab:v1",
            "registry.example.com/alice",
            "registry.example.com/alice/",
            "evil.example.com/registry.example.com/alice/lab:v1",
        ] {
            build.spec.target_image = elsewhere.into();
            let refused = target_allowed(&build, prefix).unwrap_err();
            assert!(refused.contains("registry.example.com/alice/"), "{refused}");
        }
    }

    #[test]
    fn images_are_pinned_to_the_digest_the_kubelet_reports() {
        let digest = "sha256:aaaa";
        for (image, expected) in [
            ("jupyter", "jupyter@sha256:aaaa"),
            ("jupyter:v1", "jupyter@sha256:aaaa"),
            (
                "host:5000/team/jupyter:v1",
                "host:5000/team/jupyter@sha256:aaaa",
            ),
            (
                "host:5000/team/jupyter",
                "host:5000/team/jupyter@sha256:aaaa",
            ),
            ("host/jupyter@sha256:bbbb", "host/jupyter@sha256:aaaa"),
        ] {
            assert_eq!(
                pinned(image, &format!("docker-pullable://x@{digest}")),
                expected
            );
        }
        assert_eq!(pinned("jupyter:v1", ""), "jupyter:v1");
        assert_eq!(
            pinned("jupyter:v1", "sha256:aaaa"),
            "jupyter:v1",
            "an image id, no repo digest"
        );
    }

    #[test]
    fn a_finished_status_drops_progress_and_a_failure_keeps_its_message() {
        let failed = finished_status(
            None,
            Some("jupyter@sha256:aaaa"),
            &Err("registry down".into()),
            jiff::Timestamp::UNIX_EPOCH,
        );
        assert_eq!(failed.phase, ImageBuildPhase::Failed);
        assert_eq!(failed.message.as_deref(), Some("registry down"));
        assert!(failed.progress.is_none() && failed.image_digest.is_none());
        assert!(failed.completion_time.is_some());
    }
}
