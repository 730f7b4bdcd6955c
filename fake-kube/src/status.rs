//! Failure answers as Kubernetes `Status` objects, so `kube::Error::Api` carries the same `code`,
//! `reason`, `message` and `details` a real API server would send.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::catalog::ResourceInfo;
use super::schema::FieldError;

/// A failed request: HTTP code, Status reason, message and details.
#[derive(Debug, Clone)]
pub(crate) struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Value>,
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: String) -> Self {
        ApiError {
            code,
            reason,
            message,
            details: None,
        }
    }

    fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }

    fn resource_details(resource: &ResourceInfo, name: &str) -> Value {
        json!({"name": name, "group": resource.group, "kind": resource.plural})
    }

    pub(crate) fn not_found(resource: &ResourceInfo, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", resource.group_resource()),
        )
        .with_details(Self::resource_details(resource, name))
    }

    /// Not found, for an object outside the catalog (an aggregated API's).
    pub(crate) fn named_not_found(group_resource: &str, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{group_resource} \"{name}\" not found"),
        )
    }

    pub(crate) fn path_not_found() -> Self {
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource".to_string(),
        )
    }

    pub(crate) fn already_exists(resource: &ResourceInfo, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", resource.group_resource()),
        )
        .with_details(Self::resource_details(resource, name))
    }

    pub(crate) fn conflict(resource: &ResourceInfo, name: &str, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                resource.group_resource()
            ),
        )
        .with_details(Self::resource_details(resource, name))
    }

    pub(crate) fn stale(resource: &ResourceInfo, name: &str) -> Self {
        Self::conflict(
            resource,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    pub(crate) fn apply_conflicts(
        resource: &ResourceInfo,
        name: &str,
        conflicts: &[(String, String)],
    ) -> Self {
        let causes: Vec<Value> = conflicts
            .iter()
            .map(|(manager, field)| {
                json!({"reason": "FieldManagerConflict", "message": format!("conflict with \"{manager}\""), "field": field})
            })
            .collect();
        let listed: Vec<String> = conflicts
            .iter()
            .map(|(manager, field)| format!("- {manager}: {field}"))
            .collect();
        let plural = if conflicts.len() == 1 { "" } else { "s" };
        Self::new(
            409,
            "Conflict",
            format!("Apply failed with {} conflict{plural}: {}", conflicts.len(), listed.join("\n")),
        )
        .with_details(json!({"name": name, "group": resource.group, "kind": resource.plural, "causes": causes}))
    }

    pub(crate) fn invalid(resource: &ResourceInfo, name: &str, errors: &[FieldError]) -> Self {
        let listed: Vec<String> = errors.iter().map(ToString::to_string).collect();
        let summary = if listed.len() == 1 {
            listed.join("")
        } else {
            format!("[{}]", listed.join(", "))
        };
        let causes: Vec<Value> = errors
            .iter()
            .map(|e| json!({"reason": e.reason, "message": e.message, "field": e.field}))
            .collect();
        Self::new(
            422,
            "Invalid",
            format!("{} \"{name}\" is invalid: {summary}", resource.group_kind()),
        )
        .with_details(
            json!({"name": name, "group": resource.group, "kind": resource.kind, "causes": causes}),
        )
    }

    /// 422 without field causes (a patch that cannot be applied).
    pub(crate) fn unprocessable(message: String) -> Self {
        Self::new(422, "Invalid", message)
    }

    /// 422 for invalid request options (e.g. an apply without `fieldManager`).
    pub(crate) fn invalid_options(message: &str) -> Self {
        Self::new(422, "Invalid", message.to_string())
    }

    pub(crate) fn forbidden(message: String) -> Self {
        Self::new(403, "Forbidden", message)
    }

    pub(crate) fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized".to_string())
    }

    pub(crate) fn bad_request(message: String) -> Self {
        Self::new(400, "BadRequest", message)
    }

    pub(crate) fn expired(message: String) -> Self {
        Self::new(410, "Expired", message)
    }

    pub(crate) fn method_not_allowed(method: &str) -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            format!("the server does not allow this method on the requested resource ({method})"),
        )
    }

    pub(crate) fn unsupported_media_type(content_type: &str, accepted: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format ({content_type:?}) - accepted media types include: {accepted}"
            ),
        )
    }

    pub(crate) fn status_json(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(details) = &self.details {
            status["details"] = details.clone();
        }
        status
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (code, axum::Json(self.status_json())).into_response()
    }
}

/// A Status of success (a completed deletion).
pub(crate) fn success(resource: &ResourceInfo, name: &str, uid: Option<&str>) -> Value {
    let mut details = json!({"name": name, "group": resource.group, "kind": resource.plural});
    if let Some(uid) = uid {
        details["uid"] = Value::from(uid);
    }
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details})
}
