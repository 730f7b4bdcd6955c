//! RBAC, as the API server's authorizer evaluates it, for clients that present a user.
//!
//! A client made by [`FakeApiServer::client_as`](super::FakeApiServer::client_as) sends a
//! bearer token that names its user (`system:serviceaccount:<ns>:<name>` for a service
//! account); every request it makes is then allowed only by the Roles, ClusterRoles (with
//! aggregation) and bindings stored in the server, and refused with Kubernetes' 403 otherwise.
//! Requests without a token are the cluster admin's, so tests set up freely.
//!
//! Evaluated: verbs (`get`, `list`, `watch`, `create`, `update`, `patch`, `delete`,
//! `deletecollection`), API groups, resources and subresources (`pods/exec`,
//! `notebooks/status`), `resourceNames`, `*` in each, RoleBindings to Roles or ClusterRoles in
//! their namespace, ClusterRoleBindings everywhere, subjects by user, service account and the
//! groups every service account has (`system:serviceaccounts`, `…:<ns>`, `system:authenticated`).
//! Not evaluated: non-resource URLs (discovery and health are open to all, as Kubernetes'
//! `system:discovery` role makes them), impersonation, escalation checks on writing roles.

use super::catalog::ResourceId;
use super::store::{Filter, Store};
use serde_json::Value;

/// What a request asks to do, in the authorizer's terms.
#[derive(Debug, Clone)]
pub(crate) struct Request<'a> {
    pub user: String,
    pub verb: &'a str,
    pub group: &'a str,
    /// `pods`, or with a subresource `pods/exec`.
    pub resource: String,
    pub namespace: Option<&'a str>,
    pub name: Option<&'a str>,
}

impl Request<'_> {
    /// Kubernetes' words for a refusal.
    pub(crate) fn refusal(&self) -> String {
        let group = self.group;
        // The object is named by its resource, group-qualified, without the subresource.
        let base = self.resource.split('/').next().unwrap_or_default();
        let qualified = if group.is_empty() {
            base.to_string()
        } else {
            format!("{base}.{group}")
        };
        let target = match self.name {
            Some(name) => format!("{qualified} \"{name}\""),
            None => qualified,
        };
        let scope = match self.namespace {
            Some(ns) => format!(" in the namespace \"{ns}\""),
            None => " at the cluster scope".to_string(),
        };
        format!(
            "{target} is forbidden: User \"{}\" cannot {} resource \"{}\" in API group \"{group}\"{scope}",
            self.user, self.verb, self.resource
        )
    }
}

/// The groups a user is in: a service account's, and everyone's.
fn groups(user: &str) -> Vec<String> {
    let mut groups = vec!["system:authenticated".to_string()];
    if let Some(rest) = user.strip_prefix("system:serviceaccount:")
        && let Some((namespace, _)) = rest.split_once(':')
    {
        groups.push("system:serviceaccounts".into());
        groups.push(format!("system:serviceaccounts:{namespace}"));
    }
    groups
}

fn strings(value: &Value) -> impl Iterator<Item = &str> {
    value
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
}

fn binds(binding: &Value, user: &str, groups: &[String]) -> bool {
    binding["subjects"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|subject| {
            let name = subject["name"].as_str().unwrap_or_default();
            match subject["kind"].as_str() {
                Some("User") => name == user,
                Some("Group") => groups.iter().any(|g| g == name),
                Some("ServiceAccount") => {
                    let namespace = subject["namespace"]
                        .as_str()
                        .filter(|ns| !ns.is_empty())
                        .or(binding["metadata"]["namespace"].as_str())
                        .unwrap_or_default();
                    user == format!("system:serviceaccount:{namespace}:{name}")
                }
                _ => false,
            }
        })
}

fn rule_allows(rule: &Value, request: &Request<'_>) -> bool {
    let any = |field: &str, wanted: &str| strings(&rule[field]).any(|v| v == "*" || v == wanted);
    let resource_matches = strings(&rule["resources"]).any(|r| {
        r == "*"
            || r == request.resource
            || request
                .resource
                .split_once('/')
                .is_some_and(|(_, sub)| r == format!("*/{sub}"))
    });
    // A created object's name is not known when it is authorized (a subresource's parent's is).
    let names: Vec<&str> = strings(&rule["resourceNames"]).collect();
    let creates_unnamed = request.verb == "create" && !request.resource.contains('/');
    let name_matches = names.is_empty()
        || (!creates_unnamed && request.name.is_some_and(|name| names.contains(&name)));
    any("verbs", request.verb)
        && any("apiGroups", request.group)
        && resource_matches
        && name_matches
}

/// Whether RBAC in `store` lets `request` through.
pub(crate) fn allows(store: &Store, request: &Request<'_>) -> bool {
    let catalog = &store.schemas().catalog;
    let rbac = "rbac.authorization.k8s.io";
    let all = |kind: &str| -> Vec<Value> {
        catalog
            .by_kind(rbac, "v1", kind)
            .map(|id: ResourceId| store.list(id, &Filter::default()).0)
            .unwrap_or_default()
    };
    let cluster_roles = all("ClusterRole");
    let roles = all("Role");
    let groups = groups(&request.user);
    let cluster_role = |name: &str| {
        cluster_roles
            .iter()
            .find(|r| r["metadata"]["name"].as_str() == Some(name))
    };
    let grants = |role: Option<&Value>| {
        role.is_some_and(|role| {
            aggregated_rules(&cluster_roles, role, 0)
                .iter()
                .any(|rule| rule_allows(rule, request))
        })
    };
    let cluster_wide = all("ClusterRoleBinding").iter().any(|binding| {
        binding["roleRef"]["kind"] == "ClusterRole"
            && binds(binding, &request.user, &groups)
            && grants(binding["roleRef"]["name"].as_str().and_then(cluster_role))
    });
    if cluster_wide {
        return true;
    }
    let Some(namespace) = request.namespace else {
        return false;
    };
    all("RoleBinding").iter().any(|binding| {
        let name = binding["roleRef"]["name"].as_str().unwrap_or_default();
        binding["metadata"]["namespace"].as_str() == Some(namespace)
            && binds(binding, &request.user, &groups)
            && match binding["roleRef"]["kind"].as_str() {
                Some("ClusterRole") => grants(cluster_role(name)),
                Some("Role") => grants(roles.iter().find(|r| {
                    r["metadata"]["name"].as_str() == Some(name)
                        && r["metadata"]["namespace"].as_str() == Some(namespace)
                })),
                _ => false,
            }
    })
}

/// A role's rules; for an aggregated ClusterRole, those of every ClusterRole its selectors
/// match, as the controller manager fills them in.
fn aggregated_rules(cluster_roles: &[Value], role: &Value, depth: usize) -> Vec<Value> {
    let Some(selectors) = role["aggregationRule"]["clusterRoleSelectors"].as_array() else {
        return role["rules"].as_array().cloned().unwrap_or_default();
    };
    if depth > 8 {
        return Vec::new();
    }
    cluster_roles
        .iter()
        .filter(|candidate| {
            let labels = &candidate["metadata"]["labels"];
            selectors.iter().any(|selector| {
                selector["matchLabels"]
                    .as_object()
                    .is_some_and(|want| want.iter().all(|(k, v)| &labels[k] == v))
            })
        })
        .flat_map(|candidate| aggregated_rules(cluster_roles, candidate, depth + 1))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn request<'a>(verb: &'a str, resource: &str, namespace: Option<&'a str>) -> Request<'a> {
        Request {
            user: "system:serviceaccount:kubeflow:web".into(),
            verb,
            group: "",
            resource: resource.into(),
            namespace,
            name: Some("x"),
        }
    }

    #[test]
    fn rules_match_verbs_resources_subresources_and_names() {
        let rule = json!({"apiGroups": [""], "resources": ["pods", "*/status"], "verbs": ["get"]});
        assert!(rule_allows(&rule, &request("get", "pods", None)));
        assert!(rule_allows(&rule, &request("get", "pods/status", None)));
        assert!(!rule_allows(&rule, &request("get", "pods/exec", None)));
        assert!(!rule_allows(&rule, &request("list", "pods", None)));
        let named = json!({"apiGroups": [""], "resources": ["configmaps", "pods/exec"],
            "resourceNames": ["x"], "verbs": ["get", "create"]});
        assert!(rule_allows(&named, &request("get", "configmaps", None)));
        assert!(!rule_allows(&named, &request("create", "configmaps", None)));
        assert!(rule_allows(&named, &request("create", "pods/exec", None)));
    }

    #[test]
    fn service_accounts_are_bound_by_name_and_by_their_groups() {
        let user = "system:serviceaccount:kubeflow:web";
        let groups = groups(user);
        let by_name = json!({"metadata": {"namespace": "kubeflow"},
            "subjects": [{"kind": "ServiceAccount", "name": "web"}]});
        assert!(binds(&by_name, user, &groups));
        let elsewhere =
            json!({"subjects": [{"kind": "ServiceAccount", "name": "web", "namespace": "other"}]});
        assert!(!binds(&elsewhere, user, &groups));
        let group =
            json!({"subjects": [{"kind": "Group", "name": "system:serviceaccounts:kubeflow"}]});
        assert!(binds(&group, user, &groups));
    }

    #[test]
    fn a_refusal_reads_like_kubernetes() {
        let mut log = request("get", "pods/log", Some("alice"));
        log.name = Some("lab-0");
        assert_eq!(
            log.refusal(),
            "pods \"lab-0\" is forbidden: User \"system:serviceaccount:kubeflow:web\" \
             cannot get resource \"pods/log\" in API group \"\" in the namespace \"alice\""
        );
        let mut refused = request("create", "persistentvolumeclaims", Some("alice"));
        refused.name = None;
        assert_eq!(
            refused.refusal(),
            "persistentvolumeclaims is forbidden: User \"system:serviceaccount:kubeflow:web\" \
             cannot create resource \"persistentvolumeclaims\" in API group \"\" in the namespace \"alice\""
        );
    }
}
