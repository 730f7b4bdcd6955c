//! Prometheus metrics with Kubeflow's names (dashboards keep working) plus reconcile timings.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Instant;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NamespaceLabels {
    pub namespace: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NotebookLabels {
    pub namespace: String,
    pub name: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub error: String,
}

pub struct Metrics {
    pub running: Family<NamespaceLabels, Gauge>,
    pub created: Family<NamespaceLabels, Counter>,
    pub create_failed: Family<NamespaceLabels, Counter>,
    pub culled: Family<NotebookLabels, Counter>,
    pub last_culled: Family<NotebookLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    pub reconcile_duration: Histogram,
    pub reconcile_errors: Family<ErrorLabels, Counter>,
    /// 1 while this replica holds the leader lease (or runs without election).
    pub leader: Gauge,
    /// Running state per notebook, to keep `notebook_running` exact per namespace.
    running_by_notebook: Mutex<BTreeMap<(String, String), bool>>,
}

impl Metrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            running: Family::default(),
            created: Family::default(),
            create_failed: Family::default(),
            culled: Family::default(),
            last_culled: Family::default(),
            reconcile_duration: Histogram::new([
                0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
            ]),
            reconcile_errors: Family::default(),
            leader: Gauge::default(),
            running_by_notebook: Mutex::new(BTreeMap::new()),
        };
        registry.register(
            "notebook_running",
            "Current running notebooks in the cluster",
            metrics.running.clone(),
        );
        // prometheus-client appends `_total` to counters.
        registry.register(
            "notebook_create",
            "Total times of creating notebooks",
            metrics.created.clone(),
        );
        registry.register(
            "notebook_create_failed",
            "Total failure times of creating notebooks",
            metrics.create_failed.clone(),
        );
        registry.register(
            "notebook_culling",
            "Total times of culling notebooks",
            metrics.culled.clone(),
        );
        registry.register(
            "last_notebook_culling_timestamp_seconds",
            "Timestamp of the last notebook culling in seconds",
            metrics.last_culled.clone(),
        );
        registry.register(
            "labforge_notebook_reconcile_duration_seconds",
            "Time spent reconciling one Notebook",
            metrics.reconcile_duration.clone(),
        );
        registry.register(
            "labforge_notebook_reconcile_errors",
            "Reconcile failures by error kind",
            metrics.reconcile_errors.clone(),
        );
        registry.register(
            "labforge_controller_leader",
            "Whether this replica leads (1) or stands by (0)",
            metrics.leader.clone(),
        );
        metrics
    }

    /// Records whether a notebook runs (forgetting it when `running` is `None`).
    pub fn set_running(&self, namespace: &str, name: &str, running: Option<bool>) {
        let Ok(mut by_notebook) = self.running_by_notebook.lock() else {
            return;
        };
        let key = (namespace.to_owned(), name.to_owned());
        match running {
            Some(running) => by_notebook.insert(key, running),
            None => by_notebook.remove(&key),
        };
        // Keys sort by namespace first: count only this namespace's entries, not every notebook
        // on every reconcile.
        let count = by_notebook
            .range((namespace.to_owned(), String::new())..)
            .take_while(|((ns, _), _)| ns == namespace)
            .filter(|(_, running)| **running)
            .count();
        self.running
            .get_or_create(&NamespaceLabels {
                namespace: namespace.to_owned(),
            })
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    /// A timer that records the reconcile duration when dropped.
    pub fn reconcile_timer(&self) -> DurationTimer<'_> {
        DurationTimer {
            start: Instant::now(),
            histogram: &self.reconcile_duration,
        }
    }
}

pub struct DurationTimer<'a> {
    start: Instant,
    histogram: &'a Histogram,
}

impl Drop for DurationTimer<'_> {
    fn drop(&mut self) {
        self.histogram.observe(self.start.elapsed().as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_uses_kubeflow_names_and_counts_running_per_namespace() {
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry);
        metrics.set_running("alice", "a", Some(true));
        metrics.set_running("alice", "b", Some(true));
        metrics.set_running("alice", "b", Some(false));
        metrics.set_running("bob", "c", Some(true));
        metrics.set_running("bob", "c", None);
        metrics
            .created
            .get_or_create(&NamespaceLabels {
                namespace: "alice".into(),
            })
            .inc();
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains(r#"notebook_running{namespace="alice"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"notebook_running{namespace="bob"} 0"#),
            "{text}"
        );
        assert!(
            text.contains(r#"notebook_create_total{namespace="alice"} 1"#),
            "{text}"
        );
        let culled = NotebookLabels {
            namespace: "alice".into(),
            name: "a".into(),
        };
        metrics.culled.get_or_create(&culled).inc();
        metrics
            .last_culled
            .get_or_create(&culled)
            .set(1_763_700_000.5);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains(r#"notebook_culling_total{namespace="alice",name="a"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"last_notebook_culling_timestamp_seconds{namespace="alice",name="a"} 1763700000.5"#),
            "{text}"
        );
        assert!(
            text.contains("labforge_notebook_reconcile_duration_seconds"),
            "{text}"
        );
    }
}
