//! What a Notebook's container is: image, command, limits, volumes, labels and its route, as
//! a pure function of the Notebook and the runtime's settings.

use k8s_openapi::api::core::v1::{Container, PodSpec};
use labforge_crds::istio::VirtualService;
use labforge_crds::notebook::{Notebook, REWRITE_URI_ANNOTATION};
use labforge_notebook_controller::builders::{self, BuilderConfig};
use labforge_web::model::{SERVER_TYPE_ANNOTATION, ServerType};
use sha2::Digest as _;
use std::collections::HashMap;

/// Names the labforge instance (its data dir) that manages a container: several instances on one
/// machine must never adopt or remove each other's notebooks.
pub const MANAGED_LABEL: &str = "dev.labforge.managed";
pub const NOTEBOOK_LABEL: &str = "dev.labforge.notebook";
pub const PLAN_LABEL: &str = "dev.labforge.plan";
pub const PORT_LABEL: &str = "dev.labforge.port";
pub const DEVICES_LABEL: &str = "dev.labforge.devices";
/// The size a volume was asked with (a quantity): podman volumes have no size of their own,
/// and the namespace's storage quota and volume list read it here.
pub const SIZE_LABEL: &str = "dev.labforge.size";
/// Where notebook servers' ports are published: a loopback address of their own. Not
/// 127.0.0.1, which `localhost` and `*.localhost` (the web app's and the notebooks' hosts)
/// resolve to: cookies are not kept apart by port, so a notebook's server on `localhost:<port>`
/// would get every cookie the browser holds for `localhost` once a page navigated there.
pub const PUBLISH_ADDRESS: &str = "127.0.0.2";
/// Where the agent directory is mounted (read-only) in every notebook container.
pub const AGENT_MOUNT: &str = "/.labforge/agent";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PlanError {
    #[error(transparent)]
    Build(#[from] builders::BuildError),
    #[error("{0}")]
    Unsupported(String),
}

/// One notebook's container, as `<engine> run` arguments.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerPlan {
    /// The container's name, and its network's: each notebook has a network of its own, which
    /// no other notebook's container can reach.
    pub name: String,
    pub image: String,
    /// Everything between `run -d` and the image, except the published port.
    pub options: Vec<String>,
    pub command: Vec<String>,
    pub container_port: i32,
    /// Digest of all of the above: a container with another digest is replaced.
    pub digest: String,
    /// The volumes it makes (podman volume name → the size asked), labelled with their size
    /// when they do not exist yet. Not in the digest: a volume's size never changes.
    pub new_volumes: Vec<(String, String)>,
}

/// The container name of a notebook, which is also the name of its network. Namespaces and
/// notebook names are DNS labels, which never hold `_`: no two notebooks share a name (with `-`
/// between them, `alice`'s `x-lab` and `alice-x`'s `lab` did).
pub fn container_name(namespace: &str, name: &str) -> String {
    format!("labforge-{namespace}_{name}")
}

/// The podman volume standing in for a PersistentVolumeClaim; injective as [`container_name`].
pub fn volume_name(namespace: &str, claim: &str) -> String {
    format!("labforge-{namespace}_{claim}")
}

/// The name [`volume_name`] gave before names were injective: `labforge-<ns>-<claim>`.
pub(super) fn legacy_volume_name(namespace: &str, claim: &str) -> String {
    format!("labforge-{namespace}-{claim}")
}

/// The claim a legacy volume name can only have meant for `namespace`, or `None` when another of
/// `namespaces` could have made the same name (`labforge-alice-x-ws` is `alice`'s `x-ws` or
/// `alice-x`'s `ws`).
pub(super) fn unambiguous_legacy_claim<'n>(
    legacy: &str,
    namespace: &str,
    namespaces: impl IntoIterator<Item = &'n str>,
) -> Option<String> {
    let claim = legacy.strip_prefix(&format!("labforge-{namespace}-"))?;
    let ambiguous = namespaces.into_iter().any(|other| {
        other != namespace
            && legacy
                .strip_prefix(&format!("labforge-{other}-"))
                .is_some_and(|rest| !rest.is_empty())
    });
    (!ambiguous && !claim.is_empty()).then(|| claim.to_owned())
}

/// A CPU limit as `--cpus` wants it. Raised to [`validate::MIN_CPU`](labforge_web::validate::MIN_CPU)
/// and never dropped: a notebook stored before validation refused less (or written to the store
/// directly) must not get `--cpus 0.000`, which podman reads as no limit.
fn cpus(quantity: &str) -> Result<String, PlanError> {
    let value = labforge_web::validate::quantity("cpu", quantity)
        .map_err(|err| PlanError::Unsupported(format!("the CPU limit: {err}")))?;
    Ok(format!("{:.3}", value.max(labforge_web::validate::MIN_CPU)))
}

#[cfg(test)]
mod quantity_tests;

/// A memory limit as `--memory` wants it, in bytes, raised to
/// [`validate::MIN_MEMORY`](labforge_web::validate::MIN_MEMORY): `--memory 0` is no limit.
fn memory_bytes(quantity: &str) -> Result<String, PlanError> {
    let value = labforge_web::validate::quantity("memory", quantity)
        .map_err(|err| PlanError::Unsupported(format!("the memory limit: {err}")))?;
    Ok(format!(
        "{}",
        value.max(labforge_web::validate::MIN_MEMORY).round() as u64
    ))
}

fn bytes(quantity: &str) -> Option<String> {
    let value = labforge_web::validate::quantity("memory", quantity).ok()?;
    Some(format!("{}", value.round() as u64))
}

/// Plans the container of `notebook`, from the pod template the controller would give Kubernetes;
/// `secret` is the notebook's own ([`crate::notebook_secrets`]), given to its server.
pub fn plan(
    notebook: &Notebook,
    config: &BuilderConfig,
    agent_dir: Option<&std::path::Path>,
    gpu_devices: &[String],
    secret: Option<&str>,
) -> Result<ContainerPlan, PlanError> {
    let namespace = notebook.metadata.namespace.clone().unwrap_or_default();
    let name = notebook.metadata.name.clone().unwrap_or_default();
    let stateful_set = builders::stateful_set(notebook, config)?;
    let pod: PodSpec = stateful_set
        .spec
        .and_then(|s| s.template.spec)
        .ok_or(builders::BuildError::NoContainers)?;
    let container = pod
        .containers
        .first()
        .ok_or(builders::BuildError::NoContainers)?;
    // Fully qualified, whatever the notebook says: podman looks a short name up among its local
    // images first and takes any whose repository ends the same, another namespace's saves among
    // them (`python:3` could be `<registry>/alice/python:3`).
    let image = container
        .image
        .as_deref()
        .filter(|i| !i.is_empty())
        .map(labforge_web::validate::qualified_image)
        .ok_or_else(|| PlanError::Unsupported("the notebook's container has no image".into()))?;
    let container_port = builders::container_port(notebook);
    let mut options: Vec<String> = vec![
        "--name".into(),
        container_name(&namespace, &name),
        "--label".into(),
        format!("{NOTEBOOK_LABEL}={namespace}/{name}"),
        "--hostname".into(),
        name.clone(),
        "--network".into(),
        container_name(&namespace, &name),
    ];
    if let Some(dir) = &container.working_dir {
        options.extend(["--workdir".into(), dir.clone()]);
    }
    options.extend(env_options(container)?);
    options.extend(volume_options(&pod, container, &namespace)?);
    if let Some(resources) = &container.resources
        && let Some(limits) = &resources.limits
    {
        if let Some(cpu) = limits.get("cpu") {
            options.extend(["--cpus".into(), cpus(&cpu.0)?]);
        }
        if let Some(memory) = limits.get("memory") {
            options.extend(["--memory".into(), memory_bytes(&memory.0)?]);
        }
    }
    if let Some(secret) = secret {
        // Last, so that it wins over a variable of that name in the spec.
        options.extend([
            "--env".into(),
            format!(
                "{}={secret}",
                labforge_notebook_controller::secret::SECRET_ENV
            ),
        ]);
    }
    for device in gpu_devices {
        options.extend(["--device".into(), device.clone()]);
    }
    if !gpu_devices.is_empty() {
        options.extend([
            "--label".into(),
            format!("{DEVICES_LABEL}={}", gpu_devices.join(",")),
        ]);
    }
    if let Some(dir) = agent_dir {
        options.extend([
            "--volume".into(),
            format!("{}:{AGENT_MOUNT}:ro", dir.display()),
        ]);
    }
    if let Some(user) = pod
        .security_context
        .as_ref()
        .and_then(|s| s.run_as_user)
        .or_else(|| {
            container
                .security_context
                .as_ref()
                .and_then(|s| s.run_as_user)
        })
    {
        options.extend(["--user".into(), user.to_string()]);
    }
    let mut command = Vec::new();
    if let Some(entrypoint) = &container.command {
        options.extend([
            "--entrypoint".into(),
            serde_json::to_string(entrypoint).unwrap_or_default(),
        ]);
    }
    command.extend(container.args.iter().flatten().cloned());

    let mut hasher = sha2::Sha256::new();
    for part in options.iter().chain([&image]).chain(&command) {
        hasher.update(part.as_bytes());
        hasher.update([0]);
    }
    let digest = hex::encode(&hasher.finalize()[..12]);
    options.extend(["--label".into(), format!("{PLAN_LABEL}={digest}")]);
    Ok(ContainerPlan {
        name: container_name(&namespace, &name),
        image,
        options,
        command,
        container_port,
        digest,
        new_volumes: notebook
            .volume_sizes()
            .into_iter()
            .map(|(claim, size)| (volume_name(&namespace, &claim), size))
            .collect(),
    })
}

/// `--env` for each of the container's variables; one whose value comes from a reference is
/// refused, since nothing here could resolve it.
fn env_options(container: &Container) -> Result<Vec<String>, PlanError> {
    let mut options = Vec::new();
    for var in container.env.iter().flatten() {
        match &var.value {
            Some(value) => options.extend(["--env".into(), format!("{}={value}", var.name)]),
            None if var.value_from.is_some() => {
                return Err(PlanError::Unsupported(format!(
                    "env {} comes from a reference, which the embedded mode cannot resolve",
                    var.name
                )));
            }
            None => options.extend(["--env".into(), format!("{}=", var.name)]),
        }
    }
    Ok(options)
}

/// `--volume`, `--shm-size` and `--tmpfs` for the container's mounts (the agent's own mount
/// left out): claims as the engine's named volumes, `/dev/shm` in memory at its size, other
/// emptyDirs as tmpfs. Any other kind of volume is refused.
fn volume_options(
    pod: &PodSpec,
    container: &Container,
    namespace: &str,
) -> Result<Vec<String>, PlanError> {
    let mut options = Vec::new();
    let volumes: HashMap<&str, &k8s_openapi::api::core::v1::Volume> = pod
        .volumes
        .iter()
        .flatten()
        .map(|v| (v.name.as_str(), v))
        .collect();
    for mount in container.volume_mounts.iter().flatten() {
        if mount.mount_path == AGENT_MOUNT {
            continue;
        }
        let volume = volumes.get(mount.name.as_str()).ok_or_else(|| {
            PlanError::Unsupported(format!("volume mount {} names no volume", mount.name))
        })?;
        let read_only = if mount.read_only == Some(true) {
            ":ro"
        } else {
            ""
        };
        if let Some(claim) = &volume.persistent_volume_claim {
            options.extend([
                "--volume".into(),
                format!(
                    "{}:{}{read_only}",
                    volume_name(namespace, &claim.claim_name),
                    mount.mount_path
                ),
            ]);
        } else if let Some(empty) = &volume.empty_dir {
            if empty.medium.as_deref() == Some("Memory") && mount.mount_path == "/dev/shm" {
                let size = empty
                    .size_limit
                    .as_ref()
                    .and_then(|q| bytes(&q.0))
                    .unwrap_or_else(|| "67108864".into());
                options.extend(["--shm-size".into(), size]);
            } else {
                options.extend(["--tmpfs".into(), mount.mount_path.clone()]);
            }
        } else {
            return Err(PlanError::Unsupported(format!(
                "volume {} is neither a PersistentVolumeClaim nor an emptyDir",
                mount.name
            )));
        }
    }
    Ok(options)
}

/// The route of `notebook`, pointed at its container's published port, presenting `secret` (the
/// notebook's own) to its server.
pub fn route(
    notebook: &Notebook,
    config: &BuilderConfig,
    host_port: u16,
    secret: Option<&str>,
) -> Result<VirtualService, builders::BuildError> {
    let mut vs = builders::virtual_service(notebook, config)?;
    let code_server = notebook.annotation(labforge_web::model::SERVER_TYPE_ANNOTATION)
        == Some(labforge_web::model::ServerType::Vscode.annotation());
    for rule in &mut vs.spec.http {
        for destination in &mut rule.route {
            destination.destination.host = PUBLISH_ADDRESS.into();
            if let Some(port) = destination.destination.port.as_mut() {
                port.number = u32::from(host_port);
            }
        }
        if let Some(secret) = secret {
            let operations = rule
                .headers
                .get_or_insert_with(Default::default)
                .request
                .get_or_insert_with(Default::default);
            operations
                .set
                .extend(labforge_notebook_controller::secret::upstream_headers(
                    secret,
                    code_server,
                ));
        }
    }
    // Merge order among VirtualServices is by creation time, as in Istio.
    vs.metadata.creation_timestamp = notebook.metadata.creation_timestamp.clone();
    Ok(vs)
}

/// Where a notebook's server says it is up, and what it answers there: Jupyter's version at
/// `<prefix>/api`, code-server's heartbeat at `<root>/healthz`. Any other answer (an image that
/// serves the other IDE, or nothing like either) is not ready, so "ready" means the server the
/// user chose answers. RStudio has no such endpoint: any answer at `<root>` but a server error
/// counts.
pub fn readiness_check(notebook: &Notebook) -> (ServerType, String, &'static str) {
    let namespace = notebook.metadata.namespace.as_deref().unwrap_or_default();
    let name = notebook.metadata.name.as_deref().unwrap_or_default();
    let root = notebook
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(REWRITE_URI_ANNOTATION))
        .filter(|uri| !uri.is_empty())
        .cloned()
        .unwrap_or_else(|| format!("{}/", builders::route_prefix(namespace, name)));
    let server = ServerType::from_annotation(notebook.annotation(SERVER_TYPE_ANNOTATION));
    match server {
        ServerType::Jupyter => (server, format!("{root}api"), "version"),
        ServerType::Vscode => (server, format!("{root}healthz"), "status"),
        ServerType::Rstudio => (server, root, ""),
    }
}

/// The most of a readiness answer read; a longer one is not the expected server's.
pub(super) const READINESS_ANSWER_LIMIT: usize = 64 * 1024;

/// Whether an answer to [`readiness_check`]'s path is the expected server's: a 200 with a JSON
/// object holding `key`; with no key (RStudio's page), any answer but a server error.
pub(super) fn answers_as_expected(status: u16, body: &[u8], key: &str) -> bool {
    if key.is_empty() {
        return (200..500).contains(&status);
    }
    status == 200
        && serde_json::from_slice::<serde_json::Value>(body).is_ok_and(|v| v.get(key).is_some())
}

#[cfg(test)]
mod tests {
    use super::*;
    use labforge_web::model::{NotebookRequest, ServerType, WorkspaceRequest};

    fn notebook(namespace: &str, request: NotebookRequest) -> Notebook {
        let config = labforge_web::config::default_spawner("registry.local");
        labforge_web::validate::notebook_from_request(&request, namespace, namespace, &config, &[])
            .unwrap()
    }

    fn request(name: &str) -> NotebookRequest {
        NotebookRequest {
            name: name.into(),
            ..Default::default()
        }
    }

    fn option_values<'p>(plan: &'p ContainerPlan, option: &str) -> Vec<&'p str> {
        plan.options
            .windows(2)
            .filter(|pair| pair[0] == option)
            .map(|pair| pair[1].as_str())
            .collect()
    }

    #[test]
    fn names_of_containers_networks_and_volumes_never_collide_across_namespaces() {
        // `alice`'s `x-lab` and `alice-x`'s `lab`: one string apart only in where the dash goes.
        let config = BuilderConfig::default();
        let mut existing = request("x-lab");
        existing.workspace = Some(WorkspaceRequest::Existing {
            name: "ws".into(),
            mount_path: None,
        });
        let a = plan(&notebook("alice", existing), &config, None, &[], None).unwrap();
        let mut other = request("lab");
        other.workspace = Some(WorkspaceRequest::Existing {
            name: "x-ws".into(),
            mount_path: None,
        });
        let b = plan(&notebook("alice-x", other), &config, None, &[], None).unwrap();
        assert_ne!(a.name, b.name);
        assert_eq!(option_values(&a, "--network"), [a.name.as_str()]);
        assert_eq!(option_values(&b, "--network"), [b.name.as_str()]);
        assert_ne!(option_values(&a, "--volume"), option_values(&b, "--volume"));
        assert_eq!(
            option_values(&a, "--volume"),
            ["labforge-alice_ws:/home/jovyan"]
        );
        assert_ne!(volume_name("alice", "x-ws"), volume_name("alice-x", "ws"));
    }

    #[test]
    fn a_legacy_volume_name_is_taken_only_when_no_other_namespace_could_have_made_it() {
        let legacy = legacy_volume_name("alice", "x-ws");
        assert_eq!(
            unambiguous_legacy_claim(&legacy, "alice", ["alice", "bob"]).as_deref(),
            Some("x-ws")
        );
        assert_eq!(
            unambiguous_legacy_claim(&legacy, "alice", ["alice", "alice-x"]),
            None
        );
        assert_eq!(
            unambiguous_legacy_claim(&legacy, "bob", ["alice", "bob"]),
            None
        );
        assert_eq!(
            unambiguous_legacy_claim("labforge-alice-", "alice", ["alice"]),
            None
        );
    }

    #[test]
    fn the_engine_is_given_every_image_fully_qualified() {
        let config = BuilderConfig::default();
        for (named, given) in [
            ("python:3.12", "docker.io/library/python:3.12"),
            ("alice/lab:v1", "docker.io/alice/lab:v1"),
            ("registry.local/alice/lab:v1", "registry.local/alice/lab:v1"),
        ] {
            let mut lab = notebook("alice", request("lab"));
            if let Some(container) = lab.container_mut() {
                container.image = Some(named.into());
            }
            let planned = plan(&lab, &config, None, &[], None).unwrap();
            assert_eq!(planned.image, given, "{named}");
        }
    }

    #[test]
    fn the_secret_goes_to_the_server_and_onto_its_route_only() {
        let config = BuilderConfig::default();
        let lab = notebook("alice", request("lab"));
        let mut spec = lab.clone();
        // A variable of that name in the spec does not win over the notebook's own secret.
        if let Some(container) = spec.container_mut() {
            container
                .env
                .get_or_insert_with(Vec::new)
                .push(k8s_openapi::api::core::v1::EnvVar {
                    name: labforge_notebook_controller::secret::SECRET_ENV.into(),
                    value: Some("chosen".into()),
                    ..Default::default()
                });
        }
        let planned = plan(&spec, &config, None, &[], Some("s3cret")).unwrap();
        let envs = option_values(&planned, "--env");
        let position = |value: &str| envs.iter().position(|e| *e == value);
        assert!(
            position("LABFORGE_NOTEBOOK_SECRET=s3cret")
                > position("LABFORGE_NOTEBOOK_SECRET=chosen"),
            "{envs:?}"
        );
        // Same inputs, same plan: a running container is not replaced for its secret.
        assert_eq!(
            plan(&spec, &config, None, &[], Some("s3cret"))
                .unwrap()
                .digest,
            planned.digest
        );

        let headers = |nb: &Notebook| {
            let vs = route(nb, &config, 4000, Some("s3cret")).unwrap();
            vs.spec.http[0]
                .headers
                .clone()
                .and_then(|h| h.request)
                .unwrap()
                .set
        };
        let jupyter = headers(&lab);
        assert_eq!(jupyter["authorization"], "token s3cret");
        assert!(!jupyter.contains_key("cookie"));
        let mut code = request("code");
        code.server_type = ServerType::Vscode;
        let vscode = headers(&notebook("alice", code));
        assert_eq!(vscode["cookie"], "code-server-session=s3cret");
        let vs = route(&lab, &config, 4000, None).unwrap();
        assert!(
            vs.spec.http.iter().all(|r| r.headers.is_none()),
            "no secret, no headers"
        );
        assert_eq!(vs.spec.http[0].route[0].destination.host, PUBLISH_ADDRESS);
    }
}
