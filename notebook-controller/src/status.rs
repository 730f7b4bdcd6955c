//! The Notebook status, mirrored from its StatefulSet and pod exactly as Kubeflow does; a pure
//! function, so "write status only when it changed" is a plain comparison.

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use labforge_crds::{Notebook, NotebookCondition, NotebookStatus};

/// Condition type labforge adds when a Notebook cannot be built (Kubeflow has none for this).
pub const INVALID_SPEC_CONDITION: &str = "InvalidSpec";

/// Status from the StatefulSet (ready replicas) and the notebook's pod (conditions, and the state
/// of the notebook container: the one named like the Notebook, as in Kubeflow, or else the first
/// container of the template, so a differently named container still reports).
pub fn notebook_status(
    notebook: &Notebook,
    stateful_set: Option<&StatefulSet>,
    pod: Option<&Pod>,
) -> NotebookStatus {
    let ready_replicas = stateful_set
        .and_then(|s| s.status.as_ref())
        .and_then(|s| s.ready_replicas)
        .unwrap_or(0);
    let notebook_name = notebook.metadata.name.as_deref();
    let first_container = notebook.container().map(|c| c.name.as_str());
    let pod_status = pod.and_then(|p| p.status.as_ref());
    let container_state = pod_status
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|statuses| {
            let named =
                |name: Option<&str>| statuses.iter().find(|c| Some(c.name.as_str()) == name);
            named(notebook_name).or_else(|| named(first_container))
        })
        .and_then(|c| c.state.clone())
        .unwrap_or_default();
    let conditions = pod_status
        .and_then(|s| s.conditions.as_ref())
        .map(|conditions| {
            conditions
                .iter()
                .map(|c| NotebookCondition {
                    type_: c.type_.clone(),
                    status: c.status.clone(),
                    last_probe_time: c.last_probe_time.clone(),
                    last_transition_time: c.last_transition_time.clone(),
                    reason: c.reason.clone(),
                    message: c.message.clone(),
                })
                .collect()
        })
        .unwrap_or_default();
    NotebookStatus {
        conditions,
        ready_replicas,
        container_state,
    }
}

/// Status of a Notebook whose spec cannot be turned into a StatefulSet: nothing is created, and
/// the reason is a condition users see in `kubectl get notebook -o yaml` and the web app.
pub fn invalid_spec_status(notebook: &Notebook, message: &str) -> NotebookStatus {
    let unchanged = notebook
        .status
        .as_ref()
        .and_then(|s| {
            s.conditions
                .iter()
                .find(|c| c.type_ == INVALID_SPEC_CONDITION)
        })
        .filter(|c| c.message.as_deref() == Some(message));
    let condition = unchanged.cloned().unwrap_or_else(|| NotebookCondition {
        type_: INVALID_SPEC_CONDITION.into(),
        status: "True".into(),
        last_probe_time: None,
        last_transition_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            jiff::Timestamp::now(),
        )),
        reason: Some("InvalidSpec".into()),
        message: Some(message.to_owned()),
    });
    NotebookStatus {
        conditions: vec![condition],
        ready_replicas: 0,
        container_state: Default::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::NotebookFixture;
    use k8s_openapi::api::apps::v1::StatefulSetStatus;
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateWaiting, ContainerStatus, PodCondition, PodStatus,
    };

    fn pod_waiting(container: &str, reason: &str) -> Pod {
        Pod {
            status: Some(PodStatus {
                conditions: Some(vec![PodCondition {
                    type_: "Ready".into(),
                    status: "False".into(),
                    reason: Some("ContainersNotReady".into()),
                    ..Default::default()
                }]),
                container_statuses: Some(vec![ContainerStatus {
                    name: container.into(),
                    state: Some(ContainerState {
                        waiting: Some(ContainerStateWaiting {
                            reason: Some(reason.into()),
                            message: Some("Back-off pulling image".into()),
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn status_mirrors_pod_conditions_container_state_and_ready_replicas() {
        let nb = Notebook::test("alice", "lab");
        let sts = StatefulSet {
            status: Some(StatefulSetStatus {
                ready_replicas: Some(1),
                replicas: 1,
                ..Default::default()
            }),
            ..Default::default()
        };
        let status = notebook_status(
            &nb,
            Some(&sts),
            Some(&pod_waiting("lab", "ImagePullBackOff")),
        );
        assert_eq!(status.ready_replicas, 1);
        assert_eq!(status.conditions.len(), 1);
        assert_eq!(status.conditions[0].type_, "Ready");
        assert_eq!(
            status.conditions[0].reason.as_deref(),
            Some("ContainersNotReady")
        );
        let waiting = status.container_state.waiting.unwrap();
        assert_eq!(waiting.reason.as_deref(), Some("ImagePullBackOff"));
    }

    #[test]
    fn sidecar_state_is_not_taken_for_the_notebook_container() {
        let nb = Notebook::test("alice", "lab");
        let status = notebook_status(&nb, None, Some(&pod_waiting("istio-proxy", "Waiting")));
        assert_eq!(status.container_state, ContainerState::default());
        assert_eq!(status.ready_replicas, 0);
    }

    #[test]
    fn an_unchanged_error_keeps_its_condition_so_nothing_is_rewritten() {
        let nb = Notebook::test("alice", "lab");
        let mut nb_with_status = nb.clone();
        nb_with_status.status = Some(invalid_spec_status(&nb, "no containers"));
        assert_eq!(
            invalid_spec_status(&nb_with_status, "no containers"),
            nb_with_status.status.clone().unwrap(),
            "an unchanged error keeps its transition time"
        );
        let changed = invalid_spec_status(&nb_with_status, "another problem");
        assert_eq!(
            changed.conditions[0].message.as_deref(),
            Some("another problem")
        );
    }

    #[test]
    fn container_named_like_the_notebook_wins_over_the_first_container() {
        let mut nb = Notebook::test("alice", "lab");
        nb.spec.template.spec.as_mut().unwrap().containers[0].name = "sidecar-first".into();
        let mut pod = pod_waiting("sidecar-first", "Sidecar");
        let named = pod_waiting("lab", "ImagePullBackOff")
            .status
            .unwrap()
            .container_statuses
            .unwrap();
        pod.status
            .as_mut()
            .unwrap()
            .container_statuses
            .as_mut()
            .unwrap()
            .extend(named);
        let status = notebook_status(&nb, None, Some(&pod));
        assert_eq!(
            status.container_state.waiting.unwrap().reason.as_deref(),
            Some("ImagePullBackOff")
        );
    }
}
