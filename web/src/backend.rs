//! Where the API keeps notebooks and who may touch them: one interface, two backends.
//!
//! - **Embedded** (`labforge_embedded::store::Store` + [`crate::users::LocalAuth`]): the
//!   file-backed store and local users with session cookies; a user owns the namespace of their
//!   name, admins all.
//! - **Kubernetes** ([`KubernetesBackend`] + [`KubernetesAccess`]): Notebook CRs through kube-rs;
//!   the user comes from a header set by the cluster's auth proxy (`kubeflow-userid`), and every
//!   decision is a SubjectAccessReview for that user, as Kubeflow's web apps do, so RBAC stays the
//!   one source of truth.

use crate::model::{NotebookEvent, SavedImage};
use crate::namespaces::{Action, Role, allows};
use crate::users::{LocalAuth, User};
use futures::StreamExt;
use http::HeaderMap;
use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, PersistentVolumeClaimSpec, ResourceQuota, ServiceAccount,
    VolumeResourceRequirements,
};
use k8s_openapi::api::rbac::v1::RoleBinding;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::{Resource, ResourceExt};
use labforge_crds::notebook::Notebook;
use labforge_proxy::authz::{IdentitySource, TrustedHeader};
use std::collections::BTreeMap;
use tokio::sync::broadcast;

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("notebook {namespace}/{name} already exists")]
    AlreadyExists { namespace: String, name: String },
    #[error("notebook {namespace}/{name} not found")]
    NotFound { namespace: String, name: String },
    /// The API server refused the object (422).
    #[error("{0}")]
    Invalid(String),
    /// Over the namespace's quota: labforge's own check, or the API server's quota admission.
    #[error(transparent)]
    OverQuota(#[from] crate::quota::QuotaExceeded),
    #[error("{0}")]
    Unavailable(String),
}

/// What changed; subscribers re-read what they need.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// Its spec or metadata changed (what the runtime acts on).
    Notebook {
        namespace: String,
        name: String,
    },
    /// Only its status changed (the runtime's own report: views follow it, the runtime does not).
    Status {
        namespace: String,
        name: String,
    },
    Event {
        namespace: String,
        name: String,
    },
    SavedImages {
        namespace: String,
    },
    /// A new sample of the namespace's resource use (kept in memory, not in the store).
    Usage {
        namespace: String,
    },
}

/// A change to apply to a notebook; called again when the backend retries after a conflict.
pub type NotebookChange<'a> = &'a (dyn Fn(&mut Notebook) + Send + Sync);

/// Notebook objects, their events and saved images.
#[async_trait::async_trait]
pub trait Backend: Send + Sync {
    async fn list(&self, namespace: Option<&str>) -> Result<Vec<Notebook>, BackendError>;
    async fn get(&self, namespace: &str, name: &str) -> Result<Option<Notebook>, BackendError>;
    async fn create(&self, notebook: Notebook) -> Result<Notebook, BackendError>;
    async fn update(
        &self,
        namespace: &str,
        name: &str,
        change: NotebookChange<'_>,
    ) -> Result<Notebook, BackendError>;
    async fn delete(&self, namespace: &str, name: &str) -> Result<(), BackendError>;
    async fn events(&self, namespace: &str, name: &str)
    -> Result<Vec<NotebookEvent>, BackendError>;
    /// Best effort: an event that cannot be recorded is logged, never fails the work it tells of.
    async fn record_event(
        &self,
        namespace: &str,
        name: &str,
        kind: &str,
        reason: &str,
        message: &str,
    );
    async fn saved_images(&self, namespace: &str) -> Result<Vec<SavedImage>, BackendError>;
    /// Shares `image`, saved in `namespace`, with exactly the namespaces `with` (none: with no
    /// one). `None` when `namespace` has no such saved image.
    async fn share_saved_image(
        &self,
        namespace: &str,
        image: &str,
        with: &[String],
    ) -> Result<Option<SavedImage>, BackendError>;
    /// Images other namespaces saved and shared with `namespace`.
    async fn images_shared_with(&self, namespace: &str) -> Result<Vec<SavedImage>, BackendError>;
    /// The namespaces that saved an image with manifest digest `digest`.
    async fn saved_image_namespaces_with_digest(
        &self,
        digest: &str,
    ) -> Result<Vec<String>, BackendError>;
    /// Announces changed notebooks (for the live views).
    fn changes(&self) -> broadcast::Receiver<Change>;
    /// The namespace's quota, when an admin set one here (a cluster's ResourceQuotas are the API
    /// server's to enforce).
    async fn quota(&self, _namespace: &str) -> Result<Option<crate::quota::Quota>, BackendError> {
        Ok(None)
    }
    /// Sets the namespace's quota, or with `None` removes it.
    async fn set_quota(
        &self,
        _namespace: &str,
        _quota: Option<crate::quota::Quota>,
    ) -> Result<(), BackendError> {
        Err(BackendError::Invalid(
            "quotas here are the cluster's ResourceQuotas: set them with kubectl".into(),
        ))
    }
}

/// What a request may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verb {
    List,
    Get,
    Create,
    Update,
    Delete,
}

impl Verb {
    /// What the verb does to a namespace's notebooks, as [`allows`] judges it.
    pub fn action(self) -> Action {
        match self {
            Self::List | Self::Get => Action::View,
            Self::Create | Self::Update | Self::Delete => Action::Change,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::List => "list",
            Self::Get => "get",
            Self::Create => "create",
            Self::Update => "patch",
            Self::Delete => "delete",
        }
    }
}

/// Who a request is and what they may do.
#[async_trait::async_trait]
pub trait Access: Send + Sync {
    async fn identify(&self, headers: &HeaderMap) -> Option<User>;
    /// Whether `user` may `verb` notebooks in `namespace` (`None`: in every namespace).
    async fn may(&self, user: &User, verb: Verb, namespace: Option<&str>) -> bool;
    /// Whether `user` may do `action` to `notebook`, its shares counted: a user it is shared
    /// with sees and opens it.
    async fn may_on(&self, user: &User, action: Action, notebook: &Notebook) -> bool {
        let namespace = notebook.metadata.namespace.as_deref();
        let shared = notebook.shared_with().contains(&user.name.as_str());
        match action {
            Action::View | Action::Open if shared => true,
            Action::View => self.may(user, Verb::Get, namespace).await,
            // Opening runs code as the owner: what changing the notebook allows (the proxy's
            // question too), so a `kubeflow-view` contributor sees and does not open.
            Action::Open | Action::Change => self.may(user, Verb::Update, namespace).await,
            Action::Manage => self.may(user, Verb::List, None).await,
        }
    }
    /// The namespaces `user` is bound in by the platform's own objects, with their role there
    /// (a cluster: Kubeflow's profile RoleBindings); none where labforge keeps the members.
    async fn bound_namespaces(&self, _user: &User) -> Vec<(String, Role)> {
        Vec::new()
    }
}

#[async_trait::async_trait]
impl Access for LocalAuth {
    /// An API token when the request carries one (its cookies then do not count), else the
    /// session cookie.
    async fn identify(&self, headers: &HeaderMap) -> Option<User> {
        match crate::tokens::bearer(headers) {
            Some(token) => self.user_of_token(token),
            None => self.user_of(headers),
        }
    }
    async fn may(&self, user: &User, verb: Verb, namespace: Option<&str>) -> bool {
        match namespace {
            None => user.admin,
            Some(ns) => allows(user.admin, self.role_of(user, ns), false, verb.action()),
        }
    }
    async fn may_on(&self, user: &User, action: Action, notebook: &Notebook) -> bool {
        let role = notebook
            .metadata
            .namespace
            .as_deref()
            .and_then(|ns| self.role_of(user, ns));
        let shared = notebook.shared_with().contains(&user.name.as_str());
        allows(user.admin, role, shared, action)
    }
}

/// Kubeflow's default profile namespace for a user: the name up to '@', lowercased, with
/// anything but letters and digits as '-'.
pub fn default_namespace(user: &str) -> String {
    let local = user.split('@').next().unwrap_or(user).to_ascii_lowercase();
    let mapped: String = local
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let trimmed = mapped.trim_matches('-');
    trimmed.chars().take(63).collect()
}

/// Identity from the auth proxy's header; decisions by SubjectAccessReview.
pub struct KubernetesAccess {
    pub client: kube::Client,
    pub header: TrustedHeader,
}

impl KubernetesAccess {
    async fn review(&self, user: &str, verb: Verb, namespace: Option<&str>) -> bool {
        let review = labforge_proxy::review::notebook_access_review(user, verb.as_str(), namespace);
        let api: Api<SubjectAccessReview> = Api::all(self.client.clone());
        match api.create(&PostParams::default(), &review).await {
            Ok(answer) => answer.status.is_some_and(|s| s.allowed),
            Err(err) => {
                // Fail closed: no answer is no access.
                tracing::warn!(error = %err, "SubjectAccessReview");
                false
            }
        }
    }
}

#[async_trait::async_trait]
impl Access for KubernetesAccess {
    async fn identify(&self, headers: &HeaderMap) -> Option<User> {
        let identity = self.header.identify(headers)?;
        let admin = self.review(&identity.user, Verb::List, None).await;
        Some(User {
            namespace: default_namespace(&identity.user),
            name: identity.user,
            admin,
            password_hash: String::new(),
        })
    }
    async fn may(&self, user: &User, verb: Verb, namespace: Option<&str>) -> bool {
        self.review(&user.name, verb, namespace).await
    }
    /// The RoleBindings Kubeflow writes for a profile's owner and contributors (KFAM's): the
    /// user as a subject, bound to `kubeflow-admin`, `kubeflow-edit` or `kubeflow-view`.
    /// Unreadable bindings (no RBAC for them) list none: the picker then offers the user's own.
    async fn bound_namespaces(&self, user: &User) -> Vec<(String, Role)> {
        let api: Api<RoleBinding> = Api::all(self.client.clone());
        match api.list(&Default::default()).await {
            Ok(list) => kubeflow_roles(&list.items, &user.name),
            Err(err) => {
                tracing::warn!(error = %err, "listing RoleBindings for the namespace picker");
                Vec::new()
            }
        }
    }
}

/// The namespaces where `bindings` bind user `user` to one of Kubeflow's profile roles, sorted.
fn kubeflow_roles(bindings: &[RoleBinding], user: &str) -> Vec<(String, Role)> {
    let mut found: Vec<(String, Role)> = bindings
        .iter()
        .filter(|b| {
            b.subjects
                .iter()
                .flatten()
                .any(|s| s.kind == "User" && s.name == user)
        })
        .filter(|b| b.role_ref.kind == "ClusterRole")
        .filter_map(|b| {
            let role = match b.role_ref.name.as_str() {
                "kubeflow-admin" => Role::Owner,
                "kubeflow-edit" => Role::Edit,
                "kubeflow-view" => Role::View,
                _ => return None,
            };
            Some((b.metadata.namespace.clone()?, role))
        })
        .collect();
    // The strongest role where several bind the user.
    found.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
    found.dedup_by(|later, first| later.0 == first.0);
    found
}

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
        _ => BackendError::Unavailable(format!("the Kubernetes API: {err}")),
    }
}

/// Kubeflow's service account for notebook pods, made in each profile namespace.
const DEFAULT_EDITOR: &str = "default-editor";

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
        err => BackendError::Unavailable(format!(
            "creating volume {}: the Kubernetes API: {err}",
            claim.name_any()
        )),
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
        Err(BackendError::Unavailable(format!(
            "notebook {namespace}/{name} kept changing; try again"
        )))
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
        crate::image_builds::saved_images(&self.client, namespace)
            .await
            .map_err(|err| BackendError::Unavailable(err.to_string()))
    }

    async fn share_saved_image(
        &self,
        namespace: &str,
        image: &str,
        with: &[String],
    ) -> Result<Option<SavedImage>, BackendError> {
        crate::image_builds::share(&self.client, namespace, image, with)
            .await
            .map_err(|err| BackendError::Unavailable(err.to_string()))
    }

    async fn images_shared_with(&self, namespace: &str) -> Result<Vec<SavedImage>, BackendError> {
        crate::image_builds::images_shared_with(&self.client, namespace)
            .await
            .map_err(|err| BackendError::Unavailable(err.to_string()))
    }

    async fn saved_image_namespaces_with_digest(
        &self,
        digest: &str,
    ) -> Result<Vec<String>, BackendError> {
        crate::image_builds::namespaces_with_digest(&self.client, digest)
            .await
            .map_err(|err| BackendError::Unavailable(err.to_string()))
    }

    fn changes(&self) -> broadcast::Receiver<Change> {
        self.changes.subscribe()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn kubeflows_profile_bindings_give_each_namespace_its_strongest_role() {
        let binding = |ns: &str, role: &str, user: &str| -> RoleBinding {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": format!("user-{user}-{role}"), "namespace": ns},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
            }))
            .unwrap()
        };
        let bindings = [
            binding("team", "kubeflow-view", "alice@example.com"),
            binding("team", "kubeflow-edit", "alice@example.com"),
            binding("alice", "kubeflow-admin", "alice@example.com"),
            binding("lab", "kubeflow-view", "alice@example.com"),
            binding("other", "kubeflow-edit", "bob@example.com"),
            binding("pipelines", "pipeline-runner", "alice@example.com"),
        ];
        assert_eq!(
            kubeflow_roles(&bindings, "alice@example.com"),
            [
                ("alice".to_owned(), Role::Owner),
                ("lab".to_owned(), Role::View),
                ("team".to_owned(), Role::Edit),
            ]
        );
    }

    use super::*;

    #[test]
    fn kubeflow_profile_names_for_users() {
        assert_eq!(default_namespace("Alice.Smith@example.com"), "alice-smith");
        assert_eq!(default_namespace("bob"), "bob");
    }
}
