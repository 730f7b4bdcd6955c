//! The Kubernetes reconcile loop: Notebook → applied children → mirrored status.
//!
//! Children are applied with server-side apply under one field manager, so the API server (not
//! us) decides whether anything changed: an unchanged apply is free. Status is written only when
//! the computed status differs from the stored one, so a resync of an idle cluster writes nothing.

use crate::builders::{BuilderConfig, build_children};
use crate::metrics::{ErrorLabels, Metrics, NamespaceLabels};
use crate::status::{invalid_spec_status, notebook_status};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Event as CoreEvent, Pod, Service};
use kube::api::{ListParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use labforge_crds::notebook::NOTEBOOK_NAME_LABEL;
use labforge_crds::{Notebook, NotebookStatus, VirtualService};
use std::collections::HashSet;
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
}

impl Error {
    /// Short label for the failure metric.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::MissingNamespace => "missing_namespace",
            Error::Apply { .. } => "apply",
            Error::Read { .. } => "read",
            Error::Status(_) => "status",
        }
    }
}

/// What every reconcile shares.
pub struct Context {
    pub client: Client,
    pub config: BuilderConfig,
    pub metrics: Arc<Metrics>,
    pub recorder: Recorder,
    /// Warning events already re-emitted on their Notebook (by event uid).
    reemitted: Mutex<HashSet<String>>,
}

impl Context {
    pub fn new(client: Client, config: BuilderConfig, metrics: Arc<Metrics>) -> Self {
        let reporter = Reporter {
            controller: FIELD_MANAGER.into(),
            instance: std::env::var("POD_NAME").ok(),
        };
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            config,
            metrics,
            reemitted: Mutex::new(HashSet::new()),
        }
    }
}

/// Brings one Notebook's children and status in line with its spec.
#[tracing::instrument(skip(notebook, ctx), fields(name = %notebook.name_any(), namespace = notebook.namespace()))]
pub async fn reconcile(notebook: Arc<Notebook>, ctx: Arc<Context>) -> Result<Action, Error> {
    let _timer = ctx.metrics.reconcile_timer();
    let namespace = notebook.namespace().ok_or(Error::MissingNamespace)?;
    let name = notebook.name_any();
    if notebook.metadata.deletion_timestamp.is_some() {
        // Children go with the Notebook through their ownerReferences.
        ctx.metrics.set_running(&namespace, &name, None);
        return Ok(Action::await_change());
    }
    let notebooks: Api<Notebook> = Api::namespaced(ctx.client.clone(), &namespace);

    let children = match build_children(&notebook, &ctx.config) {
        Ok(children) => children,
        Err(err) => {
            // Nothing is created for a Notebook we cannot build; the reason is on its status.
            let status = invalid_spec_status(&notebook, &err.to_string());
            write_status_if_changed(&notebooks, &notebook, status).await?;
            publish(
                &ctx,
                &notebook,
                EventType::Warning,
                "InvalidSpec",
                err.to_string(),
            )
            .await;
            return Ok(Action::await_change());
        }
    };

    let apply = PatchParams::apply(FIELD_MANAGER).force();
    let stateful_sets: Api<StatefulSet> = Api::namespaced(ctx.client.clone(), &namespace);
    let existed = stateful_sets
        .get_metadata_opt(&name)
        .await
        .map_err(|source| Error::Read {
            what: format!("StatefulSet {name}"),
            source,
        })?
        .is_some();
    let ns_labels = NamespaceLabels {
        namespace: namespace.clone(),
    };
    let stateful_set = match stateful_sets
        .patch(&name, &apply, &Patch::Apply(&children.stateful_set))
        .await
    {
        Ok(sts) => {
            if !existed {
                ctx.metrics.created.get_or_create(&ns_labels).inc();
                publish(
                    &ctx,
                    &notebook,
                    EventType::Normal,
                    "Created",
                    format!("Created StatefulSet {name}"),
                )
                .await;
            }
            sts
        }
        Err(source) => {
            if !existed {
                ctx.metrics.create_failed.get_or_create(&ns_labels).inc();
            }
            return Err(Error::Apply {
                kind: "StatefulSet",
                name,
                source,
            });
        }
    };
    let services: Api<Service> = Api::namespaced(ctx.client.clone(), &namespace);
    services
        .patch(&name, &apply, &Patch::Apply(&children.service))
        .await
        .map_err(|source| Error::Apply {
            kind: "Service",
            name: name.clone(),
            source,
        })?;
    if let Some(vs) = &children.virtual_service {
        let virtual_services: Api<VirtualService> = Api::namespaced(ctx.client.clone(), &namespace);
        let vs_name = vs.name_any();
        virtual_services
            .patch(&vs_name, &apply, &Patch::Apply(vs))
            .await
            .map_err(|source| Error::Apply {
                kind: "VirtualService",
                name: vs_name,
                source,
            })?;
    }

    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
    let pod_name = format!("{name}-0");
    let pod = pods
        .get_opt(&pod_name)
        .await
        .map_err(|source| Error::Read {
            what: format!("Pod {pod_name}"),
            source,
        })?;
    let status = notebook_status(&notebook, Some(&stateful_set), pod.as_ref());
    ctx.metrics
        .set_running(&namespace, &name, Some(status.ready_replicas > 0));
    write_status_if_changed(&notebooks, &notebook, status).await?;
    reemit_warnings(
        &ctx,
        &notebook,
        &namespace,
        &[(&pod_name, "Pod"), (&name, "StatefulSet")],
    )
    .await;
    Ok(Action::requeue(Duration::from_secs(300)))
}

async fn write_status_if_changed(
    api: &Api<Notebook>,
    notebook: &Notebook,
    status: NotebookStatus,
) -> Result<(), Error> {
    if notebook.status.as_ref() == Some(&status) {
        return Ok(());
    }
    let patch = serde_json::json!({ "status": status });
    api.patch_status(
        &notebook.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
    .map_err(Error::Status)?;
    Ok(())
}

/// Warning events of the notebook's pod and StatefulSet, repeated on the Notebook so users see
/// why their notebook does not start where they look (Kubeflow does the same).
async fn reemit_warnings(
    ctx: &Context,
    notebook: &Notebook,
    namespace: &str,
    objects: &[(&str, &str)],
) {
    let events: Api<CoreEvent> = Api::namespaced(ctx.client.clone(), namespace);
    for (name, kind) in objects {
        let selector =
            format!("involvedObject.name={name},involvedObject.kind={kind},type=Warning");
        let Ok(list) = events.list(&ListParams::default().fields(&selector)).await else {
            continue;
        };
        for event in list.items {
            let Some(uid) = event.metadata.uid.clone() else {
                continue;
            };
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

/// Requeues failed reconciles with backoff and counts the failure by kind.
pub fn error_policy(_notebook: Arc<Notebook>, error: &Error, ctx: Arc<Context>) -> Action {
    tracing::warn!(error = %error, source = ?std::error::Error::source(error), "reconcile failed");
    ctx.metrics
        .reconcile_errors
        .get_or_create(&ErrorLabels {
            error: error.metric_label().into(),
        })
        .inc();
    Action::requeue(Duration::from_secs(5))
}

/// Runs the controller until the stream ends (the process is shutting down).
pub async fn run(ctx: Arc<Context>) {
    let client = ctx.client.clone();
    let notebooks: Api<Notebook> = Api::all(client.clone());
    let pods: Api<Pod> = Api::all(client.clone());
    Controller::new(notebooks, watcher::Config::default())
        .owns(
            Api::<StatefulSet>::all(client.clone()),
            watcher::Config::default(),
        )
        .owns(
            Api::<Service>::all(client.clone()),
            watcher::Config::default(),
        )
        .watches(
            pods,
            watcher::Config::default().labels(NOTEBOOK_NAME_LABEL),
            |pod| {
                let name = pod.labels().get(NOTEBOOK_NAME_LABEL)?.clone();
                Some(ObjectRef::<Notebook>::new(&name).within(&pod.namespace()?))
            },
        )
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(err) = result {
                tracing::debug!(error = %err, "reconcile stream");
            }
        })
        .await;
}
