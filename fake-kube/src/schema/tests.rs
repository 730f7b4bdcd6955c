//! Validation against the real schemas in `../shared/schemas`.

use std::sync::OnceLock;

use serde_json::{Value, json};

use super::{FieldError, SchemaSet};
use crate::FakeApiServerOptions;

fn schemas() -> &'static SchemaSet {
    static SCHEMAS: OnceLock<SchemaSet> = OnceLock::new();
    SCHEMAS.get_or_init(|| SchemaSet::load(&FakeApiServerOptions::default()).unwrap())
}

fn statefulset() -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "nb", "namespace": "team-a", "labels": {"app": "nb"}},
        "spec": {
            "replicas": 1,
            "serviceName": "",
            "selector": {"matchLabels": {"statefulset": "nb"}},
            "template": {
                "metadata": {"labels": {"statefulset": "nb", "notebook-name": "nb"}},
                "spec": {
                    "containers": [{
                        "name": "nb",
                        "image": "jupyter:latest",
                        "workingDir": "/home/jovyan",
                        "ports": [{"name": "notebook-port", "containerPort": 8888, "protocol": "TCP"}],
                        "env": [{"name": "NB_PREFIX", "value": "/notebook/team-a/nb"}],
                        "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": 2, "memory": "2Gi"}},
                        "volumeMounts": [{"name": "workspace", "mountPath": "/home/jovyan"}],
                    }],
                    "securityContext": {"fsGroup": 100},
                    "volumes": [{"name": "workspace", "persistentVolumeClaim": {"claimName": "ws"}}],
                },
            },
        },
    })
}

fn notebook() -> Value {
    json!({
        "apiVersion": "kubeflow.org/v1",
        "kind": "Notebook",
        "metadata": {"name": "nb", "namespace": "team-a", "annotations": {"notebooks.kubeflow.org/last-activity": "2025-01-01T00:00:00Z"}},
        "spec": {"template": {"spec": {"containers": [{
            "name": "nb",
            "image": "jupyter:latest",
            "resources": {"requests": {"cpu": "0.5", "memory": "1Gi"}},
            "ports": [{"containerPort": 8888}],
        }]}}},
    })
}

fn errors(api_version: &str, kind: &str, object: &Value) -> Vec<FieldError> {
    schemas()
        .validate(api_version, kind, object)
        .err()
        .unwrap_or_default()
}

#[track_caller]
fn assert_rejected_at(api_version: &str, kind: &str, object: &Value, field: &str) -> FieldError {
    let errors = errors(api_version, kind, object);
    errors
        .iter()
        .find(|error| error.field == field)
        .cloned()
        .unwrap_or_else(|| panic!("expected an error at {field}, got {errors:#?}"))
}

#[test]
fn a_valid_statefulset_passes() {
    assert_eq!(errors("apps/v1", "StatefulSet", &statefulset()), vec![]);
}

#[test]
fn an_unknown_field_is_rejected_with_its_path() {
    let mut object = statefulset();
    object["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = json!("Always");
    let error = assert_rejected_at(
        "apps/v1",
        "StatefulSet",
        &object,
        "spec.template.spec.containers[0].imagePullPolicyy",
    );
    assert!(error.message.contains("not declared"), "{error}");
}

#[test]
fn a_wrong_type_is_rejected() {
    let mut object = statefulset();
    object["spec"]["replicas"] = json!("1");
    let error = assert_rejected_at("apps/v1", "StatefulSet", &object, "spec.replicas");
    assert_eq!(error.reason, "FieldValueTypeInvalid");
    object["spec"]["replicas"] = json!(1.5);
    assert_rejected_at("apps/v1", "StatefulSet", &object, "spec.replicas");
}

#[test]
fn missing_required_containers_are_rejected() {
    let mut object = statefulset();
    object["spec"]["template"]["spec"]
        .as_object_mut()
        .unwrap()
        .remove("containers");
    let error = assert_rejected_at(
        "apps/v1",
        "StatefulSet",
        &object,
        "spec.template.spec.containers",
    );
    assert_eq!(error.reason, "FieldValueRequired");
    object["spec"]["template"]["spec"]["containers"] = json!([]);
    assert_rejected_at(
        "apps/v1",
        "StatefulSet",
        &object,
        "spec.template.spec.containers",
    );
}

#[test]
fn a_bad_quantity_is_rejected() {
    let mut object = statefulset();
    object["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"] =
        json!("1GB");
    let error = assert_rejected_at(
        "apps/v1",
        "StatefulSet",
        &object,
        "spec.template.spec.containers[0].resources.limits[memory]",
    );
    assert!(error.message.contains("1GB"), "{error}");
}

#[test]
fn intorstring_and_time_formats_are_checked() {
    let mut service = json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "nb", "namespace": "team-a"},
        "spec": {"selector": {"statefulset": "nb"}, "ports": [{"name": "http-nb", "port": 80, "targetPort": 8888}]},
    });
    assert_eq!(errors("v1", "Service", &service), vec![]);
    service["spec"]["ports"][0]["targetPort"] = json!("notebook-port");
    assert_eq!(errors("v1", "Service", &service), vec![]);
    service["spec"]["ports"][0]["targetPort"] = json!(true);
    assert_rejected_at("v1", "Service", &service, "spec.ports[0].targetPort");

    let mut lease = json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "leader", "namespace": "default"},
        "spec": {"holderIdentity": "a", "renewTime": "2025-01-01T00:00:00.000000Z"},
    });
    assert_eq!(errors("coordination.k8s.io/v1", "Lease", &lease), vec![]);
    lease["spec"]["renewTime"] = json!("yesterday");
    assert_rejected_at("coordination.k8s.io/v1", "Lease", &lease, "spec.renewTime");
}

#[test]
fn names_labels_and_selectors_follow_kubernetes_rules() {
    let mut object = statefulset();
    object["metadata"]["name"] = json!("Not_Valid");
    assert_rejected_at("apps/v1", "StatefulSet", &object, "metadata.name");
    object["metadata"]["name"] = json!(null);
    object["metadata"]["generateName"] = json!("nb-");
    assert_eq!(errors("apps/v1", "StatefulSet", &object), vec![]);
    object["metadata"]["generateName"] = json!("NB-");
    assert_rejected_at("apps/v1", "StatefulSet", &object, "metadata.generateName");

    let mut object = statefulset();
    object["metadata"]["labels"]["app"] = json!("has space");
    assert_rejected_at("apps/v1", "StatefulSet", &object, "metadata.labels[app]");

    let mut object = statefulset();
    object["spec"]["selector"]["matchLabels"]["statefulset"] = json!("other");
    assert_rejected_at(
        "apps/v1",
        "StatefulSet",
        &object,
        "spec.template.metadata.labels",
    );

    let mut object = statefulset();
    object["spec"]["template"]["spec"]["containers"][0]["volumeMounts"][0]["name"] =
        json!("missing");
    assert_rejected_at(
        "apps/v1",
        "StatefulSet",
        &object,
        "spec.template.spec.containers[0].volumeMounts[0].name",
    );

    let mut object = statefulset();
    object["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] =
        json!("3");
    assert_rejected_at(
        "apps/v1",
        "StatefulSet",
        &object,
        "spec.template.spec.containers[0].resources.requests[cpu]",
    );

    let service = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "1nb", "namespace": "team-a"},
        "spec": {"ports": [{"port": 80}]},
    });
    assert_rejected_at("v1", "Service", &service, "metadata.name");
}

#[test]
fn a_valid_notebook_passes_and_a_misspelt_pod_field_fails() {
    assert_eq!(errors("kubeflow.org/v1", "Notebook", &notebook()), vec![]);
    assert_eq!(
        errors("kubeflow.org/v1beta1", "Notebook", &{
            let mut nb = notebook();
            nb["apiVersion"] = json!("kubeflow.org/v1beta1");
            nb
        }),
        vec![]
    );
    let mut object = notebook();
    object["spec"]["template"]["spec"]["containers"][0]["volumeMount"] = json!([]);
    assert_rejected_at(
        "kubeflow.org/v1",
        "Notebook",
        &object,
        "spec.template.spec.containers[0].volumeMount",
    );
    let mut object = notebook();
    object["spec"]["template"]["spec"]["serviceAccount"] = json!("ok");
    object["spec"]["template"]["spec"]["nodeSelectr"] = json!({});
    assert_rejected_at(
        "kubeflow.org/v1",
        "Notebook",
        &object,
        "spec.template.spec.nodeSelectr",
    );
    let mut object = notebook();
    object["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] =
        json!({"memory": "2GB"});
    assert_rejected_at(
        "kubeflow.org/v1",
        "Notebook",
        &object,
        "spec.template.spec.containers[0].resources.limits[memory]",
    );
    // x-kubernetes-int-or-string takes any integer (2Gi in bytes does not fit an int32).
    let mut object = notebook();
    object["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] =
        json!({"memory": 2147483648u64});
    assert_eq!(errors("kubeflow.org/v1", "Notebook", &object), vec![]);
    // Custom resources' metadata is an ObjectMeta too.
    let mut object = notebook();
    object["metadata"]["labelz"] = json!({});
    assert_rejected_at("kubeflow.org/v1", "Notebook", &object, "metadata.labelz");
}

#[test]
fn notebook_status_requires_its_fields() {
    let mut object = notebook();
    object["status"] = json!({"readyReplicas": 1});
    assert_rejected_at("kubeflow.org/v1", "Notebook", &object, "status.conditions");
    object["status"] = json!({"readyReplicas": 1, "conditions": [], "containerState": {"running": {"startedAt": "2025-01-01T00:00:00Z"}}});
    assert_eq!(errors("kubeflow.org/v1", "Notebook", &object), vec![]);
}

#[test]
fn crd_defaults_are_applied() {
    let set = schemas();
    let id = set
        .catalog
        .by_kind("kubeflow.org", "v1", "Notebook")
        .unwrap();
    let mut object = notebook();
    set.normalize(id, "v1", &mut object);
    assert_eq!(
        object["spec"]["template"]["spec"]["containers"][0]["ports"][0]["protocol"],
        "TCP"
    );
}

fn virtual_service(http: Value) -> Value {
    json!({
        "apiVersion": "networking.istio.io/v1",
        "kind": "VirtualService",
        "metadata": {"name": "notebook-team-a-nb", "namespace": "team-a"},
        "spec": {
            "hosts": ["*"],
            "gateways": ["kubeflow/kubeflow-gateway"],
            "http": [http],
        },
    })
}

#[test]
fn a_virtual_service_with_prefix_match_and_rewrite_passes() {
    let route = json!({
        "match": [{"uri": {"prefix": "/notebook/team-a/nb/"}}],
        "rewrite": {"uri": "/notebook/team-a/nb/"},
        "headers": {"request": {"set": {"X-Forwarded-Prefix": "/notebook/team-a/nb"}}},
        "route": [{"destination": {"host": "nb.team-a.svc.cluster.local", "port": {"number": 80}}}],
    });
    let object = virtual_service(route.clone());
    for version in ["v1", "v1beta1", "v1alpha3"] {
        let mut object = object.clone();
        let api_version = format!("networking.istio.io/{version}");
        object["apiVersion"] = json!(api_version);
        assert_eq!(
            errors(&api_version, "VirtualService", &object),
            vec![],
            "{version}"
        );
    }

    // `uri` is a oneOf: exact, prefix and regex exclude each other.
    let mut both = route.clone();
    both["match"][0]["uri"]["exact"] = json!("/x");
    assert_rejected_at(
        "networking.istio.io/v1",
        "VirtualService",
        &virtual_service(both),
        "spec.http[0].match[0].uri",
    );
    let mut typo = route;
    typo["rewrite"]["url"] = json!("/");
    assert_rejected_at(
        "networking.istio.io/v1",
        "VirtualService",
        &virtual_service(typo),
        "spec.http[0].rewrite.url",
    );
}

#[test]
fn unknown_kinds_are_rejected() {
    assert!(
        schemas()
            .validate("apps/v1", "Nonsense", &json!({}))
            .is_err()
    );
    assert!(
        schemas()
            .validate("apps/v2", "StatefulSet", &statefulset())
            .is_err()
    );
}

#[test]
fn what_json_schema_alone_would_let_through_is_refused() {
    // Go decodes integers only from integers.
    let mut object = statefulset();
    object["spec"]["replicas"] = json!(1.0);
    let error = assert_rejected_at("apps/v1", "StatefulSet", &object, "spec.replicas");
    assert_eq!(error.reason, "FieldValueTypeInvalid", "{error}");

    // An int32 field and int-or-string's integer hold 32 bits.
    let mut object = statefulset();
    object["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] =
        json!(1_u64 << 33);
    let error = assert_rejected_at(
        "apps/v1",
        "StatefulSet",
        &object,
        "spec.template.spec.containers[0].ports[0].containerPort",
    );
    assert!(error.message.contains("32-bit"), "{error}");

    // Items of a list-map differ in their keys: two containers with one name.
    let mut object = statefulset();
    let container = object["spec"]["template"]["spec"]["containers"][0].clone();
    object["spec"]["template"]["spec"]["containers"] = json!([container.clone(), container]);
    let error = assert_rejected_at(
        "apps/v1",
        "StatefulSet",
        &object,
        "spec.template.spec.containers[1]",
    );
    assert_eq!(error.reason, "FieldValueDuplicate", "{error}");

    // `byte` strings are base64; a null where the field cannot hold one is dropped, not refused.
    let mut secret = json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "s", "namespace": "team-a", "labels": null},
        "data": {"token": "bm90IGEgc2VjcmV0"},
    });
    assert_eq!(errors("v1", "Secret", &secret), vec![]);
    secret["data"]["token"] = json!("not base64!");
    let error = assert_rejected_at("v1", "Secret", &secret, "data[token]");
    assert!(error.message.contains("base64"), "{error}");
}
