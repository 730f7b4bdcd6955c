//! Where the API keeps notebooks and who may touch them: one interface, two backends.
//!
//! - **Embedded** (`labforge_embedded::store::Store` + [`crate::users::LocalAuth`]): the
//!   file-backed store and local users with session cookies; a user owns the namespace of their
//!   name, admins all.
//! - **Kubernetes** ([`crate::cluster::KubernetesBackend`] + [`crate::cluster::KubernetesAccess`], in [`crate::cluster`]): Notebook CRs through kube-rs;
//!   the user comes from a header set by the cluster's auth proxy (`kubeflow-userid`), and every
//!   decision is a SubjectAccessReview for that user, as Kubeflow's web apps do, so RBAC stays the
//!   one source of truth.

use crate::model::{NotebookEvent, SavedImage};
use crate::namespaces::{Action, Role, allows};
use crate::users::{LocalAuth, User};
use http::HeaderMap;
use labforge_crds::notebook::Notebook;
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
    #[error(transparent)]
    Unavailable(#[from] crate::unavailable::Unavailable),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubeflow_profile_names_for_users() {
        assert_eq!(default_namespace("Alice.Smith@example.com"), "alice-smith");
        assert_eq!(default_namespace("bob"), "bob");
    }
}
