//! Where notebooks run in a cluster: a notebook's pod and logs, a namespace's claims, storage
//! classes and PodDefaults, and the agent's SSH server reached through pods/exec.

use crate::unavailable::Unavailable;
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{DynamicObject, ListParams, LogParams};
use kube::discovery::ApiResource;
use labforge_crds::notebook::Notebook;
use serde_json::{Value, json};

use crate::model::NotebookState;
use crate::workloads::{
    AgentCommand, Claim, Holding, LogStream, NO_POD, SshStream, StorageClasses, WorkloadError,
    Workloads, redact_secret,
};

/// Notebooks in a Kubernetes cluster: pods, claims, storage classes and PodDefaults through its
/// API, as the web app's service account.
pub struct ClusterWorkloads {
    pub client: kube::Client,
}

fn unavailable(
    what: &str,
    error: impl Into<Box<dyn std::error::Error + Send + Sync>>,
) -> WorkloadError {
    Unavailable::new(what, error).into()
}

/// Kubeflow's PodDefault resource (`kubeflow.org/v1alpha1`).
fn pod_default_resource() -> ApiResource {
    ApiResource {
        group: "kubeflow.org".into(),
        version: "v1alpha1".into(),
        api_version: "kubeflow.org/v1alpha1".into(),
        kind: "PodDefault".into(),
        plural: "poddefaults".into(),
    }
}

impl ClusterWorkloads {
    fn log_error(ns: &str, pod: &str, error: kube::Error) -> WorkloadError {
        match error {
            // No pod yet, or its container not started: a state that passes.
            kube::Error::Api(status) if matches!(status.code, 400 | 404) => {
                WorkloadError::NotFound(status.message)
            }
            e => unavailable(&format!("reading the logs of pod {ns}/{pod}"), e),
        }
    }

    fn log_params(name: &str, follow: bool, tail: u32) -> LogParams {
        LogParams {
            container: Some(name.to_owned()),
            follow,
            tail_lines: Some(i64::from(tail)),
            ..Default::default()
        }
    }
}

#[async_trait::async_trait]
impl Workloads for ClusterWorkloads {
    async fn logs(
        &self,
        ns: &str,
        name: &str,
        follow: bool,
        tail: u32,
    ) -> Result<LogStream, WorkloadError> {
        use tokio_util::compat::FuturesAsyncReadCompatExt as _;
        let pods: kube::Api<Pod> = kube::Api::namespaced(self.client.clone(), ns);
        // The StatefulSet's one pod.
        let pod = format!("{name}-0");
        let reader = pods
            .log_stream(&pod, &Self::log_params(name, follow, tail))
            .await
            .map_err(|e| Self::log_error(ns, &pod, e))?;
        Ok(tokio_util::io::ReaderStream::new(reader.compat()).boxed())
    }

    async fn recent_logs(&self, ns: &str, name: &str, lines: u32) -> Result<String, WorkloadError> {
        let pods: kube::Api<Pod> = kube::Api::namespaced(self.client.clone(), ns);
        let pod = format!("{name}-0");
        pods.logs(&pod, &Self::log_params(name, false, lines))
            .await
            .map_err(|e| Self::log_error(ns, &pod, e))
    }

    async fn claims(&self, ns: &str) -> Result<Vec<Claim>, WorkloadError> {
        let api: kube::Api<PersistentVolumeClaim> = kube::Api::namespaced(self.client.clone(), ns);
        let list = api
            .list(&ListParams::default())
            .await
            .map_err(|e| unavailable(&format!("listing the volumes of {ns}"), e))?;
        let mut claims: Vec<Claim> = list
            .items
            .into_iter()
            .map(|claim| {
                let spec = claim.spec.unwrap_or_default();
                Claim {
                    name: claim.metadata.name.unwrap_or_default(),
                    size: spec
                        .resources
                        .and_then(|r| r.requests)
                        .and_then(|r| r.get("storage").map(|q| q.0.clone()))
                        .unwrap_or_default(),
                    mode: spec
                        .access_modes
                        .and_then(|m| m.into_iter().next())
                        .unwrap_or_default(),
                }
            })
            .collect();
        claims.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(claims)
    }

    async fn remove_claim(&self, ns: &str, name: &str) -> Result<(), WorkloadError> {
        // A claim may be mounted by anything in the namespace (a pipeline's pod, another
        // workload), which the web app cannot see, and the delete would be its own service
        // account's, not the user's.
        Err(WorkloadError::Unsupported(format!(
            "in a cluster, volume claims are deleted with kubectl by those RBAC lets (kubectl delete pvc {name} -n {ns})"
        )))
    }

    async fn storage_classes(&self) -> Result<StorageClasses, WorkloadError> {
        let classes: kube::Api<StorageClass> = kube::Api::all(self.client.clone());
        let list = classes
            .list(&ListParams::default())
            .await
            .map_err(|e| unavailable("listing storage classes", e))?;
        let is_default = |class: &StorageClass| {
            class.metadata.annotations.as_ref().is_some_and(|a| {
                [
                    "storageclass.kubernetes.io/is-default-class",
                    "storageclass.beta.kubernetes.io/is-default-class",
                ]
                .iter()
                .any(|key| a.get(*key).is_some_and(|v| v == "true"))
            })
        };
        let default = list
            .items
            .iter()
            .find(|c| is_default(c))
            .and_then(|c| c.metadata.name.clone())
            .unwrap_or_default();
        let names = list
            .items
            .into_iter()
            .filter_map(|c| c.metadata.name)
            .collect();
        Ok(StorageClasses { names, default })
    }

    async fn pod_defaults(&self, ns: &str) -> Result<Vec<Value>, WorkloadError> {
        let api: kube::Api<DynamicObject> =
            kube::Api::namespaced_with(self.client.clone(), ns, &pod_default_resource());
        let items = match api.list(&ListParams::default()).await {
            Ok(list) => list.items,
            // No PodDefault CRD in this cluster.
            Err(kube::Error::Api(status)) if status.code == 404 => Vec::new(),
            Err(e) => return Err(unavailable(&format!("listing the PodDefaults of {ns}"), e)),
        };
        Ok(items
            .into_iter()
            .map(|item| {
                let name = item.metadata.name.clone().unwrap_or_default();
                let mut value = serde_json::to_value(&item).unwrap_or_default();
                let label = value
                    .pointer("/spec/selector/matchLabels")
                    .and_then(Value::as_object)
                    .and_then(|labels| labels.keys().next().cloned())
                    .unwrap_or_default();
                let desc = value
                    .pointer("/spec/desc")
                    .and_then(Value::as_str)
                    .map_or(name, str::to_owned);
                value["label"] = label.into();
                value["desc"] = desc.into();
                if let Some(env) = value.pointer_mut("/spec/env").and_then(Value::as_array_mut) {
                    for var in env {
                        let name = var["name"].clone();
                        *var = json!({ "name": name });
                    }
                }
                value
            })
            .collect())
    }

    async fn pod(
        &self,
        notebook: &Notebook,
        _state: NotebookState,
    ) -> Result<Value, WorkloadError> {
        let ns = notebook.metadata.namespace.clone().unwrap_or_default();
        let name = notebook.metadata.name.clone().unwrap_or_default();
        let pods: kube::Api<Pod> = kube::Api::namespaced(self.client.clone(), &ns);
        let found = pods
            .get_opt(&format!("{name}-0"))
            .await
            .map_err(|e| unavailable(&format!("reading the pod of {ns}/{name}"), e))?;
        // Only the notebook's own pod: another pod labelled the same is not it.
        let found = found.filter(|p| {
            p.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("notebook-name"))
                == Some(&name)
        });
        let mut pod =
            serde_json::to_value(found.ok_or_else(|| WorkloadError::NotFound(NO_POD.to_owned()))?)
                .unwrap_or_default();
        redact_secret(&mut pod);
        Ok(pod)
    }

    /// Through `pods/exec`, in the notebook's container of pod `<name>-0`, where the controller
    /// put the agent (with `LABFORGE_AGENT_IMAGE`, as for saves).
    async fn agent(
        &self,
        ns: &str,
        name: &str,
        command: AgentCommand,
    ) -> Result<SshStream, WorkloadError> {
        let pods: kube::Api<Pod> = kube::Api::namespaced(self.client.clone(), ns);
        let pod_name = format!("{name}-0");
        let pod = pods
            .get_opt(&pod_name)
            .await
            .map_err(|e| unavailable(&format!("reading the pod of {ns}/{name}"), e))?
            .ok_or_else(|| WorkloadError::NotFound(NO_POD.to_owned()))?;
        let agent_dir = labforge_notebook_controller::builders::AGENT_DIR;
        let has_agent = pod
            .spec
            .iter()
            .flat_map(|spec| &spec.containers)
            .filter(|c| c.name == name)
            .flat_map(|c| c.volume_mounts.iter().flatten())
            .any(|m| m.mount_path == agent_dir);
        if !has_agent {
            return Err(WorkloadError::Unsupported(format!(
                "notebook {ns}/{name} runs without labforge's agent, which serves SSH and ports: \
                 the controller adds it to notebooks started while LABFORGE_AGENT_IMAGE is set"
            )));
        }
        let params = kube::api::AttachParams::default()
            .container(name)
            .stdin(true)
            .stdout(true)
            .stderr(false);
        let mut process = pods
            .exec(&pod_name, command.command_line(), &params)
            .await
            .map_err(|e| unavailable(&format!("starting the agent in {ns}/{name}"), e))?;
        let (Some(stdout), Some(stdin)) = (process.stdout(), process.stdin()) else {
            return Err(Unavailable::said("exec gave no stdin or stdout").into());
        };
        Ok(Box::new(Holding {
            io: tokio::io::join(stdout, stdin),
            _held: process,
        }))
    }
}
