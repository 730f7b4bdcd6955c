//! The Kubernetes reconcile loop: Notebook → applied children → mirrored status.
//!
//! Children are applied with server-side apply under one field manager, and only when the live
//! object differs from what was last applied; status is written only when the computed status
//! differs from the stored one. Reads come from watch caches ([`crate::cache`]), so a resync of
//! an idle cluster sends no request.

use crate::builders::{BuilderConfig, build_children};
use crate::cache::{self, CacheWriters, Caches, Feeds};
use crate::metrics::{ErrorLabels, Metrics, NamespaceLabels};
use crate::status::{invalid_spec_status, notebook_status};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Event as CoreEvent, Pod, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{ListParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use labforge_crds::notebook::{
    LAST_ACTIVITY_ANNOTATION, LAST_ACTIVITY_CHECK_ANNOTATION, NOTEBOOK_NAME_LABEL,
};
use labforge_crds::{Notebook, NotebookStatus, VirtualService};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The one field manager labforge applies with.
pub const FIELD_MANAGER: &str = "labforge-notebook-controller";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Notebook has no namespace")]
    MissingNamespace,
    #[error("applying {kind} {name}")]
    Apply {
        kind: &'static str,
        name: String,
        /// Whether the object existed before (a failed first apply is a failed creation).
        existed: bool,
        #[source]
        source: kube::Error,
    },
    #[error("reading {what}")]
    Read {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("writing the Notebook status")]
    Status(#[source] kube::Error),
    #[error("removing {what} from the Notebook")]
    Write {
        what: &'static str,
        #[source]
        source: kube::Error,
    },
}

impl Error {
    /// Short label for the failure metric.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::MissingNamespace => "missing_namespace",
            Error::Apply { .. } => "apply",
            Error::Read { .. } => "read",
            Error::Status(_) => "status",
            Error::Write { .. } => "write",
        }
    }
}

/// How often an unchanged Notebook is checked again by default: an edit the watches missed is
/// repaired within this time, and a check costs no request while the caches serve it.
pub const DEFAULT_RESYNC: Duration = Duration::from_secs(300);

/// What every reconcile shares.
pub struct Context {
    pub client: Client,
    pub config: BuilderConfig,
    pub metrics: Arc<Metrics>,
    pub recorder: Recorder,
    /// What reconciles read instead of asking the API server.
    pub caches: Caches,
    /// How often an unchanged Notebook is reconciled again.
    pub resync: Duration,
    /// Warning events already re-emitted on their Notebook (by event uid).
    reemitted: Mutex<HashSet<String>>,
    /// Consecutive reconcile failures per Notebook, for exponential backoff.
    failures: Mutex<HashMap<ObjectRef<Notebook>, u32>>,
    /// Events last seen before this moment were re-emitted by an earlier instance.
    started: jiff::Timestamp,
}

impl Context {
    /// `instance` names this replica in the events it publishes (the pod name in a cluster);
    /// `caches` are filled by the watches [`run`] starts.
    pub fn new(
        client: Client,
        config: BuilderConfig,
        metrics: Arc<Metrics>,
        instance: Option<String>,
        caches: Caches,
    ) -> Self {
        let reporter = Reporter {
            controller: FIELD_MANAGER.into(),
            instance,
        };
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            config,
            metrics,
            caches,
            resync: DEFAULT_RESYNC,
            reemitted: Mutex::new(HashSet::new()),
            failures: Mutex::new(HashMap::new()),
            started: jiff::Timestamp::now(),
        }
    }
}

/// Brings one Notebook's children and status in line with its spec.
#[tracing::instrument(skip(notebook, ctx), fields(name = %notebook.name_any(), namespace = notebook.namespace()))]
pub async fn reconcile(notebook: Arc<Notebook>, ctx: Arc<Context>) -> Result<Action, Error> {
    let _timer = ctx.metrics.reconcile_timer();
    let action = reconcile_notebook(&notebook, &ctx).await?;
    if let Ok(mut failures) = ctx.failures.lock() {
        failures.remove(&ObjectRef::from_obj(notebook.as_ref()));
    }
    Ok(action)
}

async fn reconcile_notebook(notebook: &Notebook, ctx: &Context) -> Result<Action, Error> {
    let namespace = notebook.namespace().ok_or(Error::MissingNamespace)?;
    let name = notebook.name_any();
    if notebook.metadata.deletion_timestamp.is_some() {
        // Children go with the Notebook through their ownerReferences.
        ctx.metrics.set_running(&namespace, &name, None);
        return Ok(Action::await_change());
    }
    let notebooks: Api<Notebook> = Api::namespaced(ctx.client.clone(), &namespace);

    let children = match build_children(notebook, &ctx.config) {
        Ok(children) => children,
        Err(err) => return report_invalid_spec(&notebooks, notebook, ctx, err.to_string()).await,
    };

    // Before the pod exists: it never runs unguarded.
    if let Some(policy) = &children.network_policy {
        let policies: Api<NetworkPolicy> = Api::namespaced(ctx.client.clone(), &namespace);
        let cache = &ctx.caches.network_policies;
        apply_child(&policies, cache, policy, "NetworkPolicy").await?;
    }
    let ns_labels = NamespaceLabels {
        namespace: namespace.clone(),
    };
    let stateful_sets: Api<StatefulSet> = Api::namespaced(ctx.client.clone(), &namespace);
    let cache = &ctx.caches.stateful_sets;
    let stateful_set =
        match apply_child(&stateful_sets, cache, &children.stateful_set, "StatefulSet").await {
            Ok((sts, created)) => {
                if created {
                    ctx.metrics.created.get_or_create(&ns_labels).inc();
                    publish(
                        ctx,
                        notebook,
                        EventType::Normal,
                        "Created",
                        format!("Created StatefulSet {name}"),
                    )
                    .await;
                }
                sts
            }
            Err(err) => {
                if matches!(err, Error::Apply { existed: false, .. }) {
                    ctx.metrics.create_failed.get_or_create(&ns_labels).inc();
                }
                // The API server refused what the Notebook asks for (a quantity our CRD let
                // through, say): retrying cannot help, the user has to fix the Notebook.
                if let Error::Apply {
                    kind,
                    source: kube::Error::Api(status),
                    ..
                } = &err
                    && status.code == 422
                {
                    let message = format!("{kind} rejected: {}", status.message);
                    return report_invalid_spec(&notebooks, notebook, ctx, message).await;
                }
                return Err(err);
            }
        };
    let services: Api<Service> = Api::namespaced(ctx.client.clone(), &namespace);
    apply_child(
        &services,
        &ctx.caches.services,
        &children.service,
        "Service",
    )
    .await?;
    if let Some(vs) = &children.virtual_service {
        let virtual_services: Api<VirtualService> = Api::namespaced(ctx.client.clone(), &namespace);
        let cache = &ctx.caches.virtual_services;
        apply_child(&virtual_services, cache, vs, "VirtualService").await?;
    }

    let pod_name = format!("{name}-0");
    let pod = if cache::is_ready(&ctx.caches.pods) {
        cache::cached(&ctx.caches.pods, &namespace, &pod_name).map(|pod| (*pod).clone())
    } else {
        let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
        pods.get_opt(&pod_name)
            .await
            .map_err(|source| Error::Read {
                what: format!("Pod {pod_name}"),
                source,
            })?
    };
    forget_activity_when_not_running(&notebooks, notebook, pod.is_some()).await?;
    let status = notebook_status(notebook, Some(&stateful_set), pod.as_ref());
    ctx.metrics
        .set_running(&namespace, &name, Some(status.ready_replicas > 0));
    write_status_if_changed(&notebooks, notebook, status).await?;
    reemit_warnings(
        ctx,
        notebook,
        &namespace,
        &[(&pod_name, "Pod"), (&name, "StatefulSet")],
    )
    .await;
    Ok(Action::requeue(ctx.resync))
}

/// Clears the culler's annotations while a notebook is stopped or has no pod, as Kubeflow does:
/// however it was stopped (kubectl, Kubeflow's UI), it starts again with a fresh idle clock
/// instead of being culled at once for the time it spent stopped.
async fn forget_activity_when_not_running(
    notebooks: &Api<Notebook>,
    notebook: &Notebook,
    has_pod: bool,
) -> Result<(), Error> {
    let recorded = [LAST_ACTIVITY_ANNOTATION, LAST_ACTIVITY_CHECK_ANNOTATION]
        .into_iter()
        .filter(|key| notebook.annotation(key).is_some())
        .map(|key| (key.to_owned(), serde_json::Value::Null))
        .collect::<serde_json::Map<_, _>>();
    if recorded.is_empty() || (has_pod && !notebook.is_stopped()) {
        return Ok(());
    }
    let patch = serde_json::json!({ "metadata": { "annotations": recorded } });
    notebooks
        .patch(
            &notebook.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .map_err(|source| Error::Write {
            what: "the culling annotations",
            source,
        })?;
    Ok(())
}

/// Nothing (more) is created for a Notebook that cannot be realized; the reason goes on its
/// status as an `InvalidSpec` condition and a Warning event, and it waits for the user's fix.
async fn report_invalid_spec(
    notebooks: &Api<Notebook>,
    notebook: &Notebook,
    ctx: &Context,
    message: String,
) -> Result<Action, Error> {
    let status = invalid_spec_status(notebook, &message);
    let changed = notebook.status.as_ref() != Some(&status);
    write_status_if_changed(notebooks, notebook, status).await?;
    if changed {
        publish(ctx, notebook, EventType::Warning, "InvalidSpec", message).await;
    }
    Ok(Action::await_change())
}

/// Annotation on each child with the digest of what labforge last applied to it.
pub const APPLIED_DIGEST_ANNOTATION: &str = "labforge.dev/applied-digest";

/// Applies `desired` unless the live object is exactly what was last applied (same digest of the
/// desired object, so removed fields are noticed) and still carries every field of it (so edits
/// by others are repaired). The live object comes from `cache`; one it lacks is read from the
/// server, as the cache may not have caught up with a write yet. A resync of unchanged notebooks
/// thus sends no request at all. Returns the live object and whether it was created.
async fn apply_child<K>(
    api: &Api<K>,
    cache: &Store<K>,
    desired: &K,
    kind: &'static str,
) -> Result<(K, bool), Error>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let name = desired.meta().name.as_deref().unwrap_or_default();
    let namespace = desired.meta().namespace.as_deref().unwrap_or_default();
    let existing = match cache::cached(cache, namespace, name) {
        Some(cached) => Some((*cached).clone()),
        None => api.get_opt(name).await.map_err(|source| Error::Read {
            what: format!("{kind} {name}"),
            source,
        })?,
    };
    let mut desired = desired.clone();
    if let Some(existing) = &existing {
        keep_owner_versions(desired.meta_mut(), existing.meta());
    }
    let digest = applied_digest(&desired);
    desired
        .meta_mut()
        .annotations
        .get_or_insert_with(Default::default)
        .insert(APPLIED_DIGEST_ANNOTATION.to_owned(), digest.clone());
    let desired = &desired;
    if let Some(existing) = existing.as_ref()
        && existing
            .meta()
            .annotations
            .as_ref()
            .and_then(|a| a.get(APPLIED_DIGEST_ANNOTATION))
            == Some(&digest)
        && is_applied(desired, existing)
    {
        return Ok((existing.clone(), false));
    }
    let applied = api
        .patch(
            name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(desired),
        )
        .await
        .map_err(|source| Error::Apply {
            kind,
            name: name.to_owned(),
            existed: existing.is_some(),
            source,
        })?;
    Ok((applied, existing.is_none()))
}

/// Keeps the apiVersion of an owner reference the live object already has for the same owner.
/// Kubeflow's controller writes `kubeflow.org/v1beta1` there; rewriting it to `v1` would change
/// the owner references, which clusters enforcing owner-reference permissions (OpenShift) allow
/// only to who may delete the child.
fn keep_owner_versions(desired: &mut ObjectMeta, live: &ObjectMeta) {
    let live = live.owner_references.as_deref().unwrap_or_default();
    for owner in desired.owner_references.iter_mut().flatten() {
        if let Some(same) = live
            .iter()
            .find(|l| l.uid == owner.uid && l.kind == owner.kind)
        {
            owner.api_version.clone_from(&same.api_version);
        }
    }
}

/// A digest of the object as built (before the annotation is added).
fn applied_digest(desired: &impl serde::Serialize) -> String {
    use sha2::Digest as _;
    let bytes = serde_json::to_vec(desired).unwrap_or_default();
    hex::encode(&sha2::Sha256::digest(&bytes)[..16])
}

/// Whether every field set in `desired` has the same value in `live` (fields the API server or
/// other managers added are ignored, as server-side apply ignores them).
fn is_applied(desired: &impl serde::Serialize, live: &impl serde::Serialize) -> bool {
    match (serde_json::to_value(desired), serde_json::to_value(live)) {
        (Ok(desired), Ok(live)) => is_subset(&desired, &live),
        _ => false,
    }
}

fn is_subset(desired: &serde_json::Value, live: &serde_json::Value) -> bool {
    use serde_json::Value;
    match (desired, live) {
        (Value::Object(want), Value::Object(have)) => want
            .iter()
            .filter(|(_, v)| !v.is_null())
            .all(|(k, v)| have.get(k).is_some_and(|h| is_subset(v, h))),
        (Value::Array(want), Value::Array(have)) => {
            want.len() == have.len() && want.iter().zip(have).all(|(w, h)| is_subset(w, h))
        }
        (want, have) => want == have,
    }
}

async fn write_status_if_changed(
    api: &Api<Notebook>,
    notebook: &Notebook,
    status: NotebookStatus,
) -> Result<(), Error> {
    if notebook.status.as_ref() == Some(&status) {
        return Ok(());
    }
    let stored = serde_json::to_value(&notebook.status).unwrap_or_default();
    let wanted = serde_json::to_value(&status).unwrap_or_default();
    let patch = serde_json::json!({ "status": merge_patch(&stored, &wanted) });
    api.patch_status(
        &notebook.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
    .map_err(Error::Status)?;
    Ok(())
}

/// The JSON merge patch that turns `stored` into `wanted` (RFC 7386): keys `wanted` lacks are
/// sent as null, since a merge patch keeps whatever it does not name, and a container that went
/// from waiting to running must not keep its `waiting`.
fn merge_patch(stored: &serde_json::Value, wanted: &serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match (stored, wanted) {
        (Value::Object(stored), Value::Object(wanted)) => {
            let mut patch: serde_json::Map<String, Value> = stored
                .keys()
                .filter(|key| !wanted.contains_key(*key))
                .map(|key| (key.clone(), Value::Null))
                .collect();
            for (key, value) in wanted {
                let field = match stored.get(key) {
                    Some(old) if old == value => continue,
                    Some(old) => merge_patch(old, value),
                    None => value.clone(),
                };
                patch.insert(key.clone(), field);
            }
            Value::Object(patch)
        }
        (_, wanted) => wanted.clone(),
    }
}

/// Warning events of the notebook's pod and StatefulSet, repeated on the Notebook so users see
/// why their notebook does not start where they look (Kubeflow does the same).
async fn reemit_warnings(
    ctx: &Context,
    notebook: &Notebook,
    namespace: &str,
    objects: &[(&str, &str)],
) {
    for (name, kind) in objects {
        let events: Vec<CoreEvent> =
            match cache::warnings_about(&ctx.caches.warnings, namespace, kind, name) {
                Some(cached) => cached.iter().map(|event| (**event).clone()).collect(),
                None => {
                    let events: Api<CoreEvent> = Api::namespaced(ctx.client.clone(), namespace);
                    let selector = format!(
                        "involvedObject.name={name},involvedObject.kind={kind},type=Warning"
                    );
                    match events.list(&ListParams::default().fields(&selector)).await {
                        Ok(list) => list.items,
                        Err(_) => continue,
                    }
                }
            };
        for event in events {
            let Some(uid) = event.metadata.uid.clone() else {
                continue;
            };
            let last_seen = event
                .last_timestamp
                .as_ref()
                .or(event.metadata.creation_timestamp.as_ref())
                .map(|t| t.0);
            // Event times have whole-second precision: compare at that precision.
            if last_seen.is_some_and(|t| t.as_second() < ctx.started.as_second()) {
                // Happened before this instance started: an earlier one has re-emitted it.
                continue;
            }
            let fresh = ctx
                .reemitted
                .lock()
                .map(|mut seen| seen.insert(uid))
                .unwrap_or(false);
            if fresh {
                let note = format!("{kind} {name}: {}", event.message.unwrap_or_default());
                let reason = event.reason.unwrap_or_else(|| "Warning".into());
                publish(ctx, notebook, EventType::Warning, &reason, note).await;
            }
        }
    }
}

async fn publish(ctx: &Context, notebook: &Notebook, type_: EventType, reason: &str, note: String) {
    let event = Event {
        type_,
        reason: reason.to_owned(),
        note: Some(note),
        action: "Reconcile".into(),
        secondary: None,
    };
    if let Err(err) = ctx
        .recorder
        .publish(&event, &notebook.object_ref(&()))
        .await
    {
        tracing::warn!(error = %err, "could not publish event");
    }
}

/// Delay before retrying after `failures` consecutive failures: 1 s doubling to at most 5 min.
pub fn backoff(failures: u32) -> Duration {
    Duration::from_secs(1u64 << failures.saturating_sub(1).min(9)).min(Duration::from_secs(300))
}

/// Requeues failed reconciles with exponential backoff and counts the failure by kind.
pub fn error_policy(notebook: Arc<Notebook>, error: &Error, ctx: Arc<Context>) -> Action {
    let failures = ctx.failures.lock().map_or(1, |mut failures| {
        let count = failures
            .entry(ObjectRef::from_obj(notebook.as_ref()))
            .or_insert(0);
        *count = count.saturating_add(1);
        *count
    });
    tracing::warn!(error = %labforge_messages::error_chain(error), failures, "reconcile failed");
    ctx.metrics
        .reconcile_errors
        .get_or_create(&ErrorLabels {
            error: error.metric_label().into(),
        })
        .inc();
    Action::requeue(backoff(failures))
}

/// Runs the controller until the stream ends (the process is shutting down); its watches fill
/// the context's caches through `writers`.
pub async fn run(ctx: Arc<Context>, writers: CacheWriters) {
    let client = ctx.client.clone();
    let notebooks: Api<Notebook> = Api::all(client.clone());
    let feeds = Feeds::new(&client, writers);
    let mut controller = Controller::new(notebooks, watcher::Config::default())
        .owns_stream(feeds.stateful_sets)
        .owns_stream(feeds.services);
    if ctx.config.virtual_service {
        // An edited or deleted VirtualService is repaired at once, not at the next resync.
        controller = controller.owns_stream(feeds.virtual_services);
    }
    if ctx.config.network_policy_from.is_some() {
        controller = controller.owns_stream(feeds.network_policies);
    }
    let forget = ctx.clone();
    let caches = ctx.caches.clone();
    controller
        .watches_stream(feeds.pods, |pod| {
            let name = pod.labels().get(NOTEBOOK_NAME_LABEL)?.clone();
            Some(ObjectRef::<Notebook>::new(&name).within(&pod.namespace()?))
        })
        .watches_stream(feeds.warnings, move |event| {
            // Only events about a notebook's own pod or StatefulSet (the caches hold only those),
            // not every Warning of the cluster.
            let about = &event.involved_object;
            let namespace = event.namespace()?;
            let object = about.name.as_deref()?;
            let name = match about.kind.as_deref()? {
                "StatefulSet" => cache::cached(&caches.stateful_sets, &namespace, object)?
                    .labels()
                    .get(NOTEBOOK_NAME_LABEL)?
                    .clone(),
                "Pod" => cache::cached(&caches.pods, &namespace, object)?
                    .labels()
                    .get(NOTEBOOK_NAME_LABEL)?
                    .clone(),
                _ => return None,
            };
            Some(ObjectRef::<Notebook>::new(&name).within(&namespace))
        })
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(move |result| {
            // A deleted Notebook shows up here once; drop what was kept about it.
            if let Err(kube::runtime::controller::Error::ObjectNotFound(object)) = &result {
                let namespace = object.namespace.clone().unwrap_or_default();
                forget.metrics.set_running(&namespace, &object.name, None);
                if let Ok(mut failures) = forget.failures.lock() {
                    failures.remove(&ObjectRef::<Notebook>::new(&object.name).within(&namespace));
                }
            } else if let Err(err) = result {
                tracing::debug!(error = %err, "reconcile stream");
            }
            futures::future::ready(())
        })
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_status_patch_clears_what_the_new_status_lacks() {
        let stored = json!({"readyReplicas": 1, "conditions": [{"type": "Ready"}],
            "containerState": {"waiting": {"reason": "ContainerCreating", "message": "pulling"}}});
        let wanted = json!({"readyReplicas": 1, "conditions": [],
            "containerState": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}});
        let patch = merge_patch(&stored, &wanted);
        assert_eq!(
            patch,
            json!({"conditions": [], "containerState": {"waiting": null,
                "running": {"startedAt": "2026-01-01T00:00:00Z"}}})
        );
        let nested = merge_patch(
            &json!({"waiting": {"reason": "ImagePullBackOff", "message": "no such image"}}),
            &json!({"waiting": {"reason": "ContainerCreating"}}),
        );
        assert_eq!(
            nested,
            json!({"waiting": {"reason": "ContainerCreating", "message": null}})
        );
        assert_eq!(merge_patch(&serde_json::Value::Null, &wanted), wanted);
    }

    #[test]
    fn backoff_doubles_from_one_second_up_to_five_minutes() {
        let delays: Vec<_> = [1, 2, 3, 4, 9, 10, 50]
            .map(|n| backoff(n).as_secs())
            .to_vec();
        assert_eq!(delays, [1, 2, 4, 8, 256, 300, 300]);
    }

    #[test]
    fn live_object_with_server_defaults_counts_as_applied() {
        let desired = json!({"spec": {"replicas": 1, "template": {"spec": {"containers": [{"name": "a", "image": "x"}]}}}});
        let live = json!({"metadata": {"resourceVersion": "7"}, "spec": {"replicas": 1, "podManagementPolicy": "OrderedReady",
            "template": {"spec": {"containers": [{"name": "a", "image": "x", "terminationMessagePath": "/dev/termination-log"}]}}},
            "status": {"readyReplicas": 1}});
        assert!(is_subset(&desired, &live));
    }

    #[test]
    fn changed_or_missing_fields_and_list_lengths_need_an_apply() {
        let desired = json!({"spec": {"replicas": 0, "ports": [{"port": 80}]}});
        assert!(!is_subset(
            &desired,
            &json!({"spec": {"replicas": 1, "ports": [{"port": 80}]}})
        ));
        assert!(!is_subset(
            &desired,
            &json!({"spec": {"ports": [{"port": 80}]}})
        ));
        assert!(!is_subset(
            &desired,
            &json!({"spec": {"replicas": 0, "ports": [{"port": 80}, {"port": 81}]}})
        ));
    }
}
