//! Who may do what in a cluster: the user from the auth proxy's header, each decision a
//! SubjectAccessReview for that user (as Kubeflow's web apps ask), and the namespaces Kubeflow's
//! profile RoleBindings give them.

use crate::backend::{Access, Verb, default_namespace};
use crate::namespaces::Role;
use crate::users::User;
use http::HeaderMap;
use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, PostParams};
use labforge_proxy::authz::{IdentitySource, TrustedHeader};

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
