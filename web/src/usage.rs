//! What each running notebook uses right now, beside what it asked for: owners see whether a
//! kernel is near its memory limit before it dies, admins who holds the CPUs and memory.
//!
//! One task samples every running notebook at a fixed interval (the container engine's stats in
//! the embedded mode), whatever the number of pages open; pages and `/metrics` read the last
//! sample from a [`UsageBoard`] in memory. CPU use is the change in CPU time between two samples
//! over the time between them, so it is known from the second sample on.

use crate::store::Store;
use axum::response::IntoResponse;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
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
    /// CPU time its container used since it started.
    pub cpu_seconds: f64,
    /// Memory in use, as the engine counts it (page cache it could drop left out).
    pub memory_bytes: u64,
    /// Its memory limit; `None` when it has none below the machine's memory.
    pub memory_limit_bytes: Option<u64>,
    /// At or above [`NEAR_LIMIT`] of its memory limit: the kernel may soon be killed.
    pub memory_near_limit: bool,
    /// When it was read (RFC 3339).
    pub sampled_at: String,
}

/// One container's reading, as podman's `ContainerStats` reports it.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct EngineStats {
    #[serde(rename = "Name")]
    pub name: String,
    /// CPU time since the container started.
    #[serde(rename = "CPUNano")]
    pub cpu_nanos: u64,
    /// The machine's clock when read.
    #[serde(rename = "SystemNano")]
    pub system_nanos: u64,
    #[serde(rename = "MemUsage")]
    pub memory_bytes: u64,
    /// The container's memory limit, or the machine's memory when it has none.
    #[serde(rename = "MemLimit")]
    pub memory_limit_bytes: u64,
}

/// The engine's stats output: one JSON object per line (`--format '{{json .ContainerStats}}'`).
pub fn parse_stats(output: &str) -> Result<Vec<EngineStats>, serde_json::Error> {
    output
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(serde_json::from_str)
        .collect()
}

/// The use `now` shows, given the notebook's previous reading (for CPU) and the machine's memory
/// (a limit that large is no limit).
pub fn usage_of(
    now: &EngineStats,
    before: Option<&EngineStats>,
    machine_memory_bytes: u64,
) -> Usage {
    let cpu_cores = before.and_then(|before| {
        let wall = now.system_nanos.checked_sub(before.system_nanos)?;
        // A restarted container's CPU time starts again from zero.
        let cpu = now.cpu_nanos.checked_sub(before.cpu_nanos)?;
        (wall > 0).then(|| cpu as f64 / wall as f64)
    });
    let memory_limit_bytes = (now.memory_limit_bytes > 0
        && now.memory_limit_bytes < machine_memory_bytes)
        .then_some(now.memory_limit_bytes);
    Usage {
        cpu_cores,
        cpu_seconds: now.cpu_nanos as f64 / 1e9,
        memory_bytes: now.memory_bytes,
        memory_limit_bytes,
        memory_near_limit: memory_limit_bytes
            .is_some_and(|limit| now.memory_bytes as f64 >= limit as f64 * NEAR_LIMIT),
        sampled_at: jiff::Timestamp::from_nanosecond(i128::from(now.system_nanos))
            .unwrap_or_else(|_| jiff::Timestamp::now())
            .to_string(),
    }
}

type Key = (String, String);

/// The last sample of every running notebook.
#[derive(Debug, Default)]
pub struct UsageBoard {
    samples: RwLock<BTreeMap<Key, (EngineStats, Usage)>>,
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
        readings: Vec<(Key, EngineStats)>,
        machine_memory_bytes: u64,
    ) -> BTreeSet<String> {
        let mut samples = self.samples.write().unwrap_or_else(|e| e.into_inner());
        let mut next = BTreeMap::new();
        for (key, stats) in readings {
            let before = samples.get(&key).map(|(stats, _)| stats);
            let usage = usage_of(&stats, before, machine_memory_bytes);
            next.insert(key, (stats, usage));
        }
        let mut changed: BTreeSet<String> = samples
            .keys()
            .filter(|key| !next.contains_key(*key))
            .map(|(ns, _)| ns.clone())
            .collect();
        changed.extend(next.keys().map(|(ns, _)| ns.clone()));
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

/// The board as Prometheus metrics, read at each scrape.
impl Collector for UsageBoard {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let all = self.all();
        let labels = |(ns, name): &Key| [("namespace", ns.clone()), ("notebook", name.clone())];
        let cpu = encoder.encode_descriptor(
            "labforge_notebook_cpu_usage_seconds",
            "CPU time a running notebook's container used since it started",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        let mut cpu = cpu;
        for (key, usage) in &all {
            ConstCounter::new(usage.cpu_seconds).encode(cpu.encode_family(&labels(key))?)?;
        }
        let mut memory = encoder.encode_descriptor(
            "labforge_notebook_memory_working_set_bytes",
            "Memory a running notebook uses, page cache it could drop left out",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for (key, usage) in &all {
            ConstGauge::new(usage.memory_bytes as i64)
                .encode(memory.encode_family(&labels(key))?)?;
        }
        let mut limit = encoder.encode_descriptor(
            "labforge_notebook_memory_limit_bytes",
            "A running notebook's memory limit (absent without one)",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for (key, usage) in &all {
            if let Some(bytes) = usage.memory_limit_bytes {
                ConstGauge::new(bytes as i64).encode(limit.encode_family(&labels(key))?)?;
            }
        }
        Ok(())
    }
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

/// Samples the running notebooks' containers every [`SAMPLE_INTERVAL`], forever, and tells the
/// namespaces' watchers (a [`crate::store::Change::Usage`]) after each sample.
pub async fn sample_forever(
    engine: crate::runtime::Engine,
    store: Arc<Store>,
    board: Arc<UsageBoard>,
) {
    let machine_memory = machine_memory_bytes();
    let mut ticks = tokio::time::interval(SAMPLE_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let stats = match engine.stats().await {
            Ok(stats) => stats,
            Err(err) => {
                // A container removed while being read fails the whole call: the next one reads
                // the rest.
                tracing::debug!(error = %err, "reading the notebooks' resource use");
                continue;
            }
        };
        let by_container: BTreeMap<String, Key> = store
            .list(None)
            .iter()
            .map(|nb| {
                let ns = nb.metadata.namespace.clone().unwrap_or_default();
                let name = nb.metadata.name.clone().unwrap_or_default();
                (crate::runtime::container_name(&ns, &name), (ns, name))
            })
            .collect();
        let readings = stats
            .into_iter()
            .filter_map(|s| Some((by_container.get(&s.name)?.clone(), s)))
            .collect();
        for namespace in board.record(readings, machine_memory) {
            store.notify_usage(&namespace);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn stats(cpu_ms: u64, at_ms: u64, memory: u64, limit: u64) -> EngineStats {
        EngineStats {
            name: "labforge-alice_lab".into(),
            cpu_nanos: cpu_ms * 1_000_000,
            system_nanos: 1_800_000_000_000_000_000 + at_ms * 1_000_000,
            memory_bytes: memory,
            memory_limit_bytes: limit,
        }
    }

    #[test]
    fn podmans_stats_lines_are_read() {
        let line = r#"{"AvgCPU":3.7,"ContainerID":"898b","Name":"labforge-alice_lab","PerCPU":null,"CPU":3.7,"CPUNano":40124421,"CPUSystemNano":1,"SystemNano":1795685189707279470,"MemUsage":1019904,"MemLimit":536870912,"MemPerc":0.19,"NetInput":472,"NetOutput":916,"BlockInput":0,"BlockOutput":0,"PIDs":2,"UpTime":40124421,"Duration":40124421}"#;
        let parsed = parse_stats(&format!("{line}\n\n")).unwrap();
        assert_eq!(
            parsed,
            [EngineStats {
                name: "labforge-alice_lab".into(),
                cpu_nanos: 40_124_421,
                system_nanos: 1_795_685_189_707_279_470,
                memory_bytes: 1_019_904,
                memory_limit_bytes: 536_870_912,
            }]
        );
        assert!(parse_stats("not json").is_err());
    }

    #[test]
    fn cpu_is_the_change_in_cpu_time_over_the_time_between_samples() {
        let first = usage_of(&stats(1_000, 0, GIB, 2 * GIB), None, 16 * GIB);
        assert_eq!(first.cpu_cores, None, "one sample tells no rate");
        assert_eq!(first.cpu_seconds, 1.0);
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
            16 * GIB,
        );
        assert_eq!(changed, BTreeSet::from(["alice".into(), "bob".into()]));
        let changed = board.record(
            vec![(key("alice", "lab"), stats(1_000, 1_000, GIB, 2 * GIB))],
            16 * GIB,
        );
        assert_eq!(changed, BTreeSet::from(["alice".into(), "bob".into()]));
        assert_eq!(board.get("alice", "lab").unwrap().cpu_cores, Some(1.0));
        assert_eq!(board.get("bob", "lab"), None, "stopped: no use shown");

        let mut text = String::new();
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(Arc::new(board)));
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains(
                r#"labforge_notebook_cpu_usage_seconds_total{namespace="alice",notebook="lab"} 1.0"#
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
        assert!(!text.contains("bob"), "{text}");
    }
}
