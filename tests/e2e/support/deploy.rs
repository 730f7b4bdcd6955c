//! `deploy/` as the suites read it: its kustomizations built as `kubectl kustomize` builds them,
//! its RBAC loaded into the fake API server, and a client as each Deployment's ServiceAccount.

use kube::Api;
use kube::api::ApiResource;
use kube::api::DynamicObject;
use kube::api::GroupVersionKind;
use kube::api::PostParams;
use labforge_tests::fake_kube::FakeApiServer;
use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The service accounts `deploy/` runs labforge's components under, as RBAC names them.
pub const CONTROLLER_USER: &str =
    "system:serviceaccount:labforge-system:labforge-notebook-controller";

pub const IMAGE_BUILDS_USER: &str = "system:serviceaccount:labforge-system:labforge-image-builds";

pub const WEB_USER: &str = "system:serviceaccount:kubeflow:labforge-web";

pub const PROXY_USER: &str = "system:serviceaccount:kubeflow:labforge-proxy";

/// Stores `deploy/`'s roles and bindings in `server`, so that a client acting as one of the
/// service accounts above has exactly the rights `deploy/` grants it.
pub async fn load_deploy_rbac(server: &FakeApiServer) {
    let client = server.client();
    for object in build(&deploy_dir()) {
        let kind = object["kind"].as_str().unwrap_or_default();
        if !["ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"].contains(&kind) {
            continue;
        }
        let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(
            "rbac.authorization.k8s.io",
            "v1",
            kind,
        ));
        let api: Api<DynamicObject> = match object["metadata"]["namespace"].as_str() {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
            None => Api::all_with(client.clone(), &resource),
        };
        let dynamic: DynamicObject = serde_json::from_value(object.clone()).unwrap();
        match api.create(&PostParams::default(), &dynamic).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(err) => panic!("storing {:?}: {err}", identity(&object)),
        }
    }
}

/// A client acting as `user`, with `deploy/`'s RBAC loaded.
pub async fn client_as_deployed(server: &FakeApiServer, user: &str) -> kube::Client {
    load_deploy_rbac(server).await;
    server.client_as(user).unwrap()
}

pub(crate) fn deploy_dir() -> PathBuf {
    labforge_tests::repo_root().join("deploy")
}

/// Kind, group, namespace, name: what the API server keeps one of.
pub(crate) fn identity(object: &Value) -> (String, String, String, String) {
    (
        object["kind"].as_str().unwrap_or_default().to_owned(),
        group_of(object["apiVersion"].as_str().unwrap_or_default()).to_owned(),
        object["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        object["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
    )
}

/// What `kubectl kustomize <dir>` yields: resources (files and kustomizations), then components.
pub(crate) fn build(dir: &Path) -> Vec<Value> {
    let k = kustomization(dir);
    assert_eq!(
        k.kind,
        "Kustomization",
        "{} is built as a kustomization",
        relative(dir)
    );
    let mut out = Vec::new();
    add_resources(&k, &mut out);
    for entry in &k.components {
        let path = referenced(&k, entry);
        let component = kustomization(&path);
        assert_eq!(
            component.kind, "Component",
            "{entry} is used as a component"
        );
        assert!(component.components.is_empty(), "nested components");
        add_resources(&component, &mut out);
    }
    set_images(&k.images, &mut out);
    let mut seen = BTreeSet::new();
    for object in &out {
        assert!(
            seen.insert(identity(object)),
            "{}: {:?} twice (kustomize refuses that)",
            relative(dir),
            identity(object)
        );
    }
    out
}

/// `deploy/...` for messages and lookups.
pub(crate) fn relative(path: &Path) -> String {
    path.strip_prefix(labforge_tests::repo_root())
        .unwrap_or(path)
        .display()
        .to_string()
}

pub(crate) fn group_of(api_version: &str) -> &str {
    api_version
        .rsplit_once('/')
        .map_or("", |(group, _version)| group)
}

/// kustomize's images transformer.
pub(crate) fn set_images(rules: &[ImageRule], objects: &mut [Value]) {
    for object in objects {
        for image in container_images(object) {
            let current = image.as_str().unwrap_or_default().to_owned();
            let (name, tag) = split_image(&current);
            if let Some(rule) = rules.iter().find(|rule| rule.name == name) {
                let name = rule.new_name.as_deref().unwrap_or(name);
                *image = Value::String(match rule.new_tag.as_deref().or(tag) {
                    Some(tag) => format!("{name}:{tag}"),
                    None => name.to_owned(),
                });
            }
        }
    }
}

pub(crate) fn kustomization(dir: &Path) -> Kustomization {
    let path = dir.join("kustomization.yaml");
    assert!(
        path.is_file(),
        "{} has no kustomization.yaml",
        relative(dir)
    );
    let docs = documents_at(&path);
    assert_eq!(docs.len(), 1, "{}: one document", relative(&path));
    let doc = &docs[0];
    for key in doc.as_object().unwrap().keys() {
        assert!(
            ["apiVersion", "kind", "resources", "components", "images"].contains(&key.as_str()),
            "{}: `{key}` is not understood by this test's kustomize build; teach build() about it",
            relative(&path)
        );
    }
    let kind = doc["kind"].as_str().unwrap_or_default().to_owned();
    let expected_version = match kind.as_str() {
        "Kustomization" => "kustomize.config.k8s.io/v1beta1",
        "Component" => "kustomize.config.k8s.io/v1alpha1",
        other => panic!("{}: kind {other:?}", relative(&path)),
    };
    assert_eq!(doc["apiVersion"], expected_version, "{}", relative(&path));
    Kustomization {
        dir: dir.to_owned(),
        kind,
        resources: strings(&doc["resources"]),
        components: strings(&doc["components"]),
        images: doc["images"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|rule| {
                for key in rule.as_object().unwrap().keys() {
                    assert!(
                        ["name", "newName", "newTag"].contains(&key.as_str()),
                        "{}: images.{key} is not understood by this test's kustomize build",
                        relative(&path)
                    );
                }
                ImageRule {
                    name: rule["name"].as_str().unwrap().to_owned(),
                    new_name: rule["newName"].as_str().map(str::to_owned),
                    new_tag: rule["newTag"].as_str().map(str::to_owned),
                }
            })
            .collect(),
    }
}

/// A path a kustomization names: it must exist and stay inside deploy/.
pub(crate) fn referenced(k: &Kustomization, entry: &str) -> PathBuf {
    let path = k.dir.join(entry);
    assert!(
        path.exists(),
        "{}/kustomization.yaml names {entry}, which does not exist",
        relative(&k.dir)
    );
    let path = path.canonicalize().unwrap();
    assert!(
        path.starts_with(deploy_dir().canonicalize().unwrap()),
        "{}/kustomization.yaml names {entry}, outside deploy/",
        relative(&k.dir)
    );
    path
}

pub(crate) fn add_resources(k: &Kustomization, out: &mut Vec<Value>) {
    for entry in &k.resources {
        let path = referenced(k, entry);
        if path.is_dir() {
            out.extend(build(&path));
        } else {
            out.extend(documents_at(&path));
        }
    }
}

pub(crate) fn documents_at(path: &Path) -> Vec<Value> {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}

pub(crate) fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .map(|items| {
            items
                .iter()
                .map(|v| v.as_str().unwrap().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

// --- kustomize, for the features deploy/ uses ------------------------------------------------------

pub(crate) struct Kustomization {
    pub(crate) dir: PathBuf,
    pub(crate) kind: String,
    pub(crate) resources: Vec<String>,
    pub(crate) components: Vec<String>,
    /// `images:` entries: name → (newName, newTag).
    pub(crate) images: Vec<ImageRule>,
}

/// One entry of a kustomization's `images:` (the fields deploy/ uses).
pub(crate) struct ImageRule {
    pub(crate) name: String,
    pub(crate) new_name: Option<String>,
    pub(crate) new_tag: Option<String>,
}

/// An image reference split into name and tag, as kustomize matches it (a registry's port is not
/// a tag).
pub(crate) fn split_image(image: &str) -> (&str, Option<&str>) {
    match image.rsplit_once(':') {
        Some((name, tag)) if !tag.contains('/') => (name, Some(tag)),
        _ => (image, None),
    }
}

/// Every container image field of `object` (workloads and bare pods).
pub(crate) fn container_images(object: &mut Value) -> Vec<&mut Value> {
    let object_kind = object["kind"].as_str().unwrap_or_default().to_owned();
    let spec = if object_kind == "Pod" {
        object.get_mut("spec")
    } else {
        object.pointer_mut("/spec/template/spec")
    };
    let Some(spec) = spec.and_then(Value::as_object_mut) else {
        return Vec::new();
    };
    spec.iter_mut()
        .filter(|(key, _)| *key == "containers" || *key == "initContainers")
        .flat_map(|(_, list)| list.as_array_mut().into_iter().flatten())
        .filter_map(|container| container.get_mut("image"))
        .collect()
}
