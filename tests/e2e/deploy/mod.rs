//! The manifests in deploy/ and the CRDs in crds/: they validate against the official schemas with
//! the same validator the fake API server applies to every write; the kustomizations cover every
//! manifest and build without duplicates; RBAC is least privilege; the Deployments are hardened and
//! pass only flags and variables the real binary accepts; and the proxy and the web app, started
//! with their Deployments' arguments against the fake API server, serve the no-Istio path.

use crate::deploy::deployment_checks::{deployment_container, deployments, env_value, flag_value};
use crate::deploy::serving::rendered_notebook_virtual_service;
mod deployment_checks;
mod rbac;
mod serving;

use crate::support::deploy::{
    build, container_images, deploy_dir, documents_at, group_of, identity, kustomization,
    referenced, relative, split_image, strings,
};
use labforge_tests::fake_kube::{FakeApiServerOptions, SchemaSet};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

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
