//! What each running notebook uses right now, beside what it asked for: owners see whether a
//! kernel is near its memory limit before it dies, admins who holds the CPUs and memory.
//!
//! One task samples every running notebook at a fixed interval, whatever the number of pages
//! open; pages and `/metrics` read the last sample from a [`UsageBoard`] in memory. The sampler
//! is the platform's: a cluster's metrics API ([`sample_metrics_api`]), or the containers' cgroup
//! counters in the embedded mode. From counters ([`Reading`]), CPU use is the change in CPU time
//! between two samples over the time between them, so it is known from the second sample on.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// A share of its memory limit from which a notebook is marked as near it.
pub const NEAR_LIMIT: f64 = 0.9;

/// One container's counters at one moment.
#[derive(Clone, Debug, PartialEq)]
pub struct Reading {
    /// CPU time since the container started.
    pub cpu_nanos: u64,
    /// When it was read: rates are measured on this monotonic clock, which no clock step moves.
    pub at: std::time::Instant,
    /// Memory in use, less the page cache the kernel could drop (what cAdvisor and the kubelet
    /// call the working set).
    pub memory_bytes: u64,
    /// Its memory limit; `None` without one.
    pub memory_limit_bytes: Option<u64>,
}

/// One notebook's use at one moment.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
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
    #[schema(inline, nullable = false)]
    pub gpu: Option<GpuUse>,
}

/// What a notebook's GPUs do: the mean utilization of its devices and their memory in use.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
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

/// A notebook: its namespace and name.
pub type Key = (String, String);

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

/// Serves the board at `/metrics` on `listener` until the process stops.
pub async fn serve_metrics(listener: tokio::net::TcpListener, board: Arc<UsageBoard>) {
    let mut registry = prometheus_client::registry::Registry::default();
    registry.register_collector(Box::new(board));
    let app: axum::Router = labforge_metrics::router(Arc::new(registry));
    if let Err(err) = axum::serve(listener, app).await {
        tracing::warn!(error = %err, "metrics server stopped");
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
/// [`crate::backend::Change::Usage`] for each namespace whose samples changed. Without
/// metrics-server (or the RBAC to read it) no use is shown.
pub async fn sample_metrics_api(
    client: kube::Client,
    board: Arc<UsageBoard>,
    changes: tokio::sync::broadcast::Sender<crate::backend::Change>,
) {
    let mut ticks = tokio::time::interval(METRICS_API_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        match read_metrics_api(&client).await {
            Ok(usages) => {
                for namespace in board.replace(usages) {
                    // Nobody watching is fine.
                    let _ = changes.send(crate::backend::Change::Usage { namespace });
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
