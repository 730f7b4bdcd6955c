//! Rules the API server enforces in Go code rather than in the schema: object names, labels,
//! finalizers, and the handful of workload rules a builder most easily breaks (selector vs
//! template labels, volume mounts naming a volume, requests above limits, immutable StatefulSet
//! fields).

use std::collections::BTreeSet;

use base64::Engine as _;
use serde_json::{Map, Value};

use super::FieldError;
use super::names::{
    self, DNS1035_LABEL_ERROR, DNS1123_LABEL_ERROR, DNS1123_SUBDOMAIN_ERROR, LABEL_VALUE_ERROR,
};
use super::quantity::parse_quantity;
use super::validate::{child_path, index_path, key_path};
use crate::catalog::{NameRule, ResourceInfo};
use crate::selector::label_selector_object_matches;

/// Maximum total size of annotations, as in apimachinery.
const TOTAL_ANNOTATION_SIZE_LIMIT: usize = 256 * 1024;

pub(crate) fn check_object(
    resource: &ResourceInfo,
    object: &Value,
    old: Option<&Value>,
    errors: &mut Vec<FieldError>,
) {
    if resource.stored {
        check_metadata(resource, object.get("metadata"), errors);
    }
    if resource.custom {
        return;
    }
    let spec = object.get("spec");
    match (resource.group.as_str(), resource.kind.as_str()) {
        ("apps", "StatefulSet") => {
            check_workload(object, true, errors);
            if let (Some(old), Some(spec)) = (old.and_then(|o| o.get("spec")), spec) {
                check_statefulset_update(old, spec, errors);
            }
        }
        ("apps", "Deployment") => {
            check_workload(object, false, errors);
            if let (Some(old), Some(spec)) = (old.and_then(|o| o.get("spec")), spec)
                && old.get("selector") != spec.get("selector")
            {
                errors.push(FieldError::invalid(
                    "spec.selector",
                    spec.get("selector").unwrap_or(&Value::Null),
                    "field is immutable",
                ));
            }
        }
        ("", "Pod") => {
            if let Some(spec) = spec {
                check_pod_spec(spec, "spec", &BTreeSet::new(), errors);
            }
        }
        ("", "Service") => {
            if let Some(spec) = spec {
                check_service(spec, errors);
            }
        }
        ("", "PersistentVolumeClaim") if old.is_none() => {
            if let Some(spec) = spec {
                check_claim_spec(spec, "spec", errors);
            }
        }
        _ => {}
    }
}

fn check_metadata(resource: &ResourceInfo, metadata: Option<&Value>, errors: &mut Vec<FieldError>) {
    let empty = Value::Object(Map::new());
    let metadata = metadata.unwrap_or(&empty);
    let name = metadata
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let generate_name = metadata
        .get("generateName")
        .and_then(Value::as_str)
        .unwrap_or_default();
    // A generateName is checked as a prefix: trailing dashes are fine, a suffix will follow.
    let (field, candidate) = if !name.is_empty() {
        ("metadata.name", name.to_string())
    } else if !generate_name.is_empty() {
        (
            "metadata.generateName",
            format!("{}a", generate_name.trim_end_matches('-')),
        )
    } else {
        errors.push(FieldError::required_because(
            "metadata.name",
            "name or generateName is required",
        ));
        ("metadata.name", String::new())
    };
    if !candidate.is_empty() {
        let (ok, rule) = match resource.name_rule {
            NameRule::Subdomain => (
                names::is_dns1123_subdomain(&candidate),
                DNS1123_SUBDOMAIN_ERROR,
            ),
            NameRule::Label => (names::is_dns1123_label(&candidate), DNS1123_LABEL_ERROR),
            NameRule::Dns1035Label => (names::is_dns1035_label(&candidate), DNS1035_LABEL_ERROR),
        };
        if !ok {
            let given = if name.is_empty() { generate_name } else { name };
            errors.push(FieldError::invalid(field, &Value::from(given), rule));
        }
    }
    if resource.namespaced {
        // The server fills the namespace from the URL; a pure validation may leave it out.
        if let Some(namespace) = metadata.get("namespace").and_then(Value::as_str)
            && !names::is_dns1123_label(namespace)
        {
            errors.push(FieldError::invalid(
                "metadata.namespace",
                &Value::from(namespace),
                DNS1123_LABEL_ERROR,
            ));
        }
    }
    if let Some(labels) = metadata.get("labels").and_then(Value::as_object) {
        check_labels(labels, "metadata.labels", errors);
    }
    if let Some(annotations) = metadata.get("annotations").and_then(Value::as_object) {
        let mut total = 0;
        for (key, value) in annotations {
            total += key.len() + value.as_str().map_or(0, str::len);
            if let Err(why) = names::check_qualified_name(&key.to_ascii_lowercase()) {
                errors.push(FieldError::invalid(
                    "metadata.annotations",
                    &Value::from(key.as_str()),
                    &why,
                ));
            }
        }
        if total > TOTAL_ANNOTATION_SIZE_LIMIT {
            errors.push(FieldError::too_long(
                "metadata.annotations",
                TOTAL_ANNOTATION_SIZE_LIMIT as u64,
            ));
        }
    }
    for (index, finalizer) in array(metadata.get("finalizers")).iter().enumerate() {
        if let Some(text) = finalizer.as_str()
            && let Err(why) = names::check_qualified_name(text)
        {
            errors.push(FieldError::invalid(
                &index_path("metadata.finalizers", index),
                finalizer,
                &why,
            ));
        }
    }
    let mut controllers = 0;
    for (index, owner) in array(metadata.get("ownerReferences")).iter().enumerate() {
        let path = index_path("metadata.ownerReferences", index);
        if owner
            .get("uid")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
        {
            errors.push(FieldError::invalid(
                &child_path(&path, "uid"),
                owner.get("uid").unwrap_or(&Value::Null),
                "uid must not be empty",
            ));
        }
        if owner.get("controller").and_then(Value::as_bool) == Some(true) {
            controllers += 1;
        }
    }
    if controllers > 1 {
        errors.push(FieldError::invalid(
            "metadata.ownerReferences",
            &Value::from(controllers),
            "Only one reference can have Controller set to true",
        ));
    }
}

fn check_labels(labels: &Map<String, Value>, path: &str, errors: &mut Vec<FieldError>) {
    for (key, value) in labels {
        if let Err(why) = names::check_qualified_name(key) {
            errors.push(FieldError::invalid(path, &Value::from(key.as_str()), &why));
        }
        if let Some(text) = value.as_str()
            && !names::is_label_value(text)
        {
            errors.push(FieldError::invalid(
                &key_path(path, key),
                value,
                LABEL_VALUE_ERROR,
            ));
        }
    }
}

fn array(value: Option<&Value>) -> &[Value] {
    value.and_then(Value::as_array).map_or(&[], Vec::as_slice)
}

fn name_of(value: &Value) -> Option<&str> {
    value.get("name").and_then(Value::as_str)
}

fn check_workload(object: &Value, statefulset: bool, errors: &mut Vec<FieldError>) {
    let Some(spec) = object.get("spec") else {
        return;
    };
    let selector = spec.get("selector").unwrap_or(&Value::Null);
    let empty_selector = selector.as_object().is_none_or(|s| {
        s.get("matchLabels")
            .and_then(Value::as_object)
            .is_none_or(Map::is_empty)
            && s.get("matchExpressions")
                .and_then(Value::as_array)
                .is_none_or(Vec::is_empty)
    });
    let labels = spec
        .pointer("/template/metadata/labels")
        .and_then(Value::as_object);
    if empty_selector {
        errors.push(FieldError::invalid(
            "spec.selector",
            selector,
            "empty selector is invalid for deployment",
        ));
    } else if !label_selector_object_matches(selector, labels) {
        errors.push(FieldError::invalid(
            "spec.template.metadata.labels",
            &labels.cloned().map_or(Value::Null, Value::Object),
            "`selector` does not match template `labels`",
        ));
    }
    if let Some(replicas) = spec.get("replicas").and_then(Value::as_i64)
        && replicas < 0
    {
        errors.push(FieldError::invalid(
            "spec.replicas",
            &Value::from(replicas),
            "must be greater than or equal to 0",
        ));
    }
    let mut claim_names = BTreeSet::new();
    if statefulset {
        for (index, claim) in array(spec.get("volumeClaimTemplates")).iter().enumerate() {
            let path = index_path("spec.volumeClaimTemplates", index);
            if let Some(name) = claim.pointer("/metadata/name").and_then(Value::as_str) {
                claim_names.insert(name.to_string());
            } else {
                errors.push(FieldError::required(&child_path(&path, "metadata.name")));
            }
            if let Some(claim_spec) = claim.get("spec") {
                check_claim_spec(claim_spec, &child_path(&path, "spec"), errors);
            }
        }
    }
    match spec.pointer("/template/spec") {
        Some(pod_spec) => check_pod_spec(pod_spec, "spec.template.spec", &claim_names, errors),
        None => errors.push(FieldError::required("spec.template.spec.containers")),
    }
}

/// Fields of a StatefulSet spec that may change after creation (apps/v1 validation).
const STATEFULSET_MUTABLE: &[&str] = &[
    "replicas",
    "ordinals",
    "template",
    "updateStrategy",
    "revisionHistoryLimit",
    "persistentVolumeClaimRetentionPolicy",
    "minReadySeconds",
];

fn check_statefulset_update(old: &Value, new: &Value, errors: &mut Vec<FieldError>) {
    let strip = |spec: &Value| -> Value {
        let mut spec = spec.clone();
        if let Some(map) = spec.as_object_mut() {
            for field in STATEFULSET_MUTABLE {
                map.remove(*field);
            }
        }
        spec
    };
    if strip(old) != strip(new) {
        errors.push(FieldError::forbidden(
            "spec",
            "updates to statefulset spec for fields other than 'replicas', 'ordinals', 'template', 'updateStrategy', 'revisionHistoryLimit', 'persistentVolumeClaimRetentionPolicy' and 'minReadySeconds' are forbidden",
        ));
    }
}

fn check_pod_spec(
    spec: &Value,
    path: &str,
    claim_names: &BTreeSet<String>,
    errors: &mut Vec<FieldError>,
) {
    // A missing list is the schema's `required`; an empty one is this rule's.
    if spec
        .get("containers")
        .is_some_and(|c| c.as_array().is_some_and(Vec::is_empty))
    {
        errors.push(FieldError::required(&child_path(path, "containers")));
    }
    let mut volumes = claim_names.clone();
    for (index, volume) in array(spec.get("volumes")).iter().enumerate() {
        let Some(name) = name_of(volume) else {
            continue;
        };
        let field = child_path(&index_path(&child_path(path, "volumes"), index), "name");
        if !names::is_dns1123_label(name) {
            errors.push(FieldError::invalid(
                &field,
                &Value::from(name),
                DNS1123_LABEL_ERROR,
            ));
        }
        if !volumes.insert(name.to_string()) {
            errors.push(FieldError::duplicate(&field, &Value::from(name)));
        }
    }
    let mut container_names = BTreeSet::new();
    for list in ["initContainers", "containers"] {
        for (index, container) in array(spec.get(list)).iter().enumerate() {
            let container_path = index_path(&child_path(path, list), index);
            check_container(
                container,
                &container_path,
                &volumes,
                &mut container_names,
                errors,
            );
        }
    }
}

fn check_container(
    container: &Value,
    path: &str,
    volumes: &BTreeSet<String>,
    container_names: &mut BTreeSet<String>,
    errors: &mut Vec<FieldError>,
) {
    if let Some(name) = name_of(container) {
        let field = child_path(path, "name");
        if !names::is_dns1123_label(name) {
            errors.push(FieldError::invalid(
                &field,
                &Value::from(name),
                DNS1123_LABEL_ERROR,
            ));
        }
        if !container_names.insert(name.to_string()) {
            errors.push(FieldError::duplicate(&field, &Value::from(name)));
        }
    }
    let mut port_names = BTreeSet::new();
    for (index, port) in array(container.get("ports")).iter().enumerate() {
        let port_path = index_path(&child_path(path, "ports"), index);
        if let Some(number) = port.get("containerPort").and_then(Value::as_i64)
            && !(1..=65535).contains(&number)
        {
            errors.push(FieldError::invalid(
                &child_path(&port_path, "containerPort"),
                &Value::from(number),
                "must be between 1 and 65535, inclusive",
            ));
        }
        if let Some(name) = name_of(port) {
            if !names::is_iana_svc_name(name) {
                errors.push(FieldError::invalid(
                    &child_path(&port_path, "name"),
                    &Value::from(name),
                    "must be no more than 15 characters, contain only lowercase alphanumerics and '-', and contain at least one letter",
                ));
            }
            if !port_names.insert(name.to_string()) {
                errors.push(FieldError::duplicate(
                    &child_path(&port_path, "name"),
                    &Value::from(name),
                ));
            }
        }
    }
    for (index, mount) in array(container.get("volumeMounts")).iter().enumerate() {
        if let Some(name) = name_of(mount)
            && !volumes.contains(name)
        {
            errors.push(FieldError::not_found(
                &child_path(
                    &index_path(&child_path(path, "volumeMounts"), index),
                    "name",
                ),
                &Value::from(name),
            ));
        }
    }
    check_resources(
        container.get("resources"),
        &child_path(path, "resources"),
        errors,
    );
}

fn check_resources(resources: Option<&Value>, path: &str, errors: &mut Vec<FieldError>) {
    let Some(resources) = resources else { return };
    let amounts = |kind: &str| -> Vec<(String, Value, f64)> {
        resources
            .get(kind)
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
            .filter_map(|(name, value)| {
                let text = match value {
                    Value::String(text) => text.clone(),
                    other => other.to_string(),
                };
                parse_quantity(&text)
                    .ok()
                    .map(|amount| (name.clone(), value.clone(), amount))
            })
            .collect()
    };
    let limits = amounts("limits");
    let requests = amounts("requests");
    for (kind, list) in [("limits", &limits), ("requests", &requests)] {
        for (name, value, amount) in list {
            if *amount < 0.0 {
                errors.push(FieldError::invalid(
                    &key_path(&child_path(path, kind), name),
                    value,
                    "must be greater than or equal to 0",
                ));
            }
        }
    }
    for (name, value, amount) in &requests {
        if let Some((_, limit_value, limit)) =
            limits.iter().find(|(limit_name, _, _)| limit_name == name)
            && amount > limit
        {
            errors.push(FieldError::invalid(
                &key_path(&child_path(path, "requests"), name),
                value,
                &format!(
                    "must be less than or equal to {name} limit of {}",
                    limit_value
                        .as_str()
                        .map_or_else(|| limit_value.to_string(), str::to_string)
                ),
            ));
        }
    }
}

fn check_service(spec: &Value, errors: &mut Vec<FieldError>) {
    let headless = spec.get("clusterIP").and_then(Value::as_str) == Some("None");
    let external_name = spec.get("type").and_then(Value::as_str) == Some("ExternalName");
    let ports = array(spec.get("ports"));
    if ports.is_empty() && !headless && !external_name {
        errors.push(FieldError::required("spec.ports"));
    }
    let mut port_names = BTreeSet::new();
    for (index, port) in ports.iter().enumerate() {
        let path = index_path("spec.ports", index);
        match name_of(port) {
            Some(name) => {
                if !names::is_dns1123_label(name) {
                    errors.push(FieldError::invalid(
                        &child_path(&path, "name"),
                        &Value::from(name),
                        DNS1123_LABEL_ERROR,
                    ));
                }
                if !port_names.insert(name.to_string()) {
                    errors.push(FieldError::duplicate(
                        &child_path(&path, "name"),
                        &Value::from(name),
                    ));
                }
            }
            None if ports.len() > 1 => {
                errors.push(FieldError::required(&child_path(&path, "name")))
            }
            None => {}
        }
        if let Some(number) = port.get("port").and_then(Value::as_i64)
            && !(1..=65535).contains(&number)
        {
            errors.push(FieldError::invalid(
                &child_path(&path, "port"),
                &Value::from(number),
                "must be between 1 and 65535, inclusive",
            ));
        }
        match port.get("targetPort") {
            Some(Value::Number(number))
                if number.as_i64().is_none_or(|n| !(1..=65535).contains(&n)) =>
            {
                errors.push(FieldError::invalid(
                    &child_path(&path, "targetPort"),
                    &Value::Number(number.clone()),
                    "must be between 1 and 65535, inclusive",
                ));
            }
            Some(Value::String(name)) if !names::is_iana_svc_name(name) => {
                errors.push(FieldError::invalid(
                    &child_path(&path, "targetPort"),
                    &Value::from(name.as_str()),
                    "must contain only lowercase alphanumerics and '-', at most 15 characters, with at least one letter",
                ));
            }
            _ => {}
        }
    }
    if let Some(selector) = spec.get("selector").and_then(Value::as_object) {
        check_labels(selector, "spec.selector", errors);
    }
}

fn check_claim_spec(spec: &Value, path: &str, errors: &mut Vec<FieldError>) {
    if array(spec.get("accessModes")).is_empty() {
        errors.push(FieldError::required(&child_path(path, "accessModes")));
    }
    if spec.pointer("/resources/requests/storage").is_none() {
        errors.push(FieldError::required(&key_path(
            &child_path(path, "resources.requests"),
            "storage",
        )));
    }
}

/// Secrets: `stringData` is write-only; the server merges it into `data` (base64) and drops it.
pub(crate) fn fold_string_data(object: &mut Value) {
    let Some(map) = object.as_object_mut() else {
        return;
    };
    let Some(Value::Object(string_data)) = map.remove("stringData") else {
        return;
    };
    let data = map
        .entry("data")
        .or_insert_with(|| Value::Object(Map::new()));
    if let Some(data) = data.as_object_mut() {
        for (key, value) in string_data {
            let text = value.as_str().unwrap_or_default();
            data.insert(
                key,
                Value::from(base64::engine::general_purpose::STANDARD.encode(text)),
            );
        }
    }
}
