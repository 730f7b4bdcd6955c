//! The API's own shapes: what the spawner form sends, what the notebooks list shows, what a save
//! reports. Notebooks themselves are stored as Kubeflow `Notebook` objects; these are views of them.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::ToSchema;

/// The IDE a notebook serves, named as Kubeflow's `notebooks.kubeflow.org/server-type` values
/// (`jupyter`, `group-one`, `group-two`); `vscode` and `rstudio` are read too.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum ServerType {
    #[default]
    #[serde(rename = "jupyter")]
    Jupyter,
    #[serde(rename = "group-one", alias = "vscode")]
    Vscode,
    #[serde(rename = "group-two", alias = "rstudio")]
    Rstudio,
}

pub use labforge_crds::notebook::SERVER_TYPE_ANNOTATION;
/// [`SERVER_TYPE_ANNOTATION`]'s value for RStudio, Kubeflow's `group-two`.
pub const RSTUDIO_SERVER_TYPE: &str = "group-two";
/// "true": the environment is saved before each stop, and the notebook starts on that image.
pub const AUTO_SAVE_ANNOTATION: &str = "labforge.dev/auto-save";

impl ServerType {
    /// Kubeflow's annotation value ("group-one" is its VSCode group, "group-two" RStudio).
    pub fn annotation(self) -> &'static str {
        match self {
            Self::Jupyter => "jupyter",
            Self::Vscode => labforge_crds::notebook::VSCODE_SERVER_TYPE,
            Self::Rstudio => RSTUDIO_SERVER_TYPE,
        }
    }

    /// The server's name as users know it.
    pub fn server_name(self) -> &'static str {
        match self {
            Self::Jupyter => "JupyterLab",
            Self::Vscode => "code-server (VSCode)",
            Self::Rstudio => "RStudio",
        }
    }

    pub fn from_annotation(value: Option<&str>) -> Self {
        match value {
            Some(labforge_crds::notebook::VSCODE_SERVER_TYPE) => Self::Vscode,
            Some(RSTUDIO_SERVER_TYPE) => Self::Rstudio,
            _ => Self::Jupyter,
        }
    }
}

/// A new notebook, as the spawner form sends it (Kubeflow's jupyter web app form, reduced).
#[derive(Clone, Debug, Default, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NotebookRequest {
    /// DNS-1123 label.
    pub name: String,
    #[serde(default)]
    pub server_type: ServerType,
    /// Empty: the catalog's default image for the server type.
    #[serde(default)]
    pub image: String,
    /// CPU request (Kubernetes quantity); empty: the default.
    #[serde(default)]
    pub cpu: String,
    #[serde(default)]
    pub cpu_limit: String,
    #[serde(default)]
    pub memory: String,
    #[serde(default)]
    pub memory_limit: String,
    #[serde(default)]
    #[schema(inline, nullable = false)]
    pub gpus: Option<GpuRequest>,
    /// Absent: a new workspace volume of the default size.
    #[serde(default)]
    #[schema(inline, nullable = false)]
    pub workspace: Option<WorkspaceRequest>,
    #[serde(default)]
    #[schema(inline)]
    pub data_volumes: Vec<DataVolumeRequest>,
    /// Size of `/dev/shm`; empty: the default; "0": none.
    #[serde(default)]
    pub shm_size: String,
    #[serde(default)]
    pub environment: BTreeMap<String, String>,
    /// Save the environment when the notebook is stopped or culled; absent: the admin's default.
    #[serde(default)]
    #[schema(nullable = false)]
    pub auto_save: Option<bool>,
    /// When the node pulls the image; absent: `IfNotPresent`, as in Kubeflow's form.
    #[serde(default)]
    #[schema(inline, nullable = false)]
    pub image_pull_policy: Option<ImagePullPolicy>,
}

/// Kubernetes' image pull policies, by their names there.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
pub enum ImagePullPolicy {
    Always,
    #[default]
    IfNotPresent,
    Never,
}

impl ImagePullPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            ImagePullPolicy::Always => "Always",
            ImagePullPolicy::IfNotPresent => "IfNotPresent",
            ImagePullPolicy::Never => "Never",
        }
    }
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GpuRequest {
    /// The resource name, e.g. `nvidia.com/gpu`.
    pub vendor: String,
    pub count: u32,
}

#[derive(Clone, Debug, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub enum WorkspaceRequest {
    /// A new volume of this size; named `<notebook>-workspace` unless `name` says otherwise,
    /// mounted at the home directory unless `mountPath` does.
    #[serde(rename_all = "camelCase")]
    New {
        size: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mount_path: Option<String>,
    },
    /// A volume that exists already (kept from a deleted notebook, say).
    #[serde(rename_all = "camelCase")]
    Existing {
        name: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mount_path: Option<String>,
    },
    /// No workspace: nothing in the home directory survives a stop.
    None,
}

#[derive(Clone, Debug, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DataVolumeRequest {
    pub name: String,
    /// A new volume of this size; empty: an existing volume of the namespace, by name.
    #[serde(default)]
    pub size: String,
    pub mount_path: String,
}

/// A change to a notebook: stop or start it, move it to another image, or resize it (a running
/// notebook restarts with its new CPU and memory; its workspace stays).
#[derive(Clone, Debug, Default, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NotebookPatch {
    #[serde(default)]
    #[schema(nullable = false)]
    pub stopped: Option<bool>,
    #[serde(default)]
    #[schema(nullable = false)]
    pub image: Option<String>,
    #[serde(default)]
    #[schema(nullable = false)]
    pub auto_save: Option<bool>,
    /// The CPU request, as a quantity; a limit that was equal to it follows.
    #[serde(default)]
    #[schema(nullable = false)]
    pub cpu: Option<String>,
    #[serde(default)]
    #[schema(nullable = false)]
    pub cpu_limit: Option<String>,
    /// The memory request, as a quantity; a limit that was equal to it follows.
    #[serde(default)]
    #[schema(nullable = false)]
    pub memory: Option<String>,
    #[serde(default)]
    #[schema(nullable = false)]
    pub memory_limit: Option<String>,
}

impl NotebookPatch {
    /// Whether the patch changes CPU or memory.
    pub fn resizes(&self) -> bool {
        self.cpu.is_some()
            || self.cpu_limit.is_some()
            || self.memory.is_some()
            || self.memory_limit.is_some()
    }
}

/// Whom a saved image is shared with: `PUT /api/namespaces/<ns>/images/sharing`.
#[derive(Clone, Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ImageSharing {
    /// One of the namespace's saved images, `registry/repository:tag`.
    pub image: String,
    /// The namespaces whose notebooks may run it, all of them (empty: none).
    pub shared_with: Vec<String>,
}

/// What users see of a notebook.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = Notebook)]
pub struct NotebookView {
    pub name: String,
    pub namespace: String,
    pub owner: String,
    pub server_type: ServerType,
    pub image: String,
    pub cpu: String,
    pub cpu_limit: String,
    pub memory: String,
    pub memory_limit: String,
    #[schema(inline)]
    pub gpus: GpuView,
    pub state: NotebookState,
    /// Why it is in that state, when there is more to say.
    pub reason: String,
    pub last_activity: Option<String>,
    pub created: Option<String>,
    /// The path to open it at, through the proxy.
    pub url: String,
    /// Its own host (without port: the web app's), when notebooks have one; the path is
    /// opened there.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub host: Option<String>,
    /// The whole address a browser opens it at (scheme, host, port and path), as the request
    /// reached the web app; in the answers of the list, get and create calls.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub address: Option<String>,
    pub resource_version: String,
    /// Saved before every stop.
    pub auto_save: bool,
    /// Users it is shared with: each may see and open it.
    #[serde(default)]
    pub shared_with: Vec<String>,
    /// What it uses now, while it runs and where it is measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(inline, nullable = false)]
    pub usage: Option<crate::usage::Usage>,
}

/// The GPUs a notebook's limits hold, as Kubeflow's web app shows them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuView {
    /// Devices of every vendor together; 0 for none.
    pub count: u32,
    /// Per vendor, e.g. "1 NVIDIA, 2 AMD"; empty for none.
    pub message: String,
    /// The (first) vendor's limits key, e.g. `nvidia.com/gpu`; empty for none.
    pub vendor: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum NotebookState {
    Ready,
    Starting,
    /// Asked to stop; its container is still going (saving first, or shutting down).
    Stopping,
    Stopped,
    Culled,
    Error,
}

/// An image saved from a notebook.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SavedImage {
    /// `registry/repository:tag`.
    pub image: String,
    /// The manifest digest the tag was pushed with.
    pub digest: String,
    pub notebook: String,
    pub namespace: String,
    pub base: String,
    /// The server the notebook it was saved from ran, so that it is offered for that one only;
    /// `None` for a save recorded without it, offered for both.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub server_type: Option<ServerType>,
    /// Compressed size of the new layer.
    pub layer_bytes: u64,
    pub files_changed: u64,
    pub files_deleted: u64,
    pub created: String,
    /// What the layer changed: packages added, upgraded, removed; file totals.
    #[serde(default)]
    #[schema(value_type = Option<crate::openapi::ChangeSummary>)]
    pub summary: Option<labforge_builder::summary::ChangeSummary>,
    /// The other namespaces whose notebooks may run it, as its namespace shared it.
    #[serde(default)]
    pub shared_with: Vec<String>,
}

/// A notebook event, shaped like the Kubernetes events Kubeflow's web app shows.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NotebookEvent {
    /// `Normal` or `Warning`.
    #[serde(rename = "type")]
    pub kind: String,
    pub reason: String,
    pub message: String,
    /// When it last happened.
    pub time: String,
    /// How often it happened, the same reason and message, as Kubernetes counts repeats.
    #[serde(default = "one")]
    pub count: u32,
}

fn one() -> u32 {
    1
}

/// The error body of every 4xx/5xx answer: what is wrong and, for bad input, which field
/// (the first wrong one) and every wrong field with its own message.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ApiError {
    pub error: String,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub field: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub errors: Vec<FieldMessage>,
}

/// One wrong field and what is wrong with it (without the field's name).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct FieldMessage {
    pub field: String,
    pub message: String,
}
