//! Where notebooks run, as the API reads it: a notebook's logs and pod, a namespace's volumes,
//! storage classes and PodDefaults. The routes ask [`Workloads`] and do not know which platform
//! answers: a Kubernetes cluster ([`crate::cluster::ClusterWorkloads`]) or the container engine of
//! `labforge up` (`labforge_embedded::engine_workloads`).

use bytes::Bytes;
use futures::stream::BoxStream;
use labforge_crds::notebook::Notebook;
use serde_json::Value;

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
    #[error(transparent)]
    Unavailable(#[from] crate::unavailable::Unavailable),
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
