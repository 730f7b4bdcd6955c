//! Notebooks in a cluster: Notebook CRs through kube-rs, their workspace claims, events and
//! the namespace's ResourceQuotas read as its quota.

use crate::backend::{Backend, BackendError, Change, NotebookChange};
use crate::model::{NotebookEvent, SavedImage};
use crate::unavailable::Unavailable;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, PersistentVolumeClaimSpec, ResourceQuota, ServiceAccount,
    VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::{Resource, ResourceExt};
use labforge_crds::notebook::Notebook;
use std::collections::BTreeMap;
use tokio::sync::broadcast;

/// The saved images (ImageBuilds) could not be read or changed.
fn saved_images_unavailable(err: kube::Error) -> BackendError {
    Unavailable::new("the Kubernetes API", err).into()
}

/// Kubeflow's service account for notebook pods, made in each profile namespace.
const DEFAULT_EDITOR: &str = "default-editor";

/// Notebook CRs in a cluster.
pub struct KubernetesBackend {
    client: kube::Client,
    changes: broadcast::Sender<Change>,
    recorder: Recorder,
    _watch: tokio::task::JoinHandle<()>,
}

fn kube_error(namespace: &str, name: &str, err: kube::Error) -> BackendError {
    if let Some(exceeded) = over_quota(namespace, &err) {
        return exceeded.into();
    }
    match &err {
        kube::Error::Api(status) if status.code == 409 => BackendError::AlreadyExists {
            namespace: namespace.into(),
            name: name.into(),
        },
        kube::Error::Api(status) if status.code == 404 => BackendError::NotFound {
            namespace: namespace.into(),
            name: name.into(),
        },
        kube::Error::Api(status) if status.code == 422 => {
            BackendError::Invalid(status.message.clone())
        }
        _ => Unavailable::new("the Kubernetes API", err).into(),
    }
}

/// The claims a new notebook asks for: each volume with a size in its
/// [`crate::validate::VOLUME_SIZES_ANNOTATION`] (volumes without one name existing claims), `ReadWriteOnce` on
/// the cluster's default storage class, as Kubeflow's web app makes them.
fn new_claims(notebook: &Notebook) -> Vec<PersistentVolumeClaim> {
    notebook
        .volume_sizes()
        .into_iter()
        .map(|(claim, size)| PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some(claim),
                namespace: notebook.namespace(),
                ..Default::default()
            },
            spec: Some(PersistentVolumeClaimSpec {
                access_modes: Some(vec!["ReadWriteOnce".into()]),
                resources: Some(VolumeResourceRequirements {
                    requests: Some(BTreeMap::from([("storage".to_owned(), Quantity(size))])),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            status: None,
        })
        .collect()
}

/// The API server's quota admission refusing a write (403 "exceeded quota"), in labforge's words.
fn over_quota(namespace: &str, err: &kube::Error) -> Option<crate::quota::QuotaExceeded> {
    match err {
        kube::Error::Api(status) if status.code == 403 => {
            crate::quota::QuotaExceeded::from_api_refusal(namespace, &status.message)
        }
        _ => None,
    }
}

fn claim_error(claim: &PersistentVolumeClaim, err: kube::Error) -> BackendError {
    if let Some(exceeded) = over_quota(&claim.namespace().unwrap_or_default(), &err) {
        return exceeded.into();
    }
    match err {
        kube::Error::Api(status) if status.code == 422 => {
            BackendError::Invalid(format!("volume {}: {}", claim.name_any(), status.message))
        }
        err => Unavailable::new(
            format!("creating volume {}: the Kubernetes API", claim.name_any()),
            err,
        )
        .into(),
    }
}

impl KubernetesBackend {
    /// Whether `namespace` has Kubeflow's `default-editor` service account (a profile
    /// namespace does); unreadable counts as absent.
    async fn has_default_editor(&self, namespace: &str) -> bool {
        let accounts: Api<ServiceAccount> = Api::namespaced(self.client.clone(), namespace);
        match accounts.get_opt(DEFAULT_EDITOR).await {
            Ok(found) => found.is_some(),
            Err(err) => {
                tracing::warn!(error = %err, namespace, "looking up the default-editor service account");
                false
            }
        }
    }

    /// Where changes the live views follow are sent (the usage sampler's too).
    pub fn change_sender(&self) -> broadcast::Sender<Change> {
        self.changes.clone()
    }

    /// Starts watching Notebooks (for the live views).
    pub fn new(client: kube::Client) -> Self {
        let (changes, _) = broadcast::channel(1024);
        let sender = changes.clone();
        let api: Api<Notebook> = Api::all(client.clone());
        let watch = tokio::spawn(async move {
            let mut stream =
                kube::runtime::watcher(api, kube::runtime::watcher::Config::default()).boxed();
            while let Some(event) = stream.next().await {
                use kube::runtime::watcher::Event;
                let touched: Vec<Notebook> = match event {
                    Ok(Event::Apply(nb) | Event::Delete(nb) | Event::InitApply(nb)) => vec![nb],
                    Ok(_) => Vec::new(),
                    Err(err) => {
                        tracing::debug!(error = %err, "watching notebooks");
                        Vec::new()
                    }
                };
                for nb in touched {
                    let _ = sender.send(Change::Notebook {
                        namespace: nb.namespace().unwrap_or_default(),
                        name: nb.name_any(),
                    });
                }
            }
        });
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: "labforge-web".into(),
                instance: None,
            },
        );
        Self {
            client,
            changes,
            recorder,
            _watch: watch,
        }
    }

    fn api(&self, namespace: &str) -> Api<Notebook> {
        Api::namespaced(self.client.clone(), namespace)
    }
}

impl Drop for KubernetesBackend {
    fn drop(&mut self) {
        self._watch.abort();
    }
}

#[async_trait::async_trait]
impl Backend for KubernetesBackend {
    /// What the namespace's ResourceQuotas set, in labforge's terms: checked here before the
    /// API server does, so that a refusal names its numbers before anything is made. Unreadable
    /// quotas (no RBAC for them) leave the API server alone to enforce them.
    async fn quota(&self, namespace: &str) -> Result<Option<crate::quota::Quota>, BackendError> {
        let api: Api<ResourceQuota> = Api::namespaced(self.client.clone(), namespace);
        match api.list(&Default::default()).await {
            Ok(list) => Ok(crate::quota::Quota::from_resource_quotas(
                list.items
                    .iter()
                    .filter_map(|q| q.spec.as_ref()?.hard.as_ref()),
            )),
            Err(err) => {
                tracing::warn!(error = %err, namespace, "reading the namespace's ResourceQuotas");
                Ok(None)
            }
        }
    }

    async fn list(&self, namespace: Option<&str>) -> Result<Vec<Notebook>, BackendError> {
        let api = match namespace {
            Some(ns) => self.api(ns),
            None => Api::all(self.client.clone()),
        };
        api.list(&ListParams::default())
            .await
            .map(|list| list.items)
            .map_err(|e| kube_error(namespace.unwrap_or_default(), "", e))
    }

    async fn get(&self, namespace: &str, name: &str) -> Result<Option<Notebook>, BackendError> {
        self.api(namespace)
            .get_opt(name)
            .await
            .map_err(|e| kube_error(namespace, name, e))
    }

    /// As Kubeflow's web app: the Notebook and its new claims are first created as a dry run,
    /// so a refusal leaves nothing behind; then the claims (kept when the notebook is deleted,
    /// like Kubeflow's, and taken over when one of that name exists), then the Notebook. If the
    /// API server then refuses the Notebook, the claims made for it are removed again.
    async fn create(&self, mut notebook: Notebook) -> Result<Notebook, BackendError> {
        let namespace = notebook.namespace().unwrap_or_default();
        let name = notebook.name_any();
        if self.has_default_editor(&namespace).await
            && let Some(pod) = notebook.spec.template.spec.as_mut()
        {
            pod.service_account_name
                .get_or_insert_with(|| DEFAULT_EDITOR.to_owned());
        }
        let claims_api: Api<PersistentVolumeClaim> =
            Api::namespaced(self.client.clone(), &namespace);
        let claims = new_claims(&notebook);
        let dry_run = PostParams {
            dry_run: true,
            ..Default::default()
        };
        self.api(&namespace)
            .create(&dry_run, &notebook)
            .await
            .map_err(|e| kube_error(&namespace, &name, e))?;
        for claim in &claims {
            match claims_api.create(&dry_run, claim).await {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 409 => {}
                Err(err) => return Err(claim_error(claim, err)),
            }
        }
        let mut created = Vec::new();
        let mut result = Ok(());
        for claim in &claims {
            match claims_api.create(&PostParams::default(), claim).await {
                Ok(_) => created.push(claim.name_any()),
                Err(kube::Error::Api(status)) if status.code == 409 => {}
                Err(err) => {
                    result = Err(claim_error(claim, err));
                    break;
                }
            }
        }
        let (result, refused) = match result {
            Ok(()) => match self
                .api(&namespace)
                .create(&PostParams::default(), &notebook)
                .await
            {
                Ok(created) => (Ok(created), false),
                // Removed only after a definite refusal: a timeout may hide a Notebook that was
                // created, and a 409 one of that name that another request made, both of which
                // use the claims.
                Err(kube::Error::Api(status)) if status.code != 409 && status.code < 500 => (
                    Err(kube_error(&namespace, &name, kube::Error::Api(status))),
                    true,
                ),
                Err(err) => (Err(kube_error(&namespace, &name, err)), false),
            },
            Err(err) => (Err(err), true),
        };
        if refused {
            for claim in created {
                if let Err(err) = claims_api.delete(&claim, &DeleteParams::default()).await {
                    tracing::warn!(error = %err, %namespace, claim, "removing a claim made for a notebook that was not created");
                }
            }
        }
        result
    }

    async fn update(
        &self,
        namespace: &str,
        name: &str,
        change: NotebookChange<'_>,
    ) -> Result<Notebook, BackendError> {
        let api = self.api(namespace);
        // Read, change, replace with the read resourceVersion; a concurrent writer means again.
        for _ in 0..5 {
            let current = api
                .get(name)
                .await
                .map_err(|e| kube_error(namespace, name, e))?;
            let mut updated = current.clone();
            change(&mut updated);
            if updated == current {
                return Ok(current);
            }
            match api.replace(name, &PostParams::default(), &updated).await {
                Ok(saved) => return Ok(saved),
                Err(kube::Error::Api(status)) if status.code == 409 => continue,
                Err(err) => return Err(kube_error(namespace, name, err)),
            }
        }
        Err(Unavailable::said(format!(
            "notebook {namespace}/{name} kept changing; try again"
        ))
        .into())
    }

    async fn delete(&self, namespace: &str, name: &str) -> Result<(), BackendError> {
        self.api(namespace)
            .delete(name, &DeleteParams::foreground())
            .await
            .map(|_| ())
            .map_err(|e| kube_error(namespace, name, e))
    }

    async fn events(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Vec<NotebookEvent>, BackendError> {
        let api: Api<k8s_openapi::api::events::v1::Event> =
            Api::namespaced(self.client.clone(), namespace);
        let list = api
            .list(&ListParams::default())
            .await
            .map_err(|e| kube_error(namespace, name, e))?;
        let mut events: Vec<NotebookEvent> = list
            .items
            .into_iter()
            .filter(|e| {
                e.regarding.as_ref().is_some_and(|r| {
                    r.name.as_deref() == Some(name) && r.kind.as_deref() == Some("Notebook")
                })
            })
            .map(|e| NotebookEvent {
                kind: e.type_.unwrap_or_default(),
                reason: e.reason.unwrap_or_default(),
                message: e.note.unwrap_or_default(),
                time: e
                    .series
                    .as_ref()
                    .map(|s| s.last_observed_time.0.to_string())
                    .or_else(|| e.event_time.map(|t| t.0.to_string()))
                    .or_else(|| e.metadata.creation_timestamp.map(|t| t.0.to_string()))
                    .unwrap_or_default(),
                count: e
                    .series
                    .as_ref()
                    .map(|s| s.count)
                    .or(e.deprecated_count)
                    .and_then(|n| u32::try_from(n).ok())
                    .unwrap_or(1)
                    .max(1),
            })
            .collect();
        events.sort_by(|a, b| a.time.cmp(&b.time));
        Ok(events)
    }

    async fn record_event(
        &self,
        namespace: &str,
        name: &str,
        kind: &str,
        reason: &str,
        message: &str,
    ) {
        let Ok(Some(notebook)) = self.get(namespace, name).await else {
            return;
        };
        let event = KubeEvent {
            type_: if kind == "Warning" {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.into(),
            note: Some(message.chars().take(1024).collect()),
            action: reason.into(),
            secondary: None,
        };
        if let Err(err) = self
            .recorder
            .publish(&event, &notebook.object_ref(&()))
            .await
        {
            tracing::warn!(error = %err, "recording an event");
        }
    }

    async fn saved_images(&self, namespace: &str) -> Result<Vec<SavedImage>, BackendError> {
        // Saves in a cluster are ImageBuild objects; the succeeded ones are the saved images.
        crate::cluster::image_builds::saved_images(&self.client, namespace)
            .await
            .map_err(saved_images_unavailable)
    }

    async fn share_saved_image(
        &self,
        namespace: &str,
        image: &str,
        with: &[String],
    ) -> Result<Option<SavedImage>, BackendError> {
        crate::cluster::image_builds::share(&self.client, namespace, image, with)
            .await
            .map_err(saved_images_unavailable)
    }

    async fn images_shared_with(&self, namespace: &str) -> Result<Vec<SavedImage>, BackendError> {
        crate::cluster::image_builds::images_shared_with(&self.client, namespace)
            .await
            .map_err(saved_images_unavailable)
    }

    async fn saved_image_namespaces_with_digest(
        &self,
        digest: &str,
    ) -> Result<Vec<String>, BackendError> {
        crate::cluster::image_builds::namespaces_with_digest(&self.client, digest)
            .await
            .map_err(saved_images_unavailable)
    }

    fn changes(&self) -> broadcast::Receiver<Change> {
        self.changes.subscribe()
    }
}
