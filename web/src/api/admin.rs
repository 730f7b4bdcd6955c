//! The admin's views: every user's notebooks and the audit trail.

use crate::model::{NotebookState, NotebookView};
use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use serde::Deserialize;

use super::views::view;
use super::{ApiResult, ApiState, Failure, SignedIn};

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(crate) struct AdminQuery {
    #[serde(default)]
    #[param(nullable = false)]
    user: Option<String>,
    #[serde(default)]
    #[param(nullable = false)]
    namespace: Option<String>,
    #[serde(default)]
    #[param(nullable = false)]
    state: Option<NotebookState>,
    /// Only running notebooks that hold GPUs and saw no activity for the idle time.
    #[serde(default, rename = "idleHoldingGpus")]
    idle_holding_gpus: bool,
}

/// Running, holding GPUs, and no activity seen for `idle_after` (or ever).
pub(crate) fn idle_holding_gpus(view: &NotebookView, idle_after: std::time::Duration) -> bool {
    let holds = view.gpus.count > 0;
    let since = view
        .last_activity
        .as_deref()
        .or(view.created.as_deref())
        .and_then(|t| t.parse::<jiff::Timestamp>().ok());
    let idle =
        since.is_none_or(|t| jiff::Timestamp::now().duration_since(t).unsigned_abs() >= idle_after);
    holds && view.state == NotebookState::Ready && idle
}

/// How many records one audit answer holds at most: the newest.
pub(crate) const AUDIT_ANSWER_LIMIT: usize = 1000;

/// The audit trail, newest last (admins only).
#[utoipa::path(
    get, path = "/api/admin/audit", summary = "The audit trail: every change and notebook sign-in, oldest first, the newest 1000 the filter keeps (admins only)", params(crate::audit::AuditFilter),
    responses(
        (status = 200, description = "the records", body = inline(crate::openapi::AuditAnswer)),
        (status = 400, description = "a filter that does not parse (since)", body = crate::openapi::ApiErrorBody),
        (status = 501, description = "the trail goes to the log here (a cluster)", body = crate::openapi::ApiErrorBody),
        crate::openapi::PlatformErrors,
    )
)]
pub(crate) async fn admin_audit(
    user: SignedIn,
    State(state): State<ApiState>,
    query: Result<Query<crate::audit::AuditFilter>, QueryRejection>,
) -> ApiResult<Json<serde_json::Value>> {
    user.must_be_admin(&state).await?;
    let Query(filter) = query?;
    if let Err(problem) = filter.since() {
        return Err(Failure::new(StatusCode::BAD_REQUEST, problem));
    }
    let records = state
        .audit
        .read(&filter, AUDIT_ANSWER_LIMIT)
        .ok_or_else(|| {
            Failure::new(
                StatusCode::NOT_IMPLEMENTED,
                "the audit trail goes to the web app's log here, target \"audit\"",
            )
        })?;
    Ok(Json(serde_json::json!({ "records": records })))
}

/// Every user's notebooks in one answer (Kubeflow's web app asks namespace by namespace).
#[utoipa::path(
    get, path = "/api/admin/notebooks", summary = "Every user's notebooks (admins only)", params(AdminQuery),
    responses((status = 200, description = "notebooks and totals of running ones", body = inline(crate::openapi::AdminAnswer)), crate::openapi::PlatformErrors)
)]
pub(crate) async fn admin_notebooks(
    user: SignedIn,
    State(state): State<ApiState>,
    query: Result<Query<AdminQuery>, QueryRejection>,
) -> ApiResult<Json<serde_json::Value>> {
    user.must_be_admin(&state).await?;
    let Query(query) = query?;
    let notebooks: Vec<NotebookView> = state
        .backend
        .list(query.namespace.as_deref())
        .await?
        .iter()
        .map(|nb| view(nb, &state))
        // Part of the owner's name, in any case: admins look people up by what they remember.
        .filter(|v| {
            query
                .user
                .as_ref()
                .is_none_or(|u| v.owner.to_lowercase().contains(&u.trim().to_lowercase()))
        })
        .filter(|v| query.state.is_none_or(|s| v.state == s))
        .filter(|v| !query.idle_holding_gpus || idle_holding_gpus(v, state.idle_after))
        .collect();
    let running: Vec<&NotebookView> = notebooks
        .iter()
        .filter(|v| matches!(v.state, NotebookState::Ready | NotebookState::Starting))
        .collect();
    let sum = |f: &dyn Fn(&NotebookView) -> String, field: &str| -> f64 {
        running
            .iter()
            .filter_map(|v| crate::validate::quantity(field, &f(v)).ok())
            .sum()
    };
    let totals = serde_json::json!({
        "notebooks": notebooks.len(),
        "running": running.len(),
        "cpu": sum(&|v| v.cpu_limit.clone(), "cpu"),
        "memoryBytes": sum(&|v| v.memory_limit.clone(), "memory"),
        "cpuRequested": sum(&|v| v.cpu.clone(), "cpu"),
        "memoryBytesRequested": sum(&|v| v.memory.clone(), "memory"),
        "gpus": running.iter().map(|v| u64::from(v.gpus.count)).sum::<u64>(),
        // Measured use, beside the limits above.
        "cpuUsed": running.iter().filter_map(|v| v.usage.as_ref()?.cpu_cores).sum::<f64>(),
        "memoryBytesUsed": running.iter().filter_map(|v| Some(v.usage.as_ref()?.memory_bytes)).sum::<u64>(),
    });
    Ok(Json(
        serde_json::json!({ "notebooks": notebooks, "totals": totals }),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn notebook(state: &str, gpus: Option<&str>, last_activity: Option<&str>) -> NotebookView {
        serde_json::from_value(serde_json::json!({
            "name": "lab", "namespace": "alice", "owner": "alice", "serverType": "jupyter",
            "image": "lab:1", "cpu": "1", "cpuLimit": "1", "memory": "1Gi", "memoryLimit": "1Gi",
            "gpus": gpus.map_or(serde_json::json!({"count": 0, "message": "", "vendor": ""}),
                |count| serde_json::json!({"vendor": "nvidia.com/gpu", "count": count.parse::<u32>().unwrap(), "message": ""})),
            "state": state, "reason": "", "lastActivity": last_activity,
            "created": "2026-01-01T00:00:00Z", "url": "/notebook/alice/lab/",
            "resourceVersion": "1", "autoSave": false,
        }))
        .unwrap()
    }

    #[test]
    fn idle_and_holding_gpus_means_running_with_gpus_and_no_activity_for_the_idle_time() {
        let hour = Duration::from_secs(3600);
        let long_ago = "2026-01-01T00:00:00Z";
        let now = jiff::Timestamp::now().to_string();
        assert!(idle_holding_gpus(
            &notebook("ready", Some("1"), Some(long_ago)),
            hour
        ));
        // Never used: idle since it was made.
        assert!(idle_holding_gpus(&notebook("ready", Some("2"), None), hour));
        assert!(!idle_holding_gpus(
            &notebook("ready", Some("1"), Some(&now)),
            hour
        ));
        assert!(!idle_holding_gpus(
            &notebook("ready", None, Some(long_ago)),
            hour
        ));
        assert!(!idle_holding_gpus(
            &notebook("ready", Some("0"), Some(long_ago)),
            hour
        ));
        assert!(!idle_holding_gpus(
            &notebook("stopped", Some("1"), Some(long_ago)),
            hour
        ));
    }
}
