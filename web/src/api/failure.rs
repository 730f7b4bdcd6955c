//! The API's error answer: a message, the field it is about, and Kubeflow's failure envelope
//! beside it.

use crate::backend::BackendError;
use crate::model::{ApiError, FieldMessage};
use crate::validate::{FieldError, FieldErrors};
use crate::workloads::WorkloadError;
use axum::Json;
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

/// An error answer.
pub struct Failure(StatusCode, ApiError);

impl Failure {
    pub(crate) fn new(status: StatusCode, error: impl Into<String>) -> Self {
        Self(
            status,
            ApiError {
                error: error.into(),
                field: None,
                errors: Vec::new(),
            },
        )
    }
    /// An error about one field of the request.
    pub(crate) fn for_field(status: StatusCode, field: &str, message: String) -> Self {
        Self::field(status, FieldError::new(field, message))
    }
    pub(crate) fn field(status: StatusCode, error: FieldError) -> Self {
        Self::fields(status, &FieldErrors::from(error))
    }
    /// Every wrong field; `error` and `field` tell the first.
    pub(crate) fn fields(status: StatusCode, errors: &FieldErrors) -> Self {
        let first = errors.as_slice().first();
        Self(
            status,
            ApiError {
                error: first.map(ToString::to_string).unwrap_or_default(),
                field: first.map(|e| e.field.clone()),
                errors: errors
                    .as_slice()
                    .iter()
                    .map(|e| FieldMessage {
                        field: e.field.clone(),
                        message: e.message.clone(),
                    })
                    .collect(),
            },
        )
    }
}

impl IntoResponse for Failure {
    /// The error with Kubeflow's failure envelope beside it (`success: false`, `status`, and the
    /// message as `log`), which clients written for its web app read.
    fn into_response(self) -> Response {
        let Self(status, error) = self;
        let mut body = serde_json::to_value(&error).unwrap_or_default();
        if let Some(fields) = body.as_object_mut() {
            fields.extend(labforge_messages::kubeflow_failure(
                status.as_u16(),
                &error.error,
            ));
        }
        (status, Json(body)).into_response()
    }
}

impl From<JsonRejection> for Failure {
    fn from(rejection: JsonRejection) -> Self {
        Self::new(rejection.status(), rejection.body_text())
    }
}

impl From<QueryRejection> for Failure {
    fn from(rejection: QueryRejection) -> Self {
        Self::new(StatusCode::BAD_REQUEST, rejection.body_text())
    }
}

impl From<BackendError> for Failure {
    fn from(err: BackendError) -> Self {
        match &err {
            BackendError::AlreadyExists { .. } => Self::field(
                StatusCode::CONFLICT,
                FieldError::new("name", err.to_string()),
            ),
            BackendError::NotFound { .. } => Self::new(StatusCode::NOT_FOUND, err.to_string()),
            BackendError::Invalid(message) => {
                Self::new(StatusCode::UNPROCESSABLE_ENTITY, message.clone())
            }
            BackendError::OverQuota(exceeded) => {
                Self::new(StatusCode::FORBIDDEN, exceeded.to_string())
            }
            BackendError::Unavailable(unavailable) => {
                tracing::error!(error = %labforge_messages::error_chain(unavailable), "backend");
                Self::new(StatusCode::SERVICE_UNAVAILABLE, unavailable.to_string())
            }
        }
    }
}

impl From<WorkloadError> for Failure {
    fn from(error: WorkloadError) -> Self {
        let status = match &error {
            WorkloadError::NotFound(_) => StatusCode::NOT_FOUND,
            WorkloadError::Conflict(_) => StatusCode::CONFLICT,
            WorkloadError::Unsupported(_) => StatusCode::NOT_IMPLEMENTED,
            WorkloadError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        };
        Self::new(status, error.to_string())
    }
}

pub(crate) type ApiResult<T> = Result<T, Failure>;
