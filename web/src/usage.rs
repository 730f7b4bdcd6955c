//! What each running notebook uses right now, beside what it asked for: owners see whether a
//! kernel is near its memory limit before it dies, admins who holds the CPUs and memory.
//!
//! One task samples every running notebook at a fixed interval, whatever the number of pages
//! open; pages and `/metrics` read the last sample from a [`UsageBoard`] in memory. In the
//! embedded mode a sample reads each container's cgroup counters ([`CgroupFiles`]): a few small
//! files, where asking the engine (`podman stats`) would start a process of its own each time.
//! CPU use is the change in CPU time between two samples over the time between them, so it is
//! known from the second sample on.

use crate::cgroup::{CgroupFiles, Reading};
use axum::response::IntoResponse;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// How often the embedded mode samples its notebooks.
pub const SAMPLE_INTERVAL: Duration = Duration::from_secs(3);

/// A share of its memory limit from which a notebook is marked as near it.
pub const NEAR_LIMIT: f64 = 0.9;

/// One notebook's use at one moment.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    /// Cores used on average since the sample before; `None` on a notebook's first sample.
    pub cpu_cores: Option<f64>,
    /// CPU time its container used since it started; `None` where only a rate is reported
    /// (a cluster's metrics API).
    pub cpu_seconds: Option<f64>,
    /// Memory in use, less the page cache the kernel could drop (the working set).
    pub memory_bytes: u64,
    /// Its memory limit; `None` when it has none below the machine's memory.
    pub memory_limit_bytes: Option<u64>,
    /// At or above [`NEAR_LIMIT`] of its memory limit: the kernel may soon be killed.
    pub memory_near_limit: bool,
    /// When it was read (RFC 3339).
    pub sampled_at: String,
    /// Its GPUs' use, where their vendor reports it (`nvidia-smi`); absent: unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuUse>,
}

/// What a notebook's GPUs do: the mean utilization of its devices and their memory in use.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuUse {
    pub utilization_percent: f64,
    pub memory_bytes: u64,
}

/// The use `now` shows, given the notebook's previous reading (for CPU) and the machine's memory
/// (a limit that large is no limit).
pub fn usage_of(now: &Reading, before: Option<&Reading>, machine_memory_bytes: u64) -> Usage {
    let cpu_cores = before.and_then(|before| {
        let wall = now.at.checked_duration_since(before.at)?.as_nanos();
        // A restarted container's CPU time starts again from zero.
        let cpu = now.cpu_nanos.checked_sub(before.cpu_nanos)?;
        (wall > 0).then(|| cpu as f64 / wall as f64)
    });
    let memory_limit_bytes = now
        .memory_limit_bytes
        .filter(|limit| *limit > 0 && *limit < machine_memory_bytes);
    Usage {
        cpu_cores,
        cpu_seconds: Some(now.cpu_nanos as f64 / 1e9),
        memory_bytes: now.memory_bytes,
        memory_limit_bytes,
        memory_near_limit: memory_limit_bytes
            .is_some_and(|limit| now.memory_bytes as f64 >= limit as f64 * NEAR_LIMIT),
        sampled_at: jiff::Timestamp::now().to_string(),
        gpu: None,
    }
}

type Key = (String, String);

/// A notebook's last sample, with the counters it came from when the next one needs them for a
/// rate (the embedded mode's; a cluster's metrics API gives rates itself).
type Samples = BTreeMap<Key, (Option<Reading>, Usage)>;

/// The last sample of every running notebook.
#[derive(Debug, Default)]
pub struct UsageBoard {
    samples: RwLock<Samples>,
}

impl UsageBoard {
    pub fn get(&self, namespace: &str, name: &str) -> Option<Usage> {
        let samples = self.samples.read().unwrap_or_else(|e| e.into_inner());
        samples
            .get(&(namespace.to_owned(), name.to_owned()))
            .map(|(_, usage)| usage.clone())
    }

    /// Replaces every sample with `readings` (notebooks not among them are no longer running);
    /// returns the namespaces whose samples changed.
    pub fn record(
        &self,
        readings: Vec<(Key, Reading)>,
        gpu_use: &BTreeMap<Key, GpuUse>,
        machine_memory_bytes: u64,
    ) -> BTreeSet<String> {
        let mut samples = self.samples.write().unwrap_or_else(|e| e.into_inner());
        let mut next = Samples::new();
        for (key, reading) in readings {
            let before = samples.get(&key).and_then(|(reading, _)| reading.as_ref());
            let mut usage = usage_of(&reading, before, machine_memory_bytes);
            usage.gpu = gpu_use.get(&key).cloned();
            next.insert(key, (Some(reading), usage));
        }
        let changed = changed_namespaces(&samples, &next);
        *samples = next;
        changed
    }

    /// Replaces every sample with `usages`, measured elsewhere (a cluster's metrics API);
    /// returns the namespaces whose samples changed.
    pub fn replace(&self, usages: Vec<(Key, Usage)>) -> BTreeSet<String> {
        let mut samples = self.samples.write().unwrap_or_else(|e| e.into_inner());
        let next: Samples = usages
            .into_iter()
            .map(|(key, usage)| (key, (None, usage)))
            .collect();
        let changed = changed_namespaces(&samples, &next);
        *samples = next;
        changed
    }

    fn all(&self) -> Vec<(Key, Usage)> {
        let samples = self.samples.read().unwrap_or_else(|e| e.into_inner());
        samples
            .iter()
            .map(|(key, (_, usage))| (key.clone(), usage.clone()))
            .collect()
    }
}

/// What a page shows of a use: a new sample that would show the same tells nobody.
fn shown(usage: &Usage) -> (Option<i64>, u64, bool, Option<(i64, u64)>) {
    (
        usage.cpu_cores.map(|c| (c * 100.0).round() as i64),
        usage.memory_bytes >> 20,
        usage.memory_near_limit,
        usage
            .gpu
            .as_ref()
            .map(|g| (g.utilization_percent.round() as i64, g.memory_bytes >> 20)),
    )
}

/// The namespaces whose notebooks' shown use differs between `before` and `after` (a notebook
/// appearing or gone included).
fn changed_namespaces(before: &Samples, after: &Samples) -> BTreeSet<String> {
    let differs =
        |key: &Key| before.get(key).map(|(_, u)| shown(u)) != after.get(key).map(|(_, u)| shown(u));
    before
        .keys()
        .chain(after.keys())
        .filter(|key| differs(key))
        .map(|(ns, _)| ns.clone())
        .collect()
}

/// The board as Prometheus metrics, read at each scrape.
impl Collector for UsageBoard {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        use prometheus_client::metrics::MetricType::{Counter, Gauge};
        let all = self.all();
        let mut family = |name: &str,
                          help: &str,
                          kind,
                          metric: &dyn Fn(&Usage) -> Option<Box<dyn EncodeMetric>>|
         -> Result<(), std::fmt::Error> {
            let mut family = encoder.encode_descriptor(name, help, None, kind)?;
            for ((ns, name), usage) in &all {
                if let Some(metric) = metric(usage) {
                    let labels = [("namespace", ns.as_str()), ("notebook", name.as_str())];
                    metric.encode(family.encode_family(&labels)?)?;
                }
            }
            Ok(())
        };
        family(
            "labforge_notebook_cpu_usage_seconds",
            "CPU time a running notebook's container used since it started",
            Counter,
            &|u| Some(Box::new(ConstCounter::new(u.cpu_seconds?))),
        )?;
        family(
            "labforge_notebook_memory_working_set_bytes",
            "Memory a running notebook uses, page cache it could drop left out",
            Gauge,
            &|u| Some(Box::new(ConstGauge::new(u.memory_bytes as i64))),
        )?;
        family(
            "labforge_notebook_memory_limit_bytes",
            "A running notebook's memory limit (absent without one)",
            Gauge,
            &|u| Some(Box::new(ConstGauge::new(u.memory_limit_bytes? as i64))),
        )?;
        family(
            "labforge_notebook_gpu_utilization_ratio",
            "Mean utilization of a running notebook's GPUs, where their vendor reports it",
            Gauge,
            &|u| {
                Some(Box::new(ConstGauge::new(
                    u.gpu.as_ref()?.utilization_percent / 100.0,
                )))
            },
        )?;
        family(
            "labforge_notebook_gpu_memory_used_bytes",
            "Memory in use on a running notebook's GPUs, where their vendor reports it",
            Gauge,
            &|u| {
                Some(Box::new(ConstGauge::new(
                    u.gpu.as_ref()?.memory_bytes as i64,
                )))
            },
        )
    }
}

/// How long a GPU vendor's program may take to report.
const SMI_TIMEOUT: Duration = Duration::from_secs(5);

/// Each running notebook's GPU use, from its devices' vendor's program (`nvidia-smi`), run once
/// per sample whatever the number of notebooks. A notebook any of whose devices is not reported
/// is left out: its use is unknown, never guessed.
async fn gpu_use(
    gpus: &crate::gpus::GpuPool,
    running: &[Key],
    retry_after: &mut BTreeMap<PathBuf, tokio::time::Instant>,
) -> BTreeMap<Key, GpuUse> {
    let held: Vec<(Key, Vec<String>)> = running
        .iter()
        .map(|key| (key.clone(), gpus.held_by(&key.0, &key.1)))
        .filter(|(_, devices)| !devices.is_empty())
        .collect();
    let programs: BTreeSet<PathBuf> = held
        .iter()
        .flat_map(|(_, devices)| devices.iter())
        .filter_map(|device| gpus.smi_for(device).map(Path::to_owned))
        .collect();
    let mut reported: BTreeMap<PathBuf, Vec<crate::gpus::DeviceUse>> = BTreeMap::new();
    let now = tokio::time::Instant::now();
    for program in programs {
        // One that failed (a wedged GPU can hang it) is left alone for a while.
        if retry_after.get(&program).is_some_and(|t| *t > now) {
            continue;
        }
        match run_smi(&program).await {
            Ok(devices) => {
                retry_after.remove(&program);
                reported.insert(program, devices);
            }
            Err(err) => {
                tracing::debug!(program = %program.display(), error = %err, "reading GPU use");
                retry_after.insert(program, now + LOOKUP_RETRY);
            }
        }
    }
    held.into_iter()
        .filter_map(|(key, devices)| {
            let uses = devices
                .iter()
                .map(|device| {
                    let (_, name) = device.split_once('=')?;
                    reported
                        .get(gpus.smi_for(device)?)?
                        .iter()
                        .find(|u| u.index == name || u.uuid == name)
                })
                .collect::<Option<Vec<_>>>()?;
            let utilization =
                uses.iter().map(|u| u.utilization_percent).sum::<f64>() / uses.len() as f64;
            let memory = uses.iter().map(|u| u.memory_bytes).sum();
            Some((
                key,
                GpuUse {
                    utilization_percent: utilization,
                    memory_bytes: memory,
                },
            ))
        })
        .collect()
}

async fn run_smi(program: &Path) -> Result<Vec<crate::gpus::DeviceUse>, String> {
    let output = tokio::process::Command::new(program)
        .args(crate::gpus::SMI_QUERY)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(SMI_TIMEOUT, output)
        .await
        .map_err(|_| format!("no answer within {SMI_TIMEOUT:?}"))?
        .map_err(|e| e.to_string())?;
    if !output.status.success() {
        return Err(String::from_utf8_lossy(&output.stderr).trim().to_owned());
    }
    Ok(crate::gpus::parse_smi(&String::from_utf8_lossy(
        &output.stdout,
    )))
}

/// Serves the board at `/metrics` on `listener` until the process stops.
pub async fn serve_metrics(listener: tokio::net::TcpListener, board: Arc<UsageBoard>) {
    let mut registry = prometheus_client::registry::Registry::default();
    registry.register_collector(Box::new(board));
    let registry = Arc::new(registry);
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let registry = registry.clone();
            async move {
                let mut text = String::new();
                match prometheus_client::encoding::text::encode(&mut text, &registry) {
                    Ok(()) => (
                        [(
                            http::header::CONTENT_TYPE,
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )],
                        text,
                    )
                        .into_response(),
                    Err(_) => http::StatusCode::INTERNAL_SERVER_ERROR.into_response(),
                }
            }
        }),
    );
    if let Err(err) = axum::serve(listener, app).await {
        tracing::warn!(error = %err, "metrics server stopped");
    }
}

/// The machine's memory, from `/proc/meminfo`; `u64::MAX` when it cannot be read (every limit
/// is then taken as one).
pub fn machine_memory_bytes() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|info| {
            let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            kib.checked_mul(1024)
        })
        .unwrap_or(u64::MAX)
}

/// How long a container whose cgroup could not be found is left before it is looked up again.
const LOOKUP_RETRY: Duration = Duration::from_secs(30);

/// A running container's counters, found once from its main process.
#[derive(Clone, Debug)]
struct Tracked {
    pid: u32,
    files: CgroupFiles,
}

impl Tracked {
    /// The cgroup of container `id`'s process `pid`: refused unless the container has one of its
    /// own (its path names the container), since a shared one counts others' use too.
    fn find(id: &str, pid: u32) -> io::Result<Self> {
        let files = CgroupFiles::of_process(Path::new("/"), pid)?;
        let own = match &files {
            CgroupFiles::V1 { memory, .. } => memory.to_string_lossy().contains(id),
            CgroupFiles::V2 { dir } => dir.to_string_lossy().contains(id),
        };
        if !own {
            return Err(io::Error::other(format!(
                "the container's process is not in a cgroup of its own: {files:?}"
            )));
        }
        Ok(Self { pid, files })
    }

    /// Its counters, while its process lives: a replaced container's old cgroup may linger.
    fn read(&self) -> io::Result<Reading> {
        if !Path::new(&format!("/proc/{}", self.pid)).exists() {
            return Err(io::Error::other(format!("process {} is gone", self.pid)));
        }
        self.files.read()
    }
}

/// Samples the running notebooks' containers every [`SAMPLE_INTERVAL`], forever, and tells the
/// namespaces' watchers (a [`crate::store::Change::Usage`]) when their use changed. Each
/// container's cgroup is found once (one `inspect`); a container replaced since is found again,
/// and one that cannot be found is left for [`LOOKUP_RETRY`].
pub async fn sample_forever(runtime: Arc<crate::runtime::Runtime>, board: Arc<UsageBoard>) {
    let machine_memory = machine_memory_bytes();
    let mut tracked: BTreeMap<String, Tracked> = BTreeMap::new();
    let mut retry_after: BTreeMap<String, tokio::time::Instant> = BTreeMap::new();
    let mut smi_retry_after: BTreeMap<PathBuf, tokio::time::Instant> = BTreeMap::new();
    let mut ticks = tokio::time::interval(SAMPLE_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let running: Vec<(Key, String)> = runtime
            .store
            .list(None)
            .iter()
            .filter_map(|nb| {
                let ns = nb.metadata.namespace.clone().unwrap_or_default();
                let name = nb.metadata.name.clone().unwrap_or_default();
                runtime.port_of(&ns, &name)?;
                let container = crate::runtime::container_name(&ns, &name);
                Some(((ns, name), container))
            })
            .collect();
        let is_running = |container: &String| running.iter().any(|(_, c)| c == container);
        tracked.retain(|container, _| is_running(container));
        retry_after.retain(|container, _| is_running(container));
        let now = tokio::time::Instant::now();
        for (_, container) in &running {
            if tracked.contains_key(container)
                || retry_after.get(container).is_some_and(|t| *t > now)
            {
                continue;
            }
            let found = match runtime.engine.process_of(container).await {
                Ok((id, pid)) => tokio::task::spawn_blocking(move || Tracked::find(&id, pid))
                    .await
                    .map_err(|e| e.to_string())
                    .and_then(|found| found.map_err(|e| e.to_string())),
                Err(err) => Err(err.to_string()),
            };
            match found {
                Ok(found) => {
                    retry_after.remove(container);
                    tracked.insert(container.clone(), found);
                }
                Err(err) => {
                    tracing::debug!(%container, error = %err, "finding its cgroup");
                    retry_after.insert(container.clone(), now + LOOKUP_RETRY);
                }
            }
        }
        let to_read: Vec<(Key, String, Tracked)> = running
            .into_iter()
            .filter_map(|(key, container)| {
                let found = tracked.get(&container)?.clone();
                Some((key, container, found))
            })
            .collect();
        let Ok(read) = tokio::task::spawn_blocking(move || {
            to_read
                .into_iter()
                .map(|(key, container, found)| (key, container, found.read()))
                .collect::<Vec<_>>()
        })
        .await
        else {
            continue;
        };
        let mut readings = Vec::new();
        for (key, container, reading) in read {
            match reading {
                Ok(reading) => readings.push((key, reading)),
                Err(err) => {
                    // Gone or replaced: looked up again next time.
                    tracing::debug!(%container, error = %err, "reading its cgroup");
                    tracked.remove(&container);
                }
            }
        }
        let keys: Vec<Key> = readings.iter().map(|(key, _)| key.clone()).collect();
        let gpu_use = gpu_use(&runtime.gpus, &keys, &mut smi_retry_after).await;
        for namespace in board.record(readings, &gpu_use, machine_memory) {
            runtime.store.notify_usage(&namespace);
        }
    }
}

/// How often a cluster's metrics API is read: metrics-server scrapes every 15 s by default.
pub const METRICS_API_INTERVAL: Duration = Duration::from_secs(15);

/// `metrics.k8s.io/v1beta1` PodMetrics, as metrics-server serves them.
fn pod_metrics_resource() -> kube::api::ApiResource {
    kube::api::ApiResource {
        group: "metrics.k8s.io".into(),
        version: "v1beta1".into(),
        api_version: "metrics.k8s.io/v1beta1".into(),
        kind: "PodMetrics".into(),
        plural: "pods".into(),
    }
}

/// Every notebook pod's use, from one list of the cluster's PodMetrics: CPU cores (averaged over
/// metrics-server's window) and working-set memory of the notebook's own container (named as
/// the notebook, as Kubeflow names it; its limits are that container's), or of all its
/// containers when none is. A notebook's pod is its StatefulSet's `<name>-0`, with Kubeflow's
/// `notebook-name` label.
pub async fn read_metrics_api(client: &kube::Client) -> Result<Vec<(Key, Usage)>, kube::Error> {
    let api: kube::Api<kube::api::DynamicObject> =
        kube::Api::all_with(client.clone(), &pod_metrics_resource());
    let notebook_pods =
        kube::api::ListParams::default().labels(labforge_crds::notebook::NOTEBOOK_NAME_LABEL);
    let list = api.list(&notebook_pods).await?;
    Ok(list
        .items
        .iter()
        .filter_map(|pod| {
            let name = pod
                .metadata
                .labels
                .as_ref()?
                .get(labforge_crds::notebook::NOTEBOOK_NAME_LABEL)?
                .clone();
            // The StatefulSet's one pod: another pod a user labels so is not the notebook.
            if pod.metadata.name.as_deref() != Some(&format!("{name}-0")) {
                return None;
            }
            let namespace = pod.metadata.namespace.clone()?;
            let all = pod.data["containers"].as_array()?;
            let own: Vec<&serde_json::Value> = all.iter().filter(|c| c["name"] == name).collect();
            let containers = if own.is_empty() {
                all.iter().collect()
            } else {
                own
            };
            let amount = |resource: &str| -> f64 {
                containers
                    .iter()
                    .filter_map(|c| c["usage"][resource].as_str())
                    .filter_map(|q| labforge_crds::quantity::value(q).ok())
                    .sum()
            };
            let usage = Usage {
                cpu_cores: Some(amount("cpu")),
                cpu_seconds: None,
                memory_bytes: amount("memory") as u64,
                memory_limit_bytes: None,
                memory_near_limit: false,
                sampled_at: pod.data["timestamp"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                // A DCGM exporter would know; the metrics API does not.
                gpu: None,
            };
            Some(((namespace, name), usage))
        })
        .collect())
}

/// Reads the cluster's metrics API every [`METRICS_API_INTERVAL`], forever, and sends a
/// [`crate::store::Change::Usage`] for each namespace whose samples changed. Without
/// metrics-server (or the RBAC to read it) no use is shown.
pub async fn sample_metrics_api(
    client: kube::Client,
    board: Arc<UsageBoard>,
    changes: tokio::sync::broadcast::Sender<crate::store::Change>,
) {
    let mut ticks = tokio::time::interval(METRICS_API_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        match read_metrics_api(&client).await {
            Ok(usages) => {
                for namespace in board.replace(usages) {
                    // Nobody watching is fine.
                    let _ = changes.send(crate::store::Change::Usage { namespace });
                }
            }
            Err(err) => tracing::debug!(
                error = %labforge_messages::error_chain(&err),
                "reading notebook pods' use from metrics.k8s.io"
            ),
        }
    }
}

impl Usage {
    /// This use against `limit_bytes` (the notebook's own limit), when the sample has none.
    pub fn within(mut self, limit_bytes: Option<u64>) -> Self {
        if self.memory_limit_bytes.is_none() {
            self.memory_limit_bytes = limit_bytes;
            self.memory_near_limit = limit_bytes
                .is_some_and(|limit| self.memory_bytes as f64 >= limit as f64 * NEAR_LIMIT);
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    static START: std::sync::LazyLock<std::time::Instant> =
        std::sync::LazyLock::new(std::time::Instant::now);

    fn stats(cpu_ms: u64, at_ms: u64, memory: u64, limit: u64) -> Reading {
        Reading {
            cpu_nanos: cpu_ms * 1_000_000,
            at: *START + Duration::from_millis(at_ms),
            memory_bytes: memory,
            memory_limit_bytes: Some(limit),
        }
    }

    #[test]
    fn cpu_is_the_change_in_cpu_time_over_the_time_between_samples() {
        let first = usage_of(&stats(1_000, 0, GIB, 2 * GIB), None, 16 * GIB);
        assert_eq!(first.cpu_cores, None, "one sample tells no rate");
        assert_eq!(first.cpu_seconds, Some(1.0));
        let before = stats(1_000, 0, GIB, 2 * GIB);
        let busy = usage_of(&stats(4_000, 2_000, GIB, 2 * GIB), Some(&before), 16 * GIB);
        assert_eq!(busy.cpu_cores, Some(1.5));
        // Restarted: its CPU time went back, so no rate rather than a wrong one.
        let restarted = usage_of(&stats(10, 2_000, GIB, 2 * GIB), Some(&before), 16 * GIB);
        assert_eq!(restarted.cpu_cores, None);
    }

    #[test]
    fn a_limit_the_size_of_the_machine_is_no_limit_and_ninety_percent_is_near_it() {
        let unlimited = usage_of(&stats(0, 0, GIB, 16 * GIB), None, 16 * GIB);
        assert_eq!(unlimited.memory_limit_bytes, None);
        assert!(!unlimited.memory_near_limit);
        let under = usage_of(&stats(0, 0, GIB / 2, GIB), None, 16 * GIB);
        assert_eq!(under.memory_limit_bytes, Some(GIB));
        assert!(!under.memory_near_limit);
        let near = usage_of(&stats(0, 0, GIB * 9 / 10 + 1, GIB), None, 16 * GIB);
        assert!(near.memory_near_limit);
    }

    #[test]
    fn the_board_keeps_running_notebooks_and_names_the_namespaces_that_changed() {
        let board = UsageBoard::default();
        let key = |ns: &str, name: &str| (ns.to_owned(), name.to_owned());
        let changed = board.record(
            vec![
                (key("alice", "lab"), stats(0, 0, GIB, 2 * GIB)),
                (key("bob", "lab"), stats(0, 0, GIB, 2 * GIB)),
            ],
            &BTreeMap::new(),
            16 * GIB,
        );
        assert_eq!(changed, BTreeSet::from(["alice".into(), "bob".into()]));
        let gpu = GpuUse {
            utilization_percent: 40.0,
            memory_bytes: GIB,
        };
        let changed = board.record(
            vec![(key("alice", "lab"), stats(1_000, 1_000, GIB, 2 * GIB))],
            &BTreeMap::from([(key("alice", "lab"), gpu.clone())]),
            16 * GIB,
        );
        assert_eq!(changed, BTreeSet::from(["alice".into(), "bob".into()]));
        assert_eq!(board.get("alice", "lab").unwrap().cpu_cores, Some(1.0));
        assert_eq!(board.get("alice", "lab").unwrap().gpu, Some(gpu.clone()));
        assert_eq!(board.get("bob", "lab"), None, "stopped: no use shown");
        let same = board.record(
            vec![(key("alice", "lab"), stats(2_000, 2_000, GIB, 2 * GIB))],
            &BTreeMap::from([(key("alice", "lab"), gpu.clone())]),
            16 * GIB,
        );
        assert!(
            same.is_empty(),
            "nothing shown changed, nobody told: {same:?}"
        );

        let mut text = String::new();
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(Arc::new(board)));
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains(
                r#"labforge_notebook_cpu_usage_seconds_total{namespace="alice",notebook="lab"} 2.0"#
            ),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                r#"labforge_notebook_memory_working_set_bytes{{namespace="alice",notebook="lab"}} {GIB}"#
            )),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                r#"labforge_notebook_memory_limit_bytes{{namespace="alice",notebook="lab"}} {}"#,
                2 * GIB
            )),
            "{text}"
        );
        assert!(
            text.contains(
                r#"labforge_notebook_gpu_utilization_ratio{namespace="alice",notebook="lab"} 0.4"#
            ),
            "{text}"
        );
        assert!(!text.contains("bob"), "{text}");
    }
}
