//! Where notebooks run, as the API reads it: a notebook's logs and pod, a namespace's volumes,
//! storage classes and PodDefaults. The routes ask [`Workloads`] and do not know which platform
//! answers: a Kubernetes cluster ([`ClusterWorkloads`], here) or the container engine of
//! `labforge up` (`labforge_embedded::engine_workloads`).

use bytes::Bytes;
use futures::StreamExt as _;
use futures::stream::BoxStream;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{DynamicObject, ListParams, LogParams};
use kube::discovery::ApiResource;
use labforge_crds::notebook::Notebook;
use serde_json::{Value, json};

use crate::model::NotebookState;

/// A log as it comes.
pub type LogStream = BoxStream<'static, std::io::Result<Bytes>>;

/// Bytes both ways: a program's stdin and stdout, as exec carries them.
pub trait Duplex: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin> Duplex for T {}

/// The stdin and stdout of a notebook's SSH server: one connection.
pub type SshStream = Box<dyn Duplex>;

/// What the agent writes first for [`AgentCommand::Connect`] once it has connected (the agent's
/// `ports::CONNECTED`).
pub const AGENT_CONNECTED: &str = "ok";

/// What the agent labforge mounts in a notebook's container is started for, on stdin and stdout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentCommand {
    /// Serve one SSH connection.
    Ssh,
    /// List the TCP ports something listens on, as JSON.
    Ports,
    /// Carry one connection to this port on the container's loopback.
    Connect(u16),
}

impl AgentCommand {
    /// The command line in the container.
    pub fn command_line(self) -> Vec<String> {
        let agent_dir = labforge_notebook_controller::builders::AGENT_DIR;
        let mut line = vec![format!("{agent_dir}/labforge-agent")];
        match self {
            Self::Ssh => line.push("ssh".into()),
            Self::Ports => line.push("ports".into()),
            Self::Connect(port) => line.extend(["connect".into(), port.to_string()]),
        }
        line
    }
}

/// Why a workload could not be read or changed.
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    /// Not there (yet): no pod, no container, no log.
    #[error("{0}")]
    NotFound(String),
    /// Refused as things are: a volume still in use.
    #[error("{0}")]
    Conflict(String),
    /// Not done on this platform, and why.
    #[error("{0}")]
    Unsupported(String),
    /// The platform did not answer.
    #[error("{0}")]
    Unavailable(String),
}

/// A volume claim, as Kubeflow's form lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub name: String,
    /// The requested size; empty where volumes have none of their own.
    pub size: String,
    /// The first access mode.
    pub mode: String,
}

/// The platform's storage classes and its default one (empty when none is marked).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StorageClasses {
    pub names: Vec<String>,
    pub default: String,
}

#[async_trait::async_trait]
pub trait Workloads: Send + Sync {
    /// The last `tail` lines of notebook `ns/name`'s log, then, when `follow`, what it logs next.
    async fn logs(
        &self,
        ns: &str,
        name: &str,
        follow: bool,
        tail: u32,
    ) -> Result<LogStream, WorkloadError>;

    /// The last `lines` lines of the notebook's log, whole.
    async fn recent_logs(&self, ns: &str, name: &str, lines: u32) -> Result<String, WorkloadError>;

    /// The namespace's volume claims, sorted by name.
    async fn claims(&self, ns: &str) -> Result<Vec<Claim>, WorkloadError>;

    /// Deletes claim `name` of `ns` and its data.
    async fn remove_claim(&self, ns: &str, name: &str) -> Result<(), WorkloadError>;

    async fn storage_classes(&self) -> Result<StorageClasses, WorkloadError>;

    /// The namespace's PodDefaults as the API serves them: whole, but each env var by name only
    /// (a value may be a credential). None where PodDefaults are not installed.
    async fn pod_defaults(&self, ns: &str) -> Result<Vec<Value>, WorkloadError>;

    /// The pod `notebook` runs in (`<name>-0`), without the notebook's secret; `state` is the
    /// notebook's as the API shows it.
    async fn pod(&self, notebook: &Notebook, state: NotebookState) -> Result<Value, WorkloadError>;

    /// Starts the agent for `command` in running notebook `ns/name`'s container, as its user,
    /// and gives its stdin and stdout; the process ends when the stream is dropped.
    async fn agent(
        &self,
        ns: &str,
        name: &str,
        command: AgentCommand,
    ) -> Result<SshStream, WorkloadError> {
        let _ = (ns, name, command);
        Err(WorkloadError::Unsupported(
            "reaching into notebooks (SSH, ports) is not available on this platform".into(),
        ))
    }

    /// One SSH connection to notebook `ns/name` ([`AgentCommand::Ssh`]).
    async fn ssh(&self, ns: &str, name: &str) -> Result<SshStream, WorkloadError> {
        self.agent(ns, name, AgentCommand::Ssh).await
    }
}

/// The pod of a notebook that has none.
pub const NO_POD: &str = "No pod detected.";

/// The notebook's own secret (what its route presents to its server) out of a pod's containers:
/// a viewer of the namespace may read the pod, not open its server past the proxy.
pub fn redact_secret(pod: &mut Value) {
    let containers = pod
        .pointer_mut("/spec/containers")
        .and_then(Value::as_array_mut);
    for container in containers.into_iter().flatten() {
        if let Some(env) = container.get_mut("env").and_then(Value::as_array_mut) {
            env.retain(|var| var["name"] != labforge_notebook_controller::secret::SECRET_ENV);
        }
    }
}

/// Notebooks in a Kubernetes cluster: pods, claims, storage classes and PodDefaults through its
/// API, as the web app's service account.
pub struct ClusterWorkloads {
    pub client: kube::Client,
}

fn unavailable(what: &str, error: impl std::fmt::Display) -> WorkloadError {
    WorkloadError::Unavailable(format!("{what}: {error}"))
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
            return Err(WorkloadError::Unavailable(
                "exec gave no stdin or stdout".into(),
            ));
        };
        Ok(Box::new(Holding {
            io: tokio::io::join(stdout, stdin),
            _held: process,
        }))
    }
}

/// A stream, and what must live as long as it (a child process, an exec session).
pub struct Holding<T, H> {
    pub io: T,
    pub _held: H,
}

impl<T: tokio::io::AsyncRead + Unpin, H: Unpin> tokio::io::AsyncRead for Holding<T, H> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: tokio::io::AsyncWrite + Unpin, H: Unpin> tokio::io::AsyncWrite for Holding<T, H> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write(cx, buf)
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
