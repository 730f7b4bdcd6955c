//! deploy/'s RBAC: each role grants what its component does and no more, and Kubeflow's roles
//! let profile owners, contributors and viewers reach notebooks as they should.

use crate::deploy::{all_objects, documents, find};
use crate::support::deploy::{build, deploy_dir, load_deploy_rbac, strings};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use labforge_tests::fake_kube::{FakeApiServer, FakeApiServerOptions};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

#[test]
pub(super) fn controller_role_grants_what_the_reconciler_writes_and_no_more() {
    let docs = documents("deploy/controller.yaml");
    let role = docs.iter().find(|d| d["kind"] == "ClusterRole").unwrap();
    for (group, resource) in [
        ("apps", "statefulsets"),
        ("", "services"),
        ("networking.istio.io", "virtualservices"),
    ] {
        let verbs = grants(role, group, resource);
        for verb in ["get", "list", "watch", "create", "patch"] {
            assert!(verbs.contains(verb), "{resource} lacks {verb}");
        }
        assert!(
            !verbs.contains("delete"),
            "{resource}: deletion is the garbage collector's job"
        );
    }
    assert_eq!(
        grants(role, "kubeflow.org", "notebooks/status"),
        ["get", "patch"].map(String::from).into()
    );
    // The proxy's replicas, for PROXY_ACTIVITY_URL: listed, never watched or written.
    assert_eq!(
        grants(role, "discovery.k8s.io", "endpointslices"),
        ["list"].map(String::from).into()
    );
}

pub(super) fn grants(role: &Value, group: &str, resource: &str) -> BTreeSet<String> {
    role["rules"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| strings(&r["apiGroups"]).iter().any(|g| g == group))
        .filter(|r| strings(&r["resources"]).iter().any(|x| x == resource))
        .flat_map(|r| strings(&r["verbs"]))
        .collect()
}

/// Every rule of a role as (group, resource) → verbs.
pub(super) fn rule_set(role: &Value) -> BTreeMap<(String, String), BTreeSet<String>> {
    let mut set: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for rule in role["rules"].as_array().unwrap() {
        for group in strings(&rule["apiGroups"]) {
            for resource in strings(&rule["resources"]) {
                set.entry((group.clone(), resource))
                    .or_default()
                    .extend(strings(&rule["verbs"]));
            }
        }
    }
    set
}

pub(super) fn rules(
    entries: &[(&str, &str, &[&str])],
) -> BTreeMap<(String, String), BTreeSet<String>> {
    entries
        .iter()
        .map(|(group, resource, verbs)| {
            (
                ((*group).to_owned(), (*resource).to_owned()),
                verbs.iter().map(|v| (*v).to_owned()).collect(),
            )
        })
        .collect()
}

/// Profiles bind their owner, contributors and viewers to Kubeflow's `kubeflow-admin`,
/// `kubeflow-edit` and `kubeflow-view`, which aggregate labelled ClusterRoles: with `deploy/`'s
/// RBAC in the fake API server, which aggregates and evaluates as Kubernetes does, each may do
/// with Notebooks what Kubeflow's own roles let them, and nothing else through labforge's roles.
#[tokio::test]
pub(super) async fn profile_owners_contributors_and_viewers_reach_notebooks_through_kubeflows_roles()
 {
    use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
    use labforge_crds::Notebook;
    let server = FakeApiServer::start(FakeApiServerOptions::default())
        .await
        .unwrap();
    load_deploy_rbac(&server).await;
    let base = build(&deploy_dir());
    for name in ["admin", "edit", "view"] {
        assert!(
            find(&base, "ClusterRole", &format!("kubeflow-notebooks-{name}")).is_some(),
            "Kubeflow's kubeflow-notebooks-{name}, under its name"
        );
    }
    let rbac = |kind: &str| {
        ApiResource::from_gvk(&GroupVersionKind::gvk(
            "rbac.authorization.k8s.io",
            "v1",
            kind,
        ))
    };
    let cluster_roles: Api<DynamicObject> = Api::all_with(server.client(), &rbac("ClusterRole"));
    let bindings: Api<DynamicObject> =
        Api::namespaced_with(server.client(), "team", &rbac("RoleBinding"));
    for (role, user) in [
        ("admin", "owner"),
        ("edit", "contributor"),
        ("view", "viewer"),
    ] {
        let aggregate = serde_json::json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": format!("kubeflow-{role}")},
            "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {
                format!("rbac.authorization.kubeflow.org/aggregate-to-kubeflow-{role}"): "true"}}]},
            "rules": []});
        let binding = serde_json::json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": user, "namespace": "team"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": format!("kubeflow-{role}")},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]});
        for (api, object) in [(&cluster_roles, aggregate), (&bindings, binding)] {
            api.create(
                &PostParams::default(),
                &serde_json::from_value(object).unwrap(),
            )
            .await
            .unwrap();
        }
    }
    let notebook = |name: &str| -> Notebook {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "kubeflow.org/v1", "kind": "Notebook",
            "metadata": {"name": name, "namespace": "team"},
            "spec": {"template": {"spec": {"containers": [{"name": name, "image": "jupyter"}]}}}
        }))
        .unwrap()
    };
    Api::<Notebook>::namespaced(server.client(), "team")
        .create(&PostParams::default(), &notebook("shared"))
        .await
        .unwrap();
    let refused = |result: Result<(), kube::Error>| matches!(result, Err(kube::Error::Api(status)) if status.code == 403);
    let label = Patch::Merge(serde_json::json!({"metadata": {"labels": {"team": "ml"}}}));
    let status = Patch::Merge(serde_json::json!({"status": {"readyReplicas": 0,
        "conditions": [], "containerState": {}}}));
    for user in ["owner", "contributor", "viewer"] {
        let client = server.client_as(user).unwrap();
        let notebooks: Api<Notebook> = Api::namespaced(client.clone(), "team");
        let writes = user != "viewer";
        assert!(notebooks.get("shared").await.is_ok(), "{user} gets");
        assert!(
            notebooks.list(&ListParams::default()).await.is_ok(),
            "{user} lists"
        );
        let own = format!("{user}-lab");
        let results = [
            notebooks
                .create(&PostParams::default(), &notebook(&own))
                .await
                .map(drop),
            notebooks
                .patch("shared", &PatchParams::default(), &label)
                .await
                .map(drop),
            notebooks
                .patch_status("shared", &PatchParams::default(), &status)
                .await
                .map(drop),
            notebooks
                .delete(&own, &DeleteParams::default())
                .await
                .map(drop),
        ];
        for (verb, result) in ["create", "patch", "patch status", "delete"]
            .iter()
            .zip(results)
        {
            if writes {
                assert!(result.is_ok(), "{user} may {verb}: {result:?}");
            } else {
                assert!(refused(result), "{user} may not {verb}");
            }
        }
        let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client, "team");
        let pods = pods.list(&ListParams::default()).await.map(drop);
        assert!(
            refused(pods),
            "labforge's roles give {user} nothing but Notebooks"
        );
    }
}

#[test]
pub(super) fn rbac_is_least_privilege_everywhere() {
    let objects = all_objects();
    // The roles labforge's own service accounts are bound to; the others are Kubeflow's user
    // roles, granted through profiles (checked above).
    let bound: BTreeSet<(String, String)> = objects
        .iter()
        .filter(|(_, o)| o["kind"] == "ClusterRoleBinding" || o["kind"] == "RoleBinding")
        .map(|(_, o)| {
            let role = &o["roleRef"];
            (
                role["kind"].as_str().unwrap().to_owned(),
                role["name"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    type Roles<'a> = Vec<&'a (String, Value)>;
    let (roles, unbound): (Roles, Roles) = objects
        .iter()
        .filter(|(_, o)| o["kind"] == "ClusterRole" || o["kind"] == "Role")
        .partition(|(_, o)| {
            bound.contains(&(
                o["kind"].as_str().unwrap().to_owned(),
                o["metadata"]["name"].as_str().unwrap().to_owned(),
            ))
        });
    let unbound: Vec<&str> = unbound
        .iter()
        .map(|(_, o)| o["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        unbound,
        [
            "kubeflow-notebooks-admin",
            "kubeflow-notebooks-edit",
            "kubeflow-notebooks-view"
        ],
        "no role but Kubeflow's user roles is left unbound"
    );
    assert!(roles.len() >= 4);
    for (file, role) in &roles {
        let name = &role["metadata"]["name"];
        assert!(
            role.get("aggregationRule").is_none(),
            "{file}: {name} aggregates"
        );
        for rule in role["rules"].as_array().unwrap() {
            assert!(
                rule.get("nonResourceURLs").is_none(),
                "{file}: {name}: {rule}"
            );
            for field in ["apiGroups", "resources", "verbs"] {
                assert!(
                    !strings(&rule[field]).iter().any(|x| x.contains('*')),
                    "{file}: {name} has a wildcard in {field}: {rule}"
                );
            }
            for resource in strings(&rule["resources"]) {
                assert!(
                    resource != "secrets" && !resource.starts_with("secrets/"),
                    "{file}: {name} grants {resource}"
                );
            }
            for verb in strings(&rule["verbs"]) {
                assert!(
                    !["escalate", "bind", "impersonate", "deletecollection"]
                        .contains(&verb.as_str()),
                    "{file}: {name} grants {verb}"
                );
            }
        }
    }
    let role = |name: &str| {
        &roles
            .iter()
            .find(|(_, r)| r["kind"] == "ClusterRole" && r["metadata"]["name"] == name)
            .unwrap()
            .1
    };
    let apply = ["get", "list", "watch", "create", "patch"].as_slice();
    assert_eq!(
        rule_set(role("labforge-notebook-controller")),
        rules(&[
            (
                "kubeflow.org",
                "notebooks",
                &["get", "list", "watch", "patch"]
            ),
            ("kubeflow.org", "notebooks/status", &["get", "patch"]),
            ("kubeflow.org", "notebooks/finalizers", &["update"]),
            ("apps", "statefulsets", apply),
            ("", "services", apply),
            ("", "pods", &["get", "list", "watch"]),
            ("", "events", &["list", "watch"]),
            ("events.k8s.io", "events", &["create", "patch"]),
            ("discovery.k8s.io", "endpointslices", &["list"]),
            ("networking.istio.io", "virtualservices", apply),
            ("networking.k8s.io", "networkpolicies", apply),
        ]),
        "the controller: Notebooks and their status, its children, pods and their warnings, the \
         proxy's replicas, blockOwnerDeletion on its children"
    );
    let leader = roles
        .iter()
        .find(|(_, r)| {
            r["kind"] == "Role" && r["metadata"]["name"] == "labforge-notebook-controller-leader"
        })
        .map(|(_, r)| r)
        .unwrap();
    assert_eq!(
        rule_set(leader),
        rules(&[(
            "coordination.k8s.io",
            "leases",
            &["get", "create", "update"]
        )]),
        "leader election: its Lease only"
    );
    assert_eq!(
        rule_set(role("labforge-proxy")),
        rules(&[
            (
                "networking.istio.io",
                "virtualservices",
                &["get", "list", "watch"]
            ),
            ("authorization.k8s.io", "subjectaccessreviews", &["create"]),
        ]),
        "the proxy reads VirtualServices and asks RBAC who may open a notebook"
    );
    assert_eq!(
        rule_set(role("labforge-web")),
        rules(&[
            (
                "kubeflow.org",
                "notebooks",
                &["get", "list", "watch", "create", "update", "delete"]
            ),
            ("authorization.k8s.io", "subjectaccessreviews", &["create"]),
            ("events.k8s.io", "events", &["list", "create", "patch"]),
            ("", "pods", &["get"]),
            ("", "pods/log", &["get"]),
            ("", "pods/exec", &["get", "create"]),
            ("storage.k8s.io", "storageclasses", &["list"]),
            ("kubeflow.org", "poddefaults", &["list"]),
            ("", "nodes", &["list"]),
            ("", "persistentvolumeclaims", &["list", "create", "delete"]),
            ("", "serviceaccounts", &["get"]),
            ("", "resourcequotas", &["list"]),
            ("rbac.authorization.k8s.io", "rolebindings", &["list"]),
            ("metrics.k8s.io", "pods", &["list"]),
            (
                "labforge.dev",
                "imagebuilds",
                &["get", "list", "watch", "create", "patch"]
            ),
        ]),
        "the web app: Notebooks, its access reviews, events, pods, logs and exec (SSH), storage classes, PodDefaults, GPU capacity, volume claims, default-editor, quotas, profile bindings, pods' resource use, saves and their sharing"
    );
    assert_eq!(
        rule_set(role("labforge-image-builds")),
        rules(&[
            ("labforge.dev", "imagebuilds", &["get", "list", "watch"]),
            ("labforge.dev", "imagebuilds/status", &["get", "patch"]),
            ("kubeflow.org", "notebooks", &["get"]),
            ("", "pods", &["get"]),
            ("", "pods/exec", &["get", "create"]),
            ("events.k8s.io", "events", &["create", "patch"]),
        ]),
        "the ImageBuild reconciler: its builds, the notebook's pod and an exec into it"
    );

    // Bindings name roles and ServiceAccounts that exist; Deployments run as those accounts.
    let exists = |kind: &str, namespace: Option<&str>, name: &str| {
        objects.iter().any(|(_, o)| {
            o["kind"] == kind
                && o["metadata"]["name"] == name
                && o["metadata"]["namespace"].as_str() == namespace
        })
    };
    for (file, binding) in objects
        .iter()
        .filter(|(_, o)| o["kind"] == "ClusterRoleBinding" || o["kind"] == "RoleBinding")
    {
        let namespace = binding["metadata"]["namespace"].as_str();
        let role_ref = &binding["roleRef"];
        let role_kind = role_ref["kind"].as_str().unwrap();
        let role_ns = if role_kind == "Role" { namespace } else { None };
        assert!(
            exists(role_kind, role_ns, role_ref["name"].as_str().unwrap()),
            "{file}: {role_ref} does not exist"
        );
        for subject in binding["subjects"].as_array().unwrap() {
            assert_eq!(subject["kind"], "ServiceAccount", "{file}");
            assert!(
                exists(
                    "ServiceAccount",
                    subject["namespace"].as_str(),
                    subject["name"].as_str().unwrap()
                ),
                "{file}: {subject} does not exist"
            );
        }
    }
    for (file, deployment) in objects.iter().filter(|(_, o)| o["kind"] == "Deployment") {
        let account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
            .as_str()
            .unwrap_or_else(|| panic!("{file}: no serviceAccountName"));
        assert!(
            exists(
                "ServiceAccount",
                deployment["metadata"]["namespace"].as_str(),
                account
            ),
            "{file}: ServiceAccount {account}"
        );
    }
}
