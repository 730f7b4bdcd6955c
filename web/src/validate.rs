//! Turns a spawner request into a Kubeflow `Notebook`, or into an error naming the field that is
//! wrong. Pure: nothing is created until this has said yes, so a bad request leaves no trace.

use crate::config::SpawnerConfig;
use crate::model::{
    AUTO_SAVE_ANNOTATION, DataVolumeRequest, NotebookRequest, SERVER_TYPE_ANNOTATION, ServerType,
    WorkspaceRequest,
};
use k8s_openapi::api::core::v1::{
    Container, EmptyDirVolumeSource, EnvVar, PersistentVolumeClaimVolumeSource, PodSpec,
    ResourceRequirements, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use labforge_crds::notebook::{
    CREATOR_ANNOTATION, Notebook, NotebookSpec, NotebookTemplateSpec, REWRITE_URI_ANNOTATION,
};
use std::collections::BTreeMap;

/// A request field that is wrong, and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

impl FieldError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// Labels Kubernetes and podman both accept as object names (RFC 1123, 63 characters).
pub fn dns_label(field: &str, value: &str) -> Result<(), FieldError> {
    if labforge_crds::host::is_dns_label(value) {
        Ok(())
    } else {
        Err(FieldError::new(
            field,
            format!(
                "{value:?} is not a valid name: use 1-63 lowercase letters, digits and '-', \
                 starting and ending with a letter or digit"
            ),
        ))
    }
}

/// A Kubernetes quantity's value (`500m`, `2`, `1.5Gi`, `1e3`), or an error naming the field
/// with examples of what it takes (cores for CPU fields, bytes for the others).
pub fn quantity(field: &str, value: &str) -> Result<f64, FieldError> {
    let examples = if field.starts_with("cpu") {
        "cores, e.g. 500m, 1, 2.5"
    } else {
        "bytes, e.g. 512Mi, 1Gi, 10Gi"
    };
    let bad = || FieldError::new(field, format!("{value:?} is not an amount of {examples}"));
    match labforge_crds::quantity::value(value.trim()) {
        Ok(result) if result.is_finite() && result >= 0.0 => Ok(result),
        _ => Err(bad()),
    }
}

/// The smallest CPU amount accepted (`10m`). `--cpus` becomes a CFS quota per 100 ms period and
/// the kernel's smallest quota is 1 ms: podman refuses less, except that `--cpus 0.000` (what a
/// smaller amount rounds to) means no limit at all.
pub const MIN_CPU: f64 = 0.01;
const MIN_CPU_TEXT: &str = "10m";
/// The smallest memory amount accepted (`6Mi`, Docker's minimum): `--memory 0` (what a fraction
/// of a byte rounds to) means no limit, and a container does not start in much less.
pub const MIN_MEMORY: f64 = 6.0 * 1024.0 * 1024.0;
const MIN_MEMORY_TEXT: &str = "6Mi";

/// Refuses a CPU or memory amount below the smallest one podman enforces as a limit.
fn at_least(field: &str, text: &str, min: f64, min_text: &str) -> Result<(), FieldError> {
    if quantity(field, text)? < min {
        return Err(FieldError::new(
            field,
            format!(
                "{text} is less than the minimum {min_text}, the smallest limit podman enforces"
            ),
        ));
    }
    Ok(())
}

/// An image reference podman and registries accept.
pub fn image_reference(field: &str, value: &str) -> Result<(), FieldError> {
    if value.is_empty() || value.len() > 512 || value.chars().any(char::is_whitespace) {
        return Err(FieldError::new(
            field,
            format!("{value:?} is not an image reference"),
        ));
    }
    oci_client::Reference::try_from(value)
        .map(|_| ())
        .map_err(|e| FieldError::new(field, format!("{value:?} is not an image reference: {e}")))
}

/// `image` fully qualified, as a registry names it (`python:3` is
/// `docker.io/library/python:3`); as it is when it is no reference.
pub fn qualified_image(image: &str) -> String {
    oci_client::Reference::try_from(image).map_or_else(|_| image.to_owned(), |r| r.whole())
}

fn env_name(field: &str, name: &str) -> Result<(), FieldError> {
    let mut chars = name.chars();
    let ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !ok {
        return Err(FieldError::new(
            field,
            format!("{name:?} is not an environment variable name"),
        ));
    }
    if name == "NB_PREFIX" {
        return Err(FieldError::new(
            field,
            "NB_PREFIX is set by labforge to the notebook's route",
        ));
    }
    if name == labforge_notebook_controller::secret::SECRET_ENV {
        return Err(FieldError::new(
            field,
            format!("{name} is set by labforge to the notebook's own secret"),
        ));
    }
    Ok(())
}

/// Quantity `value` (or `default` when empty) checked against `max`; returns the text kept.
fn bounded(field: &str, value: &str, default: &str, max: &str) -> Result<String, FieldError> {
    let text = if value.trim().is_empty() {
        default
    } else {
        value.trim()
    };
    let amount = quantity(field, text)?;
    let limit = quantity(field, max)?;
    if amount <= 0.0 {
        return Err(FieldError::new(field, "must be more than 0"));
    }
    if amount > limit {
        return Err(FieldError::new(
            field,
            format!("{text} is more than the allowed {max}"),
        ));
    }
    Ok(text.to_owned())
}

/// The workspace volume's claim name, as Kubeflow's web app names it.
pub fn workspace_claim(notebook: &str) -> String {
    format!("{notebook}-workspace")
}

/// Where the workspace is mounted: the image's home.
pub const HOME: &str = "/home/jovyan";

/// Every wrong field of one request, each field once (its first problem), in the order the
/// spawner form shows them: a user fixes them all in one go.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldErrors(Vec<FieldError>);

impl FieldErrors {
    /// Adds `error` unless its field already has one.
    pub fn push(&mut self, error: FieldError) {
        if !self.0.iter().any(|e| e.field == error.field) {
            self.0.push(error);
        }
    }

    /// Puts `error` in place of any other for its field.
    pub fn replace(&mut self, error: FieldError) {
        self.0.retain(|e| e.field != error.field);
        self.0.insert(0, error);
    }

    /// The value, or `None` with the error kept.
    fn keep<T>(&mut self, result: Result<T, FieldError>) -> Option<T> {
        result.map_err(|e| self.push(e)).ok()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn as_slice(&self) -> &[FieldError] {
        &self.0
    }
}

impl From<FieldError> for FieldErrors {
    fn from(error: FieldError) -> Self {
        Self(vec![error])
    }
}

/// Builds the Notebook for `request` in `namespace`, created by `owner`; `saved_images` (saved in
/// that namespace) are allowed even where custom images are not.
pub fn notebook_from_request(
    request: &NotebookRequest,
    namespace: &str,
    owner: &str,
    config: &SpawnerConfig,
    saved_images: &[String],
) -> Result<Notebook, FieldErrors> {
    let mut errors = FieldErrors::default();
    errors.keep(notebook_name(&request.name, namespace));
    let image = errors.keep(chosen_image(request, config, saved_images));
    let resources = resources(request, config, &mut errors);
    let claims = claims(request, &config.defaults, &mut errors);
    let shm = errors.keep(shared_memory(&request.shm_size, &config.defaults));
    let mut env = Vec::new();
    for (name, value) in &request.environment {
        if errors
            .keep(env_name(&format!("environment.{name}"), name))
            .is_some()
        {
            env.push(EnvVar {
                name: name.clone(),
                value: Some(value.clone()),
                value_from: None,
            });
        }
    }
    match (image, shm) {
        (Some(image), Some(shm)) if errors.is_empty() => Ok(assemble(
            request, namespace, owner, config, image, resources, &claims, shm, env,
        )),
        // A field without a value has its error.
        _ => Err(errors),
    }
}

fn notebook_name(name: &str, namespace: &str) -> Result<(), FieldError> {
    dns_label("name", name)?;
    // Kubeflow's VirtualService is named notebook-<ns>-<name> and must stay a valid name.
    if name.len() + namespace.len() > 52 {
        return Err(FieldError::new(
            "name",
            "too long for this namespace: the route name notebook-<namespace>-<name> must fit in 63 characters",
        ));
    }
    Ok(())
}

/// The image asked for, or the catalog's default for the server type.
fn chosen_image(
    request: &NotebookRequest,
    config: &SpawnerConfig,
    saved_images: &[String],
) -> Result<String, FieldError> {
    let image = if request.image.trim().is_empty() {
        config
            .default_image(request.server_type)
            .ok_or_else(|| {
                FieldError::new("image", "the catalog has no image for this server type")
            })?
            .to_owned()
    } else {
        request.image.trim().to_owned()
    };
    image_reference("image", &image)?;
    if !config.allow_custom_images && !config.in_catalog(&image) && !saved_images.contains(&image) {
        return Err(FieldError::new(
            "image",
            format!("{image} is not in the catalog, and custom images are not allowed"),
        ));
    }
    Ok(image)
}

/// CPU, memory and GPU requests and limits (Kubernetes resource names to quantities).
#[derive(Default)]
struct Resources {
    requests: BTreeMap<String, Quantity>,
    limits: BTreeMap<String, Quantity>,
}

fn resources(
    request: &NotebookRequest,
    config: &SpawnerConfig,
    errors: &mut FieldErrors,
) -> Resources {
    let defaults = &config.defaults;
    let mut resources = cpu_and_memory(
        [
            [&request.cpu, &request.cpu_limit],
            [&request.memory, &request.memory_limit],
        ],
        [
            [&defaults.cpu, &defaults.memory],
            // A limit left empty takes the request's amount.
            ["", ""],
        ],
        defaults,
        errors,
    );
    if let Some(gpus) = &request.gpus
        && gpus.count > 0
    {
        if !config
            .gpu_vendors
            .iter()
            .any(|v| v.limits_key == gpus.vendor)
        {
            let offered: Vec<&str> = config
                .gpu_vendors
                .iter()
                .map(|v| v.limits_key.as_str())
                .collect();
            errors.push(FieldError::new(
                "gpus.vendor",
                if offered.is_empty() {
                    "no GPU vendor is available here".to_owned()
                } else {
                    format!("{:?} is not one of {}", gpus.vendor, offered.join(", "))
                },
            ));
        } else if gpus.count > defaults.max_gpus {
            errors.push(FieldError::new(
                "gpus.count",
                format!("at most {} GPUs", defaults.max_gpus),
            ));
        } else {
            // GPUs cannot be overcommitted: Kubernetes wants request = limit.
            let count = Quantity(gpus.count.to_string());
            resources.limits.insert(gpus.vendor.clone(), count.clone());
            resources.requests.insert(gpus.vendor.clone(), count);
        }
    }
    resources
}

/// CPU and memory requests and limits as asked (`[cpu, cpu limit], [memory, memory limit]`),
/// each empty one taking its default (`[[cpu, memory], [cpu limit, memory limit]]`; an empty
/// limit default is the request's amount), checked against the catalog's bounds.
fn cpu_and_memory(
    asked: [[&str; 2]; 2],
    default: [[&str; 2]; 2],
    defaults: &crate::config::Defaults,
    errors: &mut FieldErrors,
) -> Resources {
    let mut resources = Resources::default();
    for (i, (kind, [request_field, limit_field], max, min)) in [
        (
            "cpu",
            ["cpu", "cpuLimit"],
            &defaults.max_cpu,
            (MIN_CPU, MIN_CPU_TEXT),
        ),
        (
            "memory",
            ["memory", "memoryLimit"],
            &defaults.max_memory,
            (MIN_MEMORY, MIN_MEMORY_TEXT),
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let [asked, asked_limit] = asked[i];
        let amount = errors.keep(
            bounded(request_field, asked, default[0][i], max)
                .and_then(|text| at_least(request_field, &text, min.0, min.1).map(|()| text)),
        );
        let limit_default = match default[1][i] {
            "" => amount.as_deref().unwrap_or(default[0][i]),
            limit => limit,
        };
        let limit = errors.keep(
            bounded(limit_field, asked_limit, limit_default, max)
                .and_then(|text| at_least(limit_field, &text, min.0, min.1).map(|()| text)),
        );
        if let (Some(amount), Some(limit)) = (amount, limit) {
            if quantity(limit_field, &limit).ok() < quantity(request_field, &amount).ok() {
                errors.push(FieldError::new(
                    limit_field,
                    format!(
                        "must not be less than the {} request",
                        kind.replace("cpu", "CPU")
                    ),
                ));
            }
            resources.requests.insert(kind.into(), Quantity(amount));
            resources.limits.insert(kind.into(), Quantity(limit));
        }
    }
    resources
}

/// `notebook`'s container resources with CPU and memory changed as `patch` asks, under the same
/// bounds as a new notebook's. What the patch leaves out stays, except that a limit that was
/// equal to its request follows a new request (the form sets them together).
pub fn resized(
    notebook: &Notebook,
    patch: &crate::model::NotebookPatch,
    config: &SpawnerConfig,
) -> Result<ResourceRequirements, FieldErrors> {
    let current = notebook
        .container()
        .and_then(|c| c.resources.clone())
        .unwrap_or_default();
    let amount = |of: &Option<BTreeMap<String, Quantity>>, key: &str| -> String {
        of.as_ref()
            .and_then(|m| m.get(key))
            .map(|q| q.0.clone())
            .unwrap_or_default()
    };
    let [cpu, memory] = ["cpu", "memory"].map(|key| amount(&current.requests, key));
    let [cpu_limit, memory_limit] = ["cpu", "memory"].map(|key| amount(&current.limits, key));
    let asked = |value: &Option<String>| value.clone().unwrap_or_default();
    let (new_cpu, new_memory) = (asked(&patch.cpu), asked(&patch.memory));
    // An empty default limit follows the request.
    let limit_default = |limit: &str, request: &str, changed: bool| -> String {
        if limit.is_empty() || (changed && limit == request) {
            String::new()
        } else {
            limit.to_owned()
        }
    };
    let defaults = &config.defaults;
    let mut errors = FieldErrors::default();
    let [cpu_default, memory_default] = [
        if cpu.is_empty() { &defaults.cpu } else { &cpu },
        if memory.is_empty() {
            &defaults.memory
        } else {
            &memory
        },
    ];
    let limit_defaults = [
        limit_default(&cpu_limit, &cpu, patch.cpu.is_some()),
        limit_default(&memory_limit, &memory, patch.memory.is_some()),
    ];
    let changed = cpu_and_memory(
        [
            [&new_cpu, &asked(&patch.cpu_limit)],
            [&new_memory, &asked(&patch.memory_limit)],
        ],
        [
            [cpu_default, memory_default],
            [&limit_defaults[0], &limit_defaults[1]],
        ],
        defaults,
        &mut errors,
    );
    if !errors.is_empty() {
        return Err(errors);
    }
    let mut resources = current;
    resources
        .requests
        .get_or_insert_with(Default::default)
        .extend(changed.requests);
    resources
        .limits
        .get_or_insert_with(Default::default)
        .extend(changed.limits);
    Ok(resources)
}

/// A volume of the notebook: its claim, the size asked for a new one (empty: an existing one),
/// and where it is mounted.
struct Claim {
    name: String,
    size: String,
    mount_path: String,
}

/// The workspace and the data volumes.
fn claims(
    request: &NotebookRequest,
    defaults: &crate::config::Defaults,
    errors: &mut FieldErrors,
) -> Vec<Claim> {
    let mut claims = Vec::new();
    let new_workspace = WorkspaceRequest::New {
        size: String::new(),
        name: None,
        mount_path: None,
    };
    match request.workspace.as_ref().unwrap_or(&new_workspace) {
        WorkspaceRequest::New {
            size,
            name,
            mount_path,
        } => {
            let size = errors.keep(bounded(
                "workspace.size",
                size,
                &defaults.workspace_size,
                &defaults.max_volume_size,
            ));
            let name = match name.as_deref().map(str::trim).filter(|n| !n.is_empty()) {
                Some(name) => errors
                    .keep(dns_label("workspace.name", name))
                    .map(|()| name.to_owned()),
                None => Some(workspace_claim(&request.name)),
            };
            let mount_path = errors.keep(workspace_mount(mount_path.as_deref()));
            if let (Some(size), Some(name), Some(mount_path)) = (size, name, mount_path) {
                claims.push(Claim {
                    name,
                    size,
                    mount_path,
                });
            }
        }
        WorkspaceRequest::Existing { name, mount_path } => {
            let checked = errors.keep(dns_label("workspace.name", name));
            let mount_path = errors.keep(workspace_mount(mount_path.as_deref()));
            if let (Some(()), Some(mount_path)) = (checked, mount_path) {
                claims.push(Claim {
                    name: name.clone(),
                    size: String::new(),
                    mount_path,
                });
            }
        }
        WorkspaceRequest::None => {}
    }
    for (i, volume) in request.data_volumes.iter().enumerate() {
        let field = |f: &str| format!("dataVolumes[{i}].{f}");
        let DataVolumeRequest {
            name,
            size,
            mount_path,
        } = volume;
        let mut ok = errors.keep(dns_label(&field("name"), name)).is_some();
        if !size.trim().is_empty() {
            ok &= errors
                .keep(bounded(
                    &field("size"),
                    size,
                    size,
                    &defaults.max_volume_size,
                ))
                .is_some();
        }
        if !mount_path.starts_with('/') || mount_path.contains("..") || mount_path == "/" {
            errors.push(FieldError::new(
                field("mountPath"),
                format!("{mount_path:?} must be an absolute path below /"),
            ));
            ok = false;
        }
        if claims
            .iter()
            .any(|c| &c.name == name || &c.mount_path == mount_path)
        {
            errors.push(FieldError::new(
                field("name"),
                "a volume of that name or mount path is already in this notebook",
            ));
            ok = false;
        }
        if ok {
            claims.push(Claim {
                name: name.clone(),
                size: size.trim().to_owned(),
                mount_path: mount_path.clone(),
            });
        }
    }
    claims
}

/// Where the workspace is mounted: the home directory unless `asked` names another absolute
/// path (Kubeflow's admins may set one).
fn workspace_mount(asked: Option<&str>) -> Result<String, FieldError> {
    match asked.map(|p| p.trim().trim_end_matches('/')) {
        None | Some("") => Ok(HOME.to_owned()),
        Some(path) if path.starts_with('/') && !path.contains("..") => Ok(path.to_owned()),
        Some(path) => Err(FieldError::new(
            "workspace.mountPath",
            format!("{path:?} must be an absolute path below /"),
        )),
    }
}

/// The size of `/dev/shm`; `0` for none.
fn shared_memory(asked: &str, defaults: &crate::config::Defaults) -> Result<String, FieldError> {
    let shm = if asked.trim().is_empty() {
        defaults.shm_size.clone()
    } else {
        asked.trim().to_owned()
    };
    if quantity("shmSize", &shm)? > 0.0 {
        bounded("shmSize", &shm, &shm, &defaults.max_memory)?;
    }
    Ok(shm)
}

/// The pod's volumes and the container's mounts: each claim, and `/dev/shm` in memory when `shm`
/// is more than nothing.
fn volumes_and_mounts(claims: &[Claim], shm: String) -> (Vec<Volume>, Vec<VolumeMount>) {
    let mut volumes = Vec::new();
    let mut mounts = Vec::new();
    for claim in claims {
        volumes.push(Volume {
            name: claim.name.clone(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim.name.clone(),
                read_only: None,
            }),
            ..Default::default()
        });
        mounts.push(VolumeMount {
            name: claim.name.clone(),
            mount_path: claim.mount_path.clone(),
            ..Default::default()
        });
    }
    if quantity("shmSize", &shm).is_ok_and(|amount| amount > 0.0) {
        volumes.push(Volume {
            name: "dshm".into(),
            empty_dir: Some(EmptyDirVolumeSource {
                medium: Some("Memory".into()),
                size_limit: Some(Quantity(shm)),
            }),
            ..Default::default()
        });
        mounts.push(VolumeMount {
            name: "dshm".into(),
            mount_path: "/dev/shm".into(),
            ..Default::default()
        });
    }
    (volumes, mounts)
}

/// The Notebook's annotations: its creator, auto-save, server type, the route's rewrite and
/// headers its server needs, and the sizes asked for new volumes.
fn annotations(
    request: &NotebookRequest,
    namespace: &str,
    owner: &str,
    config: &SpawnerConfig,
    claims: &[Claim],
) -> BTreeMap<String, String> {
    let mut annotations = BTreeMap::from([
        (CREATOR_ANNOTATION.to_owned(), owner.to_owned()),
        (
            AUTO_SAVE_ANNOTATION.to_owned(),
            request
                .auto_save
                .unwrap_or(config.defaults.auto_save)
                .to_string(),
        ),
        (
            SERVER_TYPE_ANNOTATION.to_owned(),
            request.server_type.annotation().to_owned(),
        ),
    ]);
    // code-server and RStudio serve at `/`, as Kubeflow routes its images of them; RStudio is
    // told the path it is reached under, as Kubeflow's web app tells it.
    if matches!(
        request.server_type,
        ServerType::Vscode | ServerType::Rstudio
    ) {
        annotations.insert(REWRITE_URI_ANNOTATION.to_owned(), "/".to_owned());
    }
    if request.server_type == ServerType::Rstudio {
        annotations.insert(
            labforge_crds::notebook::HEADERS_REQUEST_SET_ANNOTATION.to_owned(),
            serde_json::json!({
                "X-RStudio-Root-Path": format!(
                    "{}/",
                    labforge_notebook_controller::builders::route_prefix(namespace, &request.name)
                )
            })
            .to_string(),
        );
    }
    let volume_sizes: BTreeMap<&str, &str> = claims
        .iter()
        .filter(|c| !c.size.is_empty())
        .map(|c| (c.name.as_str(), c.size.as_str()))
        .collect();
    if !volume_sizes.is_empty() {
        annotations.insert(
            VOLUME_SIZES_ANNOTATION.to_owned(),
            serde_json::to_string(&volume_sizes).unwrap_or_default(),
        );
    }
    annotations
}

/// The Notebook of a request whose every field checked out.
#[allow(clippy::too_many_arguments)]
fn assemble(
    request: &NotebookRequest,
    namespace: &str,
    owner: &str,
    config: &SpawnerConfig,
    image: String,
    resources: Resources,
    claims: &[Claim],
    shm: String,
    env: Vec<EnvVar>,
) -> Notebook {
    let (volumes, mounts) = volumes_and_mounts(claims, shm);
    let annotations = annotations(request, namespace, owner, config, claims);
    Notebook {
        metadata: ObjectMeta {
            name: Some(request.name.clone()),
            namespace: Some(namespace.to_owned()),
            labels: Some(BTreeMap::from([("app".to_owned(), request.name.clone())])),
            annotations: Some(annotations),
            ..Default::default()
        },
        spec: NotebookSpec {
            template: NotebookTemplateSpec {
                spec: Some(PodSpec {
                    containers: vec![Container {
                        name: request.name.clone(),
                        image: Some(image),
                        image_pull_policy: Some(
                            request
                                .image_pull_policy
                                .unwrap_or_default()
                                .as_str()
                                .into(),
                        ),
                        resources: Some(ResourceRequirements {
                            requests: Some(resources.requests),
                            limits: Some(resources.limits),
                            ..Default::default()
                        }),
                        volume_mounts: Some(mounts),
                        env: (!env.is_empty()).then_some(env),
                        ..Default::default()
                    }],
                    volumes: Some(volumes),
                    ..Default::default()
                }),
            },
        },
        status: None,
    }
}

pub use labforge_crds::notebook::VOLUME_SIZES_ANNOTATION;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{CatalogImage, Defaults, GpuVendor};
    use crate::model::GpuRequest;

    fn config() -> SpawnerConfig {
        SpawnerConfig {
            images: vec![CatalogImage {
                image: "registry.local/labforge/jupyterlab:latest".into(),
                server_type: ServerType::Jupyter,
                description: String::new(),
                default: true,
            }],
            allow_custom_images: true,
            gpu_vendors: vec![GpuVendor {
                limits_key: "nvidia.com/gpu".into(),
                name: "NVIDIA".into(),
                cdi_kind: None,
                smi: None,
            }],
            defaults: Defaults::default(),
            kubeflow: Default::default(),
        }
    }

    fn request(name: &str) -> NotebookRequest {
        NotebookRequest {
            name: name.into(),
            ..Default::default()
        }
    }

    fn field_of(r: NotebookRequest) -> String {
        notebook_from_request(&r, "alice", "alice", &config(), &[])
            .unwrap_err()
            .as_slice()[0]
            .field
            .clone()
    }

    #[test]
    fn every_wrong_field_is_told_at_once_each_once() {
        let mut r = request("Bad_Name");
        r.cpu = "lots".into();
        r.memory = "4".into();
        r.memory_limit = "1Gi".into();
        r.workspace = Some(WorkspaceRequest::New {
            size: "9Pi".into(),
            name: None,
            mount_path: None,
        });
        r.environment.insert("1BAD".into(), "x".into());
        let errors = notebook_from_request(&r, "alice", "alice", &config(), &[]).unwrap_err();
        let fields: Vec<&str> = errors.as_slice().iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "name",
                "cpu",
                "memory",
                "workspace.size",
                "environment.1BAD"
            ]
        );
        let cpu = &errors.as_slice()[1].message;
        assert!(cpu.contains("500m") && !cpu.contains("Mi"), "{cpu}");
        let memory = &errors.as_slice()[2].message;
        assert!(memory.contains("minimum 6Mi"), "{memory}");
    }

    #[test]
    fn quantities_parse_like_kubernetes() {
        assert_eq!(quantity("f", "500m").unwrap(), 0.5);
        assert_eq!(quantity("f", "2").unwrap(), 2.0);
        assert_eq!(quantity("f", "1Gi").unwrap(), 1073741824.0);
        assert_eq!(quantity("f", "1.5G").unwrap(), 1.5e9);
        assert_eq!(quantity("f", "1e3").unwrap(), 1000.0);
        for bad in ["", "abc", "1 Gi", "1Gb", "-1", "1e", "Gi"] {
            assert_eq!(quantity("cpu", bad).unwrap_err().field, "cpu", "{bad}");
        }
    }

    #[test]
    fn defaults_make_a_kubeflow_shaped_notebook() {
        let nb = notebook_from_request(&request("lab"), "alice", "alice", &config(), &[]).unwrap();
        let spec = nb.spec.template.spec.as_ref().unwrap();
        let c = &spec.containers[0];
        assert_eq!(
            c.image.as_deref(),
            Some("registry.local/labforge/jupyterlab:latest")
        );
        let res = c.resources.as_ref().unwrap();
        assert_eq!(res.requests.as_ref().unwrap()["cpu"].0, "0.5");
        assert_eq!(res.limits.as_ref().unwrap()["memory"].0, "1Gi");
        let mounts = c.volume_mounts.as_ref().unwrap();
        assert_eq!(mounts[0].mount_path, HOME);
        assert_eq!(mounts[0].name, "lab-workspace");
        assert_eq!(mounts[1].mount_path, "/dev/shm");
        assert_eq!(
            nb.metadata.annotations.as_ref().unwrap()[CREATOR_ANNOTATION],
            "alice"
        );
    }

    #[test]
    fn each_bad_field_is_named() {
        assert_eq!(field_of(request("Bad_Name")), "name");
        assert_eq!(field_of(request("")), "name");
        assert_eq!(field_of(request(&"a".repeat(64))), "name");
        let mut r = request("lab");
        r.cpu = "lots".into();
        assert_eq!(field_of(r), "cpu");
        let mut r = request("lab");
        r.cpu = "2".into();
        r.cpu_limit = "1".into();
        assert_eq!(field_of(r), "cpuLimit");
        let mut r = request("lab");
        r.memory = "1000Gi".into();
        assert_eq!(field_of(r), "memory");
        let mut r = request("lab");
        r.image = "not an image".into();
        assert_eq!(field_of(r), "image");
        let mut r = request("lab");
        r.gpus = Some(GpuRequest {
            vendor: "amd.com/gpu".into(),
            count: 1,
        });
        assert_eq!(field_of(r), "gpus.vendor");
        let mut r = request("lab");
        r.gpus = Some(GpuRequest {
            vendor: "nvidia.com/gpu".into(),
            count: 99,
        });
        assert_eq!(field_of(r), "gpus.count");
        let mut r = request("lab");
        r.workspace = Some(WorkspaceRequest::New {
            size: "9Pi".into(),
            name: None,
            mount_path: None,
        });
        assert_eq!(field_of(r), "workspace.size");
        let mut r = request("lab");
        r.environment.insert("1BAD".into(), "x".into());
        assert_eq!(field_of(r), "environment.1BAD");
        let mut r = request("lab");
        r.environment
            .insert("LABFORGE_NOTEBOOK_SECRET".into(), "mine".into());
        assert_eq!(field_of(r), "environment.LABFORGE_NOTEBOOK_SECRET");
        let mut r = request("lab");
        r.data_volumes.push(DataVolumeRequest {
            name: "data".into(),
            size: String::new(),
            mount_path: "relative".into(),
        });
        assert_eq!(field_of(r), "dataVolumes[0].mountPath");
    }

    /// Amounts podman would read as "no limit" (or refuse) are a 400 naming
    /// the field; the minimum itself is accepted.
    #[test]
    fn amounts_below_what_podman_enforces_are_refused() {
        for (field, value) in [
            ("cpu", "0.0004"),
            ("cpu", "9m"),
            ("cpuLimit", "0.001"),
            ("memory", "0.4"),
            ("memory", "5Mi"),
            ("memoryLimit", "1"),
            ("memoryLimit", "6291455"),
        ] {
            let mut r = request("nb");
            match field {
                "cpu" => r.cpu = value.into(),
                "cpuLimit" => r.cpu_limit = value.into(),
                "memory" => r.memory = value.into(),
                _ => r.memory_limit = value.into(),
            }
            let errors = notebook_from_request(&r, "alice", "alice", &config(), &[]).unwrap_err();
            let err = &errors.as_slice()[0];
            assert_eq!(err.field, field, "{value}: {err}");
            assert!(err.message.contains("minimum"), "{err}");
        }
        let mut r = request("nb");
        (r.cpu, r.cpu_limit) = ("10m".into(), "0.01".into());
        (r.memory, r.memory_limit) = ("6Mi".into(), "6291456".into());
        let notebook = notebook_from_request(&r, "alice", "alice", &config(), &[]).unwrap();
        let container = &notebook.spec.template.spec.as_ref().unwrap().containers[0];
        let limits = container
            .resources
            .as_ref()
            .unwrap()
            .limits
            .as_ref()
            .unwrap();
        assert_eq!(limits["cpu"].0, "0.01");
        assert_eq!(limits["memory"].0, "6291456");
    }

    #[test]
    fn images_are_qualified_as_registries_name_them() {
        for (named, qualified) in [
            ("python:3", "docker.io/library/python:3"),
            ("alice/lab:v1", "docker.io/alice/lab:v1"),
            ("3f2a", "docker.io/library/3f2a:latest"),
            ("127.0.0.1:5000/alice/lab:v1", "127.0.0.1:5000/alice/lab:v1"),
            (
                "quay.io/jupyter/base-notebook@sha256:0000000000000000000000000000000000000000000000000000000000000000",
                "quay.io/jupyter/base-notebook@sha256:0000000000000000000000000000000000000000000000000000000000000000",
            ),
            ("not a reference", "not a reference"),
        ] {
            assert_eq!(qualified_image(named), qualified, "{named}");
        }
    }

    #[test]
    fn custom_images_can_be_refused() {
        let mut config = config();
        config.allow_custom_images = false;
        let mut r = request("lab");
        r.image = "docker.io/library/python:3".into();
        let errors = notebook_from_request(&r, "alice", "alice", &config, &[]).unwrap_err();
        let err = &errors.as_slice()[0];
        assert_eq!(err.field, "image");
        assert!(err.message.contains("not in the catalog"), "{err}");
        // An image the user saved is theirs to use.
        let saved = ["docker.io/library/python:3".to_owned()];
        assert!(notebook_from_request(&r, "alice", "alice", &config, &saved).is_ok());
    }

    #[test]
    fn a_resize_keeps_what_it_leaves_out_and_checks_what_it_asks() {
        let mut r = request("lab");
        r.cpu = "1".into();
        r.memory = "2Gi".into();
        r.memory_limit = "3Gi".into();
        r.gpus = Some(GpuRequest {
            vendor: "nvidia.com/gpu".into(),
            count: 1,
        });
        let nb = notebook_from_request(&r, "alice", "alice", &config(), &[]).unwrap();
        let amounts = |res: &ResourceRequirements, of: &str| -> Vec<String> {
            let map = if of == "limits" {
                &res.limits
            } else {
                &res.requests
            };
            ["cpu", "memory", "nvidia.com/gpu"]
                .iter()
                .map(|key| map.as_ref().unwrap()[*key].0.clone())
                .collect()
        };
        let patch = crate::model::NotebookPatch {
            cpu: Some("2".into()),
            memory: Some("1Gi".into()),
            ..Default::default()
        };
        let changed = resized(&nb, &patch, &config()).unwrap();
        // The CPU limit moved with its request; the memory limit, set apart, stayed; GPUs stay.
        assert_eq!(amounts(&changed, "requests"), ["2", "1Gi", "1"]);
        assert_eq!(amounts(&changed, "limits"), ["2", "3Gi", "1"]);

        let too_much = crate::model::NotebookPatch {
            cpu: Some("1000".into()),
            memory_limit: Some("1Gi".into()),
            ..Default::default()
        };
        let errors = resized(&nb, &too_much, &config()).unwrap_err();
        let fields: Vec<&str> = errors.as_slice().iter().map(|e| e.field.as_str()).collect();
        assert_eq!(fields, ["cpu", "memoryLimit"]);
    }

    #[test]
    fn gpus_become_equal_requests_and_limits() {
        let mut r = request("lab");
        r.gpus = Some(GpuRequest {
            vendor: "nvidia.com/gpu".into(),
            count: 2,
        });
        let nb = notebook_from_request(&r, "alice", "alice", &config(), &[]).unwrap();
        let res = nb.spec.template.spec.unwrap().containers[0]
            .resources
            .clone()
            .unwrap();
        assert_eq!(res.limits.unwrap()["nvidia.com/gpu"].0, "2");
        assert_eq!(res.requests.unwrap()["nvidia.com/gpu"].0, "2");
    }
}
