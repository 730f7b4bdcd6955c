//! Prometheus metrics of the proxy, under the `labforge_proxy_` prefix.
//!
//! Labels stay low-cardinality (status code, error kind): a per-route label would make 10,000
//! notebooks 10,000 series per metric. Per-route facts live in the activity endpoint instead.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CodeLabels {
    pub code: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub kind: &'static str,
}

pub struct Metrics {
    /// Responses sent, by status code (the proxy's own pages included).
    pub requests: Family<CodeLabels, Counter>,
    /// Time from sending upstream to the upstream's response head.
    pub upstream_latency: Histogram,
    /// Failures to reach an upstream, by kind (`connect`, `upstream`).
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
}

impl Metrics {
    /// Creates the metrics and registers them in `registry` (prefixed `labforge_proxy`).
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            requests: Family::default(),
            upstream_latency: Histogram::new([
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
            ]),
            upstream_errors: Family::default(),
            websockets_active: Gauge::default(),
            connections_open: Gauge::default(),
            websockets: Counter::default(),
            routes: Gauge::default(),
            virtual_services: Gauge::default(),
            table_updates: Counter::default(),
            heap_releases: Counter::default(),
        };
        let registry = registry.sub_registry_with_prefix("labforge_proxy");
        registry.register(
            "requests",
            "Responses sent, by status code",
            metrics.requests.clone(),
        );
        registry.register(
            "upstream_latency_seconds",
            "Time from forwarding a request to the upstream's response head",
            metrics.upstream_latency.clone(),
        );
        registry.register(
            "upstream_errors",
            "Requests whose upstream could not be reached or failed, by kind",
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
        metrics
    }
}
