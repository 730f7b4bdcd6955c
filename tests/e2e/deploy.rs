//! The manifests in deploy/ and the CRDs in crds/ validate against the official schemas, with
//! the same validator the fake API server applies to every write.

use labforge_tests::fake_kube::{FakeApiServerOptions, SchemaSet};
use serde::Deserialize;
use serde_json::Value;

fn documents(path: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(labforge_tests::repo_root().join(path)).unwrap();
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).unwrap())
        .filter(|v| !v.is_null())
        .collect()
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

#[test]
fn deploy_manifests_and_crds_validate() {
    let schemas = SchemaSet::load(&FakeApiServerOptions::default()).unwrap();
    let kinds = assert_valid(&schemas, "deploy/controller.yaml");
    for kind in [
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "Deployment",
        "Service",
    ] {
        assert!(
            kinds.iter().any(|k| k == kind),
            "deploy/controller.yaml has no {kind}"
        );
    }
    assert_valid(&schemas, "crds/notebooks.kubeflow.org.yaml");
    assert_valid(&schemas, "crds/imagebuilds.labforge.dev.yaml");
}

#[test]
fn controller_role_grants_what_the_reconciler_writes_and_no_more() {
    let docs = documents("deploy/controller.yaml");
    let role = docs.iter().find(|d| d["kind"] == "ClusterRole").unwrap();
    let grants = |group: &str, resource: &str| -> Vec<String> {
        role["rules"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| {
                r["apiGroups"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|g| g == group)
            })
            .filter(|r| {
                r["resources"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|x| x == resource)
            })
            .flat_map(|r| {
                r["verbs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_str().unwrap().to_owned())
            })
            .collect()
    };
    for (group, resource) in [
        ("apps", "statefulsets"),
        ("", "services"),
        ("networking.istio.io", "virtualservices"),
    ] {
        let verbs = grants(group, resource);
        for verb in ["get", "list", "watch", "create", "patch"] {
            assert!(verbs.iter().any(|v| v == verb), "{resource} lacks {verb}");
        }
        assert!(
            !verbs.iter().any(|v| v == "delete" || v == "*"),
            "{resource}: deletion is the garbage collector's job"
        );
    }
    assert!(
        grants("", "secrets").is_empty(),
        "the controller never reads secrets"
    );
    assert_eq!(grants("kubeflow.org", "notebooks/status"), ["get", "patch"]);
}
