//! Pure object builders: Notebook → StatefulSet, Service, VirtualService, in Kubeflow's shape, and
//! the NetworkPolicy that keeps a notebook's pods for the platform to reach.

use crate::secret::{SECRET_ENV, SecretKey, upstream_headers};
use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetSpec};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EmptyDirVolumeSource, EnvVar, PodSecurityContext, PodSpec,
    PodTemplateSpec, ResourceRequirements, Service, ServicePort, ServiceSpec, Volume, VolumeMount,
};
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Resource;
use labforge_crds::host::is_dns_label;
use labforge_crds::istio::{
    Destination, HeaderOperations, Headers, HttpMatchRequest, HttpRewrite, HttpRoute,
    HttpRouteDestination, PortSelector, StringMatch, VirtualServiceSpec,
};
use labforge_crds::notebook::{
    HEADERS_REQUEST_SET_ANNOTATION, NOTEBOOK_NAME_LABEL, REWRITE_URI_ANNOTATION, STATEFULSET_LABEL,
};
use labforge_crds::notebook::{SERVER_TYPE_ANNOTATION, SHARED_WITH_ANNOTATION, VSCODE_SERVER_TYPE};
use labforge_crds::{Notebook, VirtualService};
use std::collections::BTreeMap;

/// Port JupyterLab and code-server listen on in labforge's and Kubeflow's images.
pub const DEFAULT_CONTAINER_PORT: i32 = 8888;
/// Port of the notebook's Service.
pub const SERVICE_PORT: i32 = 80;
/// Group the pod's volumes are shared with (`users` in the images).
pub const DEFAULT_FS_GROUP: i64 = 100;
/// Working directory of the notebook container unless the CR sets one.
pub const DEFAULT_WORKING_DIR: &str = "/home/jovyan";
/// Environment variable carrying the route prefix into the notebook.
pub const PREFIX_ENV: &str = "NB_PREFIX";
/// Where the save agent is mounted in notebook containers (the builder execs it there).
pub const AGENT_DIR: &str = "/.labforge/agent";
const AGENT_VOLUME: &str = "labforge-agent";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BuildError {
    #[error("Notebook has no metadata.{0}")]
    MissingMetadata(&'static str),
    #[error("spec.template.spec.containers is empty: a Notebook needs at least one container")]
    NoContainers,
}

/// Cluster-wide settings, with Kubeflow's environment variable names and defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BuilderConfig {
    /// `ISTIO_GATEWAY`, default `kubeflow/kubeflow-gateway`.
    pub gateway: String,
    /// `ISTIO_HOST`, default `*`.
    pub host: String,
    /// `CLUSTER_DOMAIN`, default `cluster.local`.
    pub cluster_domain: String,
    /// `USE_ISTIO`, default true: whether a VirtualService is built.
    pub virtual_service: bool,
    /// `ADD_FSGROUP`, default true: pods without a security context get `fsGroup: 100`.
    pub add_fs_group: bool,
    /// `LABFORGE_AGENT_IMAGE`: when set, an init container copies the save agent from this image
    /// into an emptyDir that the notebook container mounts read-only at [`AGENT_DIR`].
    pub agent_image: Option<String>,
    /// `LABFORGE_NOTEBOOK_DOMAIN`: when set, each notebook's VirtualService serves its own host,
    /// `<label>.<domain>` ([`labforge_crds::host`]), instead of `host`.
    pub notebook_domain: Option<String>,
    /// `LABFORGE_NETWORK_POLICY_FROM`: the namespaces whose pods may reach notebook pods
    /// (comma-separated; default the proxy's and dashboard's `kubeflow`, Istio's gateway's
    /// `istio-system`, and the controller's `labforge-system`, whose culler asks Jupyter for
    /// activity). `LABFORGE_NETWORK_POLICY=false`: no NetworkPolicy is built.
    pub network_policy_from: Option<Vec<String>>,
    /// `LABFORGE_NOTEBOOK_SECRET_KEY`: when set, each notebook gets a secret derived from it
    /// ([`crate::secret`]) in its container's environment, and its VirtualService presents it.
    pub notebook_secret_key: Option<SecretKey>,
}

/// The namespaces that reach notebook pods unless configured.
pub const DEFAULT_NETWORK_POLICY_FROM: [&str; 3] = ["kubeflow", "istio-system", "labforge-system"];

impl Default for BuilderConfig {
    fn default() -> Self {
        Self {
            gateway: "kubeflow/kubeflow-gateway".into(),
            host: "*".into(),
            cluster_domain: "cluster.local".into(),
            virtual_service: true,
            add_fs_group: true,
            agent_image: None,
            notebook_domain: None,
            network_policy_from: Some(DEFAULT_NETWORK_POLICY_FROM.map(String::from).into()),
            notebook_secret_key: None,
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{variable}={value:?}: {expected}")]
pub struct BuilderConfigError {
    pub variable: &'static str,
    pub value: String,
    /// What the variable takes.
    pub expected: &'static str,
}

/// The shortest `LABFORGE_NOTEBOOK_SECRET_KEY` taken.
pub const MIN_SECRET_KEY_BYTES: usize = 16;

/// A comma-separated list of namespace names, at least one: an empty `from` in a NetworkPolicy
/// would admit everyone.
fn namespaces(variable: &'static str, list: &str) -> Result<Vec<String>, BuilderConfigError> {
    let names: Vec<String> = list
        .split(',')
        .map(str::trim)
        .filter(|ns| !ns.is_empty())
        .map(str::to_owned)
        .collect();
    if names.is_empty() || !names.iter().all(|ns| is_dns_label(ns)) {
        return Err(BuilderConfigError {
            variable,
            value: list.to_owned(),
            expected: "one or more namespace names, comma-separated",
        });
    }
    Ok(names)
}

impl BuilderConfig {
    /// Reads Kubeflow's variables through `lookup` (the process environment in the binary, a map in
    /// tests). Unset or empty values keep the defaults; a flag that is neither `true` nor `false`
    /// is an error, never a silent default.
    pub fn from_env(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, BuilderConfigError> {
        let defaults = Self::default();
        let get = |key: &str| lookup(key).filter(|v| !v.is_empty());
        let flag = |variable: &'static str, default: bool| match get(variable).as_deref() {
            None => Ok(default),
            Some("true") => Ok(true),
            Some("false") => Ok(false),
            Some(other) => Err(BuilderConfigError {
                variable,
                value: other.to_owned(),
                expected: "true or false",
            }),
        };
        Ok(Self {
            gateway: get("ISTIO_GATEWAY").unwrap_or(defaults.gateway),
            host: get("ISTIO_HOST").unwrap_or(defaults.host),
            cluster_domain: get("CLUSTER_DOMAIN").unwrap_or(defaults.cluster_domain),
            virtual_service: flag("USE_ISTIO", defaults.virtual_service)?,
            add_fs_group: flag("ADD_FSGROUP", defaults.add_fs_group)?,
            agent_image: get("LABFORGE_AGENT_IMAGE"),
            notebook_domain: get("LABFORGE_NOTEBOOK_DOMAIN"),
            network_policy_from: match flag("LABFORGE_NETWORK_POLICY", true)? {
                false => None,
                true => Some(match get("LABFORGE_NETWORK_POLICY_FROM") {
                    Some(list) => namespaces("LABFORGE_NETWORK_POLICY_FROM", &list)?,
                    None => defaults.network_policy_from.clone().unwrap_or_default(),
                }),
            },
            notebook_secret_key: match get("LABFORGE_NOTEBOOK_SECRET_KEY") {
                // A short key would make every notebook's secret guessable from its name.
                Some(key) if key.len() < MIN_SECRET_KEY_BYTES => {
                    return Err(BuilderConfigError {
                        variable: "LABFORGE_NOTEBOOK_SECRET_KEY",
                        value: format!("({} bytes)", key.len()),
                        expected: "at least 16 bytes",
                    });
                }
                key => key.map(|key| SecretKey::new(key.into_bytes())),
            },
        })
    }
}

/// Everything a Notebook owns.
#[derive(Clone, Debug, PartialEq)]
pub struct Children {
    pub stateful_set: StatefulSet,
    pub service: Service,
    pub virtual_service: Option<VirtualService>,
    pub network_policy: Option<NetworkPolicy>,
}

/// The route prefix of a notebook, `/notebook/<namespace>/<name>` (no trailing slash, as NB_PREFIX).
pub fn route_prefix(namespace: &str, name: &str) -> String {
    format!("/notebook/{namespace}/{name}")
}

/// The VirtualService name Kubeflow uses: `notebook-<namespace>-<name>`.
pub fn virtual_service_name(namespace: &str, name: &str) -> String {
    format!("notebook-{namespace}-{name}")
}

struct Identity<'a> {
    name: &'a str,
    namespace: &'a str,
    owner: Option<OwnerReference>,
}

fn identity(notebook: &Notebook) -> Result<Identity<'_>, BuildError> {
    let name = notebook
        .metadata
        .name
        .as_deref()
        .ok_or(BuildError::MissingMetadata("name"))?;
    let namespace = notebook
        .metadata
        .namespace
        .as_deref()
        .ok_or(BuildError::MissingMetadata("namespace"))?;
    // A CR read from a file (labforge render) has no uid yet, so it cannot own anything.
    let owner = notebook
        .controller_owner_ref(&())
        .map(|owner| OwnerReference {
            // A foreground delete of the Notebook waits for its children, as in Kubeflow.
            block_owner_deletion: Some(true),
            ..owner
        });
    Ok(Identity {
        name,
        namespace,
        owner,
    })
}

/// Every child carries the `notebook-name` label so the controller watches (and caches) only
/// its own objects, not every StatefulSet or Service of the cluster.
fn child_meta(id: &Identity<'_>, name: String) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: Some(id.namespace.to_owned()),
        labels: Some(BTreeMap::from([(
            NOTEBOOK_NAME_LABEL.to_owned(),
            id.name.to_owned(),
        )])),
        owner_references: id.owner.clone().map(|o| vec![o]),
        ..Default::default()
    }
}

/// Builds every child of `notebook`.
pub fn build_children(notebook: &Notebook, config: &BuilderConfig) -> Result<Children, BuildError> {
    Ok(Children {
        stateful_set: stateful_set(notebook, config)?,
        service: service(notebook)?,
        virtual_service: if config.virtual_service {
            Some(virtual_service(notebook, config)?)
        } else {
            None
        },
        network_policy: network_policy(notebook, config)?,
    })
}

fn notebook_pod_spec(notebook: &Notebook) -> Result<PodSpec, BuildError> {
    let spec = notebook.spec.template.spec.clone().unwrap_or_default();
    if spec.containers.is_empty() {
        return Err(BuildError::NoContainers);
    }
    Ok(spec)
}

/// The StatefulSet: one replica (zero when stopped), pods labelled `statefulset` and `notebook-name`
/// plus the Notebook's own labels; container 0 gets Kubeflow's defaults.
pub fn stateful_set(
    notebook: &Notebook,
    config: &BuilderConfig,
) -> Result<StatefulSet, BuildError> {
    let id = identity(notebook)?;
    let mut pod_spec = notebook_pod_spec(notebook)?;
    if let Some(container) = pod_spec.containers.first_mut() {
        apply_container_defaults(container, &route_prefix(id.namespace, id.name));
        if let Some(key) = &config.notebook_secret_key {
            // Set over whatever the CR says: the route presents this value, nothing else.
            let env = container.env.get_or_insert_with(Vec::new);
            env.retain(|e| e.name != SECRET_ENV);
            env.push(EnvVar {
                name: SECRET_ENV.into(),
                value: Some(key.of(id.namespace, id.name)),
                ..Default::default()
            });
        }
    }
    if let Some(image) = &config.agent_image {
        mount_agent(&mut pod_spec, image);
    }
    // As the API server will store them, so that an unchanged notebook compares equal.
    labforge_crds::quantity::canonicalize_pod_spec(&mut pod_spec);
    if config.add_fs_group && pod_spec.security_context.is_none() {
        pod_spec.security_context = Some(PodSecurityContext {
            fs_group: Some(DEFAULT_FS_GROUP),
            ..Default::default()
        });
    }

    let selector = BTreeMap::from([(STATEFULSET_LABEL.to_owned(), id.name.to_owned())]);
    let mut pod_labels = selector.clone();
    pod_labels.insert(NOTEBOOK_NAME_LABEL.to_owned(), id.name.to_owned());
    if let Some(labels) = &notebook.metadata.labels {
        pod_labels.extend(labels.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    // Kubeflow copies the Notebook's annotations to its pods, but for its own and kubectl's;
    // labforge's are left out too (activity stamps or the auto-save switch would otherwise
    // restart the pod when they change).
    let pod_annotations: BTreeMap<String, String> = notebook
        .metadata
        .annotations
        .iter()
        .flatten()
        .filter(|(key, _)| {
            !key.contains("kubectl")
                && !key.contains("notebook")
                && !key.starts_with("labforge.dev/")
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();

    Ok(StatefulSet {
        metadata: child_meta(&id, id.name.to_owned()),
        spec: Some(StatefulSetSpec {
            replicas: Some(if notebook.is_stopped() { 0 } else { 1 }),
            selector: LabelSelector {
                match_labels: Some(selector),
                ..Default::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    annotations: (!pod_annotations.is_empty()).then_some(pod_annotations),
                    ..Default::default()
                }),
                spec: Some(pod_spec),
            },
            ..Default::default()
        }),
        status: None,
    })
}

/// Puts the save agent into the pod without touching the notebook's image: an init container copies
/// the static binary into an emptyDir, mounted read-only in the notebook container. The agent holds
/// no credentials; the builder outside execs it.
fn mount_agent(pod: &mut PodSpec, image: &str) {
    let mount = |read_only| VolumeMount {
        name: AGENT_VOLUME.into(),
        mount_path: AGENT_DIR.into(),
        read_only: Some(read_only),
        ..Default::default()
    };
    let volumes = pod.volumes.get_or_insert_with(Vec::new);
    if volumes.iter().any(|v| v.name == AGENT_VOLUME) {
        return;
    }
    volumes.push(Volume {
        name: AGENT_VOLUME.into(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Default::default()
    });
    pod.init_containers
        .get_or_insert_with(Vec::new)
        .push(Container {
            name: "labforge-agent-install".into(),
            image: Some(image.to_owned()),
            command: Some(vec![
                "/labforge-agent".into(),
                "install".into(),
                AGENT_DIR.into(),
            ]),
            volume_mounts: Some(vec![mount(false)]),
            // Set, so that a namespace with a ResourceQuota and no LimitRange admits the pod;
            // copying one static binary needs little.
            resources: Some(ResourceRequirements {
                requests: Some(BTreeMap::from([
                    ("cpu".to_owned(), Quantity("10m".into())),
                    ("memory".to_owned(), Quantity("16Mi".into())),
                ])),
                limits: Some(BTreeMap::from([
                    ("cpu".to_owned(), Quantity("100m".into())),
                    ("memory".to_owned(), Quantity("32Mi".into())),
                ])),
                ..Default::default()
            }),
            ..Default::default()
        });
    if let Some(container) = pod.containers.first_mut() {
        container
            .volume_mounts
            .get_or_insert_with(Vec::new)
            .push(mount(true));
    }
}

fn apply_container_defaults(container: &mut Container, prefix: &str) {
    if container.working_dir.as_deref().is_none_or(str::is_empty) {
        container.working_dir = Some(DEFAULT_WORKING_DIR.to_owned());
    }
    if container.ports.is_none() {
        container.ports = Some(vec![ContainerPort {
            container_port: DEFAULT_CONTAINER_PORT,
            name: Some("notebook-port".into()),
            protocol: Some("TCP".into()),
            ..Default::default()
        }]);
    }
    // The route prefix is the controller's to decide: a stale or hand-set value would make the
    // notebook serve under a path the proxy never routes to.
    let env = container.env.get_or_insert_with(Vec::new);
    match env.iter_mut().find(|e| e.name == PREFIX_ENV) {
        Some(var) => {
            var.value = Some(prefix.to_owned());
            var.value_from = None;
        }
        None => env.push(EnvVar {
            name: PREFIX_ENV.into(),
            value: Some(prefix.to_owned()),
            value_from: None,
        }),
    }
}

/// The port the notebook container serves on: its first declared port, else 8888.
pub fn container_port(notebook: &Notebook) -> i32 {
    notebook
        .container()
        .and_then(|c| c.ports.as_ref())
        .and_then(|p| p.first())
        .map_or(DEFAULT_CONTAINER_PORT, |p| p.container_port)
}

/// The Service: ClusterIP, port `http-<name>` 80 → the container port, selecting the StatefulSet's pods.
pub fn service(notebook: &Notebook) -> Result<Service, BuildError> {
    let id = identity(notebook)?;
    notebook_pod_spec(notebook)?;
    Ok(Service {
        metadata: child_meta(&id, id.name.to_owned()),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            selector: Some(BTreeMap::from([(
                STATEFULSET_LABEL.to_owned(),
                id.name.to_owned(),
            )])),
            ports: Some(vec![ServicePort {
                // Istio's protocol-by-name convention, so Istio policies can manage the port.
                name: Some(format!("http-{}", id.name)),
                port: SERVICE_PORT,
                target_port: Some(IntOrString::Int(container_port(notebook))),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: None,
    })
}

/// The NetworkPolicy's name: prefixed, so that a notebook cannot be named after (and so take
/// over) a policy someone else put in its namespace.
pub fn network_policy_name(notebook: &str) -> String {
    format!("labforge-notebook-{notebook}")
}

/// The NetworkPolicy admitting to the notebook's pods only pods of the platform's namespaces
/// ([`BuilderConfig::network_policy_from`]), on the notebook's port, and its own namespace's
/// pods: a notebook's server is its owner's, and another user's pod must not reach it past the
/// proxy's checks. `None` when NetworkPolicies are turned off.
pub fn network_policy(
    notebook: &Notebook,
    config: &BuilderConfig,
) -> Result<Option<NetworkPolicy>, BuildError> {
    let id = identity(notebook)?;
    notebook_pod_spec(notebook)?;
    let Some(from) = &config.network_policy_from else {
        return Ok(None);
    };
    let peers = from
        .iter()
        .map(|namespace| NetworkPolicyPeer {
            namespace_selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([(
                    "kubernetes.io/metadata.name".to_owned(),
                    namespace.clone(),
                )])),
                ..Default::default()
            }),
            ..Default::default()
        })
        .collect();
    Ok(Some(NetworkPolicy {
        metadata: child_meta(&id, network_policy_name(id.name)),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([(
                    STATEFULSET_LABEL.to_owned(),
                    id.name.to_owned(),
                )])),
                ..Default::default()
            }),
            policy_types: Some(vec!["Ingress".into()]),
            ingress: Some(vec![
                NetworkPolicyIngressRule {
                    from: Some(peers),
                    ports: Some(vec![NetworkPolicyPort {
                        port: Some(IntOrString::Int(container_port(notebook))),
                        protocol: Some("TCP".into()),
                        ..Default::default()
                    }]),
                },
                // The namespace's own pods, on any port: its members share it (Spark executors
                // calling back to a driver in the notebook, Dask or Ray workers).
                NetworkPolicyIngressRule {
                    from: Some(vec![NetworkPolicyPeer {
                        pod_selector: Some(LabelSelector::default()),
                        ..Default::default()
                    }]),
                    ports: None,
                },
            ]),
            ..Default::default()
        }),
    }))
}

/// The VirtualService routing `/notebook/<ns>/<name>/` to the Service, with no timeout.
pub fn virtual_service(
    notebook: &Notebook,
    config: &BuilderConfig,
) -> Result<VirtualService, BuildError> {
    let id = identity(notebook)?;
    let prefix = format!("{}/", route_prefix(id.namespace, id.name));
    let rewrite = notebook
        .annotation(REWRITE_URI_ANNOTATION)
        .filter(|uri| !uri.is_empty())
        .unwrap_or(&prefix)
        .to_owned();
    // Kubeflow ignores a header annotation that is not a JSON object of strings; so do we.
    let mut headers_set: BTreeMap<String, String> = notebook
        .annotation(HEADERS_REQUEST_SET_ANNOTATION)
        .and_then(|json| serde_json::from_str(json).ok())
        .unwrap_or_default();
    if let Some(key) = &config.notebook_secret_key {
        let code_server = notebook.annotation(SERVER_TYPE_ANNOTATION) == Some(VSCODE_SERVER_TYPE);
        headers_set.extend(upstream_headers(
            &key.of(id.namespace, id.name),
            code_server,
        ));
    }
    let route = HttpRoute {
        matches: vec![HttpMatchRequest {
            uri: Some(StringMatch::Prefix(prefix.clone())),
            ..Default::default()
        }],
        rewrite: Some(HttpRewrite {
            uri: Some(rewrite),
            ..Default::default()
        }),
        route: vec![HttpRouteDestination {
            destination: Destination {
                host: format!("{}.{}.svc.{}", id.name, id.namespace, config.cluster_domain),
                port: Some(PortSelector {
                    number: SERVICE_PORT.unsigned_abs(),
                }),
                subset: None,
            },
            weight: None,
        }],
        headers: (!headers_set.is_empty()).then(|| Headers {
            request: Some(HeaderOperations {
                set: headers_set,
                ..Default::default()
            }),
            response: None,
        }),
        ..Default::default()
    };
    let mut vs = VirtualService::new(
        &virtual_service_name(id.namespace, id.name),
        VirtualServiceSpec {
            hosts: vec![match &config.notebook_domain {
                Some(domain) => labforge_crds::host::notebook_host(id.namespace, id.name, domain),
                None => config.host.clone(),
            }],
            gateways: vec![config.gateway.clone()],
            http: vec![route],
        },
    );
    vs.metadata = child_meta(&id, virtual_service_name(id.namespace, id.name));
    // The proxy lets the users a notebook is shared with in by its route.
    if !notebook.shared_with().is_empty()
        && let Some(shared) = notebook.annotation(SHARED_WITH_ANNOTATION)
    {
        vs.metadata
            .annotations
            .get_or_insert_default()
            .insert(SHARED_WITH_ANNOTATION.into(), shared.into());
    }
    Ok(vs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::NotebookFixture;
    use labforge_crds::notebook::{LAST_ACTIVITY_ANNOTATION, STOP_ANNOTATION};
    use serde_json::json;

    fn first_container(sts: &StatefulSet) -> &Container {
        &sts.spec
            .as_ref()
            .unwrap()
            .template
            .spec
            .as_ref()
            .unwrap()
            .containers[0]
    }

    #[test]
    fn statefulset_has_kubeflow_shape() {
        let nb = Notebook::test("alice", "lab").labelled("team", "ml");
        let sts = stateful_set(&nb, &BuilderConfig::default()).unwrap();
        let spec = sts.spec.as_ref().unwrap();
        assert_eq!(sts.metadata.name.as_deref(), Some("lab"));
        assert_eq!(sts.metadata.namespace.as_deref(), Some("alice"));
        assert_eq!(spec.replicas, Some(1));
        assert_eq!(
            spec.selector.match_labels.as_ref().unwrap(),
            &BTreeMap::from([("statefulset".to_string(), "lab".to_string())])
        );
        let labels = spec
            .template
            .metadata
            .as_ref()
            .unwrap()
            .labels
            .as_ref()
            .unwrap();
        assert_eq!(labels["statefulset"], "lab");
        assert_eq!(labels["notebook-name"], "lab");
        assert_eq!(labels["team"], "ml");
        let container = first_container(&sts);
        assert_eq!(container.working_dir.as_deref(), Some("/home/jovyan"));
        let port = &container.ports.as_ref().unwrap()[0];
        assert_eq!(
            (port.container_port, port.name.as_deref()),
            (8888, Some("notebook-port"))
        );
        let env = container.env.as_ref().unwrap();
        assert!(env.iter().any(|e| e.name == "NB_PREFIX" && e.value.as_deref() == Some("/notebook/alice/lab")));
        let pod = spec.template.spec.as_ref().unwrap();
        assert_eq!(pod.security_context.as_ref().unwrap().fs_group, Some(100));
        // Owned by the Notebook, so deleting it cascades.
        let owner = &sts.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (
                owner.kind.as_str(),
                owner.controller,
                owner.block_owner_deletion
            ),
            ("Notebook", Some(true), Some(true))
        );
    }

    #[test]
    fn the_notebooks_annotations_reach_its_pods_but_kubeflows_and_kubectls() {
        let nb = Notebook::test("alice", "lab")
            .annotated("team.example/cost-center", "42")
            .annotated(LAST_ACTIVITY_ANNOTATION, "2026-01-01T00:00:00Z")
            .annotated(SERVER_TYPE_ANNOTATION, "jupyter")
            .annotated("labforge.dev/auto-save", "true")
            .annotated("kubectl.kubernetes.io/last-applied-configuration", "{}");
        let sts = stateful_set(&nb, &BuilderConfig::default()).unwrap();
        let template = sts.spec.unwrap().template.metadata.unwrap();
        assert_eq!(
            template.annotations.unwrap(),
            BTreeMap::from([("team.example/cost-center".to_owned(), "42".to_owned())])
        );
    }

    #[test]
    fn quantities_are_built_as_the_api_server_stores_them() {
        let mut nb = Notebook::test("alice", "lab");
        nb.container_mut().unwrap().resources = Some(
            serde_json::from_value(serde_json::json!({
                "requests": {"cpu": "0.5", "memory": "1.0Gi"},
                "limits": {"cpu": "0.6", "memory": "1.2Gi", "nvidia.com/gpu": "1"}
            }))
            .unwrap(),
        );
        let sts = stateful_set(&nb, &BuilderConfig::default()).unwrap();
        let resources = serde_json::to_value(&first_container(&sts).resources).unwrap();
        assert_eq!(
            resources,
            serde_json::json!({
                "requests": {"cpu": "500m", "memory": "1Gi"},
                "limits": {"cpu": "600m", "memory": "1288490188800m", "nvidia.com/gpu": "1"}
            })
        );
    }

    #[test]
    fn stop_annotation_scales_to_zero_whatever_its_value() {
        let nb = Notebook::test("alice", "lab").annotated(STOP_ANNOTATION, "");
        let sts = stateful_set(&nb, &BuilderConfig::default()).unwrap();
        assert_eq!(sts.spec.unwrap().replicas, Some(0));
        let sts = stateful_set(
            &Notebook::test("alice", "lab").stopped(),
            &BuilderConfig::default(),
        )
        .unwrap();
        assert_eq!(sts.spec.unwrap().replicas, Some(0));
    }

    #[test]
    fn user_choices_in_the_pod_template_are_kept() {
        let nb = Notebook::test("alice", "code")
            .with_port(8080)
            .with_working_dir("/workspace")
            .with_security_context()
            .with_env("NB_PREFIX", "/somewhere/else");
        let sts = stateful_set(&nb, &BuilderConfig::default()).unwrap();
        let container = first_container(&sts);
        assert_eq!(container.working_dir.as_deref(), Some("/workspace"));
        assert_eq!(container.ports.as_ref().unwrap()[0].container_port, 8080);
        let pod = sts.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
        assert_eq!(pod.security_context.as_ref().unwrap().fs_group, None);
        let prefixes: Vec<_> = container
            .env
            .as_ref()
            .unwrap()
            .iter()
            .filter(|e| e.name == "NB_PREFIX")
            .collect();
        assert_eq!(prefixes.len(), 1, "one NB_PREFIX");
        assert_eq!(prefixes[0].value.as_deref(), Some("/notebook/alice/code"));

        let svc = service(&nb).unwrap();
        let port = &svc.spec.unwrap().ports.unwrap()[0];
        assert_eq!(port.name.as_deref(), Some("http-code"));
        assert_eq!(port.port, 80);
        assert_eq!(port.target_port, Some(IntOrString::Int(8080)));
    }

    #[test]
    fn agent_image_adds_an_init_container_and_a_read_only_mount() {
        let config = BuilderConfig::from_env(|k| {
            (k == "LABFORGE_AGENT_IMAGE").then(|| "registry.example/labforge/agent:1".to_owned())
        })
        .unwrap();
        let sts = stateful_set(&Notebook::test("alice", "lab"), &config).unwrap();
        let pod = sts.spec.unwrap().template.spec.unwrap();
        let init = &pod.init_containers.as_ref().unwrap()[0];
        assert_eq!(
            init.image.as_deref(),
            Some("registry.example/labforge/agent:1")
        );
        assert_eq!(
            init.command.as_deref().unwrap(),
            ["/labforge-agent", "install", AGENT_DIR]
        );
        // A namespace's ResourceQuota admits only containers that state what they use.
        let resources = init.resources.as_ref().unwrap();
        for quantities in [&resources.requests, &resources.limits] {
            let quantities = quantities.as_ref().unwrap();
            assert!(quantities.contains_key("cpu") && quantities.contains_key("memory"));
        }
        let volume = &pod.volumes.as_ref().unwrap()[0];
        assert!(volume.empty_dir.is_some());
        let mounts = pod.containers[0].volume_mounts.as_ref().unwrap();
        let agent = mounts.iter().find(|m| m.mount_path == AGENT_DIR).unwrap();
        assert_eq!(
            (agent.name.as_str(), agent.read_only),
            (volume.name.as_str(), Some(true))
        );
        // Without the setting the pod is exactly Kubeflow's.
        let plain =
            stateful_set(&Notebook::test("alice", "lab"), &BuilderConfig::default()).unwrap();
        assert!(
            plain
                .spec
                .unwrap()
                .template
                .spec
                .unwrap()
                .init_containers
                .is_none()
        );
    }

    #[test]
    fn add_fsgroup_false_leaves_the_security_context_alone() {
        let config = BuilderConfig {
            add_fs_group: false,
            ..Default::default()
        };
        let sts = stateful_set(&Notebook::test("a", "b"), &config).unwrap();
        assert!(
            sts.spec
                .unwrap()
                .template
                .spec
                .unwrap()
                .security_context
                .is_none()
        );
    }

    #[test]
    fn virtual_service_matches_kubeflow_exactly() {
        let vs =
            virtual_service(&Notebook::test("alice", "lab"), &BuilderConfig::default()).unwrap();
        let mut value = serde_json::to_value(&vs).unwrap();
        value["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("ownerReferences");
        assert_eq!(
            value,
            json!({
                "apiVersion": "networking.istio.io/v1beta1",
                "kind": "VirtualService",
                // Kubeflow's metadata, plus the label the controller's watches select on.
                "metadata": { "name": "notebook-alice-lab", "namespace": "alice",
                    "labels": { "notebook-name": "lab" } },
                "spec": {
                    "hosts": ["*"],
                    "gateways": ["kubeflow/kubeflow-gateway"],
                    "http": [{
                        "match": [{ "uri": { "prefix": "/notebook/alice/lab/" } }],
                        "rewrite": { "uri": "/notebook/alice/lab/" },
                        "route": [{ "destination": {
                            "host": "lab.alice.svc.cluster.local",
                            "port": { "number": 80 }
                        } }]
                    }]
                }
            })
        );
    }

    #[test]
    fn the_network_policy_admits_only_the_platforms_namespaces_on_the_notebooks_port() {
        let nb = Notebook::test("alice", "lab");
        let policy = network_policy(&nb, &BuilderConfig::default())
            .unwrap()
            .unwrap();
        let value = serde_json::to_value(&policy).unwrap();
        assert_eq!(value["kind"], "NetworkPolicy");
        assert_eq!(value["metadata"]["namespace"], "alice");
        assert_eq!(value["metadata"]["name"], "labforge-notebook-lab");
        assert_eq!(
            value["spec"]["ingress"][1],
            json!({"from": [{"podSelector": {}}]}),
            "its own namespace's pods, on any port"
        );
        let spec = &value["spec"];
        assert_eq!(
            spec["podSelector"]["matchLabels"],
            json!({"statefulset": "lab"})
        );
        assert_eq!(spec["policyTypes"], json!(["Ingress"]));
        let from: Vec<&str> = spec["ingress"][0]["from"]
            .as_array()
            .unwrap()
            .iter()
            .map(|peer| {
                peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
                    .as_str()
                    .unwrap()
            })
            .collect();
        assert_eq!(from, DEFAULT_NETWORK_POLICY_FROM);
        assert_eq!(
            spec["ingress"][0]["ports"],
            json!([{"port": 8888, "protocol": "TCP"}])
        );

        let config = |vars: &[(&str, &str)]| {
            let vars: BTreeMap<String, String> = vars
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            BuilderConfig::from_env(|k| vars.get(k).cloned()).unwrap()
        };
        let only_gateway = config(&[("LABFORGE_NETWORK_POLICY_FROM", "gateways, labforge")]);
        let policy = network_policy(&nb, &only_gateway).unwrap().unwrap();
        let peers = policy.spec.unwrap().ingress.unwrap()[0]
            .from
            .clone()
            .unwrap();
        assert_eq!(peers.len(), 2);
        let off = config(&[("LABFORGE_NETWORK_POLICY", "false")]);
        assert_eq!(network_policy(&nb, &off).unwrap(), None);
        assert!(build_children(&nb, &off).unwrap().network_policy.is_none());
        for (variable, value) in [
            ("LABFORGE_NETWORK_POLICY", "maybe"),
            ("LABFORGE_NETWORK_POLICY_FROM", ","),
            ("LABFORGE_NETWORK_POLICY_FROM", "kubeflow,Not_A_Namespace"),
            ("LABFORGE_NETWORK_POLICY_FROM", "kubeflow,-istio"),
            ("LABFORGE_NETWORK_POLICY_FROM", "kubeflow-,istio"),
            ("LABFORGE_NOTEBOOK_SECRET_KEY", "short"),
        ] {
            let error = BuilderConfig::from_env(|k| (k == variable).then(|| value.into()))
                .expect_err(value);
            assert_eq!(error.variable, variable);
        }
    }

    #[test]
    fn with_a_secret_key_the_pod_holds_its_secret_and_the_route_presents_it() {
        let config = BuilderConfig::from_env(|k| {
            (k == "LABFORGE_NOTEBOOK_SECRET_KEY").then(|| "cluster-key-of-32-bytes-or-so...".into())
        })
        .unwrap();
        let key = config.notebook_secret_key.clone().unwrap();
        let secret = key.of("alice", "code");
        assert!(
            !format!("{config:?}").contains("cluster-key"),
            "the key stays out of logs"
        );
        let nb = Notebook::test("alice", "code")
            .annotated(SERVER_TYPE_ANNOTATION, VSCODE_SERVER_TYPE)
            .with_env(SECRET_ENV, "chosen-by-the-owner");
        let sts = stateful_set(&nb, &config).unwrap();
        let env: Vec<(String, Option<String>)> = first_container(&sts)
            .env
            .iter()
            .flatten()
            .filter(|e| e.name == SECRET_ENV)
            .map(|e| (e.name.clone(), e.value.clone()))
            .collect();
        assert_eq!(env, [(SECRET_ENV.to_owned(), Some(secret.clone()))]);
        let vs = virtual_service(&nb, &config).unwrap();
        let set = request_set(&vs);
        assert_eq!(set["authorization"], format!("token {secret}"));
        assert_eq!(set["cookie"], format!("code-server-session={secret}"));

        // Without a key, Kubeflow's objects exactly.
        let plain = BuilderConfig::default();
        assert!(
            virtual_service(&nb, &plain).unwrap().spec.http[0]
                .headers
                .is_none()
        );
        let jupyter = virtual_service(&Notebook::test("alice", "lab"), &config).unwrap();
        let set = request_set(&jupyter);
        assert_eq!(set.len(), 1, "JupyterLab takes the token header only");
    }

    /// The request headers the first rule of `vs` sets.
    fn request_set(vs: &VirtualService) -> &BTreeMap<String, String> {
        &vs.spec.http[0]
            .headers
            .as_ref()
            .unwrap()
            .request
            .as_ref()
            .unwrap()
            .set
    }

    #[test]
    fn with_a_notebook_domain_each_virtual_service_serves_its_notebooks_host() {
        let config = BuilderConfig::from_env(|k| {
            (k == "LABFORGE_NOTEBOOK_DOMAIN").then(|| "nb.example.com".into())
        })
        .unwrap();
        let vs = virtual_service(&Notebook::test("alice", "lab"), &config).unwrap();
        assert_eq!(vs.spec.hosts, ["lab--alice.nb.example.com"]);
        assert_eq!(
            vs.spec.http[0].matches[0].uri,
            Some(StringMatch::Prefix("/notebook/alice/lab/".into())),
            "the path stays, so NB_PREFIX and Kubeflow's images work unchanged"
        );
    }

    #[test]
    fn rewrite_and_header_annotations_shape_the_route() {
        let nb = Notebook::test("alice", "code")
            .annotated(REWRITE_URI_ANNOTATION, "/")
            .annotated(
                HEADERS_REQUEST_SET_ANNOTATION,
                r#"{"X-RStudio-Root-Path":"/notebook/alice/code/"}"#,
            );
        let config = BuilderConfig::from_env(|k| match k {
            "ISTIO_GATEWAY" => Some("istio-system/main".into()),
            "ISTIO_HOST" => Some("lab.example.com".into()),
            "CLUSTER_DOMAIN" => Some("corp.local".into()),
            _ => None,
        })
        .unwrap();
        let vs = virtual_service(&nb, &config).unwrap();
        assert_eq!(vs.spec.gateways, ["istio-system/main"]);
        assert_eq!(vs.spec.hosts, ["lab.example.com"]);
        let route = &vs.spec.http[0];
        assert_eq!(route.rewrite.as_ref().unwrap().uri.as_deref(), Some("/"));
        assert_eq!(route.route[0].destination.host, "code.alice.svc.corp.local");
        assert_eq!(
            route.timeout, None,
            "no timeout: notebooks hold long connections"
        );
        assert_eq!(
            request_set(&vs)["X-RStudio-Root-Path"],
            "/notebook/alice/code/"
        );
    }

    #[test]
    fn a_notebooks_shares_ride_on_its_virtual_service_for_the_proxy() {
        let nb = Notebook::test("alice", "lab").annotated(SHARED_WITH_ANNOTATION, "bob, carol");
        let vs = virtual_service(&nb, &BuilderConfig::default()).unwrap();
        let annotations = vs.metadata.annotations.unwrap();
        assert_eq!(annotations[SHARED_WITH_ANNOTATION], "bob, carol");
        let unshared = Notebook::test("alice", "lab").annotated(SHARED_WITH_ANNOTATION, " ");
        let vs = virtual_service(&unshared, &BuilderConfig::default()).unwrap();
        assert!(vs.metadata.annotations.is_none());
    }

    #[test]
    fn malformed_header_annotation_is_ignored_like_kubeflow() {
        let nb =
            Notebook::test("alice", "lab").annotated(HEADERS_REQUEST_SET_ANNOTATION, "not json");
        let vs = virtual_service(&nb, &BuilderConfig::default()).unwrap();
        assert!(vs.spec.http[0].headers.is_none());
    }

    #[test]
    fn use_istio_false_builds_no_virtual_service() {
        let config =
            BuilderConfig::from_env(|k| (k == "USE_ISTIO").then(|| "false".into())).unwrap();
        let children = build_children(&Notebook::test("a", "b"), &config).unwrap();
        assert!(children.virtual_service.is_none());
        let err =
            BuilderConfig::from_env(|k| (k == "ADD_FSGROUP").then(|| "yes".into())).unwrap_err();
        assert_eq!(err.variable, "ADD_FSGROUP");
    }

    #[test]
    fn notebook_without_containers_is_refused_with_the_field_named() {
        let nb = Notebook::test("alice", "empty").without_containers();
        let err = build_children(&nb, &BuilderConfig::default()).unwrap_err();
        assert_eq!(err, BuildError::NoContainers);
        assert!(err.to_string().contains("spec.template.spec.containers"));
    }
}

/// Every object built from the sample Notebooks validates against the official schemas
/// (Kubernetes OpenAPI for the StatefulSet and Service, Istio's CRD for the VirtualService).
#[cfg(test)]
mod schema_tests {
    use super::*;
    use labforge_tests::fake_kube::{FakeApiServerOptions, SchemaSet};

    fn samples() -> Vec<Notebook> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../crds/samples");
        let mut paths: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        paths.sort();
        paths
            .iter()
            .flat_map(|p| {
                crate::render::parse_notebooks(&std::fs::read_to_string(p).unwrap(), "default")
                    .unwrap()
            })
            .collect()
    }

    #[test]
    fn built_objects_validate_against_kubernetes_and_istio_schemas() {
        let schemas = SchemaSet::load(&FakeApiServerOptions::default()).unwrap();
        let notebooks = samples();
        assert!(notebooks.len() >= 4, "samples found: {}", notebooks.len());
        let with_agent = BuilderConfig {
            agent_image: Some("registry.example/labforge/agent:1".into()),
            ..Default::default()
        };
        for (notebook, config) in notebooks
            .iter()
            .flat_map(|n| [(n, BuilderConfig::default()), (n, with_agent.clone())])
        {
            let children = build_children(notebook, &config).unwrap();
            let objects = [
                (
                    "apps/v1",
                    "StatefulSet",
                    serde_json::to_value(&children.stateful_set).unwrap(),
                ),
                (
                    "v1",
                    "Service",
                    serde_json::to_value(&children.service).unwrap(),
                ),
                (
                    "networking.istio.io/v1beta1",
                    "VirtualService",
                    serde_json::to_value(children.virtual_service.as_ref().unwrap()).unwrap(),
                ),
            ];
            for (api_version, kind, object) in objects {
                if let Err(errors) = schemas.validate(api_version, kind, &object) {
                    panic!(
                        "{kind} of {:?} is invalid: {errors:?}",
                        notebook.metadata.name
                    );
                }
            }
        }
    }

    #[test]
    fn schema_check_catches_a_broken_statefulset() {
        // Guards the test above: the validator really rejects what a builder bug would produce.
        let schemas = SchemaSet::load(&FakeApiServerOptions::default()).unwrap();
        let children = build_children(&samples()[0], &BuilderConfig::default()).unwrap();
        let mut object = serde_json::to_value(&children.stateful_set).unwrap();
        object["spec"]["replica"] = 1.into();
        assert!(schemas.validate("apps/v1", "StatefulSet", &object).is_err());
    }
}
