//! The Notebook resource, shaped exactly like Kubeflow's so existing CRs keep working.

use k8s_openapi::api::core::v1::{Container, ContainerState, PodSpec};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Annotation whose presence stops a notebook (its StatefulSet scales to 0).
pub const STOP_ANNOTATION: &str = "kubeflow-resource-stopped";
/// Annotation the culler and the proxy keep up to date with the last activity (RFC 3339).
pub const LAST_ACTIVITY_ANNOTATION: &str = "notebooks.kubeflow.org/last-activity";
/// When the culler last checked activity (RFC 3339).
pub const LAST_ACTIVITY_CHECK_ANNOTATION: &str =
    "notebooks.kubeflow.org/last_activity_check_timestamp";
/// Replaces the VirtualService rewrite target (`/` for code-server and other apps without a base URL).
pub const REWRITE_URI_ANNOTATION: &str = "notebooks.kubeflow.org/http-rewrite-uri";
/// JSON object of request headers the VirtualService sets.
pub const HEADERS_REQUEST_SET_ANNOTATION: &str = "notebooks.kubeflow.org/http-headers-request-set";
/// Who created the notebook (set by the web app), used for authorization and the admin view.
pub const CREATOR_ANNOTATION: &str = "notebooks.kubeflow.org/creator";
/// Which IDE a notebook runs, as Kubeflow's web app marks it.
pub const SERVER_TYPE_ANNOTATION: &str = "notebooks.kubeflow.org/server-type";
/// [`SERVER_TYPE_ANNOTATION`]'s value for VSCode (code-server), Kubeflow's `group-one`.
pub const VSCODE_SERVER_TYPE: &str = "group-one";
/// The users a notebook is shared with, comma-separated: each may see and open that notebook
/// (and works as its owner there). Only those who may update the Notebook can set it; the
/// notebook's VirtualService carries it for the proxy.
pub const SHARED_WITH_ANNOTATION: &str = "labforge.dev/shared-with";
/// The sizes asked for each new volume, as JSON (claim name → quantity). In a cluster the web
/// app makes PVCs of these sizes; embedded, each podman volume is labelled with its size.
pub const VOLUME_SIZES_ANNOTATION: &str = "labforge.dev/volume-sizes";
/// Label Kubeflow puts on a notebook's pods.
pub const NOTEBOOK_NAME_LABEL: &str = "notebook-name";
/// Label selecting a notebook's StatefulSet pods.
pub const STATEFULSET_LABEL: &str = "statefulset";

/// A JupyterLab, VSCode or other web IDE server: a pod template, run as a one-replica StatefulSet.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "kubeflow.org",
    version = "v1",
    kind = "Notebook",
    plural = "notebooks",
    namespaced,
    derive = "PartialEq",
    status = "NotebookStatus",
    printcolumn = r#"{"name":"Ready","type":"integer","jsonPath":".status.readyReplicas"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
pub struct NotebookSpec {
    pub template: NotebookTemplateSpec,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct NotebookTemplateSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<PodSpec>,
}

/// Kubeflow's status: the pod's conditions, the StatefulSet's ready replicas and the notebook
/// container's state. All three are required by Kubeflow's schema, so they are always written.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NotebookStatus {
    pub conditions: Vec<NotebookCondition>,
    pub ready_replicas: i32,
    pub container_state: ContainerState,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NotebookCondition {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_probe_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl Notebook {
    /// The PersistentVolumeClaims its pod mounts (workspace and data volumes).
    pub fn claim_names(&self) -> impl Iterator<Item = &str> {
        self.spec
            .template
            .spec
            .as_ref()
            .and_then(|pod| pod.volumes.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|volume| volume.persistent_volume_claim.as_ref())
            .map(|claim| claim.claim_name.as_str())
    }

    /// Whether the stop annotation is present (its value does not matter, as in Kubeflow).
    pub fn is_stopped(&self) -> bool {
        self.metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(STOP_ANNOTATION))
    }

    /// The notebook's own container: the first of the pod template, as in Kubeflow (the
    /// controller names the StatefulSet's pod after the Notebook and keeps this container first).
    pub fn container(&self) -> Option<&Container> {
        self.spec.template.spec.as_ref()?.containers.first()
    }

    pub fn container_mut(&mut self) -> Option<&mut Container> {
        self.spec.template.spec.as_mut()?.containers.first_mut()
    }

    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .map(String::as_str)
    }

    /// The users the notebook is shared with ([`SHARED_WITH_ANNOTATION`]), in order.
    pub fn shared_with(&self) -> Vec<&str> {
        shared_with(self.annotation(SHARED_WITH_ANNOTATION))
    }

    /// The sizes its new volumes were asked with ([`VOLUME_SIZES_ANNOTATION`]); empty when
    /// the annotation is absent or not such a map.
    pub fn volume_sizes(&self) -> std::collections::BTreeMap<String, String> {
        self.annotation(VOLUME_SIZES_ANNOTATION)
            .and_then(|json| serde_json::from_str(json).ok())
            .unwrap_or_default()
    }
}

/// The user names in a [`SHARED_WITH_ANNOTATION`] value.
pub fn shared_with(annotation: Option<&str>) -> Vec<&str> {
    annotation
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|user| !user.is_empty())
        .collect()
}

/// The Notebook CRD: v1 (storage), v1beta1 and v1alpha1 served with the same schema.
///
/// Descriptions are stripped, as Kubeflow's controller-gen does (`maxDescLen=0`): three copies of a
/// documented PodSpec would approach etcd's 1.5 MiB object limit.
pub fn crd() -> CustomResourceDefinition {
    let mut crd = without_descriptions(Notebook::crd());
    if let Some(v1) = crd.spec.versions.first().cloned() {
        for name in ["v1beta1", "v1alpha1"] {
            let mut version = v1.clone();
            version.name = name.to_owned();
            version.storage = false;
            crd.spec.versions.push(version);
        }
    }
    crd
}

fn without_descriptions(crd: CustomResourceDefinition) -> CustomResourceDefinition {
    fn strip(value: &mut serde_json::Value) {
        match value {
            serde_json::Value::Object(map) => {
                if map
                    .get("description")
                    .is_some_and(serde_json::Value::is_string)
                {
                    map.remove("description");
                }
                map.values_mut().for_each(strip);
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    let Ok(mut value) = serde_json::to_value(&crd) else {
        return crd;
    };
    if let Some(versions) = value.pointer_mut("/spec/versions") {
        strip(versions);
    }
    serde_json::from_value(value).unwrap_or(crd)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The CRD lets quantities be JSON numbers (`x-kubernetes-int-or-string`) and the API
    /// server keeps a custom resource as written: one such Notebook must not fail every list.
    #[test]
    fn quantities_written_as_numbers_are_read() {
        let notebook: Notebook = serde_json::from_value(json!({
            "apiVersion": "kubeflow.org/v1", "kind": "Notebook",
            "metadata": {"name": "gpu", "namespace": "alice"},
            "spec": {"template": {"spec": {
                "containers": [{"name": "gpu", "image": "x",
                    "resources": {"limits": {"nvidia.com/gpu": 1, "cpu": 0.5, "memory": "1Gi"}}}],
                "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": 1024}}]
            }}}
        }))
        .expect("a Notebook with number quantities is read");
        let resources = notebook.container().unwrap().resources.as_ref().unwrap();
        let limits = resources.limits.as_ref().unwrap();
        assert_eq!(limits["nvidia.com/gpu"].0, "1");
        assert_eq!(limits["cpu"].0, "0.5");
        assert_eq!(limits["memory"].0, "1Gi");
        let volumes = notebook
            .spec
            .template
            .spec
            .as_ref()
            .unwrap()
            .volumes
            .as_ref();
        let size = volumes.unwrap()[0]
            .empty_dir
            .as_ref()
            .unwrap()
            .size_limit
            .as_ref();
        assert_eq!(size.unwrap().0, "1024");
    }
}
