//! The runtime's loop: makes the engine's containers match the stored notebooks' plans, and
//! their status what the containers do.

use crate::notebook_secrets::NotebookSecrets;
use crate::store::Store;
use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
};
use labforge_crds::notebook::{Notebook, NotebookCondition, NotebookStatus};
use labforge_notebook_controller::builders::{self, BuilderConfig};
use labforge_proxy::source::RouteStore;
use labforge_web::backend::Change;
use labforge_web::model::AUTO_SAVE_ANNOTATION;
use labforge_web::preparing::ImagesBeingPrepared;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{broadcast, mpsc};

use super::admission::{Admission, NotebookKey, StartQueue, ordinal};
use super::engine::{Engine, EngineError, RunningContainer};
use super::plan::*;

/// How often everything is looked at even when nothing was announced (containers that exited).
const RESYNC: Duration = Duration::from_secs(3);

/// While a notebook starts, how often its server is asked whether it is ready, so that the
/// API says ready within this of the server answering rather than at the next resync.
const READINESS_POLL: Duration = Duration::from_millis(100);

/// How long one reconcile keeps asking before it hands over to another (which lists the
/// container again, so that one that exited meanwhile is seen as promptly as by a resync).
const READINESS_WINDOW: Duration = Duration::from_millis(2500);

/// How long one start holds its place in the [`StartQueue`]. A JupyterLab start takes a few
/// seconds, even with the machine busy with others; one that is still not answering after this
/// (a server that never will, or one given a sliver of a CPU) goes on outside the count.
const START_HOLD: Duration = Duration::from_secs(60);

/// What [`Runtime::migrate_legacy_volumes`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct VolumeMigration {
    /// Volumes copied to their new names.
    pub copied: usize,
    /// Volumes left under their legacy names: not copied (failed, or ambiguous).
    pub left: usize,
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
    pub saves: Option<Arc<crate::save_jobs::SaveJobs>>,
    /// Each notebook's secret, which only its server and the proxy know.
    pub secrets: Arc<NotebookSecrets>,
    http: reqwest::Client,
    /// Notebooks with a reconcile under way, and those changed since theirs began.
    queue: WorkQueue,
    /// Starts under way, and the notebooks waiting to start.
    starts: StartQueue,
    /// Notebooks whose turn to start came: reconciled by [`Self::run`].
    turn_sender: mpsc::UnboundedSender<NotebookKey>,
    turn_receiver: Mutex<Option<mpsc::UnboundedReceiver<NotebookKey>>>,
    /// Published port of each running notebook (for the culler's Jupyter API calls).
    ports: Mutex<HashMap<(String, String), u16>>,
    /// The catalog's images still being prepared: a notebook of one waits for it rather than
    /// failing its pull.
    preparing: Arc<ImagesBeingPrepared>,
}

impl Runtime {
    #[expect(
        clippy::too_many_arguments,
        reason = "each part the embedded mode wires in"
    )]
    pub fn new(
        engine: Engine,
        store: Arc<Store>,
        routes: Arc<RouteStore>,
        builder_config: BuilderConfig,
        agent_dir: Option<PathBuf>,
        gpus: crate::gpus::GpuPool,
        saves: Option<Arc<crate::save_jobs::SaveJobs>>,
        secrets: Arc<NotebookSecrets>,
    ) -> Self {
        let (turn_sender, turn_receiver) = mpsc::unbounded_channel();
        Self {
            engine,
            store,
            routes,
            builder_config,
            agent_dir,
            gpus,
            saves,
            secrets,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(5))
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .unwrap_or_default(),
            queue: WorkQueue::default(),
            starts: StartQueue::new(default_concurrent_starts(), START_HOLD),
            turn_sender,
            turn_receiver: Mutex::new(Some(turn_receiver)),
            ports: Mutex::default(),
            preparing: Arc::default(),
        }
    }

    /// A notebook of one of `preparing`'s images waits for it (`make up` still building it, or
    /// the background pull still fetching it) instead of failing with its pull.
    pub fn with_images_being_prepared(mut self, preparing: Arc<ImagesBeingPrepared>) -> Self {
        self.preparing = preparing;
        self
    }

    /// At most `limit` notebooks start at once; the others wait in line.
    pub fn with_concurrent_starts(mut self, limit: usize) -> Self {
        self.starts = StartQueue::new(limit, START_HOLD);
        self
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

    /// Copies each workspace volume still under its legacy name (`labforge-<ns>-<claim>`) into
    /// its injective one, when none of `namespaces` (every user's, besides the store's) but the
    /// notebook's own could have made that legacy name; the old volume is kept. Only podman can
    /// copy volumes; `scratch` holds each copy's archive.
    pub async fn migrate_legacy_volumes(
        &self,
        scratch: &std::path::Path,
        namespaces: impl IntoIterator<Item = String>,
    ) -> VolumeMigration {
        let mut migration = VolumeMigration::default();
        if self.engine.is_docker() {
            return migration;
        }
        let notebooks = self.store.list(None);
        let namespaces: HashSet<String> = notebooks
            .iter()
            .filter_map(|nb| nb.metadata.namespace.clone())
            .chain(namespaces)
            .collect();
        for notebook in &notebooks {
            let ns = notebook.metadata.namespace.as_deref().unwrap_or_default();
            for claim in notebook.claim_names() {
                let (new, legacy) = (volume_name(ns, claim), legacy_volume_name(ns, claim));
                if self.engine.volume_exists(&new).await
                    || !self.engine.volume_exists(&legacy).await
                {
                    continue;
                }
                if unambiguous_legacy_claim(&legacy, ns, namespaces.iter().map(String::as_str))
                    .is_none()
                {
                    tracing::warn!(volume = %legacy, "not copied: another namespace could have made this name; copy it by hand");
                    migration.left += 1;
                    continue;
                }
                match self.engine.copy_volume(&legacy, &new, scratch).await {
                    Ok(()) => {
                        tracing::info!(from = %legacy, to = %new, "workspace volume copied to its new name; the old one is kept");
                        migration.copied += 1;
                    }
                    Err(err) => {
                        tracing::warn!(error = %err, volume = %legacy, "copying a workspace volume to its new name");
                        migration.left += 1;
                    }
                }
            }
        }
        migration
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
            let secret = self.secrets.of(ns, name);
            if let Ok(vs) = route(&notebook, &self.builder_config, port, Some(&secret)) {
                self.routes.upsert(vs);
                self.set_port(ns, name, Some(port));
                adopted += 1;
            }
        }
        Ok(adopted)
    }

    /// Reconciles each notebook whose spec or metadata changed, and every notebook every few
    /// seconds (containers that exited tell nobody), forever. Status changes, the runtime's own
    /// writes among them, wake nothing.
    pub async fn run(self: Arc<Self>) {
        let mut changes = self.store.subscribe();
        let taken = self.turn_receiver.lock().ok().and_then(|mut r| r.take());
        let Some(mut turns) = taken else {
            tracing::error!("the runtime's loop runs once");
            return;
        };
        let mut resync = tokio::time::interval(RESYNC);
        resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = resync.tick() => {
                    if let Err(err) = self.clone().reconcile_all().await {
                        tracing::warn!(error = %err, "reconciling notebook containers");
                    }
                }
                change = changes.recv() => match change {
                    Ok(Change::Notebook { namespace, name }) => {
                        self.clone().spawn_reconcile((namespace, name), None);
                    }
                    Ok(_) => {}
                    // Changes were missed: everything is looked at now.
                    Err(broadcast::error::RecvError::Lagged(_)) => resync.reset_immediately(),
                    Err(broadcast::error::RecvError::Closed) => return,
                },
                Some(key) = turns.recv() => self.clone().spawn_reconcile(key, None),
            }
        }
    }

    /// One pass: every stored notebook against every managed container, from one listing.
    pub async fn reconcile_all(self: Arc<Self>) -> Result<(), EngineError> {
        let containers = match self.engine.containers().await {
            Ok(containers) => containers,
            Err(err) => {
                self.engine_unavailable(&err);
                return Err(err);
            }
        };
        let mut by_notebook: BTreeMap<NotebookKey, RunningContainer> = BTreeMap::new();
        for container in containers {
            by_notebook.insert(container.notebook.clone(), container);
        }
        let notebooks = self.store.list(None);
        let known: HashSet<NotebookKey> = notebooks.iter().map(key_of).collect();
        for (key, container) in &by_notebook {
            if !known.contains(key) {
                self.remove_deleted(key, container).await?;
            }
        }
        for notebook in notebooks {
            let key = key_of(&notebook);
            let existing = by_notebook.remove(&key);
            self.clone()
                .spawn_reconcile(key, Some((notebook, existing)));
        }
        Ok(())
    }

    /// Reconciles `key` on a task of its own, from `seen` (the notebook and its container as a
    /// full pass found them) or from a fresh look. A notebook has at most one reconcile under
    /// way, so a slow pull does not get a second; a change announced meanwhile runs it again
    /// once it is done.
    fn spawn_reconcile(
        self: Arc<Self>,
        key: NotebookKey,
        seen: Option<(Notebook, Option<RunningContainer>)>,
    ) {
        let changed = seen.is_none();
        if !self.queue.claim(&key, changed) {
            return;
        }
        tokio::spawn(async move {
            match seen {
                Some((notebook, existing)) => self.reconcile(&notebook, existing).await,
                None => self.reconcile_fresh(&key).await,
            }
            while self.queue.finish(&key) {
                self.reconcile_fresh(&key).await;
            }
        });
    }

    /// Reconciles `key` against what the store and the engine say now: its container alone is
    /// listed, not every one.
    async fn reconcile_fresh(&self, key: &NotebookKey) {
        let (ns, name) = key;
        let existing = match self.engine.container_of(ns, name).await {
            Ok(existing) => existing,
            Err(err) => {
                // The next full pass tells the notebooks the engine is not answering.
                tracing::warn!(error = %err, namespace = %ns, notebook = %name, "listing a notebook's container");
                return;
            }
        };
        match self.store.get(ns, name) {
            Some(notebook) => self.reconcile(&notebook, existing).await,
            None => {
                self.leave_line(key);
                if let Some(container) = existing
                    && let Err(err) = self.remove_deleted(key, &container).await
                {
                    tracing::warn!(error = %err, container = %container.name, "removing the container of a deleted notebook");
                }
            }
        }
    }

    /// The container of a deleted notebook goes, and with it its route, GPUs and port.
    async fn remove_deleted(
        &self,
        (ns, name): &NotebookKey,
        container: &RunningContainer,
    ) -> Result<(), EngineError> {
        tracing::info!(container = %container.name, "removing the container of a deleted notebook");
        self.engine.remove(&container.name).await?;
        self.routes
            .remove(ns, &builders::virtual_service_name(ns, name));
        self.gpus.release(ns, name);
        self.set_port(ns, name, None);
        self.leave_line(&(ns.clone(), name.clone()));
        Ok(())
    }

    /// The engine does not answer: every notebook meant to run says so (with one event each),
    /// since labforge cannot tell whether its container is still there.
    fn engine_unavailable(&self, err: &EngineError) {
        let message = format!("the container engine is not answering: {err}");
        for notebook in self.store.list(None) {
            if notebook.is_stopped() {
                continue;
            }
            if condition_reason(&notebook) != Some(ENGINE_UNAVAILABLE) {
                self.store.record_event(
                    notebook.metadata.namespace.as_deref().unwrap_or_default(),
                    notebook.metadata.name.as_deref().unwrap_or_default(),
                    "Warning",
                    ENGINE_UNAVAILABLE,
                    &message,
                );
            }
            self.set_status(&notebook, waiting_status(ENGINE_UNAVAILABLE, &message));
        }
    }

    fn set_status(&self, notebook: &Notebook, status: NotebookStatus) {
        let (ns, name) = (
            notebook.metadata.namespace.as_deref().unwrap_or_default(),
            notebook.metadata.name.as_deref().unwrap_or_default(),
        );
        // Against the stored status, not `notebook`'s: a pass may have written one since.
        let stored = self.store.get(ns, name);
        if stored.is_some_and(|nb| nb.status.as_ref() == Some(&status)) {
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
        if notebook.is_stopped() {
            self.stop(notebook, existing).await;
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
                self.leave_line(&key_of(notebook));
                return;
            }
        };
        let secret = self.secrets.of(&ns, &name);
        let plan = match plan(
            notebook,
            &self.builder_config,
            self.agent_dir.as_deref(),
            &devices,
            Some(&secret),
        ) {
            Ok(plan) => plan,
            Err(err) => {
                event("Warning", "InvalidSpec", &err.to_string());
                self.set_status(notebook, waiting_status("InvalidSpec", &err.to_string()));
                self.leave_line(&key_of(notebook));
                return;
            }
        };
        let was_ready = notebook
            .status
            .as_ref()
            .is_some_and(|s| s.ready_replicas > 0);
        // What happened to a container that went away outside labforge, told until the notebook
        // is ready again.
        let mut restarted = None;
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
                    restarted = Some(("ContainerExited", exited(&c)));
                }
                if let Err(err) = self.engine.remove(&c.name).await {
                    event("Warning", "FailedRemove", &err.to_string());
                    return;
                }
                None
            }
            None if was_ready => {
                restarted = Some((
                    "ContainerGone",
                    format!(
                        "its container {} was removed outside labforge; starting it again",
                        container_name(&ns, &name)
                    ),
                ));
                None
            }
            None => None,
        };
        if let Some((reason, message)) = &restarted {
            event("Warning", reason, message);
            self.set_status(notebook, waiting_status(reason, message));
        }
        let port = match port {
            Some(port) => port,
            None => match self.create(notebook, &plan).await {
                Ok(Some(port)) => port,
                // Waiting in line: its turn reconciles it again.
                Ok(None) => return,
                Err((reason, err)) => {
                    event("Warning", reason, &err.to_string());
                    self.set_status(notebook, waiting_status(reason, &err.to_string()));
                    self.leave_line(&key_of(notebook));
                    return;
                }
            },
        };
        self.set_port(&ns, &name, Some(port));
        match route(notebook, &self.builder_config, port, Some(&secret)) {
            Ok(vs) => self.routes.upsert(vs),
            Err(err) => event("Warning", "InvalidSpec", &err.to_string()),
        }
        // Not ready yet after a restart of ours: still say why it restarted.
        let restarting = restarted.map(|(_, message)| message).or_else(|| {
            matches!(
                condition_reason(notebook),
                Some("ContainerExited" | "ContainerGone" | RESTARTING)
            )
            .then(|| condition_message(notebook))
            .flatten()
        });
        let status_of = |ready: bool, unexpected: &str| match &restarting {
            Some(message) if !ready && unexpected.is_empty() => {
                running_status(false, RESTARTING, message)
            }
            _ => running_status(ready, "Starting", unexpected),
        };
        let (ready, unexpected) = if was_ready {
            self.readiness(notebook, port).await
        } else {
            // Said while its server is asked again and again: the lists show why it is not
            // ready yet (a server's first start can take a while).
            // A restart's own reason stays.
            let why = if restarting.is_some() {
                ""
            } else {
                WAITING_FOR_SERVER
            };
            self.set_status(notebook, status_of(false, why));
            self.readiness_while_starting(notebook, port).await
        };
        if ready && !was_ready {
            event("Normal", "Ready", "the notebook answers");
        }
        let status = status_of(ready, &unexpected);
        self.set_status(notebook, status);
        // Its start is over: answering as something else will not change by waiting either.
        if ready || !unexpected.is_empty() {
            self.leave_line(&key_of(notebook));
        }
    }

    /// `key` no longer starts or waits to: the next in line get their turn, and those behind
    /// them are told their new places.
    fn leave_line(&self, key: &NotebookKey) {
        if !self.starts.finish(key) {
            return;
        }
        let line = self.starts.line();
        for key in line.next {
            // The receiver lives as long as the runtime's loop; without it nothing starts anyway.
            let _ = self.turn_sender.send(key);
        }
        for ((ns, name), place) in line.waiting {
            if let Some(notebook) = self.store.get(&ns, &name)
                && condition_reason(&notebook) == Some(IN_LINE)
            {
                self.set_status(&notebook, in_line_status(place));
            }
        }
    }

    /// A stopped notebook: its container saved first under auto-save, then removed; its route,
    /// GPUs and port let go.
    async fn stop(&self, notebook: &Notebook, existing: Option<RunningContainer>) {
        let ns = notebook.metadata.namespace.clone().unwrap_or_default();
        let name = notebook.metadata.name.clone().unwrap_or_default();
        let event = |kind: &str, reason: &str, message: &str| {
            self.store.record_event(&ns, &name, kind, reason, message)
        };
        let vs_name = builders::virtual_service_name(&ns, &name);
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
        self.leave_line(&key_of(notebook));
        self.set_status(notebook, stopped_status());
    }

    /// [`Self::readiness`], asked every [`READINESS_POLL`] until the server is ready, answers
    /// as something else, the notebook changes, or [`READINESS_WINDOW`] passed; then, when it
    /// is still starting, the notebook is reconciled again at once.
    async fn readiness_while_starting(&self, notebook: &Notebook, port: u16) -> (bool, String) {
        let key = key_of(notebook);
        let deadline = tokio::time::Instant::now() + READINESS_WINDOW;
        loop {
            let (ready, unexpected) = self.readiness(notebook, port).await;
            if ready || !unexpected.is_empty() || self.queue.changed(&key) {
                return (ready, unexpected);
            }
            if tokio::time::Instant::now() >= deadline {
                self.queue.again(&key);
                return (ready, unexpected);
            }
            tokio::time::sleep(READINESS_POLL).await;
        }
    }

    /// Whether the notebook's server answers on `port` as its server type does; when it answers
    /// as something else, what to tell the user. Not answering yet is starting; answering as
    /// something else is told, since it will not change by waiting (an image of the other IDE,
    /// say).
    async fn readiness(&self, notebook: &Notebook, port: u16) -> (bool, String) {
        let (server, path, key) = readiness_check(notebook);
        let url = format!("http://{PUBLISH_ADDRESS}:{port}{path}");
        match self.http.get(&url).send().await {
            Ok(mut response) => {
                let status = response.status().as_u16();
                // The server is its owner's: its answer is read up to what a version or a
                // heartbeat takes, not as far as it cares to send.
                let mut body = Vec::new();
                while body.len() <= READINESS_ANSWER_LIMIT
                    && let Ok(Some(chunk)) = response.chunk().await
                {
                    body.extend_from_slice(&chunk);
                }
                if body.len() <= READINESS_ANSWER_LIMIT && answers_as_expected(status, &body, key) {
                    (true, String::new())
                } else {
                    (
                        false,
                        format!(
                            "{path} answered HTTP {status}, not as {} does: does the image serve {}?",
                            server.server_name(),
                            server.server_name()
                        ),
                    )
                }
            }
            Err(_) => (false, String::new()),
        }
    }

    /// Saves the environment of a notebook being stopped and moves it to the new image. A failed
    /// save is recorded and never holds the stop back.
    async fn save_before_stop(&self, saves: &crate::save_jobs::SaveJobs, notebook: &Notebook) {
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

    /// Pulls if needed and, when its turn in the [`StartQueue`] has come, starts the container;
    /// returns its published port, or `None` while it waits in line (its status says where).
    async fn create(
        &self,
        notebook: &Notebook,
        plan: &ContainerPlan,
    ) -> Result<Option<u16>, (&'static str, EngineError)> {
        let ns = notebook.metadata.namespace.as_deref().unwrap_or_default();
        let name = notebook.metadata.name.as_deref().unwrap_or_default();
        // Still in line: nothing is asked of the engine (every resync passes each waiting one
        // here, and a class's worth of podman calls every few seconds slows those starting).
        if let Some(place) = self.starts.waiting_place(&key_of(notebook)) {
            self.set_status(notebook, in_line_status(place));
            return Ok(None);
        }
        if !self.engine.image_present(&plan.image).await {
            // A catalog image `make up` is still building is tried at each resync, quietly: the
            // notebook waits for it rather than failing its pull.
            let being_prepared = self.preparing.contains(&plan.image);
            if condition_reason(notebook) != Some(IMAGE_BEING_PREPARED) {
                self.set_status(
                    notebook,
                    waiting_status("Pulling", &format!("pulling {}", plan.image)),
                );
            }
            if !being_prepared {
                self.store.record_event(
                    ns,
                    name,
                    "Normal",
                    "Pulling",
                    &format!("pulling image {}", plan.image),
                );
            }
            match self.engine.pull(&plan.image).await {
                Ok(()) => self.preparing.done(&plan.image),
                Err(_) if being_prepared => {
                    if condition_reason(notebook) != Some(IMAGE_BEING_PREPARED) {
                        self.store.record_event(
                            ns,
                            name,
                            "Normal",
                            IMAGE_BEING_PREPARED,
                            &format!(
                                "waiting for image {}, which is being prepared on this machine",
                                plan.image
                            ),
                        );
                    }
                    self.set_status(
                        notebook,
                        waiting_status(
                            IMAGE_BEING_PREPARED,
                            "waiting for its image, which is being prepared on this machine",
                        ),
                    );
                    return Ok(None);
                }
                Err(err) => return Err(("ErrImagePull", err)),
            }
            self.store.record_event(
                ns,
                name,
                "Normal",
                "Pulled",
                &format!("pulled image {}", plan.image),
            );
        }
        if let Admission::InLine(place) = self.starts.admit(&key_of(notebook)) {
            if condition_reason(notebook) != Some(IN_LINE) {
                self.store.record_event(
                    ns,
                    name,
                    "Normal",
                    IN_LINE,
                    &format!(
                        "{} in line to start (notebooks start {} at a time here)",
                        ordinal(place),
                        self.starts.limit()
                    ),
                );
            }
            self.set_status(notebook, in_line_status(place));
            return Ok(None);
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
        Ok(Some(port))
    }
}

fn key_of(notebook: &Notebook) -> NotebookKey {
    (
        notebook.metadata.namespace.clone().unwrap_or_default(),
        notebook.metadata.name.clone().unwrap_or_default(),
    )
}

/// Which notebooks have a reconcile under way, and which of those changed since it began: the
/// work queue of Kubernetes controllers, where a key is worked on by one worker at a time and a
/// change during the work queues it once more.
#[derive(Default)]
struct WorkQueue {
    keys: Mutex<QueuedKeys>,
}

#[derive(Default)]
struct QueuedKeys {
    busy: HashSet<NotebookKey>,
    changed: HashSet<NotebookKey>,
}

impl WorkQueue {
    /// Whether the caller should reconcile `key` now. When it is already under way, a `changed`
    /// key is marked to run again when that reconcile finishes.
    fn claim(&self, key: &NotebookKey, changed: bool) -> bool {
        let mut keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        if keys.busy.insert(key.clone()) {
            return true;
        }
        if changed {
            keys.changed.insert(key.clone());
        }
        false
    }

    /// Whether `key` changed since its reconcile began.
    fn changed(&self, key: &NotebookKey) -> bool {
        let keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        keys.changed.contains(key)
    }

    /// Has the reconcile under way of `key` run once more when it finishes.
    fn again(&self, key: &NotebookKey) {
        let mut keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        if keys.busy.contains(key) {
            keys.changed.insert(key.clone());
        }
    }

    /// Ends a reconcile of `key`; true when it changed meanwhile and must run again (the key
    /// then stays claimed).
    fn finish(&self, key: &NotebookKey) -> bool {
        let mut keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        if keys.changed.remove(key) {
            return true;
        }
        keys.busy.remove(key);
        false
    }
}

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind((PUBLISH_ADDRESS, 0))?
        .local_addr()?
        .port())
}

/// How many notebooks start at once unless `labforge up` is told: twice the cores, so that
/// notebooks limited to half a core each (the catalog's default) keep every core busy.
pub fn default_concurrent_starts() -> usize {
    std::thread::available_parallelism().map_or(2, |cores| cores.get() * 2)
}

/// The Ready condition's reason while a notebook waits for its turn to start.
const IN_LINE: &str = "Queued";

/// A notebook waiting to start, `place`th in line.
fn in_line_status(place: usize) -> NotebookStatus {
    waiting_status(IN_LINE, &format!("{} in line", ordinal(place)))
}

/// The Ready condition's reason while a notebook's catalog image is still being prepared.
const IMAGE_BEING_PREPARED: &str = "ImageBeingPrepared";

/// The Ready condition's reason when the engine does not answer.
const ENGINE_UNAVAILABLE: &str = "EngineUnavailable";
/// The Ready condition's reason while a container started again after going away is not ready.
const RESTARTING: &str = "Restarting";

/// What became of a container that stopped by itself, as the notebook's state tells it.
fn exited(container: &RunningContainer) -> String {
    format!(
        "its container {} stopped ({}{}); starting it again",
        container.name,
        container.state,
        container
            .exit_code
            .map(|code| format!(", exit code {code}"))
            .unwrap_or_default()
    )
}

/// A notebook's Ready condition.
fn ready_condition(notebook: &Notebook) -> Option<&NotebookCondition> {
    notebook
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
}

/// The reason of a notebook's Ready condition.
fn condition_reason(notebook: &Notebook) -> Option<&str> {
    ready_condition(notebook)?.reason.as_deref()
}

fn condition_message(notebook: &Notebook) -> Option<String> {
    ready_condition(notebook)?.message.clone()
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

/// Why a notebook whose container runs is not ready yet, until its server answers otherwise.
const WAITING_FOR_SERVER: &str = "its container runs; waiting for its server to answer";

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

/// A running container's status; when not ready, `reason` and `why` (what its server answered
/// instead of being ready, or why it was started again).
fn running_status(ready: bool, reason: &str, why: &str) -> NotebookStatus {
    NotebookStatus {
        conditions: vec![condition(
            "Ready",
            ready,
            if ready { "" } else { reason },
            if ready { "" } else { why },
        )],
        ready_replicas: i32::from(ready),
        container_state: ContainerState {
            running: Some(ContainerStateRunning { started_at: None }),
            ..Default::default()
        },
    }
}

#[cfg(test)]
mod work_queue_tests {
    use super::{NotebookKey, WorkQueue};

    fn key(name: &str) -> NotebookKey {
        ("alice".into(), name.into())
    }

    #[test]
    fn a_notebook_has_one_reconcile_at_a_time_and_a_change_meanwhile_runs_it_once_more() {
        let queue = WorkQueue::default();
        assert!(queue.claim(&key("lab"), true));
        // Another notebook is not held up by this one.
        assert!(queue.claim(&key("other"), true));
        // Two changes during the work: one more run, not two.
        assert!(!queue.claim(&key("lab"), true));
        assert!(!queue.claim(&key("lab"), true));
        assert!(queue.finish(&key("lab")), "changed meanwhile: runs again");
        assert!(
            !queue.claim(&key("lab"), false),
            "still claimed by the rerun"
        );
        assert!(
            !queue.finish(&key("lab")),
            "nothing changed during the rerun"
        );
        assert!(queue.claim(&key("lab"), false), "free once done");
    }

    #[test]
    fn a_full_pass_finding_a_notebook_busy_does_not_queue_it_again() {
        let queue = WorkQueue::default();
        assert!(queue.claim(&key("lab"), true));
        assert!(!queue.claim(&key("lab"), false));
        assert!(!queue.finish(&key("lab")));
    }
}
