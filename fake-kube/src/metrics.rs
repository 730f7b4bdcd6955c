//! `metrics.k8s.io/v1beta1` as metrics-server serves it through the aggregation layer: PodMetrics,
//! read only, listed across namespaces or in one, or got by pod name. The test sets what a
//! metrics-server would have scraped ([`super::FakeApiServer::set_pod_metrics`]); the pods need
//! not exist. Requests are authorized as any other (`pods` in group `metrics.k8s.io`).

use serde_json::{Value, json};
use std::collections::BTreeMap;

pub(crate) const GROUP: &str = "metrics.k8s.io";
pub(crate) const VERSION: &str = "v1beta1";

/// One pod's sample: its labels and each container's CPU and memory quantities.
#[derive(Debug, Clone)]
pub(crate) struct PodSample {
    pub labels: BTreeMap<String, String>,
    pub containers: Vec<(String, String, String)>,
}

/// Samples by (namespace, pod).
pub(crate) type PodSamples = BTreeMap<(String, String), PodSample>;

/// A PodMetrics object as metrics-server writes it.
pub(crate) fn pod_metrics(namespace: &str, name: &str, sample: &PodSample) -> Value {
    json!({
        "kind": "PodMetrics",
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": sample.labels,
            "creationTimestamp": jiff::Timestamp::now().to_string(),
        },
        "timestamp": jiff::Timestamp::now().to_string(),
        "window": "15s",
        "containers": sample.containers.iter().map(|(container, cpu, memory)| json!({
            "name": container,
            "usage": {"cpu": cpu, "memory": memory},
        })).collect::<Vec<_>>(),
    })
}

/// The PodMetricsList of `namespace` (every namespace when `None`).
pub(crate) fn list(samples: &PodSamples, namespace: Option<&str>) -> Value {
    let items: Vec<Value> = samples
        .iter()
        .filter(|((ns, _), _)| namespace.is_none_or(|n| n == ns))
        .map(|((ns, name), sample)| pod_metrics(ns, name, sample))
        .collect();
    json!({
        "kind": "PodMetricsList",
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "metadata": {},
        "items": items,
    })
}
