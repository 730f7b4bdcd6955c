//! The embedded mode's kubelet: realizes each stored Notebook's pod, as the controller's builders
//! produce it, as one podman (or docker) container, and registers its route with the proxy.
//!
//! The plan for a container ([`ContainerPlan`]) is a pure function of the Notebook, tested without
//! podman. Containers carry labels naming their notebook and a digest of their plan, so after a
//! restart of `labforge up` the runtime adopts what is running instead of starting it twice, and
//! replaces a container whose notebook changed (a new image, say). Workspaces are named volumes,
//! kept on stop and on delete.

use crate::model::AUTO_SAVE_ANNOTATION;
use crate::store::{Change, Store};
use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting, PodSpec,
};
use labforge_crds::istio::VirtualService;
use labforge_crds::notebook::{
    Notebook, NotebookCondition, NotebookStatus, REWRITE_URI_ANNOTATION,
};
use labforge_notebook_controller::builders::{self, BuilderConfig};
use labforge_proxy::source::RouteStore;
use sha2::Digest as _;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::process::Command;

/// Names the labforge instance (its data dir) that manages a container: several instances on one
/// machine must never adopt or remove each other's notebooks.
pub const MANAGED_LABEL: &str = "dev.labforge.managed";
pub const NOTEBOOK_LABEL: &str = "dev.labforge.notebook";
pub const PLAN_LABEL: &str = "dev.labforge.plan";
pub const PORT_LABEL: &str = "dev.labforge.port";
pub const DEVICES_LABEL: &str = "dev.labforge.devices";
/// Where the agent directory is mounted (read-only) in every notebook container.
pub const AGENT_MOUNT: &str = "/.labforge/agent";
/// How often everything is looked at even when nothing was announced (containers that exited).
const RESYNC: Duration = Duration::from_secs(3);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PlanError {
    #[error(transparent)]
    Build(#[from] builders::BuildError),
    #[error("{0}")]
    Unsupported(String),
}

/// One notebook's container, as `<engine> run` arguments.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerPlan {
    pub name: String,
    pub image: String,
    /// Everything between `run -d` and the image, except the published port.
    pub options: Vec<String>,
    pub command: Vec<String>,
    pub container_port: i32,
    /// Digest of all of the above: a container with another digest is replaced.
    pub digest: String,
}

/// The container name of a notebook.
pub fn container_name(namespace: &str, name: &str) -> String {
    format!("labforge-{namespace}-{name}")
}

/// The podman volume standing in for a PersistentVolumeClaim.
pub fn volume_name(namespace: &str, claim: &str) -> String {
    format!("labforge-{namespace}-{claim}")
}

/// A CPU limit as `--cpus` wants it. Raised to [`validate::MIN_CPU`](crate::validate::MIN_CPU)
/// and never dropped: a notebook stored before validation refused less (or written to the store
/// directly) must not get `--cpus 0.000`, which podman reads as no limit.
fn cpus(quantity: &str) -> Result<String, PlanError> {
    let value = crate::validate::quantity("cpu", quantity)
        .map_err(|err| PlanError::Unsupported(format!("the CPU limit: {err}")))?;
    Ok(format!("{:.3}", value.max(crate::validate::MIN_CPU)))
}

#[cfg(test)]
mod quantity_tests;

/// A memory limit as `--memory` wants it, in bytes, raised to
/// [`validate::MIN_MEMORY`](crate::validate::MIN_MEMORY): `--memory 0` is no limit.
fn memory_bytes(quantity: &str) -> Result<String, PlanError> {
    let value = crate::validate::quantity("memory", quantity)
        .map_err(|err| PlanError::Unsupported(format!("the memory limit: {err}")))?;
    Ok(format!(
        "{}",
        value.max(crate::validate::MIN_MEMORY).round() as u64
    ))
}

fn bytes(quantity: &str) -> Option<String> {
    let value = crate::validate::quantity("memory", quantity).ok()?;
    Some(format!("{}", value.round() as u64))
}

/// Plans the container of `notebook`, from the pod template the controller would give Kubernetes.
pub fn plan(
    notebook: &Notebook,
    config: &BuilderConfig,
    agent_dir: Option<&std::path::Path>,
    gpu_devices: &[String],
) -> Result<ContainerPlan, PlanError> {
    let namespace = notebook.metadata.namespace.clone().unwrap_or_default();
    let name = notebook.metadata.name.clone().unwrap_or_default();
    let stateful_set = builders::stateful_set(notebook, config)?;
    let pod: PodSpec = stateful_set
        .spec
        .and_then(|s| s.template.spec)
        .ok_or(builders::BuildError::NoContainers)?;
    let container = pod
        .containers
        .first()
        .ok_or(builders::BuildError::NoContainers)?;
    let image = container
        .image
        .clone()
        .filter(|i| !i.is_empty())
        .ok_or_else(|| PlanError::Unsupported("the notebook's container has no image".into()))?;
    let container_port = builders::container_port(notebook);
    let mut options: Vec<String> = vec![
        "--name".into(),
        container_name(&namespace, &name),
        "--label".into(),
        format!("{NOTEBOOK_LABEL}={namespace}/{name}"),
        "--hostname".into(),
        name.clone(),
    ];
    if let Some(dir) = &container.working_dir {
        options.extend(["--workdir".into(), dir.clone()]);
    }
    for var in container.env.iter().flatten() {
        match &var.value {
            Some(value) => options.extend(["--env".into(), format!("{}={value}", var.name)]),
            None if var.value_from.is_some() => {
                return Err(PlanError::Unsupported(format!(
                    "env {} comes from a reference, which the embedded mode cannot resolve",
                    var.name
                )));
            }
            None => options.extend(["--env".into(), format!("{}=", var.name)]),
        }
    }
    let volumes: HashMap<&str, &k8s_openapi::api::core::v1::Volume> = pod
        .volumes
        .iter()
        .flatten()
        .map(|v| (v.name.as_str(), v))
        .collect();
    for mount in container.volume_mounts.iter().flatten() {
        if mount.mount_path == AGENT_MOUNT {
            continue;
        }
        let volume = volumes.get(mount.name.as_str()).ok_or_else(|| {
            PlanError::Unsupported(format!("volume mount {} names no volume", mount.name))
        })?;
        let read_only = if mount.read_only == Some(true) {
            ":ro"
        } else {
            ""
        };
        if let Some(claim) = &volume.persistent_volume_claim {
            options.extend([
                "--volume".into(),
                format!(
                    "{}:{}{read_only}",
                    volume_name(&namespace, &claim.claim_name),
                    mount.mount_path
                ),
            ]);
        } else if let Some(empty) = &volume.empty_dir {
            if empty.medium.as_deref() == Some("Memory") && mount.mount_path == "/dev/shm" {
                let size = empty
                    .size_limit
                    .as_ref()
                    .and_then(|q| bytes(&q.0))
                    .unwrap_or_else(|| "67108864".into());
                options.extend(["--shm-size".into(), size]);
            } else {
                options.extend(["--tmpfs".into(), mount.mount_path.clone()]);
            }
        } else {
            return Err(PlanError::Unsupported(format!(
                "volume {} is neither a PersistentVolumeClaim nor an emptyDir",
                mount.name
            )));
        }
    }
    if let Some(resources) = &container.resources
        && let Some(limits) = &resources.limits
    {
        if let Some(cpu) = limits.get("cpu") {
            options.extend(["--cpus".into(), cpus(&cpu.0)?]);
        }
        if let Some(memory) = limits.get("memory") {
            options.extend(["--memory".into(), memory_bytes(&memory.0)?]);
        }
    }
    for device in gpu_devices {
        options.extend(["--device".into(), device.clone()]);
    }
    if !gpu_devices.is_empty() {
        options.extend([
            "--label".into(),
            format!("{DEVICES_LABEL}={}", gpu_devices.join(",")),
        ]);
    }
    if let Some(dir) = agent_dir {
        options.extend([
            "--volume".into(),
            format!("{}:{AGENT_MOUNT}:ro", dir.display()),
        ]);
    }
    if let Some(user) = pod
        .security_context
        .as_ref()
        .and_then(|s| s.run_as_user)
        .or_else(|| {
            container
                .security_context
                .as_ref()
                .and_then(|s| s.run_as_user)
        })
    {
        options.extend(["--user".into(), user.to_string()]);
    }
    let mut command = Vec::new();
    if let Some(entrypoint) = &container.command {
        options.extend([
            "--entrypoint".into(),
            serde_json::to_string(entrypoint).unwrap_or_default(),
        ]);
    }
    command.extend(container.args.iter().flatten().cloned());

    let mut hasher = sha2::Sha256::new();
    for part in options.iter().chain([&image]).chain(&command) {
        hasher.update(part.as_bytes());
        hasher.update([0]);
    }
    let digest = hex::encode(&hasher.finalize()[..12]);
    options.extend(["--label".into(), format!("{PLAN_LABEL}={digest}")]);
    Ok(ContainerPlan {
        name: container_name(&namespace, &name),
        image,
        options,
        command,
        container_port,
        digest,
    })
}

/// The route of `notebook`, pointed at its container's published port.
pub fn route(
    notebook: &Notebook,
    config: &BuilderConfig,
    host_port: u16,
) -> Result<VirtualService, builders::BuildError> {
    let mut vs = builders::virtual_service(notebook, config)?;
    for rule in &mut vs.spec.http {
        for destination in &mut rule.route {
            destination.destination.host = "127.0.0.1".into();
            if let Some(port) = destination.destination.port.as_mut() {
                port.number = u32::from(host_port);
            }
        }
    }
    // Merge order among VirtualServices is by creation time, as in Istio.
    vs.metadata.creation_timestamp = notebook.metadata.creation_timestamp.clone();
    Ok(vs)
}

/// The path a notebook answers on once it is up (its route's rewrite target).
pub fn probe_path(notebook: &Notebook) -> String {
    let namespace = notebook.metadata.namespace.as_deref().unwrap_or_default();
    let name = notebook.metadata.name.as_deref().unwrap_or_default();
    notebook
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(REWRITE_URI_ANNOTATION))
        .filter(|uri| !uri.is_empty())
        .cloned()
        .unwrap_or_else(|| format!("{}/", builders::route_prefix(namespace, name)))
}

/// A container as `<engine> ps` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunningContainer {
    pub name: String,
    pub notebook: (String, String),
    pub plan: String,
    pub port: Option<u16>,
    /// CDI devices it was given.
    pub devices: Vec<String>,
    pub running: bool,
    pub exit_code: Option<i32>,
    pub state: String,
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("running {program}: {source}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{command} failed: {stderr}")]
    Failed { command: String, stderr: String },
    #[error("{0}")]
    Output(String),
}

/// podman or docker, through its CLI.
#[derive(Clone, Debug)]
pub struct Engine {
    pub program: PathBuf,
    /// Registries pulled from over plain HTTP (the local registry).
    pub insecure_registries: Vec<String>,
    /// This labforge instance's id (see [`MANAGED_LABEL`]).
    pub instance: String,
}

impl Engine {
    async fn run(&self, args: &[String]) -> Result<String, EngineError> {
        let output = Command::new(&self.program)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .await
            .map_err(|source| EngineError::Spawn {
                program: self.program.display().to_string(),
                source,
            })?;
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).into_owned())
        } else {
            Err(EngineError::Failed {
                command: format!(
                    "{} {}",
                    self.program.display(),
                    args.first().map(String::as_str).unwrap_or_default()
                ),
                stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
            })
        }
    }

    /// Every container labforge manages, running or not.
    pub async fn containers(&self) -> Result<Vec<RunningContainer>, EngineError> {
        let out = self
            .run(&[
                "ps".into(),
                "--all".into(),
                "--filter".into(),
                format!("label={MANAGED_LABEL}={}", self.instance),
                "--format".into(),
                "json".into(),
            ])
            .await?;
        let list: Vec<serde_json::Value> = if out.trim().is_empty() {
            Vec::new()
        } else {
            serde_json::from_str(&out).map_err(|e| EngineError::Output(e.to_string()))?
        };
        Ok(list
            .iter()
            .filter_map(|c| {
                let labels = &c["Labels"];
                let (ns, name) = labels[NOTEBOOK_LABEL].as_str()?.split_once('/')?;
                let state = c["State"].as_str().unwrap_or_default().to_owned();
                Some(RunningContainer {
                    name: c["Names"][0].as_str().unwrap_or_default().to_owned(),
                    notebook: (ns.to_owned(), name.to_owned()),
                    plan: labels[PLAN_LABEL].as_str().unwrap_or_default().to_owned(),
                    port: labels[PORT_LABEL].as_str().and_then(|p| p.parse().ok()),
                    devices: labels[DEVICES_LABEL]
                        .as_str()
                        .map(|d| d.split(',').map(str::to_owned).collect())
                        .unwrap_or_default(),
                    running: state == "running",
                    exit_code: c["ExitCode"].as_i64().map(|c| c as i32),
                    state,
                })
            })
            .collect())
    }

    fn insecure(&self, image: &str) -> bool {
        self.insecure_registries
            .iter()
            .any(|r| image.starts_with(&format!("{r}/")))
    }

    pub async fn image_present(&self, image: &str) -> bool {
        self.run(&["image".into(), "exists".into(), image.into()])
            .await
            .is_ok()
    }

    pub async fn pull(&self, image: &str) -> Result<(), EngineError> {
        let mut args = vec!["pull".to_owned(), "--quiet".to_owned()];
        if self.insecure(image) {
            args.push("--tls-verify=false".into());
        }
        args.push(image.into());
        self.run(&args).await.map(|_| ())
    }

    pub async fn start(&self, plan: &ContainerPlan, host_port: u16) -> Result<(), EngineError> {
        let mut args = vec!["run".to_owned(), "--detach".to_owned()];
        args.extend(plan.options.iter().cloned());
        args.extend([
            "--label".into(),
            format!("{MANAGED_LABEL}={}", self.instance),
            "--label".into(),
            format!("{PORT_LABEL}={host_port}"),
            "--publish".into(),
            format!("127.0.0.1:{host_port}:{}", plan.container_port),
            plan.image.clone(),
        ]);
        args.extend(plan.command.iter().cloned());
        self.run(&args).await.map(|_| ())
    }

    pub async fn remove(&self, name: &str) -> Result<(), EngineError> {
        self.run(&[
            "rm".into(),
            "--force".into(),
            "--time".into(),
            "10".into(),
            name.into(),
        ])
        .await
        .map(|_| ())
    }

    /// `<engine> logs` of a container, stdout and stderr as one stream.
    pub fn logs(
        &self,
        name: &str,
        follow: bool,
        tail: u32,
    ) -> std::io::Result<tokio::process::Child> {
        let mut command = Command::new(&self.program);
        command.args(["logs", "--tail", &tail.to_string()]);
        if follow {
            command.arg("--follow");
        }
        let (reader, writer) = std::io::pipe()?;
        let child = command
            .arg(name)
            .stdin(Stdio::null())
            .stdout(writer.try_clone()?)
            .stderr(writer)
            .kill_on_drop(true)
            .spawn()?;
        // The reader end stays with the caller through the child's stdout slot.
        let mut child = child;
        child.stdout = Some(tokio::process::ChildStdout::from_std(
            std::process::ChildStdout::from(std::os::fd::OwnedFd::from(reader)),
        )?);
        Ok(child)
    }
}

/// What the runtime needs.
pub struct Runtime {
    pub engine: Engine,
    pub store: Arc<Store>,
    pub routes: Arc<RouteStore>,
    pub builder_config: BuilderConfig,
    pub agent_dir: Option<PathBuf>,
    pub gpus: crate::gpus::GpuPool,
    /// Saves before stops, for notebooks that ask for it.
    pub saves: Option<Arc<crate::saves::SaveJobs>>,
    http: reqwest::Client,
    /// Notebooks with a reconcile under way, so a slow pull does not get a second one.
    busy: Mutex<HashSet<(String, String)>>,
    /// Published port of each running notebook (for the culler's Jupyter API calls).
    ports: Mutex<HashMap<(String, String), u16>>,
}

impl Runtime {
    pub fn new(
        engine: Engine,
        store: Arc<Store>,
        routes: Arc<RouteStore>,
        builder_config: BuilderConfig,
        agent_dir: Option<PathBuf>,
        gpus: crate::gpus::GpuPool,
        saves: Option<Arc<crate::saves::SaveJobs>>,
    ) -> Self {
        Self {
            engine,
            store,
            routes,
            builder_config,
            agent_dir,
            gpus,
            saves,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(5))
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .unwrap_or_default(),
            busy: Mutex::new(HashSet::new()),
            ports: Mutex::default(),
        }
    }

    /// Where `namespace/name` is published on loopback, while it runs.
    pub fn port_of(&self, namespace: &str, name: &str) -> Option<u16> {
        let ports = self.ports.lock().ok()?;
        ports.get(&(namespace.to_owned(), name.to_owned())).copied()
    }

    fn set_port(&self, namespace: &str, name: &str, port: Option<u16>) {
        if let Ok(mut ports) = self.ports.lock() {
            let key = (namespace.to_owned(), name.to_owned());
            match port {
                Some(port) => ports.insert(key, port),
                None => ports.remove(&key),
            };
        }
    }

    /// Routes to the containers that kept running while labforge was down, before anything is
    /// served, so their users see no gap; the first reconcile then checks them as usual.
    pub async fn adopt(&self) -> Result<usize, EngineError> {
        let mut adopted = 0;
        for container in self.engine.containers().await? {
            let (ns, name) = &container.notebook;
            let (Some(port), true) = (container.port, container.running) else {
                continue;
            };
            let Some(notebook) = self.store.get(ns, name).filter(|nb| !nb.is_stopped()) else {
                continue;
            };
            if let Ok(vs) = route(&notebook, &self.builder_config, port) {
                self.routes.upsert(vs);
                self.set_port(ns, name, Some(port));
                adopted += 1;
            }
        }
        Ok(adopted)
    }

    /// Reconciles on every change and every few seconds, forever.
    pub async fn run(self: Arc<Self>) {
        let mut changes = self.store.subscribe();
        loop {
            if let Err(err) = self.clone().reconcile_all().await {
                tracing::warn!(error = %err, "reconciling notebook containers");
            }
            let wake = tokio::time::sleep(RESYNC);
            tokio::pin!(wake);
            loop {
                tokio::select! {
                    () = &mut wake => break,
                    change = changes.recv() => match change {
                        Ok(Change::Notebook { .. }) | Err(_) => break,
                        Ok(_) => continue,
                    }
                }
            }
        }
    }

    /// One pass: every stored notebook against every managed container.
    pub async fn reconcile_all(self: Arc<Self>) -> Result<(), EngineError> {
        let containers = self.engine.containers().await?;
        let mut by_notebook: BTreeMap<(String, String), RunningContainer> = BTreeMap::new();
        for container in containers {
            by_notebook.insert(container.notebook.clone(), container);
        }
        let notebooks = self.store.list(None);
        let known: HashSet<(String, String)> = notebooks
            .iter()
            .map(|nb| {
                (
                    nb.metadata.namespace.clone().unwrap_or_default(),
                    nb.metadata.name.clone().unwrap_or_default(),
                )
            })
            .collect();
        // Containers whose notebook was deleted.
        for (key, container) in &by_notebook {
            if !known.contains(key) {
                tracing::info!(container = %container.name, "removing the container of a deleted notebook");
                self.engine.remove(&container.name).await?;
                self.routes
                    .remove(&key.0, &builders::virtual_service_name(&key.0, &key.1));
                self.gpus.release(&key.0, &key.1);
                self.set_port(&key.0, &key.1, None);
            }
        }
        for notebook in notebooks {
            let key = (
                notebook.metadata.namespace.clone().unwrap_or_default(),
                notebook.metadata.name.clone().unwrap_or_default(),
            );
            if let Ok(mut busy) = self.busy.lock()
                && !busy.insert(key.clone())
            {
                continue;
            }
            let existing = by_notebook.remove(&key);
            let runtime = self.clone();
            tokio::spawn(async move {
                runtime.reconcile(&notebook, existing).await;
                if let Ok(mut busy) = runtime.busy.lock() {
                    busy.remove(&key);
                }
            });
        }
        Ok(())
    }

    fn set_status(&self, notebook: &Notebook, status: NotebookStatus) {
        let (ns, name) = (
            notebook.metadata.namespace.as_deref().unwrap_or_default(),
            notebook.metadata.name.as_deref().unwrap_or_default(),
        );
        if notebook.status.as_ref() == Some(&status) {
            return;
        }
        if let Err(err) = self.store.update(ns, name, |nb| nb.status = Some(status)) {
            tracing::debug!(error = %err, "status of a notebook deleted meanwhile");
        }
    }

    async fn reconcile(&self, notebook: &Notebook, existing: Option<RunningContainer>) {
        let ns = notebook.metadata.namespace.clone().unwrap_or_default();
        let name = notebook.metadata.name.clone().unwrap_or_default();
        let event = |kind: &str, reason: &str, message: &str| {
            self.store.record_event(&ns, &name, kind, reason, message)
        };
        let vs_name = builders::virtual_service_name(&ns, &name);
        if notebook.is_stopped() {
            if let Some(container) = existing {
                if container.running
                    && notebook.annotation(AUTO_SAVE_ANNOTATION) == Some("true")
                    && let Some(saves) = &self.saves
                {
                    self.save_before_stop(saves, notebook).await;
                }
                match self.engine.remove(&container.name).await {
                    Ok(()) => event(
                        "Normal",
                        "Stopped",
                        "the notebook's container was removed; its workspace is kept",
                    ),
                    Err(err) => event("Warning", "StopFailed", &err.to_string()),
                }
            }
            self.routes.remove(&ns, &vs_name);
            self.gpus.release(&ns, &name);
            self.set_port(&ns, &name, None);
            self.set_status(notebook, stopped_status());
            return;
        }
        let preferred = existing
            .as_ref()
            .map(|c| c.devices.clone())
            .unwrap_or_default();
        let devices = match self.gpus.assign(notebook, &preferred) {
            Ok(devices) => devices,
            Err(err) => {
                event("Warning", "FailedScheduling", &err.to_string());
                self.set_status(notebook, waiting_status("Unschedulable", &err.to_string()));
                return;
            }
        };
        let plan = match plan(
            notebook,
            &self.builder_config,
            self.agent_dir.as_deref(),
            &devices,
        ) {
            Ok(plan) => plan,
            Err(err) => {
                event("Warning", "InvalidSpec", &err.to_string());
                self.set_status(notebook, waiting_status("InvalidSpec", &err.to_string()));
                return;
            }
        };
        let port = match existing {
            Some(c) if c.plan == plan.digest && c.running && c.port.is_some() => c.port,
            Some(c) => {
                if c.plan != plan.digest {
                    event(
                        "Normal",
                        "Replacing",
                        "the notebook changed; its container is replaced",
                    );
                } else if !c.running {
                    event(
                        "Warning",
                        "ContainerExited",
                        &format!(
                            "the container {} ({}), exit code {:?}; starting it again",
                            c.name, c.state, c.exit_code
                        ),
                    );
                }
                if let Err(err) = self.engine.remove(&c.name).await {
                    event("Warning", "FailedRemove", &err.to_string());
                    return;
                }
                None
            }
            None => None,
        };
        let port = match port {
            Some(port) => port,
            None => match self.create(notebook, &plan).await {
                Ok(port) => port,
                Err((reason, err)) => {
                    event("Warning", reason, &err.to_string());
                    self.set_status(notebook, waiting_status(reason, &err.to_string()));
                    return;
                }
            },
        };
        self.set_port(&ns, &name, Some(port));
        match route(notebook, &self.builder_config, port) {
            Ok(vs) => self.routes.upsert(vs),
            Err(err) => event("Warning", "InvalidSpec", &err.to_string()),
        }
        let url = format!("http://127.0.0.1:{port}{}", probe_path(notebook));
        let ready = self
            .http
            .get(&url)
            .send()
            .await
            .is_ok_and(|r| r.status().as_u16() < 500);
        let was_ready = notebook
            .status
            .as_ref()
            .is_some_and(|s| s.ready_replicas > 0);
        if ready && !was_ready {
            event("Normal", "Ready", "the notebook answers");
        }
        self.set_status(notebook, running_status(ready));
    }

    /// Saves the environment of a notebook being stopped and moves it to the new image. A failed
    /// save is recorded and never holds the stop back.
    async fn save_before_stop(&self, saves: &crate::saves::SaveJobs, notebook: &Notebook) {
        let ns = notebook.metadata.namespace.as_deref().unwrap_or_default();
        let name = notebook.metadata.name.as_deref().unwrap_or_default();
        self.store.record_event(
            ns,
            name,
            "Normal",
            "AutoSaving",
            "saving the environment before the stop",
        );
        match saves.save_before_stop(notebook).await {
            Ok(Some(saved)) => {
                let moved = self.store.update(ns, name, |nb| {
                    if let Some(container) = nb.container_mut() {
                        container.image = Some(saved.image.clone());
                    }
                });
                match moved {
                    Ok(_) => self.store.record_event(
                        ns,
                        name,
                        "Normal",
                        "AutoSaved",
                        &format!("the next start runs on {}", saved.image),
                    ),
                    Err(err) => {
                        tracing::warn!(error = %err, "moving a stopped notebook to its saved image")
                    }
                }
            }
            Ok(None) => {}
            Err(message) => self.store.record_event(
                ns,
                name,
                "Warning",
                "AutoSaveFailed",
                &format!("stopped without saving: {message}"),
            ),
        }
    }

    /// Pulls if needed and starts the container; returns its published port.
    async fn create(
        &self,
        notebook: &Notebook,
        plan: &ContainerPlan,
    ) -> Result<u16, (&'static str, EngineError)> {
        let ns = notebook.metadata.namespace.as_deref().unwrap_or_default();
        let name = notebook.metadata.name.as_deref().unwrap_or_default();
        if !self.engine.image_present(&plan.image).await {
            self.set_status(
                notebook,
                waiting_status("Pulling", &format!("pulling {}", plan.image)),
            );
            self.store.record_event(
                ns,
                name,
                "Normal",
                "Pulling",
                &format!("pulling image {}", plan.image),
            );
            self.engine
                .pull(&plan.image)
                .await
                .map_err(|e| ("ErrImagePull", e))?;
            self.store.record_event(
                ns,
                name,
                "Normal",
                "Pulled",
                &format!("pulled image {}", plan.image),
            );
        }
        let port = free_port().map_err(|e| ("FailedCreate", EngineError::Output(e.to_string())))?;
        self.engine
            .start(plan, port)
            .await
            .map_err(|e| ("FailedCreate", e))?;
        self.store.record_event(
            ns,
            name,
            "Normal",
            "Started",
            &format!("started container {} from {}", plan.name, plan.image),
        );
        Ok(port)
    }
}

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn condition(kind: &str, status: bool, reason: &str, message: &str) -> NotebookCondition {
    NotebookCondition {
        type_: kind.to_owned(),
        status: if status { "True" } else { "False" }.to_owned(),
        reason: (!reason.is_empty()).then(|| reason.to_owned()),
        message: (!message.is_empty()).then(|| message.to_owned()),
        last_probe_time: None,
        last_transition_time: None,
    }
}

fn stopped_status() -> NotebookStatus {
    NotebookStatus {
        conditions: Vec::new(),
        ready_replicas: 0,
        container_state: ContainerState {
            terminated: Some(ContainerStateTerminated {
                reason: Some("Stopped".into()),
                exit_code: 0,
                ..Default::default()
            }),
            ..Default::default()
        },
    }
}

fn waiting_status(reason: &str, message: &str) -> NotebookStatus {
    NotebookStatus {
        conditions: vec![condition("Ready", false, reason, message)],
        ready_replicas: 0,
        container_state: ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some(reason.to_owned()),
                message: Some(message.to_owned()),
            }),
            ..Default::default()
        },
    }
}

fn running_status(ready: bool) -> NotebookStatus {
    NotebookStatus {
        conditions: vec![condition(
            "Ready",
            ready,
            if ready { "" } else { "Starting" },
            "",
        )],
        ready_replicas: i32::from(ready),
        container_state: ContainerState {
            running: Some(ContainerStateRunning { started_at: None }),
            ..Default::default()
        },
    }
}
