//! Prometheus metrics of the proxy, under the `labforge_proxy_` prefix.
//!
//! Labels stay low-cardinality (status code, error kind): a per-route label would make 10,000
//! notebooks 10,000 series per metric. Per-route facts live in the activity endpoint instead.
//!
//! What every request updates (responses by code, upstream latency) is kept per serving thread
//! ([`ThreadMetrics`]) and summed when scraped: one shared counter family and histogram, each
//! behind a lock, moved their cache lines between the cores on every request.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CodeLabels {
    pub code: u16,
}

/// Why a VirtualService's rule was refused ([`crate::routes::Refusal::label`]).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusalLabels {
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub kind: &'static str,
}

pub struct Metrics {
    /// Responses by status code and upstream latency, a shard per serving thread.
    per_thread: Arc<PerThread>,
    /// Failures to reach an upstream, by kind (`connect`, `upstream`, `timeout`: a route's
    /// timeout passed before the response head).
    pub upstream_errors: Family<ErrorLabels, Counter>,
    pub websockets_active: Gauge,
    /// Client connections open now (each one a task).
    pub connections_open: Gauge,
    pub websockets: Counter,
    /// Rules in the current table.
    pub routes: Gauge,
    pub virtual_services: Gauge,
    /// Route tables built and swapped in.
    pub table_updates: Counter,
    /// Times free memory was given back to the operating system ([`crate::heap_release`]).
    pub heap_releases: Counter,
    /// VirtualService rules refused for reaching beyond their namespace, by reason, counted
    /// each time such a rule arrives.
    pub rules_refused: Family<RefusalLabels, Counter>,
    /// Client connections answered 503 at once: the connection cap was reached.
    pub connections_refused: Counter,
    /// Requests whose body came too slowly and was cut off.
    pub slow_bodies: Counter,
    /// Websocket tunnels closed because the visitor's session ended.
    pub tunnels_revoked: Counter,
}

impl Metrics {
    /// Creates the metrics and registers them in `registry` (prefixed `labforge_proxy`).
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            per_thread: Arc::default(),
            upstream_errors: Family::default(),
            websockets_active: Gauge::default(),
            connections_open: Gauge::default(),
            websockets: Counter::default(),
            routes: Gauge::default(),
            virtual_services: Gauge::default(),
            table_updates: Counter::default(),
            heap_releases: Counter::default(),
            rules_refused: Family::default(),
            connections_refused: Counter::default(),
            slow_bodies: Counter::default(),
            tunnels_revoked: Counter::default(),
        };
        let registry = registry.sub_registry_with_prefix("labforge_proxy");
        registry.register_collector(Box::new(metrics.per_thread.clone()));
        registry.register(
            "upstream_errors",
            "Requests whose upstream could not be reached, failed or timed out, by kind",
            metrics.upstream_errors.clone(),
        );
        registry.register(
            "websockets_active",
            "Websocket connections being proxied now",
            metrics.websockets_active.clone(),
        );
        registry.register(
            "connections_open",
            "Client connections open now",
            metrics.connections_open.clone(),
        );
        registry.register(
            "websockets",
            "Websocket connections proxied",
            metrics.websockets.clone(),
        );
        registry.register("routes", "Rules in the route table", metrics.routes.clone());
        registry.register(
            "virtual_services",
            "VirtualServices contributing routes",
            metrics.virtual_services.clone(),
        );
        registry.register(
            "route_table_updates",
            "Route tables built and swapped in",
            metrics.table_updates.clone(),
        );
        registry.register(
            "heap_releases",
            "Times free memory was given back to the operating system after a burst of connections or a new route list",
            metrics.heap_releases.clone(),
        );
        registry.register(
            "rules_refused",
            "VirtualService rules refused for reaching beyond their namespace, by reason",
            metrics.rules_refused.clone(),
        );
        registry.register(
            "connections_refused",
            "Client connections answered 503 because the connection cap was reached",
            metrics.connections_refused.clone(),
        );
        registry.register(
            "slow_request_bodies",
            "Requests whose body arrived slower than the minimum rate and was cut off",
            metrics.slow_bodies.clone(),
        );
        registry.register(
            "tunnels_revoked",
            "Websocket tunnels closed because the visitor's session ended",
            metrics.tunnels_revoked.clone(),
        );
        metrics
    }

    /// A new serving thread's own shard of the per-request metrics.
    pub fn thread_shard(&self) -> Arc<ThreadMetrics> {
        let shard = Arc::new(ThreadMetrics::default());
        self.per_thread
            .shards
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(shard.clone());
        shard
    }
}

/// Upper bounds of the upstream latency histogram's buckets, in seconds.
const LATENCY_BUCKETS: [f64; 13] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];
const LOWEST_CODE: u16 = 100;
const HIGHEST_CODE: u16 = 599;

/// One serving thread's responses by status code and upstream latencies. Only that thread
/// writes them, so their cache lines stay in its core; a scrape reads them all.
#[derive(Debug)]
pub struct ThreadMetrics {
    /// Responses by status code, indexed by code − 100.
    responses: Box<[AtomicU64]>,
    /// Upstream latencies per bucket of [`LATENCY_BUCKETS`], then above the last.
    latency_buckets: [AtomicU64; LATENCY_BUCKETS.len() + 1],
    latency_sum_nanos: AtomicU64,
}

impl Default for ThreadMetrics {
    fn default() -> Self {
        Self {
            responses: (LOWEST_CODE..=HIGHEST_CODE)
                .map(|_| AtomicU64::new(0))
                .collect(),
            latency_buckets: Default::default(),
            latency_sum_nanos: AtomicU64::new(0),
        }
    }
}

impl ThreadMetrics {
    /// Counts a response sent with `code` (hyper allows 100–999; above 599 counts as 599).
    pub fn response(&self, code: u16) {
        let at = code.clamp(LOWEST_CODE, HIGHEST_CODE) - LOWEST_CODE;
        if let Some(count) = self.responses.get(usize::from(at)) {
            count.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Records the time from forwarding a request to its upstream's response head.
    pub fn upstream_latency(&self, took: Duration) {
        let seconds = took.as_secs_f64();
        let bucket = LATENCY_BUCKETS
            .iter()
            .position(|&upper| seconds <= upper)
            .unwrap_or(LATENCY_BUCKETS.len());
        self.latency_buckets[bucket].fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        self.latency_sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }
}

/// Every serving thread's shard, summed into `requests` and `upstream_latency_seconds` when
/// scraped.
#[derive(Debug, Default)]
struct PerThread {
    shards: Mutex<Vec<Arc<ThreadMetrics>>>,
}

impl Collector for PerThread {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let shards = self
            .shards
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let total = |read: &dyn Fn(&ThreadMetrics) -> &AtomicU64| -> u64 {
            shards.iter().map(|s| read(s).load(Ordering::Relaxed)).sum()
        };

        let mut requests = encoder.encode_descriptor(
            "requests",
            "Responses sent, by status code",
            None,
            MetricType::Counter,
        )?;
        for (at, code) in (LOWEST_CODE..=HIGHEST_CODE).enumerate() {
            let count = total(&|s| &s.responses[at]);
            if count > 0 {
                requests
                    .encode_family(&CodeLabels { code })?
                    .encode_counter::<NoLabelSet, _, u64>(&count, None)?;
            }
        }

        let buckets: Vec<(f64, u64)> = LATENCY_BUCKETS
            .iter()
            .copied()
            .chain([f64::INFINITY])
            .enumerate()
            .map(|(at, upper)| (upper, total(&|s| &s.latency_buckets[at])))
            .collect();
        let count = buckets.iter().map(|(_, n)| n).sum();
        let sum = total(&|s| &s.latency_sum_nanos) as f64 / 1e9;
        encoder
            .encode_descriptor(
                "upstream_latency_seconds",
                "Time from forwarding a request to the upstream's response head",
                None,
                MetricType::Histogram,
            )?
            .encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_thread_shards_are_summed_when_scraped() {
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry);
        let (one, two) = (metrics.thread_shard(), metrics.thread_shard());
        one.response(200);
        one.response(200);
        two.response(200);
        two.response(503);
        two.response(999);
        one.upstream_latency(Duration::from_micros(300));
        two.upstream_latency(Duration::from_millis(2));
        two.upstream_latency(Duration::from_secs(60));

        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for expected in [
            "# TYPE labforge_proxy_requests counter",
            r#"labforge_proxy_requests_total{code="200"} 3"#,
            r#"labforge_proxy_requests_total{code="503"} 1"#,
            r#"labforge_proxy_requests_total{code="599"} 1"#,
            "# TYPE labforge_proxy_upstream_latency_seconds histogram",
            r#"labforge_proxy_upstream_latency_seconds_bucket{le="0.0005"} 1"#,
            r#"labforge_proxy_upstream_latency_seconds_bucket{le="0.001"} 1"#,
            r#"labforge_proxy_upstream_latency_seconds_bucket{le="0.0025"} 2"#,
            r#"labforge_proxy_upstream_latency_seconds_bucket{le="10.0"} 2"#,
            r#"labforge_proxy_upstream_latency_seconds_bucket{le="+Inf"} 3"#,
            "labforge_proxy_upstream_latency_seconds_count 3",
            "labforge_proxy_upstream_latency_seconds_sum 60.0023",
        ] {
            assert!(lines.contains(&expected), "no {expected:?} in\n{text}");
        }
        assert!(
            !text.contains(r#"code="404""#),
            "codes never sent are not listed"
        );
    }
}
