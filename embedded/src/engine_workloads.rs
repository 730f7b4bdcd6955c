//! [`Workloads`] of `labforge up`: notebooks are containers of the engine (podman or docker), and
//! their volumes the engine's volumes. What only Kubernetes has (storage classes, PodDefaults) is
//! empty here, and the container stands for the pod.

use crate::runtime::{Engine, EngineError, container_name, volume_in_use};
use futures::StreamExt as _;
use labforge_crds::notebook::Notebook;
use labforge_web::model::NotebookState;
use labforge_web::unavailable::Unavailable;
use labforge_web::workloads::{
    AgentCommand, Claim, Holding, LogStream, NO_POD, SshStream, StorageClasses, WorkloadError,
    Workloads, redact_secret,
};
use serde_json::{Value, json};

pub struct EngineWorkloads {
    pub engine: Engine,
}

impl EngineWorkloads {
    fn log_child(
        &self,
        ns: &str,
        name: &str,
        follow: bool,
        tail: u32,
    ) -> Result<tokio::process::Child, WorkloadError> {
        self.engine
            .logs(&container_name(ns, name), follow, tail)
            .map_err(|e| WorkloadError::from(Unavailable::new("reading logs", e)))
    }
}

#[async_trait::async_trait]
impl Workloads for EngineWorkloads {
    async fn logs(
        &self,
        ns: &str,
        name: &str,
        follow: bool,
        tail: u32,
    ) -> Result<LogStream, WorkloadError> {
        let mut child = self.log_child(ns, name, follow, tail)?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| WorkloadError::from(Unavailable::said("no log stream")))?;
        // The engine's own complaint when the container is replaced while its log is followed (a
        // restart onto another image) is not the notebook's log: its lines are kept out.
        let gone = format!(
            "Error: no container with name or ID \"{}\" found",
            container_name(ns, name)
        );
        let lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stdout));
        // The child lives as long as the stream: a client that goes away kills it.
        Ok(
            futures::stream::unfold(Some((lines, child)), move |reading| {
                let gone = gone.clone();
                async move {
                    let (mut lines, child) = reading?;
                    loop {
                        match lines.next_line().await {
                            Ok(Some(line)) if line.starts_with(&gone) => continue,
                            Ok(Some(line)) => {
                                let chunk = bytes::Bytes::from(format!("{line}\n"));
                                return Some((Ok(chunk), Some((lines, child))));
                            }
                            Ok(None) => return None,
                            // Said once; the stream ends there.
                            Err(err) => return Some((Err(err), None)),
                        }
                    }
                }
            })
            .boxed(),
        )
    }

    async fn agent(
        &self,
        ns: &str,
        name: &str,
        command: AgentCommand,
    ) -> Result<SshStream, WorkloadError> {
        let unavailable = |e: std::io::Error| {
            WorkloadError::from(Unavailable::new(
                format!("starting the agent in {ns}/{name}"),
                e,
            ))
        };
        let command = command.command_line();
        let command: Vec<&str> = command.iter().map(String::as_str).collect();
        let mut child = self
            .engine
            .exec_stdio(&container_name(ns, name), &command)
            .map_err(unavailable)?;
        let (Some(stdout), Some(stdin)) = (child.stdout.take(), child.stdin.take()) else {
            return Err(Unavailable::said("exec gave no stdin or stdout").into());
        };
        // The child lives as long as the stream: dropping it kills the exec.
        Ok(Box::new(Holding {
            io: tokio::io::join(stdout, stdin),
            _held: child,
        }))
    }

    async fn recent_logs(&self, ns: &str, name: &str, lines: u32) -> Result<String, WorkloadError> {
        let child = self.log_child(ns, name, false, lines)?;
        let output = child
            .wait_with_output()
            .await
            .map_err(|e| WorkloadError::from(Unavailable::new("reading logs", e)))?;
        if !output.status.success() {
            return Err(WorkloadError::NotFound(NO_POD.to_owned()));
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// Engine volumes have no size of their own: each has the one it was asked with as a label
    /// (none for volumes made before). One container mounts them at a time.
    async fn claims(&self, ns: &str) -> Result<Vec<Claim>, WorkloadError> {
        let names = self.engine.claims(ns).await.map_err(|e| {
            WorkloadError::from(Unavailable::new(format!("listing the volumes of {ns}"), e))
        })?;
        Ok(names
            .into_iter()
            .map(|(name, size)| Claim {
                name,
                size,
                mode: "ReadWriteOnce".into(),
            })
            .collect())
    }

    async fn remove_claim(&self, ns: &str, name: &str) -> Result<(), WorkloadError> {
        self.engine
            .remove_volume(ns, name)
            .await
            .map_err(|e| match e {
                EngineError::Failed { ref stderr, .. } if volume_in_use(stderr) => {
                    WorkloadError::Conflict(format!("volume {name} is still in use by a container"))
                }
                other => Unavailable::new(format!("deleting volume {name} of {ns}"), other).into(),
            })
    }

    async fn storage_classes(&self) -> Result<StorageClasses, WorkloadError> {
        Ok(StorageClasses::default())
    }

    async fn pod_defaults(&self, _ns: &str) -> Result<Vec<Value>, WorkloadError> {
        Ok(Vec::new())
    }

    /// The container in a pod's shape: its name, the `notebook-name` label and the notebook's
    /// container spec.
    async fn pod(&self, notebook: &Notebook, state: NotebookState) -> Result<Value, WorkloadError> {
        if notebook.is_stopped() {
            return Err(WorkloadError::NotFound(NO_POD.to_owned()));
        }
        let ns = notebook.metadata.namespace.clone().unwrap_or_default();
        let name = notebook.metadata.name.clone().unwrap_or_default();
        let phase = match state {
            NotebookState::Ready => "Running",
            NotebookState::Error => "Failed",
            _ => "Pending",
        };
        let mut pod = json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": format!("{name}-0"),
                "namespace": ns,
                "labels": { "notebook-name": name },
                "annotations": { "labforge.dev/container": container_name(&ns, &name) },
            },
            "spec": { "containers": notebook.container().into_iter().collect::<Vec<_>>() },
            "status": { "phase": phase },
        });
        redact_secret(&mut pod);
        Ok(pod)
    }
}
