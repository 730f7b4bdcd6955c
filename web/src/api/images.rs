//! Saved images: list, share with other namespaces, delete.

use crate::api::extract::{Allowed, NamespacePath, verb};
use crate::validate::{FieldError, FieldErrors};
use axum::Json;
use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use axum::http::StatusCode;
use serde::Deserialize;

use super::{ApiQuery, ApiResult, ApiState, Failure};

/// Images shared with a namespace, as its users see them: whom else each is shared with is its
/// owner's business.
pub(crate) fn shared_for_viewer(
    mut images: Vec<crate::model::SavedImage>,
) -> Vec<crate::model::SavedImage> {
    for image in &mut images {
        image.shared_with.clear();
    }
    images
}

/// Most namespaces one saved image may be shared with.
pub(crate) const MAX_SHARED_WITH: usize = 100;

/// Shares one of the namespace's saved images with exactly the namespaces named: their
/// notebooks may then run it. Only the namespace's owners (and admins) may.
#[utoipa::path(
    put, path = "/api/namespaces/{ns}/images/sharing",
    summary = "Share a saved image with exactly the namespaces named (none: with no one)", params(NamespacePath),
    request_body = crate::model::ImageSharing,
    responses(
        (status = 200, description = "the saved image, with whom it is shared now", body = crate::model::SavedImage),
        (status = 404, description = "no such saved image in this namespace", body = crate::openapi::ApiErrorBody),
        (status = 415, response = crate::openapi::UnsupportedMediaType),
        (status = 422, description = "a namespace named is not a namespace name, or is this one", body = crate::openapi::ApiErrorBody),
        crate::openapi::PlatformErrors,
    )
)]
pub(crate) async fn share_saved_image(
    Allowed { user, ns, .. }: Allowed<verb::Update>,
    State(state): State<ApiState>,
    body: Result<Json<crate::model::ImageSharing>, JsonRejection>,
) -> ApiResult<Json<crate::model::SavedImage>> {
    let Json(sharing) = body?;
    let mut errors = FieldErrors::default();
    let mut with: Vec<String> = Vec::new();
    if sharing.shared_with.len() > MAX_SHARED_WITH {
        errors.push(FieldError::new(
            "sharedWith",
            format!("at most {MAX_SHARED_WITH} namespaces"),
        ));
    }
    for (i, namespace) in sharing.shared_with.iter().enumerate() {
        let field = format!("sharedWith[{i}]");
        if let Err(err) = crate::validate::dns_label(&field, namespace) {
            errors.push(err);
        } else if *namespace == ns {
            errors.push(FieldError::new(
                field,
                format!("{ns} is the image's own namespace"),
            ));
        } else if !with.contains(namespace) {
            with.push(namespace.clone());
        }
    }
    if !errors.is_empty() {
        return Err(Failure::fields(StatusCode::UNPROCESSABLE_ENTITY, &errors));
    }
    let shared = state
        .backend
        .share_saved_image(&ns, &sharing.image, &with)
        .await?
        .ok_or_else(|| {
            Failure::field(
                StatusCode::NOT_FOUND,
                FieldError::new(
                    "image",
                    format!("namespace {ns} has no saved image {}", sharing.image),
                ),
            )
        })?;
    tracing::info!(namespace = %ns, image = %shared.image, shared_with = ?shared.shared_with, by = %user.0.name, "saved image sharing changed");
    Ok(Json(shared))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct ImageQuery {
    /// The saved image, registry/repository:tag.
    image: String,
}

/// Deletes a saved image from its registry (never one a notebook runs on) and forgets it.
#[utoipa::path(
    delete, path = "/api/namespaces/{ns}/images",
    summary = "Delete a saved image from its registry and forget it (never one a notebook runs on)", params(NamespacePath, ImageQuery),
    responses(
        (status = 204, description = "deleted"),
        (status = 404, description = "no such saved image in this namespace", body = crate::openapi::ApiErrorBody),
        (status = 409, description = "a notebook runs on it", body = crate::openapi::ApiErrorBody),
        (status = 501, description = "not possible on this platform (a cluster's registry is its admin's)", body = crate::openapi::ApiErrorBody),
        (status = 502, description = "the registry refused or failed", body = crate::openapi::ApiErrorBody),
        crate::openapi::PlatformErrors,
    )
)]
pub(crate) async fn delete_saved_image(
    Allowed { ns, .. }: Allowed<verb::Delete>,
    State(state): State<ApiState>,
    ApiQuery(query): ApiQuery<ImageQuery>,
) -> ApiResult<StatusCode> {
    use crate::saves::DeleteImageError;
    let saves = state
        .saves
        .as_ref()
        .ok_or_else(|| Failure::new(StatusCode::NOT_FOUND, "saving is not set up here"))?;
    saves.delete_image(&ns, &query.image).await.map_err(|err| {
        let status = match &err {
            DeleteImageError::NotFound { .. } => StatusCode::NOT_FOUND,
            DeleteImageError::InUse { .. } => StatusCode::CONFLICT,
            DeleteImageError::Registry { .. } => StatusCode::BAD_GATEWAY,
            DeleteImageError::Unsupported(_) => StatusCode::NOT_IMPLEMENTED,
        };
        Failure::new(status, err.to_string())
    })?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(
    get, path = "/api/namespaces/{ns}/images", summary = "Images saved in a namespace, newest first", params(NamespacePath),
    responses((status = 200, description = "saved images", body = inline(crate::openapi::ImagesAnswer)), crate::openapi::PlatformErrors)
)]
pub(crate) async fn saved_images(
    Allowed { ns, .. }: Allowed<verb::List>,
    State(state): State<ApiState>,
) -> ApiResult<Json<serde_json::Value>> {
    Ok(Json(
        serde_json::json!({ "images": state.backend.saved_images(&ns).await? }),
    ))
}
