//! The resources the fake serves: a fixed table of built-in kinds, plus every kind of the CRDs it
//! was given, each with its served versions and the compiled schema of each version.

use std::collections::BTreeMap;

use serde_json::Value;

use super::schema::compile::NodeId;

/// Which name rule `metadata.name` follows for a kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NameRule {
    Subdomain,
    Label,
    Dns1035Label,
}

/// The compiled schema of one served version.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RootSchema {
    pub node: NodeId,
    /// A CRD's own `metadata` schema (name patterns), checked besides `ObjectMeta`.
    pub crd_metadata: Option<NodeId>,
}

/// One REST resource (`statefulsets.apps`, `notebooks.kubeflow.org`).
#[derive(Debug, Clone)]
pub(crate) struct ResourceInfo {
    pub group: String,
    /// Served versions, storage version first.
    pub versions: Vec<String>,
    pub storage_version: String,
    pub plural: String,
    pub singular: String,
    pub kind: String,
    pub list_kind: String,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    pub namespaced: bool,
    pub has_status: bool,
    pub has_generation: bool,
    pub name_rule: NameRule,
    /// Custom resources take no strategic merge patch, as on a real server.
    pub custom: bool,
    /// Review resources (SubjectAccessReview) are answered, never stored.
    pub stored: bool,
    pub schemas: BTreeMap<String, RootSchema>,
}

impl ResourceInfo {
    pub(crate) fn api_version(&self, version: &str) -> String {
        if self.group.is_empty() {
            version.to_string()
        } else {
            format!("{}/{version}", self.group)
        }
    }

    pub(crate) fn storage_api_version(&self) -> String {
        self.api_version(&self.storage_version)
    }

    /// `statefulsets.apps`, `pods`: how Status messages name a resource.
    pub(crate) fn group_resource(&self) -> String {
        if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// `StatefulSet.apps`, `Pod`: how Invalid messages name a kind.
    pub(crate) fn group_kind(&self) -> String {
        if self.group.is_empty() {
            self.kind.clone()
        } else {
            format!("{}.{}", self.kind, self.group)
        }
    }

    pub(crate) fn serves(&self, version: &str) -> bool {
        self.versions.iter().any(|v| v == version)
    }
}

/// A built-in kind: group, version, plural, singular, kind, namespaced, status subresource,
/// generation, name rule, Swagger definition, short names.
pub(crate) struct Builtin {
    pub group: &'static str,
    pub version: &'static str,
    pub plural: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
    pub has_status: bool,
    pub has_generation: bool,
    pub name_rule: NameRule,
    pub definition: &'static str,
    pub short_names: &'static [&'static str],
    pub stored: bool,
}

const fn builtin(
    group: &'static str,
    plural: &'static str,
    kind: &'static str,
    definition: &'static str,
    short_names: &'static [&'static str],
) -> Builtin {
    Builtin {
        group,
        version: "v1",
        plural,
        kind,
        namespaced: true,
        has_status: false,
        has_generation: false,
        name_rule: NameRule::Subdomain,
        definition,
        short_names,
        stored: true,
    }
}

pub(crate) const BUILTINS: &[Builtin] = &[
    Builtin {
        namespaced: false,
        has_status: true,
        name_rule: NameRule::Label,
        ..builtin(
            "",
            "namespaces",
            "Namespace",
            "io.k8s.api.core.v1.Namespace",
            &["ns"],
        )
    },
    Builtin {
        namespaced: false,
        has_status: true,
        ..builtin("", "nodes", "Node", "io.k8s.api.core.v1.Node", &["no"])
    },
    Builtin {
        has_status: true,
        has_generation: true,
        ..builtin("", "pods", "Pod", "io.k8s.api.core.v1.Pod", &["po"])
    },
    Builtin {
        has_status: true,
        name_rule: NameRule::Dns1035Label,
        ..builtin(
            "",
            "services",
            "Service",
            "io.k8s.api.core.v1.Service",
            &["svc"],
        )
    },
    builtin("", "events", "Event", "io.k8s.api.core.v1.Event", &["ev"]),
    Builtin {
        has_status: true,
        ..builtin(
            "",
            "persistentvolumeclaims",
            "PersistentVolumeClaim",
            "io.k8s.api.core.v1.PersistentVolumeClaim",
            &["pvc"],
        )
    },
    builtin(
        "",
        "configmaps",
        "ConfigMap",
        "io.k8s.api.core.v1.ConfigMap",
        &["cm"],
    ),
    builtin("", "secrets", "Secret", "io.k8s.api.core.v1.Secret", &[]),
    Builtin {
        has_status: true,
        ..builtin(
            "",
            "resourcequotas",
            "ResourceQuota",
            "io.k8s.api.core.v1.ResourceQuota",
            &["quota"],
        )
    },
    builtin(
        "",
        "limitranges",
        "LimitRange",
        "io.k8s.api.core.v1.LimitRange",
        &["limits"],
    ),
    builtin(
        "",
        "serviceaccounts",
        "ServiceAccount",
        "io.k8s.api.core.v1.ServiceAccount",
        &["sa"],
    ),
    Builtin {
        has_status: true,
        has_generation: true,
        ..builtin(
            "apps",
            "statefulsets",
            "StatefulSet",
            "io.k8s.api.apps.v1.StatefulSet",
            &["sts"],
        )
    },
    Builtin {
        has_status: true,
        has_generation: true,
        ..builtin(
            "apps",
            "deployments",
            "Deployment",
            "io.k8s.api.apps.v1.Deployment",
            &["deploy"],
        )
    },
    builtin(
        "networking.k8s.io",
        "networkpolicies",
        "NetworkPolicy",
        "io.k8s.api.networking.v1.NetworkPolicy",
        &["netpol"],
    ),
    builtin(
        "discovery.k8s.io",
        "endpointslices",
        "EndpointSlice",
        "io.k8s.api.discovery.v1.EndpointSlice",
        &[],
    ),
    builtin(
        "coordination.k8s.io",
        "leases",
        "Lease",
        "io.k8s.api.coordination.v1.Lease",
        &[],
    ),
    builtin(
        "events.k8s.io",
        "events",
        "Event",
        "io.k8s.api.events.v1.Event",
        &["ev"],
    ),
    Builtin {
        namespaced: false,
        stored: false,
        ..builtin(
            "authorization.k8s.io",
            "subjectaccessreviews",
            "SubjectAccessReview",
            "io.k8s.api.authorization.v1.SubjectAccessReview",
            &[],
        )
    },
    // RBAC, so that deploy/ manifests are checked by the same validator.
    Builtin {
        namespaced: false,
        ..builtin(
            "rbac.authorization.k8s.io",
            "clusterroles",
            "ClusterRole",
            "io.k8s.api.rbac.v1.ClusterRole",
            &[],
        )
    },
    Builtin {
        namespaced: false,
        ..builtin(
            "rbac.authorization.k8s.io",
            "clusterrolebindings",
            "ClusterRoleBinding",
            "io.k8s.api.rbac.v1.ClusterRoleBinding",
            &[],
        )
    },
    builtin(
        "rbac.authorization.k8s.io",
        "roles",
        "Role",
        "io.k8s.api.rbac.v1.Role",
        &[],
    ),
    builtin(
        "rbac.authorization.k8s.io",
        "rolebindings",
        "RoleBinding",
        "io.k8s.api.rbac.v1.RoleBinding",
        &[],
    ),
    Builtin {
        namespaced: false,
        ..builtin(
            "storage.k8s.io",
            "storageclasses",
            "StorageClass",
            "io.k8s.api.storage.v1.StorageClass",
            &["sc"],
        )
    },
    Builtin {
        namespaced: false,
        ..builtin(
            "apiextensions.k8s.io",
            "customresourcedefinitions",
            "CustomResourceDefinition",
            "io.k8s.apiextensions-apiserver.pkg.apis.apiextensions.v1.CustomResourceDefinition",
            &["crd"],
        )
    },
];

impl Builtin {
    pub(crate) fn info(&self, root: NodeId) -> ResourceInfo {
        ResourceInfo {
            group: self.group.to_string(),
            versions: vec![self.version.to_string()],
            storage_version: self.version.to_string(),
            plural: self.plural.to_string(),
            singular: self.kind.to_ascii_lowercase(),
            kind: self.kind.to_string(),
            list_kind: format!("{}List", self.kind),
            short_names: self.short_names.iter().map(|s| s.to_string()).collect(),
            categories: Vec::new(),
            namespaced: self.namespaced,
            has_status: self.has_status,
            has_generation: self.has_generation,
            name_rule: self.name_rule,
            custom: false,
            stored: self.stored,
            schemas: BTreeMap::from([(
                self.version.to_string(),
                RootSchema {
                    node: root,
                    crd_metadata: None,
                },
            )]),
        }
    }
}

/// What a CRD document declares, before its schemas are compiled.
pub(crate) struct CrdDocument {
    pub info: ResourceInfo,
    /// Served version name and its `openAPIV3Schema`.
    pub schemas: Vec<(String, Value)>,
}

/// Reads one `CustomResourceDefinition` document; other documents yield `Ok(None)`.
pub(crate) fn parse_crd(document: &Value) -> Result<Option<CrdDocument>, String> {
    if document.get("kind").and_then(Value::as_str) != Some("CustomResourceDefinition") {
        return Ok(None);
    }
    let spec = document.get("spec").ok_or("no spec")?;
    let text = |value: Option<&Value>, what: &str| {
        value
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| format!("no {what}"))
    };
    let strings = |value: Option<&Value>| -> Vec<String> {
        value
            .and_then(Value::as_array)
            .map(|items| {
                items
                    .iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default()
    };
    let names = spec.get("names").ok_or("no spec.names")?;
    let kind = text(names.get("kind"), "spec.names.kind")?;
    let plural = text(names.get("plural"), "spec.names.plural")?;
    let mut versions = Vec::new();
    let mut storage_version = None;
    let mut has_status = false;
    let mut schemas = Vec::new();
    for version in spec
        .get("versions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let name = text(version.get("name"), "spec.versions[].name")?;
        if version.get("storage").and_then(Value::as_bool) == Some(true) {
            storage_version = Some(name.clone());
        }
        if version.get("served").and_then(Value::as_bool) != Some(true) {
            continue;
        }
        if version.pointer("/subresources/status").is_some() {
            has_status = true;
        }
        let schema = version
            .pointer("/schema/openAPIV3Schema")
            .cloned()
            .unwrap_or_else(|| serde_json::json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}));
        schemas.push((name.clone(), schema));
        versions.push(name);
    }
    let storage_version = storage_version.ok_or("no storage version")?;
    versions.sort_by_key(|v| *v != storage_version);
    Ok(Some(CrdDocument {
        info: ResourceInfo {
            group: text(spec.get("group"), "spec.group")?,
            versions,
            storage_version,
            singular: names
                .get("singular")
                .and_then(Value::as_str)
                .map_or_else(|| kind.to_ascii_lowercase(), str::to_string),
            list_kind: names
                .get("listKind")
                .and_then(Value::as_str)
                .map_or_else(|| format!("{kind}List"), str::to_string),
            kind,
            plural,
            short_names: strings(names.get("shortNames")),
            categories: strings(names.get("categories")),
            namespaced: spec.get("scope").and_then(Value::as_str) != Some("Cluster"),
            has_status,
            has_generation: true,
            name_rule: NameRule::Subdomain,
            custom: true,
            stored: true,
            schemas: BTreeMap::new(),
        },
        schemas,
    }))
}

/// Every served resource.
#[derive(Debug, Default)]
pub(crate) struct Catalog {
    pub resources: Vec<ResourceInfo>,
}

/// Index of a resource in [`Catalog::resources`].
pub(crate) type ResourceId = usize;

impl Catalog {
    /// Adds a resource, replacing an earlier one with the same group and plural.
    pub(crate) fn insert(&mut self, info: ResourceInfo) {
        if let Some(existing) = self
            .resources
            .iter_mut()
            .find(|r| r.group == info.group && r.plural == info.plural)
        {
            *existing = info;
        } else {
            self.resources.push(info);
        }
    }

    pub(crate) fn get(&self, id: ResourceId) -> &ResourceInfo {
        &self.resources[id]
    }

    pub(crate) fn by_plural(&self, group: &str, version: &str, plural: &str) -> Option<ResourceId> {
        self.resources
            .iter()
            .position(|r| r.group == group && r.plural == plural && r.serves(version))
    }

    pub(crate) fn by_kind(&self, group: &str, version: &str, kind: &str) -> Option<ResourceId> {
        self.resources
            .iter()
            .position(|r| r.group == group && r.kind == kind && r.serves(version))
    }

    /// Groups with their served versions (storage first), core group included as "".
    pub(crate) fn groups(&self) -> BTreeMap<String, Vec<String>> {
        let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for resource in &self.resources {
            let versions = groups.entry(resource.group.clone()).or_default();
            for version in &resource.versions {
                if !versions.contains(version) {
                    versions.push(version.clone());
                }
            }
        }
        groups
    }
}

/// Splits `apps/v1` into (`apps`, `v1`) and `v1` into (``, `v1`).
pub(crate) fn split_api_version(api_version: &str) -> (&str, &str) {
    api_version.split_once('/').unwrap_or(("", api_version))
}
