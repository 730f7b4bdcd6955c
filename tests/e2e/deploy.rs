//! The manifests in deploy/ and the CRDs in crds/: they validate against the official schemas with
//! the same validator the fake API server applies to every write; the kustomizations cover every
//! manifest and build without duplicates; RBAC is least privilege; the Deployments are hardened and
//! pass only flags and variables the real binary accepts; and the proxy and the web app, started
//! with their Deployments' arguments against the fake API server, serve the no-Istio path.

use crate::support::deploy::{
    PROXY_USER, WEB_USER, build, container_images, deploy_dir, documents_at, group_of, identity,
    kustomization, load_deploy_rbac, referenced, relative, split_image, strings,
};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use labforge_proxy::activity::Activity;
use labforge_proxy::authz::{Decision, Identity, StaticAccess, authorize};
use labforge_proxy::routes::{GatewayFilter, RequestView, RouteTable};
use labforge_tests::fake_kube::{FakeApiServer, FakeApiServerOptions, SchemaSet};
use serde::Deserialize;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

const NO_ISTIO_CRD: &str = "deploy/overlays/no-istio/virtualservices-crd.yaml";
const WEB_ROUTE: &str = "deploy/components/standalone/web-route.yaml";

fn documents(path: &str) -> Vec<Value> {
    documents_at(&labforge_tests::repo_root().join(path))
}

fn assert_valid(schemas: &SchemaSet, path: &str) -> Vec<String> {
    let mut kinds = Vec::new();
    for object in documents(path) {
        let api_version = object["apiVersion"].as_str().unwrap_or_default();
        let kind = object["kind"].as_str().unwrap_or_default();
        if let Err(errors) = schemas.validate(api_version, kind, &object) {
            panic!(
                "{path}: {kind} {} is invalid: {errors:?}",
                object["metadata"]["name"]
            );
        }
        kinds.push(kind.to_owned());
    }
    kinds
}

fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(files_under(&path));
        } else {
            files.push(path);
        }
    }
    files.sort();
    files
}

fn is_manifest(path: &Path) -> bool {
    let name = path.file_name().unwrap().to_string_lossy();
    (name.ends_with(".yaml") || name.ends_with(".yml") || name.ends_with(".json"))
        && name != "kustomization.yaml"
}

/// Every manifest under deploy/ (YAML that is not a kustomization), repository-relative.
fn manifest_files() -> Vec<String> {
    files_under(&deploy_dir())
        .iter()
        .filter(|p| is_manifest(p))
        .map(|p| relative(p))
        .collect()
}

/// Every object of every manifest under deploy/, with its file.
fn all_objects() -> Vec<(String, Value)> {
    manifest_files()
        .into_iter()
        .flat_map(|file| {
            documents(&file)
                .into_iter()
                .map(move |object| (file.clone(), object))
        })
        .collect()
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> Option<&'a Value> {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
}

fn kinds(objects: &[Value]) -> BTreeSet<String> {
    objects
        .iter()
        .map(|o| o["kind"].as_str().unwrap().to_owned())
        .collect()
}

// --- tests -----------------------------------------------------------------------------------------

#[test]
fn deploy_manifests_and_crds_validate() {
    let schemas = SchemaSet::load(&FakeApiServerOptions::default()).unwrap();
    let mut all_kinds = BTreeSet::new();
    for file in manifest_files() {
        all_kinds.extend(assert_valid(&schemas, &file));
    }
    let workload = [
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Deployment",
        "Service",
    ];
    let expected: [(&str, &[&str]); 3] = [
        ("deploy/controller.yaml", &["Role", "RoleBinding"]),
        ("deploy/proxy.yaml", &[]),
        ("deploy/web.yaml", &["ConfigMap"]),
    ];
    for (file, extra) in expected {
        let kinds = assert_valid(&schemas, file);
        for kind in workload.iter().chain(extra) {
            assert!(kinds.iter().any(|k| k == kind), "{file} has no {kind}");
        }
    }
    for kind in ["Gateway", "VirtualService", "CustomResourceDefinition"] {
        assert!(all_kinds.contains(kind), "deploy/ has no {kind}");
    }
    assert_valid(&schemas, "crds/notebooks.kubeflow.org.yaml");
    assert_valid(&schemas, "crds/imagebuilds.labforge.dev.yaml");

    // The no-Istio overlay's VirtualService CRD stands in for Istio's: what the web route and the
    // controller's VirtualServices are checked against there.
    let minimal = SchemaSet::load(&FakeApiServerOptions {
        extra_crds: vec![labforge_tests::repo_root().join(NO_ISTIO_CRD)],
        ..FakeApiServerOptions::default()
    })
    .unwrap();
    assert_valid(&minimal, WEB_ROUTE);
    let notebook_vs = rendered_notebook_virtual_service();
    for set in [&schemas, &minimal] {
        set.validate(
            "networking.istio.io/v1beta1",
            "VirtualService",
            &notebook_vs,
        )
        .unwrap();
    }
}

/// The CRD the no-Istio overlay installs has Istio's group, names, scope and versions, so the
/// controller (v1beta1), the proxy (v1 first) and a later Istio install all see the same resource.
#[test]
fn the_no_istio_virtualservice_crd_matches_istios() {
    let ours = documents(NO_ISTIO_CRD).remove(0);
    let istio_file = FakeApiServerOptions::default()
        .schemas_dir
        .join("istio-networking-crds.yaml");
    let istio = documents_at(&istio_file)
        .into_iter()
        .find(|d| d["metadata"]["name"] == "virtualservices.networking.istio.io")
        .unwrap();
    assert_eq!(ours["metadata"]["name"], istio["metadata"]["name"]);
    for field in ["group", "names", "scope"] {
        assert_eq!(ours["spec"][field], istio["spec"][field], "spec.{field}");
    }
    let versions = |crd: &Value| -> BTreeMap<String, (bool, bool)> {
        crd["spec"]["versions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| {
                (
                    v["name"].as_str().unwrap().to_owned(),
                    (v["served"] == true, v["storage"] == true),
                )
            })
            .collect()
    };
    assert_eq!(versions(&ours), versions(&istio));
    assert_eq!(
        versions(&ours)["v1beta1"],
        (true, false),
        "the controller writes v1beta1"
    );
}

/// Every image a build of deploy/ names: its containers' and the spawner form's.
fn images_named(objects: &mut [Value]) -> BTreeSet<String> {
    fn under_image_keys(value: &Value, out: &mut BTreeSet<String>) {
        match value {
            Value::Object(map) => {
                for (key, value) in map {
                    match value.as_str() {
                        Some(image) if key == "image" => {
                            out.insert(image.to_owned());
                        }
                        _ => under_image_keys(value, out),
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|item| under_image_keys(item, out)),
            _ => {}
        }
    }
    let mut images = BTreeSet::new();
    for object in objects {
        if object["kind"] == "ConfigMap" {
            for text in object["data"].as_object().into_iter().flatten() {
                if let Ok(config) = serde_json::from_str::<Value>(text.1.as_str().unwrap_or("")) {
                    under_image_keys(&config, &mut images);
                }
            }
        }
        for image in container_images(object) {
            images.insert(image.as_str().unwrap().to_owned());
        }
    }
    images
}

#[test]
fn every_image_deploy_names_is_built_here_or_a_documented_third_party() {
    let readme = std::fs::read_to_string(deploy_dir().join("README.md")).unwrap();
    let (built_here, third_party) = readme
        .split_once("Third-party images")
        .expect("deploy/README.md has a `Third-party images` section");
    let version = env!("CARGO_PKG_VERSION");
    for dir in [
        "",
        "overlays/istio",
        "overlays/no-istio",
        "overlays/kubeflow",
    ] {
        let mut objects = build(&deploy_dir().join(dir));
        let images = images_named(&mut objects);
        assert!(!images.is_empty(), "deploy/{dir}: no images");
        for image in images {
            let (name, tag) = split_image(&image);
            if name == "ghcr.io/labforge/labforge" {
                // The workloads' image is this release's, built by `make image`.
                assert_eq!(tag, Some(version), "deploy/{dir}: {image}");
                assert!(
                    built_here.contains(&format!("`{name}`")),
                    "{name} undocumented"
                );
                assert!(
                    labforge_tests::repo_root()
                        .join("images/labforge/recipe")
                        .is_file()
                );
                continue;
            }
            assert!(
                third_party.contains(&format!("`{name}`")),
                "deploy/{dir} names {image}, which this repository does not build and deploy/README.md does not list as a third-party image"
            );
        }
    }
    // Every workload is retargeted by the one `images:` entry.
    for (file, object) in deployments() {
        let mut object = object.clone();
        for image in container_images(&mut object) {
            assert_eq!(
                image, "labforge",
                "{file}: name the image through kustomization.yaml's images:"
            );
        }
    }
}

#[test]
fn kustomizations_cover_every_manifest_and_name_only_what_exists() {
    let mut dirs = BTreeSet::new();
    for file in files_under(&deploy_dir()) {
        dirs.insert(file.parent().unwrap().to_owned());
    }
    for dir in &dirs {
        let k = kustomization(dir);
        let listed: BTreeSet<PathBuf> = k
            .resources
            .iter()
            .chain(&k.components)
            .map(|entry| referenced(&k, entry))
            .collect();
        for entry in &k.components {
            assert!(
                referenced(&k, entry).is_dir(),
                "component {entry} is a directory"
            );
        }
        for entry in &k.resources {
            let path = referenced(&k, entry);
            if path.is_dir() {
                assert_eq!(
                    kustomization(&path).kind,
                    "Kustomization",
                    "{} lists {entry} as a resource",
                    relative(dir)
                );
            }
        }
        for file in std::fs::read_dir(dir).unwrap() {
            let file = file.unwrap().path();
            if file.is_file() && is_manifest(&file) {
                assert!(
                    listed.contains(&file.canonicalize().unwrap()),
                    "{} is in no kustomization: {}/kustomization.yaml does not list it",
                    relative(&file),
                    relative(dir)
                );
            }
        }
    }
    // Every component is used, every overlay builds on the base.
    let components: BTreeSet<PathBuf> = dirs
        .iter()
        .filter(|d| kustomization(d).kind == "Component")
        .map(|d| d.canonicalize().unwrap())
        .collect();
    let used: BTreeSet<PathBuf> = dirs
        .iter()
        .map(|d| kustomization(d))
        .flat_map(|k| {
            k.components
                .iter()
                .map(|c| referenced(&k, c))
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(components, used, "unused components");
    for overlay in ["istio", "no-istio", "kubeflow"] {
        let k = kustomization(&deploy_dir().join("overlays").join(overlay));
        assert!(
            k.resources
                .iter()
                .any(|r| referenced(&k, r) == deploy_dir().canonicalize().unwrap()),
            "overlay {overlay} builds on deploy/"
        );
    }
}

#[test]
fn each_build_has_what_its_cluster_lacks_and_nothing_it_has() {
    let base = build(&deploy_dir());
    let istio = build(&deploy_dir().join("overlays/istio"));
    let no_istio = build(&deploy_dir().join("overlays/no-istio"));

    // A Kubeflow cluster has the kubeflow namespace, its gateway and its dashboard at `/`.
    assert!(find(&base, "Namespace", "kubeflow").is_none());
    assert!(
        !base
            .iter()
            .any(|o| group_of(o["apiVersion"].as_str().unwrap()) == "networking.istio.io"),
        "the base leaves Kubeflow's routes alone"
    );
    assert!(!kinds(&base).contains("CustomResourceDefinition"));

    // Istio without Kubeflow: the namespace, the example gateway, the web app at `/`.
    let gateway = find(&istio, "Gateway", "kubeflow-gateway").expect("a Gateway");
    assert_eq!(gateway["metadata"]["namespace"], "kubeflow");
    assert_eq!(gateway["spec"]["selector"]["istio"], "ingressgateway");
    let server = &gateway["spec"]["servers"][0];
    assert_eq!(server["port"]["number"], 80);
    assert_eq!(server["port"]["protocol"], "HTTP");
    assert_eq!(strings(&server["hosts"]), ["*"]);
    assert!(
        !kinds(&istio).contains("CustomResourceDefinition"),
        "Istio has its CRDs"
    );

    // No Istio: no Gateway (nothing serves its kind), the VirtualService CRD instead.
    assert!(!kinds(&no_istio).contains("Gateway"));
    assert!(
        find(
            &no_istio,
            "CustomResourceDefinition",
            "virtualservices.networking.istio.io"
        )
        .is_some()
    );

    for (name, objects) in [("istio", &istio), ("no-istio", &no_istio)] {
        assert!(
            find(objects, "VirtualService", "labforge-web").is_some(),
            "{name}: web route"
        );
        // Every namespace used is created by the same build.
        let created: BTreeSet<&str> = objects
            .iter()
            .filter(|o| o["kind"] == "Namespace")
            .map(|o| o["metadata"]["name"].as_str().unwrap())
            .collect();
        for object in objects.iter() {
            if let Some(ns) = object["metadata"]["namespace"].as_str() {
                assert!(
                    created.contains(ns),
                    "{name}: namespace {ns} is not created"
                );
            }
        }
        // Everything the base has, the overlays have, unchanged.
        for object in &base {
            assert!(
                objects.contains(object),
                "{name} changes {:?}",
                identity(object)
            );
        }
    }

    // The controller, the proxy and the gateway agree on the gateway's name.
    let controller = deployment_container(&base, "labforge-notebook-controller");
    let proxy = deployment_container(&base, "labforge-proxy");
    assert_eq!(
        env_value(controller, "USE_ISTIO"),
        Some("true".into()),
        "the proxy reads VirtualServices"
    );
    assert_eq!(
        env_value(controller, "ISTIO_GATEWAY"),
        flag_value(proxy, "--gateway")
    );
    assert_eq!(
        flag_value(proxy, "--gateway").unwrap(),
        "kubeflow/kubeflow-gateway"
    );
    assert!(
        strings(&find(&istio, "VirtualService", "labforge-web").unwrap()["spec"]["gateways"])
            .contains(&"kubeflow/kubeflow-gateway".to_owned())
    );
}

#[test]
fn the_kubeflow_overlay_puts_the_web_app_where_the_dashboard_opens_notebooks() {
    let base = build(&deploy_dir());
    let kubeflow = build(&deploy_dir().join("overlays/kubeflow"));
    // A Kubeflow cluster has the namespace and the gateway; the base is there unchanged.
    assert!(find(&kubeflow, "Namespace", "kubeflow").is_none());
    assert!(!kinds(&kubeflow).contains("Gateway"));
    for object in &base {
        assert!(kubeflow.contains(object), "changes {:?}", identity(object));
    }

    // The dashboard's Notebooks entry opens the path the route serves and the app is under.
    let links: Value = serde_json::from_str(
        &std::fs::read_to_string(
            labforge_tests::repo_root().join("tests/fixtures/kubeflow/centraldashboard-links.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let notebooks = links["menuLinks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["text"] == "Notebooks")
        .unwrap()["link"]
        .as_str()
        .unwrap();
    let path = find(&kubeflow, "ConfigMap", "labforge-web-path").unwrap()["data"]["basePath"]
        .as_str()
        .unwrap();
    assert_eq!(path, notebooks);
    assert!(labforge_web::base_path::BasePath::parse(path).is_ok());
    // It takes over Kubeflow's own route for its web app, by name.
    let route = find(
        &kubeflow,
        "VirtualService",
        "jupyter-web-app-jupyter-web-app",
    )
    .unwrap();
    assert_eq!(route["metadata"]["namespace"], "kubeflow");
    assert_eq!(
        strings(&route["spec"]["gateways"]),
        [flag_value(deployment_container(&base, "labforge-proxy"), "--gateway").unwrap()]
    );
    let rule = &route["spec"]["http"][0];
    assert_eq!(rule["match"][0]["uri"]["prefix"], path);
    assert!(
        rule.get("rewrite").is_none(),
        "the app serves under its path"
    );
    let destination = &rule["route"][0]["destination"];
    assert_eq!(
        destination["host"],
        "labforge-web.kubeflow.svc.cluster.local"
    );
    let service = find(&base, "Service", "labforge-web").unwrap();
    assert_eq!(
        destination["port"]["number"],
        service["spec"]["ports"][0]["port"]
    );

    // The web app serves under that path, and the proxy sends stopped notebooks' visitors there.
    for (deployment, variable) in [
        ("labforge-web", "LABFORGE_BASE_PATH"),
        ("labforge-proxy", "LABFORGE_APP_PATH"),
    ] {
        let container = deployment_container(&kubeflow, deployment);
        let from = container["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == variable)
            .unwrap_or_else(|| panic!("{deployment} has no {variable}"));
        let key = &from["valueFrom"]["configMapKeyRef"];
        assert_eq!(
            (key["name"].as_str(), key["key"].as_str()),
            (Some("labforge-web-path"), Some("basePath"))
        );
    }

    // Only Kubeflow's ingress gateway reaches the web app's pods, as it does Kubeflow's.
    let policy = find(&kubeflow, "AuthorizationPolicy", "labforge-web").unwrap();
    let pods = &find(&base, "Deployment", "labforge-web").unwrap()["spec"]["template"]["metadata"]
        ["labels"];
    for (key, value) in policy["spec"]["selector"]["matchLabels"]
        .as_object()
        .unwrap()
    {
        assert_eq!(&pods[key], value);
    }
    assert_eq!(
        strings(&policy["spec"]["rules"][0]["from"][0]["source"]["principals"]),
        ["cluster.local/ns/istio-system/sa/istio-ingressgateway-service-account"]
    );
}

#[test]
fn controller_role_grants_what_the_reconciler_writes_and_no_more() {
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

fn grants(role: &Value, group: &str, resource: &str) -> BTreeSet<String> {
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
fn rule_set(role: &Value) -> BTreeMap<(String, String), BTreeSet<String>> {
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

fn rules(entries: &[(&str, &str, &[&str])]) -> BTreeMap<(String, String), BTreeSet<String>> {
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
async fn profile_owners_contributors_and_viewers_reach_notebooks_through_kubeflows_roles() {
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
fn rbac_is_least_privilege_everywhere() {
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

fn deployments() -> Vec<(String, Value)> {
    all_objects()
        .into_iter()
        .filter(|(_, o)| o["kind"] == "Deployment")
        .collect()
}

fn deployment_container<'a>(objects: &'a [Value], name: &str) -> &'a Value {
    &find(objects, "Deployment", name).unwrap()["spec"]["template"]["spec"]["containers"][0]
}

fn env_value(container: &Value, name: &str) -> Option<String> {
    container["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)
        .and_then(|e| e["value"].as_str())
        .map(str::to_owned)
}

/// The value after `flag` in the container's args.
fn flag_value(container: &Value, flag: &str) -> Option<String> {
    let args = strings(&container["args"]);
    let at = args.iter().position(|a| a == flag)?;
    args.get(at + 1).cloned()
}

#[test]
fn deployments_are_hardened_probed_and_reachable_through_their_services() {
    let objects: Vec<Value> = all_objects().into_iter().map(|(_, o)| o).collect();
    let deployments = deployments();
    assert_eq!(
        deployments.len(),
        4,
        "controller, ImageBuild reconciler, proxy, web app"
    );
    for (file, deployment) in &deployments {
        let name = deployment["metadata"]["name"].as_str().unwrap();
        let at = format!("{file}: {name}");
        // Two replicas at least, or a singleton by design: one replica, replaced not rolled.
        let replicas = deployment["spec"]["replicas"].as_i64().unwrap();
        assert!(
            replicas >= 2
                || (replicas == 1 && deployment["spec"]["strategy"]["type"] == "Recreate"),
            "{at}: replicas"
        );
        let pod = &deployment["spec"]["template"]["spec"];
        assert_eq!(pod["securityContext"]["runAsNonRoot"], true, "{at}");
        assert!(
            pod["securityContext"]["runAsUser"].as_i64().unwrap() > 0,
            "{at}"
        );
        assert_eq!(
            pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault",
            "{at}"
        );
        assert!(
            pod.get("hostNetwork").is_none() && pod.get("hostPID").is_none(),
            "{at}"
        );
        let selector = &deployment["spec"]["selector"]["matchLabels"];
        for (key, value) in selector.as_object().unwrap() {
            assert_eq!(
                &deployment["spec"]["template"]["metadata"]["labels"][key], value,
                "{at}"
            );
        }
        let containers = pod["containers"].as_array().unwrap();
        for container in containers {
            let security = &container["securityContext"];
            assert_eq!(security["readOnlyRootFilesystem"], true, "{at}");
            assert_eq!(security["allowPrivilegeEscalation"], false, "{at}");
            assert_eq!(strings(&security["capabilities"]["drop"]), ["ALL"], "{at}");
            assert!(
                security.get("privileged").is_none_or(|p| p == false),
                "{at}"
            );
            let resources = &container["resources"];
            for key in ["cpu", "memory"] {
                assert!(
                    resources["requests"][key].is_string(),
                    "{at}: requests.{key}"
                );
            }
            assert!(
                resources["limits"]["memory"].is_string(),
                "{at}: limits.memory"
            );
            let ports: BTreeSet<String> = container["ports"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p["name"].as_str().unwrap().to_owned())
                .collect();
            for probe in ["livenessProbe", "readinessProbe"] {
                let get = &container[probe]["httpGet"];
                assert!(get["path"].is_string(), "{at}: {probe}");
                assert!(
                    ports.contains(get["port"].as_str().unwrap_or_default()),
                    "{at}: {probe} port {} is no named container port",
                    get["port"]
                );
            }
        }
        // Mounted volumes exist, and ConfigMaps they name are in deploy/.
        let volumes = pod["volumes"].as_array().cloned().unwrap_or_default();
        for container in containers {
            for mount in container["volumeMounts"]
                .as_array()
                .cloned()
                .unwrap_or_default()
            {
                let volume = volumes
                    .iter()
                    .find(|v| v["name"] == mount["name"])
                    .unwrap_or_else(|| panic!("{at}: volume {}", mount["name"]));
                // Only scratch space (an emptyDir) is writable.
                if volume.get("emptyDir").is_none() {
                    assert_eq!(mount["readOnly"], true, "{at}: mounts are read-only");
                }
                if let Some(name) = volume["configMap"]["name"].as_str() {
                    assert!(
                        find(&objects, "ConfigMap", name).is_some(),
                        "{at}: ConfigMap {name}"
                    );
                }
            }
        }
    }

    // Each Service selects a Deployment in its namespace, on ports that Deployment names.
    for service in objects.iter().filter(|o| o["kind"] == "Service") {
        let name = &service["metadata"]["name"];
        let selector = service["spec"]["selector"].as_object().unwrap();
        let target = deployments
            .iter()
            .map(|(_, d)| d)
            .find(|d| {
                d["metadata"]["namespace"] == service["metadata"]["namespace"]
                    && selector
                        .iter()
                        .all(|(k, v)| &d["spec"]["template"]["metadata"]["labels"][k] == v)
            })
            .unwrap_or_else(|| panic!("Service {name} selects no Deployment"));
        let ports: Vec<&Value> = target["spec"]["template"]["spec"]["containers"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|c| c["ports"].as_array().unwrap())
            .collect();
        for port in service["spec"]["ports"].as_array().unwrap() {
            assert!(
                ports.iter().any(|p| p["name"] == port["targetPort"]),
                "Service {name}: targetPort {}",
                port["targetPort"]
            );
        }
    }

    // What the issue asks of the proxy and the web app, precisely.
    let base = build(&deploy_dir());
    let proxy = deployment_container(&base, "labforge-proxy");
    let port = |container: &Value, name: &str| {
        container["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .unwrap()["containerPort"]
            .as_i64()
            .unwrap()
    };
    assert_eq!(proxy["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(proxy["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(port(proxy, "http-admin"), 8081);
    assert_eq!(port(proxy, "http"), 8000);
    assert_eq!(flag_value(proxy, "--listen").unwrap(), "0.0.0.0:8000");
    assert_eq!(flag_value(proxy, "--admin-addr").unwrap(), "0.0.0.0:8081");
    let proxy_service = find(&base, "Service", "labforge-proxy").unwrap();
    let service_port = |service: &Value, target: &str| {
        service["spec"]["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["targetPort"] == target)
            .unwrap()["port"]
            .as_i64()
            .unwrap()
    };
    assert_eq!(service_port(proxy_service, "http"), 80);
    assert_eq!(service_port(proxy_service, "http-admin"), 8081);
    for object in &base {
        if object["kind"] == "Service" {
            assert!(
                object["spec"]["type"].is_null() || object["spec"]["type"] == "ClusterIP",
                "{}: trusts a header, so only the auth proxy may reach it",
                object["metadata"]["name"]
            );
        }
    }
    let web = deployment_container(&base, "labforge-web");
    assert_eq!(web["readinessProbe"]["httpGet"]["path"], "/api/healthz");
    assert_eq!(
        flag_value(web, "--listen").unwrap(),
        format!("0.0.0.0:{}", port(web, "http"))
    );
}

/// The web app's spawner configuration is what `labforge web --spawner-config` reads, mounted where
/// the flag points.
#[test]
fn the_spawner_configmap_is_a_valid_spawner_config_at_the_flags_path() {
    let base = build(&deploy_dir());
    let web = find(&base, "Deployment", "labforge-web").unwrap();
    let container = &web["spec"]["template"]["spec"]["containers"][0];
    let path = PathBuf::from(flag_value(container, "--spawner-config").unwrap());
    let mount = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| path.starts_with(m["mountPath"].as_str().unwrap()))
        .expect("--spawner-config lies in a mounted volume");
    let volume = web["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .unwrap();
    let config_map = find(
        &base,
        "ConfigMap",
        volume["configMap"]["name"].as_str().unwrap(),
    )
    .unwrap();
    let key = path
        .strip_prefix(mount["mountPath"].as_str().unwrap())
        .unwrap()
        .to_str()
        .unwrap();
    let json = config_map["data"][key]
        .as_str()
        .unwrap_or_else(|| panic!("the ConfigMap has no key {key}"));
    let config: labforge_web::config::SpawnerConfig = serde_json::from_str(json).unwrap();
    use labforge_web::model::ServerType;
    for server_type in [ServerType::Jupyter, ServerType::Vscode] {
        assert!(
            config.default_image(server_type).is_some(),
            "{server_type:?}"
        );
    }
    assert!(!config.gpu_vendors.is_empty());
}

/// What a container runs: the image's entrypoint `labforge` with a subcommand as the first
/// argument, or the `labforge-proxy` binary its `command` names.
struct Invocation {
    binary: fn() -> std::process::Command,
    /// `labforge <subcommand>` or `labforge-proxy`, for messages.
    name: String,
    /// The subcommand, when there is one.
    subcommand: Vec<String>,
    /// Everything after it.
    args: Vec<String>,
}

impl Invocation {
    fn of(file: &str, container: &Value) -> Self {
        let mut args = strings(&container["args"]);
        match container.get("command") {
            None => {
                let subcommand = args.remove(0);
                Invocation {
                    binary: crate::labforge,
                    name: format!("labforge {subcommand}"),
                    subcommand: vec![subcommand],
                    args,
                }
            }
            Some(command) => {
                assert_eq!(
                    strings(command),
                    ["labforge-proxy"],
                    "{file}: the image's binaries are labforge (its entrypoint) and labforge-proxy"
                );
                Invocation {
                    binary: crate::labforge_proxy,
                    name: "labforge-proxy".into(),
                    subcommand: Vec::new(),
                    args,
                }
            }
        }
    }

    /// The binary with the subcommand, ready for more arguments.
    fn command(&self) -> std::process::Command {
        let mut command = (self.binary)();
        command.args(&self.subcommand);
        command
    }

    fn help(&self) -> String {
        let output = self.command().arg("--help").output().unwrap();
        assert!(output.status.success(), "{} --help", self.name);
        String::from_utf8(output.stdout).unwrap()
    }
}

/// Whether `text` names `flag` as a whole word (`--admin` is not `--admin-addr`).
fn names_flag(text: &str, flag: &str) -> bool {
    text.match_indices(flag).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + flag.len()..].chars().next();
        !before.is_some_and(|c| c.is_alphanumeric() || c == '-')
            && !after.is_some_and(|c| c.is_alphanumeric() || c == '-' || c == '_')
    })
}

/// A setting clap accepts but the proxy cannot use stops both binaries before anything binds,
/// with exit code 64 and a message naming the binary and the flag.
#[test]
fn a_bad_proxy_setting_exits_64_naming_the_binary_and_the_flag() {
    let mut labforge = crate::labforge();
    labforge.arg("proxy");
    for (mut command, program) in [
        (labforge, "labforge"),
        (crate::labforge_proxy(), "labforge-proxy"),
    ] {
        let out = command
            .args(["--access", "static", "--member", "alice"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{program}: {stderr}");
        assert!(
            stderr.starts_with(&format!("{program}: error: --member")),
            "{program}: {stderr}"
        );
    }
}

/// Kubeflow's culling variables are settings too: one neither command can read stops `labforge
/// up` and `labforge controller` with exit code 64 and the variable named, before anything is
/// made.
#[test]
fn a_bad_culling_variable_exits_64_naming_it() {
    let data_dir = tempfile::tempdir().unwrap();
    let mut up = crate::labforge();
    up.arg("up")
        .arg("--data-dir")
        .arg(data_dir.path().join("lab"));
    let mut controller = crate::labforge();
    controller.arg("controller");
    for (mut command, what) in [(up, "up"), (controller, "controller")] {
        let out = command.env("ENABLE_CULLING", "sometimes").output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{what}: {stderr}");
        assert!(
            stderr.contains("ENABLE_CULLING") && stderr.contains("sometimes"),
            "{what}: {stderr}"
        );
    }
    assert!(
        !data_dir.path().join("lab").exists(),
        "up made its data dir before refusing"
    );
}

#[test]
fn every_flag_and_variable_the_deployments_pass_is_accepted_by_the_binary() {
    // The check below is meaningful: clap parses values before it answers --help.
    let mut labforge_proxy = crate::labforge();
    labforge_proxy.arg("proxy");
    for mut refused in [labforge_proxy, crate::labforge_proxy()] {
        let refused = refused
            .args(["--listen", "not-an-address", "--help"])
            .output()
            .unwrap();
        assert!(
            !refused.status.success(),
            "a bad value is refused before --help"
        );
    }

    for (file, deployment) in deployments() {
        for container in deployment["spec"]["template"]["spec"]["containers"]
            .as_array()
            .unwrap()
        {
            let invocation = Invocation::of(&file, container);
            let name = &invocation.name;
            let text = invocation.help();
            for arg in &invocation.args {
                if let Some(flag) = arg.strip_prefix("--") {
                    let flag = format!("--{}", flag.split('=').next().unwrap());
                    assert!(
                        names_flag(&text, &flag),
                        "{file}: `{name} --help` does not know {flag}"
                    );
                }
            }
            for env in container["env"].as_array().cloned().unwrap_or_default() {
                let name = env["name"].as_str().unwrap();
                assert!(
                    text.contains(name),
                    "{file}: `{} --help` does not name {name}",
                    invocation.name
                );
            }
            // The whole argument list parses (values included).
            let output = invocation
                .command()
                .args(&invocation.args)
                .arg("--help")
                .output()
                .unwrap();
            assert!(
                output.status.success(),
                "{file}: {name} {}: {}",
                invocation.args.join(" "),
                String::from_utf8_lossy(&output.stderr)
            );
        }
    }
}

/// The VirtualService the controller writes for `crds/samples/jupyterlab.yaml` (alice/jupyter),
/// rendered by the binary with the controller Deployment's environment.
fn rendered_notebook_virtual_service() -> Value {
    let base = build(&deploy_dir());
    let controller = deployment_container(&base, "labforge-notebook-controller");
    let mut render = crate::labforge();
    render
        .args(["render", "-f"])
        .arg(labforge_tests::repo_root().join("crds/samples/jupyterlab.yaml"))
        .env_remove("ISTIO_GATEWAY")
        .env_remove("ISTIO_HOST")
        .env_remove("CLUSTER_DOMAIN");
    for env in controller["env"].as_array().unwrap() {
        if let Some(value) = env["value"].as_str() {
            render.env(env["name"].as_str().unwrap(), value);
        }
    }
    let output = render.output().unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_yaml_ng::Deserializer::from_str(std::str::from_utf8(&output.stdout).unwrap())
        .map(|doc| Value::deserialize(doc).unwrap())
        .find(|d| d["kind"] == "VirtualService")
        .expect("render yields a VirtualService")
}

/// The proxy Deployment's route table, from the web app's route and a notebook's: the notebook's
/// prefix wins over `/` whichever is older, the web app is open to every signed-in user, a notebook
/// is guarded by its namespace, which RBAC decides (the Deployment names no one).
#[tokio::test]
async fn the_proxy_serves_notebooks_first_and_the_web_app_at_root() {
    let base = build(&deploy_dir());
    let proxy = deployment_container(&base, "labforge-proxy");
    let args = strings(&proxy["args"]);
    let values = |flag: &str| -> Vec<String> {
        args.windows(2)
            .filter(|w| w[0] == flag)
            .map(|w| w[1].clone())
            .collect()
    };
    let gateway = GatewayFilter(flag_value(proxy, "--gateway"));
    assert_eq!(
        flag_value(proxy, "--access"),
        None,
        "RBAC decides who opens a notebook (a SubjectAccessReview, the default)"
    );
    for flag in ["--admin", "--member"] {
        assert!(values(flag).is_empty(), "{flag} is for --access static");
    }
    // Nobody is anybody's member: what the shared namespaces alone open.
    let access = StaticAccess {
        shared: values("--shared-namespace").into_iter().collect(),
        ..StaticAccess::default()
    };

    let web_service = find(&base, "Service", "labforge-web").unwrap();
    let web_destination = format!(
        "{}.{}.svc.cluster.local:{}",
        web_service["metadata"]["name"].as_str().unwrap(),
        web_service["metadata"]["namespace"].as_str().unwrap(),
        web_service["spec"]["ports"][0]["port"]
    );
    for (web_created, notebook_created) in [
        ("2020-01-01T00:00:00Z", "2030-01-01T00:00:00Z"),
        ("2030-01-01T00:00:00Z", "2020-01-01T00:00:00Z"),
    ] {
        let mut web: Value = documents(WEB_ROUTE).remove(0);
        web["metadata"]["creationTimestamp"] = web_created.into();
        let mut notebook = rendered_notebook_virtual_service();
        notebook["metadata"]["creationTimestamp"] = notebook_created.into();
        let virtual_services: Vec<labforge_crds::VirtualService> = [web, notebook]
            .into_iter()
            .map(|v| serde_json::from_value(v).unwrap())
            .collect();
        let (table, skipped) = RouteTable::build(&virtual_services, &gateway, &Activity::default());
        assert!(skipped.is_empty(), "{skipped:?}");
        assert_eq!(
            table.virtual_service_count(),
            2,
            "both are bound to the proxy's gateway"
        );
        let method = http::Method::GET;
        let headers = http::HeaderMap::new();
        let lookup = |path: &str| {
            let found = table
                .lookup(&RequestView {
                    host: "labforge.example.com",
                    authority: "labforge.example.com",
                    scheme: "https",
                    query: None,
                    path,
                    method: &method,
                    headers: &headers,
                })
                .unwrap_or_else(|| panic!("{path} has no route"));
            (
                found.rule.destinations[0].authority.to_string(),
                found
                    .rule
                    .namespaces()
                    .map(str::to_owned)
                    .collect::<Vec<_>>(),
            )
        };
        for path in [
            "/",
            "/api/config",
            "/notebooks/alice/jupyter",
            "/static/app.js",
        ] {
            let (destination, namespaces) = lookup(path);
            assert_eq!(destination, web_destination, "{path}");
            let anyone = Identity {
                user: "anyone@example.com".into(),
            };
            assert_eq!(
                authorize(
                    Some(&anyone),
                    namespaces.iter().map(String::as_str),
                    &[],
                    &access
                )
                .await,
                Decision::Allow,
                "{path}"
            );
            assert_eq!(
                authorize(None, namespaces.iter().map(String::as_str), &[], &access).await,
                Decision::Unauthenticated
            );
        }
        let (destination, namespaces) = lookup("/notebook/alice/jupyter/lab");
        assert_eq!(destination, "jupyter.alice.svc.cluster.local:80");
        let alice = Identity {
            user: "alice@example.com".into(),
        };
        assert_eq!(namespaces, ["alice"]);
        assert_eq!(
            authorize(
                Some(&alice),
                namespaces.iter().map(String::as_str),
                &[],
                &access
            )
            .await,
            Decision::Forbidden,
            "a notebook's namespace is not shared"
        );
    }
}

/// A child process killed when the test ends, its standard error kept for failure messages.
struct Running {
    child: std::process::Child,
    name: String,
    log: PathBuf,
}

impl Running {
    fn log(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        format!("{} said:\n{text}", self.name)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the container runs, with its arguments and environment, addresses moved to loopback.
fn start(
    container: &Value,
    replace: &[(&str, String)],
    extra: &[String],
    kubeconfig: &Path,
) -> Running {
    let invocation = Invocation::of("deploy/", container);
    let mut args = invocation.args.clone();
    for (flag, value) in replace {
        let at = args.iter().position(|a| a == flag).unwrap() + 1;
        args[at] = value.clone();
    }
    args.extend_from_slice(extra);
    let log = kubeconfig.with_file_name(format!("{}.log", invocation.name.replace(' ', "-")));
    let mut command = invocation.command();
    command
        .args(&args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("KUBECONFIG", kubeconfig)
        .env("LABFORGE_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    for env in container["env"].as_array().unwrap() {
        match env["value"].as_str() {
            Some(value) => {
                command.env(env["name"].as_str().unwrap(), value);
            }
            // An optional ConfigMap key some overlay sets; the builds run here leave it unset.
            None => assert_eq!(
                env["valueFrom"]["configMapKeyRef"]["optional"], true,
                "{env}"
            ),
        }
    }
    Running {
        child: command.spawn().unwrap(),
        name: invocation.name,
        log,
    }
}

/// Polls `url` until it answers 200; fails at once with its log when a process exits.
async fn until_ok(url: &str, user: Option<&str>, processes: &mut [&mut Running]) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        for process in processes.iter_mut() {
            if let Some(status) = process.child.try_wait().unwrap() {
                panic!("{} exited ({status}); {}", process.name, process.log());
            }
        }
        if let Some((200, body)) = get(url, user).await {
            return body;
        }
        if std::time::Instant::now() > deadline {
            let logs: Vec<String> = processes.iter().map(|p| p.log()).collect();
            panic!("{url} did not answer 200 within 30 s; {}", logs.join("\n"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn get(url: &str, user: Option<&str>) -> Option<(u16, String)> {
    let mut request = reqwest::Client::new().get(url);
    if let Some(user) = user {
        request = request.header("kubeflow-userid", user);
    }
    let response = request.send().await.ok()?;
    let status = response.status().as_u16();
    Some((status, response.text().await.ok()?))
}

/// Without Istio: the overlay's objects apply to an API server (the fake, with the overlay's
/// VirtualService CRD in place of Istio's); the web app and the proxy, started with their
/// Deployments' arguments and environment, answer their probes; a signed-in request to the
/// proxy reaches the web app through the web route, which answers with the ConfigMap's catalog;
/// and a notebook's route opens to whom the API server's SubjectAccessReviews allow, one review
/// per user and namespace.
#[tokio::test(flavor = "multi_thread")]
async fn without_istio_the_proxy_brings_requests_to_the_web_app() {
    crate::init_crypto();
    let server = FakeApiServer::start(FakeApiServerOptions {
        extra_crds: vec![labforge_tests::repo_root().join(NO_ISTIO_CRD)],
        ..FakeApiServerOptions::default()
    })
    .await
    .unwrap();
    let client = server.client();
    let mut objects = build(&deploy_dir().join("overlays/no-istio"));
    // kubectl's order: namespaces and CRDs first.
    objects.sort_by_key(|o| match o["kind"].as_str().unwrap() {
        "Namespace" => 0,
        "CustomResourceDefinition" => 1,
        _ => 2,
    });
    for object in &objects {
        let api_version = object["apiVersion"].as_str().unwrap();
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        let gvk = GroupVersionKind::gvk(group, version, object["kind"].as_str().unwrap());
        let (resource, _) = kube::discovery::pinned_kind(&client, &gvk)
            .await
            .unwrap_or_else(|e| panic!("{gvk:?}: {e}"));
        let api: Api<DynamicObject> = match object["metadata"]["namespace"].as_str() {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
            None => Api::all_with(client.clone(), &resource),
        };
        let dynamic: DynamicObject = serde_json::from_value(object.clone()).unwrap();
        api.create(&PostParams::default(), &dynamic)
            .await
            .unwrap_or_else(|e| panic!("creating {:?}: {e}", identity(object)));
    }

    let dir = tempfile::tempdir().unwrap();
    // Each binary acts as its Deployment's service account, with deploy/'s RBAC (stored above).
    let web_kubeconfig = dir.path().join("web-kubeconfig");
    server
        .write_kubeconfig_as(&web_kubeconfig, WEB_USER)
        .unwrap();
    let proxy_kubeconfig = dir.path().join("proxy-kubeconfig");
    server
        .write_kubeconfig_as(&proxy_kubeconfig, PROXY_USER)
        .unwrap();
    let base = build(&deploy_dir());
    let spawner = dir.path().join("spawner.json");
    std::fs::write(
        &spawner,
        find(&base, "ConfigMap", "labforge-web-spawner").unwrap()["data"]["spawner.json"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    let free = || labforge_tests::tools::free_port().unwrap();
    let (web_port, proxy_port, admin_port) = (free(), free(), free());
    let notebook = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let notebook_addr = notebook.local_addr().unwrap();
    let notebook_task = tokio::spawn(async move {
        let app = axum::Router::new().fallback(|| async { "the notebook" });
        axum::serve(notebook, app).await.unwrap();
    });

    let web_container = deployment_container(&base, "labforge-web");
    let mut web = start(
        web_container,
        &[
            ("--listen", format!("127.0.0.1:{web_port}")),
            ("--spawner-config", spawner.display().to_string()),
        ],
        &[],
        &web_kubeconfig,
    );
    let proxy_container = deployment_container(&base, "labforge-proxy");
    let mut proxy = start(
        proxy_container,
        &[
            ("--listen", format!("127.0.0.1:{proxy_port}")),
            ("--admin-addr", format!("127.0.0.1:{admin_port}")),
        ],
        // What cluster DNS does for the web app's Service and the notebook's.
        &[
            "--upstream".into(),
            format!("labforge-web.kubeflow.svc.cluster.local:80=127.0.0.1:{web_port}"),
            "--upstream".into(),
            format!("jupyter.alice.svc.cluster.local:80={notebook_addr}"),
        ],
        &proxy_kubeconfig,
    );

    let probe = |container: &Value, probe: &str, port: u16| {
        format!(
            "http://127.0.0.1:{port}{}",
            container[probe]["httpGet"]["path"].as_str().unwrap()
        )
    };
    for (container, port) in [(web_container, web_port), (proxy_container, admin_port)] {
        for kind in ["livenessProbe", "readinessProbe"] {
            until_ok(
                &probe(container, kind, port),
                None,
                &mut [&mut web, &mut proxy],
            )
            .await;
        }
    }

    let through_proxy = format!("http://127.0.0.1:{proxy_port}/api/config");
    let body = until_ok(
        &through_proxy,
        Some("alice@example.com"),
        &mut [&mut web, &mut proxy],
    )
    .await;
    let config: Value = serde_json::from_str(&body).unwrap();
    let images: Vec<&str> = config["images"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["image"].as_str().unwrap())
        .collect();
    assert!(
        images.contains(&"kubeflownotebookswg/jupyter-scipy:v1.9.0"),
        "{config}"
    );
    let (status, _) = get(&through_proxy, None).await.unwrap();
    assert_eq!(status, 401, "no user header, no entry");

    // RBAC as the API server answers it: alice in her namespace, root everywhere.
    let reviews = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let asked = reviews.clone();
    server.set_access_rule(move |spec| {
        let user = spec["user"].as_str().unwrap_or_default();
        let attributes = &spec["resourceAttributes"];
        let namespace = attributes["namespace"].as_str().unwrap_or_default();
        asked.lock().unwrap().push(format!("{user} {namespace}"));
        attributes["group"] == "kubeflow.org"
            && attributes["resource"] == "notebooks"
            && attributes["verb"] == "update"
            && (user == "root@example.com" || (user == "alice@example.com" && namespace == "alice"))
    });
    let notebook_route = rendered_notebook_virtual_service();
    let version = notebook_route["apiVersion"].as_str().unwrap();
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(
            "networking.istio.io",
            version.rsplit('/').next().unwrap(),
            "VirtualService",
        ),
        "virtualservices",
    );
    Api::<DynamicObject>::namespaced_with(client.clone(), "alice", &resource)
        .create(
            &PostParams::default(),
            &serde_json::from_value(notebook_route).unwrap(),
        )
        .await
        .unwrap();
    let lab = format!("http://127.0.0.1:{proxy_port}/notebook/alice/jupyter/lab");
    let body = until_ok(&lab, Some("alice@example.com"), &mut [&mut web, &mut proxy]).await;
    assert_eq!(body, "the notebook");
    for (user, expected) in [
        ("alice@example.com", 200),
        ("root@example.com", 200),
        ("bob@example.com", 403),
        ("bob@example.com", 403),
    ] {
        let (status, _) = get(&lab, Some(user)).await.unwrap();
        assert_eq!(status, expected, "{user}");
    }
    let notebook_reviews: Vec<String> = reviews
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r.ends_with(" alice"))
        .cloned()
        .collect();
    assert_eq!(
        notebook_reviews,
        [
            "alice@example.com alice",
            "root@example.com alice",
            "bob@example.com alice"
        ],
        "one review per user and namespace; answers are cached"
    );
    notebook_task.abort();
}
