//! The cluster's other half, minimal: a StatefulSet controller and a kubelet, so that what a
//! controller asks for turns into pods the way a cluster would run them.
//!
//! - StatefulSets get a pod `<name>-<ordinal>` per replica, owned by the set (blocking owner
//!   deletion), from the set's template; pods past `replicas` are deleted, and a pod whose
//!   template no longer matches is replaced. The set's status counts its ready pods.
//! - A pod is not created when a ResourceQuota of its namespace limits CPU or memory that one of
//!   its containers does not state and no LimitRange gives it a default (quota admission's
//!   rule); the set gets a `FailedCreate` Warning event saying so, as the real controller's does.
//! - The kubelet runs a pod whose claims all exist: Running and Ready, every container running.
//!   A pod claiming a missing PersistentVolumeClaim stays Pending, `Unschedulable`, with the
//!   scheduler's message.
//!
//! It works through the server's own API (a client of it), so every object it writes is validated
//! like anyone else's. Not modelled: rolling-update order, pod disruption, images, probes.

use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetStatus};
use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStatus, Event, EventSource,
    LimitRange, PersistentVolumeClaim, Pod, PodCondition, PodStatus, ResourceQuota,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use std::collections::BTreeMap;
use std::time::Duration;

/// Label with the template's digest, which tells a pod made from an older template.
const TEMPLATE_HASH_LABEL: &str = "controller-revision-hash";
const POD_NAME_LABEL: &str = "statefulset.kubernetes.io/pod-name";

/// Runs until the server stops: one pass on every change, and at least every half second.
pub(crate) async fn run(
    client: kube::Client,
    mut changes: tokio::sync::watch::Receiver<u64>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        if let Err(err) = pass(&client).await {
            tracing::debug!(error = %err, "the fake kubelet's pass");
        }
        tokio::select! {
            _ = changes.changed() => {}
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            _ = shutdown.wait_for(|stopped| *stopped) => return,
        }
    }
}

/// One round over every set and pod; what fails for one (logged) does not hold the others.
async fn pass(client: &kube::Client) -> kube::Result<()> {
    let log = |what: &str, result: kube::Result<()>| {
        if let Err(err) = result {
            tracing::debug!(error = %err, what, "the fake kubelet");
        }
    };
    let sets = Api::<StatefulSet>::all(client.clone())
        .list(&ListParams::default())
        .await?;
    for set in &sets.items {
        if set.metadata.deletion_timestamp.is_none() {
            log("a StatefulSet's pods", reconcile_set(client, set).await);
        }
    }
    let pods = Api::<Pod>::all(client.clone())
        .list(&ListParams::default())
        .await?;
    for pod in &pods.items {
        log("a pod's status", run_pod(client, pod).await);
    }
    for set in &sets.items {
        if set.metadata.deletion_timestamp.is_none() {
            log(
                "a StatefulSet's status",
                write_set_status(client, set, &pods.items).await,
            );
        }
    }
    Ok(())
}

fn template_hash(set: &StatefulSet) -> String {
    let template = set.spec.as_ref().map(|s| &s.template);
    format!(
        "{:010x}",
        fnv(&serde_json::to_vec(&template).unwrap_or_default()) >> 24
    )
}

/// FNV-1a: a short, stable name for a template or a message (not for security).
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

async fn reconcile_set(client: &kube::Client, set: &StatefulSet) -> kube::Result<()> {
    let namespace = set.namespace().unwrap_or_default();
    let name = set.name_any();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let Some(spec) = set.spec.as_ref() else {
        return Ok(());
    };
    let replicas = spec.replicas.unwrap_or(1).max(0);
    let hash = template_hash(set);
    let owned = pods
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|pod| {
            pod.owner_references()
                .iter()
                .any(|o| Some(&o.uid) == set.metadata.uid.as_ref())
        });
    let mut present = BTreeMap::new();
    for pod in owned {
        let ordinal = pod
            .name_any()
            .strip_prefix(&format!("{name}-"))
            .and_then(|n| n.parse::<i32>().ok());
        let current = pod.labels().get(TEMPLATE_HASH_LABEL) == Some(&hash);
        match ordinal {
            Some(ordinal) if ordinal < replicas && current => {
                present.insert(ordinal, pod);
            }
            _ if pod.metadata.deletion_timestamp.is_none() => {
                pods.delete(&pod.name_any(), &DeleteParams::default())
                    .await?;
            }
            _ => {}
        }
    }
    for ordinal in 0..replicas {
        if present.contains_key(&ordinal) {
            continue;
        }
        // The set may have been deleted since it was listed: no pod for it then.
        let sets: Api<StatefulSet> = Api::namespaced(client.clone(), &namespace);
        let current = sets.get_opt(&name).await?;
        if current.is_none_or(|current| {
            current.metadata.deletion_timestamp.is_some()
                || current.metadata.uid != set.metadata.uid
        }) {
            return Ok(());
        }
        let pod = pod_for(set, ordinal, &hash);
        if let Some(refusal) = quota_refusal(client, &namespace, &pod).await? {
            let message = format!(
                "create Pod {} in StatefulSet {name} failed error: pods \"{}\" is forbidden: {refusal}",
                pod.name_any(),
                pod.name_any()
            );
            warn_once(client, set, "FailedCreate", &message).await?;
            continue;
        }
        match pods.create(&PostParams::default(), &pod).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(err) => return Err(err),
        }
    }
    Ok(())
}

fn pod_for(set: &StatefulSet, ordinal: i32, hash: &str) -> Pod {
    let name = format!("{}-{ordinal}", set.name_any());
    let template = set
        .spec
        .as_ref()
        .map(|s| s.template.clone())
        .unwrap_or_default();
    let template_meta = template.metadata.unwrap_or_default();
    let mut labels = template_meta.labels.unwrap_or_default();
    labels.insert(TEMPLATE_HASH_LABEL.into(), hash.into());
    labels.insert(POD_NAME_LABEL.into(), name.clone());
    let owner = OwnerReference {
        api_version: "apps/v1".into(),
        kind: "StatefulSet".into(),
        name: set.name_any(),
        uid: set.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    };
    let mut spec = template.spec.unwrap_or_default();
    spec.hostname = Some(name.clone());
    Pod {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: set.namespace(),
            labels: Some(labels),
            annotations: template_meta.annotations,
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        spec: Some(spec),
        status: None,
    }
}

/// Quota admission's refusal of `pod`, if any: a ResourceQuota of the namespace limits CPU or
/// memory (`limits.cpu`, `requests.memory`, `cpu`, ...) that a container, init containers
/// included, does not state, and no LimitRange gives it a default.
async fn quota_refusal(
    client: &kube::Client,
    namespace: &str,
    pod: &Pod,
) -> kube::Result<Option<String>> {
    let quotas = Api::<ResourceQuota>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await?;
    if quotas.items.is_empty() {
        return Ok(None);
    }
    let ranges = Api::<LimitRange>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await?;
    // A LimitRange fills a container's limit from its `default` (else its `max`), and its
    // request from `defaultRequest` (else the limit so filled).
    let defaulted = |resource: &str| {
        ranges.items.iter().any(|range| {
            range.spec.as_ref().is_some_and(|spec| {
                spec.limits.iter().any(|item| {
                    item.type_ == "Container"
                        && [&item.default, &item.default_request, &item.max]
                            .iter()
                            .any(|d| d.as_ref().is_some_and(|d| d.contains_key(resource)))
                })
            })
        })
    };
    let spec = pod.spec.clone().unwrap_or_default();
    let containers: Vec<&Container> = spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .collect();
    for quota in &quotas.items {
        let hard = quota.spec.as_ref().and_then(|s| s.hard.as_ref());
        for resource in hard.into_iter().flat_map(|h| h.keys()) {
            // Quota admission asks every container to state CPU and memory only.
            let (kind, name) = match resource.as_str() {
                "limits.cpu" => ("limits", "cpu"),
                "limits.memory" => ("limits", "memory"),
                "requests.cpu" | "cpu" => ("requests", "cpu"),
                "requests.memory" | "memory" => ("requests", "memory"),
                _ => continue,
            };
            if defaulted(name) {
                continue;
            }
            let missing: Vec<&str> = containers
                .iter()
                .filter(|c| {
                    let resources = c.resources.as_ref();
                    let stated = match kind {
                        "limits" => resources.and_then(|r| r.limits.as_ref()),
                        _ => resources.and_then(|r| r.requests.as_ref().or(r.limits.as_ref())),
                    };
                    !stated.is_some_and(|q| q.contains_key(name))
                })
                .map(|c| c.name.as_str())
                .collect();
            if !missing.is_empty() {
                return Ok(Some(format!(
                    "failed quota: {}: must specify {resource} for: {}",
                    quota.name_any(),
                    missing.join(",")
                )));
            }
        }
    }
    Ok(None)
}

/// The kubelet's and scheduler's part: a pod whose claims exist runs; one that claims a
/// missing PersistentVolumeClaim is Pending and says why.
async fn run_pod(client: &kube::Client, pod: &Pod) -> kube::Result<()> {
    if pod.metadata.deletion_timestamp.is_some() {
        return Ok(());
    }
    let namespace = pod.namespace().unwrap_or_default();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &namespace);
    let spec = pod.spec.clone().unwrap_or_default();
    let mut missing = None;
    for volume in spec.volumes.iter().flatten() {
        if let Some(claim) = &volume.persistent_volume_claim
            && claims.get_opt(&claim.claim_name).await?.is_none()
        {
            missing = Some(claim.claim_name.clone());
            break;
        }
    }
    let now = Time(jiff::Timestamp::now());
    let condition = |type_: &str, status: bool| PodCondition {
        type_: type_.into(),
        status: if status { "True" } else { "False" }.into(),
        last_transition_time: Some(now.clone()),
        ..Default::default()
    };
    let status = match missing {
        Some(claim) => PodStatus {
            phase: Some("Pending".into()),
            conditions: Some(vec![PodCondition {
                reason: Some("Unschedulable".into()),
                message: Some(format!(
                    "0/1 nodes are available: persistentvolumeclaim \"{claim}\" not found."
                )),
                ..condition("PodScheduled", false)
            }]),
            ..Default::default()
        },
        None => PodStatus {
            phase: Some("Running".into()),
            conditions: Some(
                ["PodScheduled", "Initialized", "ContainersReady", "Ready"]
                    .iter()
                    .map(|t| condition(t, true))
                    .collect(),
            ),
            container_statuses: Some(
                spec.containers
                    .iter()
                    .map(|c| ContainerStatus {
                        name: c.name.clone(),
                        image: c.image.clone().unwrap_or_default(),
                        image_id: String::new(),
                        ready: true,
                        restart_count: 0,
                        started: Some(true),
                        state: Some(ContainerState {
                            running: Some(ContainerStateRunning {
                                started_at: Some(now.clone()),
                            }),
                            ..Default::default()
                        }),
                        ..Default::default()
                    })
                    .collect(),
            ),
            start_time: Some(now.clone()),
            ..Default::default()
        },
    };
    let current = pod.status.as_ref();
    if current.is_some_and(|current| same_state(current, &status)) {
        return Ok(());
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let patch = serde_json::json!({ "status": status });
    pods.patch_status(
        &pod.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await?;
    Ok(())
}

/// Whether a pod's status already says what `wanted` says (times aside).
fn same_state(current: &PodStatus, wanted: &PodStatus) -> bool {
    fn conditions(status: &PodStatus) -> Vec<(String, String, Option<String>)> {
        status
            .conditions
            .iter()
            .flatten()
            .map(|c| (c.type_.clone(), c.status.clone(), c.message.clone()))
            .collect()
    }
    current.phase == wanted.phase && conditions(current) == conditions(wanted)
}

async fn write_set_status(
    client: &kube::Client,
    set: &StatefulSet,
    pods: &[Pod],
) -> kube::Result<()> {
    let owned: Vec<&Pod> = pods
        .iter()
        .filter(|pod| {
            pod.owner_references()
                .iter()
                .any(|o| Some(&o.uid) == set.metadata.uid.as_ref())
                && pod.metadata.deletion_timestamp.is_none()
        })
        .collect();
    let ready = owned
        .iter()
        .filter(|pod| {
            pod.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
        .count() as i32;
    let status = StatefulSetStatus {
        replicas: owned.len() as i32,
        ready_replicas: Some(ready),
        available_replicas: Some(ready),
        current_replicas: Some(owned.len() as i32),
        observed_generation: set.metadata.generation,
        ..Default::default()
    };
    if set.status.as_ref() == Some(&status) {
        return Ok(());
    }
    let sets: Api<StatefulSet> =
        Api::namespaced(client.clone(), &set.namespace().unwrap_or_default());
    let patch = serde_json::json!({ "status": status });
    sets.patch_status(
        &set.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await?;
    Ok(())
}

/// A Warning event on `set`, once per reason and message (core/v1, as controllers record them).
async fn warn_once(
    client: &kube::Client,
    set: &StatefulSet,
    reason: &str,
    message: &str,
) -> kube::Result<()> {
    let namespace = set.namespace().unwrap_or_default();
    let name = format!(
        "{}.{:x}",
        set.name_any(),
        fnv(format!("{reason}{message}").as_bytes())
    );
    let events: Api<Event> = Api::namespaced(client.clone(), &namespace);
    if events.get_opt(&name).await?.is_some() {
        return Ok(());
    }
    let now = Time(jiff::Timestamp::now());
    let event = Event {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(namespace),
            ..Default::default()
        },
        involved_object: set.object_ref(&()),
        reason: Some(reason.into()),
        message: Some(message.into()),
        type_: Some("Warning".into()),
        first_timestamp: Some(now.clone()),
        last_timestamp: Some(now),
        count: Some(1),
        source: Some(EventSource {
            component: Some("statefulset-controller".into()),
            host: None,
        }),
        ..Default::default()
    };
    match events.create(&PostParams::default(), &event).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(err) => Err(err),
    }
}
