//! The ImageBuild resource: "save this notebook's environment as an image".

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Commit the changes made inside a running notebook as one new layer on the image it runs, and push
/// the result to `targetImage`.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "labforge.dev",
    version = "v1alpha1",
    kind = "ImageBuild",
    plural = "imagebuilds",
    namespaced,
    derive = "PartialEq",
    status = "ImageBuildStatus",
    printcolumn = r#"{"name":"Notebook","type":"string","jsonPath":".spec.notebook"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Image","type":"string","jsonPath":".status.imageDigest"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ImageBuildSpec {
    /// Name of the Notebook (same namespace) whose running environment is saved.
    pub notebook: String,
    /// Image reference to push, e.g. `registry.example.com/team/env:v2`.
    pub target_image: String,
    /// Layer compression; zstd unless the target registry or runtime needs gzip.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compression: Option<LayerCompression>,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum LayerCompression {
    Zstd,
    Gzip,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ImageBuildPhase {
    #[default]
    Pending,
    Running,
    Succeeded,
    Failed,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImageBuildStatus {
    pub phase: ImageBuildPhase,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<ImageBuildProgress>,
    /// The image the notebook ran, which the new layer goes on (by digest when known).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_image: Option<String>,
    /// Digest of the pushed manifest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_digest: Option<String>,
    /// Digest and compressed size of the one layer this build added.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layer_digest: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layer_size: Option<i64>,
    /// The change set was already in the cache: nothing was compressed or uploaded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_hit: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
    /// Human-readable detail, the error when failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImageBuildProgress {
    /// scanning, writing, uploading, done
    pub stage: String,
    pub files_scanned: i64,
    /// Entries added or modified, and deleted, once the scan is over.
    #[serde(default)]
    pub files_changed: i64,
    #[serde(default)]
    pub files_deleted: i64,
    pub bytes_written: i64,
    /// Content bytes the layer will carry, once the scan is over.
    #[serde(default)]
    pub bytes_total: i64,
    pub bytes_uploaded: i64,
}

pub fn crd() -> CustomResourceDefinition {
    ImageBuild::crd()
}
