//! Validation of objects against the official schemas: the built-in kinds from the Kubernetes
//! OpenAPI v2 document, custom resources from their CRDs' `openAPIV3Schema`.
//!
//! [`SchemaSet`] compiles every served kind once and validates without a server, so pure builder
//! tests can check their output the way the fake API server does on every write.

pub(crate) mod checks;
pub(crate) mod compile;
pub(crate) mod json_schema;
pub(crate) mod names;
pub(crate) mod quantity;
pub(crate) mod validate;

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::catalog::{
    BUILTINS, Catalog, ResourceId, ResourceInfo, RootSchema, parse_crd, split_api_version,
};
use super::{FakeApiServerOptions, FakeKubeError};
use compile::{Additional, Arena, ListType, Node, NodeId, SwaggerCompiler, compile_structural};

/// One violation, as a cause in a Kubernetes `Invalid` Status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// The field path, e.g. `spec.template.spec.containers[0].image`.
    pub field: String,
    /// The cause reason: `FieldValueRequired`, `FieldValueInvalid`, `FieldValueTypeInvalid`,
    /// `FieldValueNotSupported`, `FieldValueForbidden`, `FieldValueDuplicate`, ...
    pub reason: String,
    /// The cause message, e.g. `Required value` or `Invalid value: "1GB": quantities must ...`.
    pub message: String,
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

fn short_json(value: &Value) -> String {
    let text = serde_json::to_string(value).unwrap_or_default();
    if text.chars().count() > 120 {
        format!("{}...", text.chars().take(117).collect::<String>())
    } else {
        text
    }
}

impl FieldError {
    fn new(field: &str, reason: &str, message: String) -> Self {
        FieldError {
            field: field.to_string(),
            reason: reason.to_string(),
            message,
        }
    }

    pub(crate) fn required(field: &str) -> Self {
        Self::new(field, "FieldValueRequired", "Required value".to_string())
    }

    pub(crate) fn required_because(field: &str, detail: &str) -> Self {
        Self::new(
            field,
            "FieldValueRequired",
            format!("Required value: {detail}"),
        )
    }

    pub(crate) fn invalid(field: &str, value: &Value, detail: &str) -> Self {
        Self::new(
            field,
            "FieldValueInvalid",
            format!("Invalid value: {}: {detail}", short_json(value)),
        )
    }

    pub(crate) fn type_invalid(field: &str, value: &Value, expected: &str) -> Self {
        Self::new(
            field,
            "FieldValueTypeInvalid",
            format!(
                "Invalid value: {}: must be of type {expected}",
                short_json(value)
            ),
        )
    }

    pub(crate) fn unknown(field: &str) -> Self {
        Self::new(
            field,
            "FieldValueInvalid",
            "field not declared in schema (unknown field)".to_string(),
        )
    }

    pub(crate) fn not_supported(field: &str, value: &Value, allowed: &[Value]) -> Self {
        let allowed: Vec<String> = allowed.iter().map(short_json).collect();
        Self::new(
            field,
            "FieldValueNotSupported",
            format!(
                "Unsupported value: {}: supported values: {}",
                short_json(value),
                allowed.join(", ")
            ),
        )
    }

    pub(crate) fn forbidden(field: &str, detail: &str) -> Self {
        Self::new(field, "FieldValueForbidden", format!("Forbidden: {detail}"))
    }

    pub(crate) fn duplicate(field: &str, value: &Value) -> Self {
        Self::new(
            field,
            "FieldValueDuplicate",
            format!("Duplicate value: {}", short_json(value)),
        )
    }

    pub(crate) fn not_found(field: &str, value: &Value) -> Self {
        Self::new(
            field,
            "FieldValueNotFound",
            format!("Not found: {}", short_json(value)),
        )
    }

    pub(crate) fn too_long(field: &str, max: u64) -> Self {
        Self::new(
            field,
            "FieldValueTooLong",
            format!("Too long: may not be more than {max} bytes"),
        )
    }

    pub(crate) fn too_many(field: &str, count: u64, max: u64) -> Self {
        Self::new(
            field,
            "FieldValueTooMany",
            format!("Too many: {count}: must have at most {max} items"),
        )
    }
}

/// Every served kind with its compiled schemas; built once, shared by the server and by tests.
#[derive(Debug)]
pub struct SchemaSet {
    arena: Arena,
    pub(crate) catalog: Catalog,
    validators: json_schema::Validators,
}

fn read(path: &Path) -> Result<String, FakeKubeError> {
    std::fs::read_to_string(path).map_err(|source| FakeKubeError::Read {
        path: path.to_path_buf(),
        source,
    })
}

impl SchemaSet {
    /// Loads `kubernetes-openapi-v2.json`, `kubeflow.org_notebooks.yaml` and
    /// `istio-networking-crds.yaml` from `options.schemas_dir`, then `options.extra_crds`.
    pub fn load(options: &FakeApiServerOptions) -> Result<SchemaSet, FakeKubeError> {
        let swagger_path = options.schemas_dir.join("kubernetes-openapi-v2.json");
        let swagger: Value =
            serde_json::from_str(&read(&swagger_path)?).map_err(|source| FakeKubeError::Json {
                path: swagger_path.clone(),
                source,
            })?;
        let empty = serde_json::Map::new();
        let definitions = swagger
            .get("definitions")
            .and_then(Value::as_object)
            .unwrap_or(&empty);
        let mut arena = Arena::default();
        let mut catalog = Catalog::default();
        let schema_error = |path: &Path, err: compile::CompileError| FakeKubeError::Schema {
            path: path.to_path_buf(),
            location: err.location,
            message: err.message,
        };
        let object_meta = {
            let mut compiler = SwaggerCompiler {
                arena: &mut arena,
                definitions,
            };
            for builtin in BUILTINS {
                let root = compiler
                    .definition(builtin.definition)
                    .map_err(|err| schema_error(&swagger_path, err))?;
                catalog.insert(builtin.info(root));
            }
            compiler
                .definition(OBJECT_META)
                .map_err(|err| schema_error(&swagger_path, err))?
        };
        let mut crd_files: Vec<PathBuf> = vec![
            options.schemas_dir.join("kubeflow.org_notebooks.yaml"),
            options.schemas_dir.join("istio-networking-crds.yaml"),
        ];
        crd_files.extend(options.extra_crds.iter().cloned());
        for path in &crd_files {
            let text = read(path)?;
            for document in serde_yaml_ng::Deserializer::from_str(&text) {
                let document: Value =
                    serde::Deserialize::deserialize(document).map_err(|source| {
                        FakeKubeError::Yaml {
                            path: path.clone(),
                            source,
                        }
                    })?;
                let parsed = parse_crd(&document).map_err(|message| FakeKubeError::Schema {
                    path: path.clone(),
                    location: "CustomResourceDefinition".to_string(),
                    message,
                })?;
                let Some(crd) = parsed else { continue };
                let mut info = crd.info;
                for (version, schema) in crd.schemas {
                    let first = arena.nodes.len();
                    let location = format!("{}/{version}", info.group_resource());
                    let root = compile_structural(&mut arena, &schema, &location)
                        .map_err(|err| schema_error(path, err))?;
                    let crd_metadata = link_object_meta(&mut arena, first, root, object_meta);
                    info.schemas.insert(
                        version,
                        RootSchema {
                            node: root,
                            crd_metadata,
                        },
                    );
                }
                catalog.insert(info);
            }
        }
        let roots = catalog.resources.iter().flat_map(|r| r.schemas.values());
        let strict = roots.clone().map(|root| root.node).collect();
        let loose = roots.filter_map(|root| root.crd_metadata).collect();
        let validators = json_schema::Validators::build(&strict, &loose);
        Ok(SchemaSet {
            arena,
            catalog,
            validators,
        })
    }

    /// Validates `object` as the API server does before storing it: `apiVersion`/`kind` must name
    /// a served kind; CRD defaults are applied first; then the schema (unknown fields rejected),
    /// the metadata rules and the kind's own rules (e.g. a StatefulSet selector must match its
    /// template labels) are checked.
    pub fn validate(
        &self,
        api_version: &str,
        kind: &str,
        object: &Value,
    ) -> Result<(), Vec<FieldError>> {
        let (group, version) = split_api_version(api_version);
        let Some(id) = self.catalog.by_kind(group, version, kind) else {
            return Err(vec![FieldError::invalid(
                "kind",
                &Value::String(kind.to_string()),
                &format!("no kind {kind:?} is served in {api_version:?}"),
            )]);
        };
        let mut errors = Vec::new();
        for (field, expected) in [("apiVersion", api_version), ("kind", kind)] {
            if let Some(actual) = object.get(field)
                && actual.as_str() != Some(expected)
            {
                errors.push(FieldError::invalid(
                    field,
                    actual,
                    &format!("must be {expected:?}"),
                ));
            }
        }
        let mut object = object.clone();
        self.normalize(id, version, &mut object);
        errors.extend(self.check(id, version, &object, None));
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors)
        }
    }

    pub(crate) fn resource(&self, id: ResourceId) -> &ResourceInfo {
        self.catalog.get(id)
    }

    /// Applies decoding-time changes: nulls dropped, CRD defaults filled, Secret `stringData`
    /// folded into `data`.
    pub(crate) fn normalize(&self, id: ResourceId, version: &str, object: &mut Value) {
        let resource = self.catalog.get(id);
        if let Some(root) = resource.schemas.get(version) {
            validate::normalize(&self.arena, root.node, object);
        }
        if !resource.custom && resource.kind == "Secret" {
            checks::fold_string_data(object);
        }
    }

    /// Schema and semantic checks of a normalized object; `old` is the stored object on updates.
    pub(crate) fn check(
        &self,
        id: ResourceId,
        version: &str,
        object: &Value,
        old: Option<&Value>,
    ) -> Vec<FieldError> {
        let resource = self.catalog.get(id);
        let mut errors = Vec::new();
        if let Some(root) = resource.schemas.get(version) {
            errors = self.validators.check(&self.arena, root.node, object, "");
            if let (Some(crd_metadata), Some(metadata)) =
                (root.crd_metadata, object.get("metadata"))
            {
                // Only the CRD's extra rules (name patterns); ObjectMeta already judged the fields.
                errors.extend(self.validators.check_loose(
                    &self.arena,
                    crd_metadata,
                    metadata,
                    "metadata",
                ));
            }
        }
        checks::check_object(resource, object, old, &mut errors);
        errors
    }

    /// The root node of a served version.
    pub(crate) fn root(&self, id: ResourceId, version: &str) -> Option<NodeId> {
        self.catalog
            .get(id)
            .schemas
            .get(version)
            .map(|root| root.node)
    }

    pub(crate) fn node(&self, id: NodeId) -> &Node {
        self.arena.node(id)
    }

    /// The schema of field `key` of an object node (`None` when untyped).
    pub(crate) fn child(&self, id: Option<NodeId>, key: &str) -> Option<NodeId> {
        let node = self.arena.node(id?);
        node.properties.get(key).copied().or(match node.additional {
            Additional::Schema(child) => Some(child),
            _ => None,
        })
    }

    /// The schema of the items of an array node.
    pub(crate) fn items(&self, id: Option<NodeId>) -> Option<NodeId> {
        self.arena.node(id?).items
    }

    /// How an array merges: declared list type, else atomic (as for untyped lists).
    pub(crate) fn list_type(&self, id: Option<NodeId>) -> ListType {
        id.and_then(|id| self.arena.node(id).list_type.clone())
            .unwrap_or(ListType::Atomic)
    }

    /// Whether an object node is replaced as a whole (`x-kubernetes-map-type: atomic`).
    pub(crate) fn map_atomic(&self, id: Option<NodeId>) -> bool {
        id.is_some_and(|id| self.arena.node(id).map_atomic)
    }
}

const OBJECT_META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta";

/// Makes a CRD's root `metadata` (and that of embedded resources) an `ObjectMeta`, as the server
/// decodes it; returns the CRD's own root `metadata` node for its extra name rules.
fn link_object_meta(
    arena: &mut Arena,
    first: NodeId,
    root: NodeId,
    object_meta: NodeId,
) -> Option<NodeId> {
    let own = arena.nodes[root].properties.get("metadata").copied();
    arena.nodes[root]
        .properties
        .insert("metadata".to_string(), object_meta);
    for (name, ty) in [("apiVersion", "string"), ("kind", "string")] {
        if !arena.nodes[root].properties.contains_key(name) {
            arena.nodes.push(Node {
                ty: compile::JsonType::parse(ty),
                ..Node::default()
            });
            let id = arena.nodes.len() - 1;
            arena.nodes[root].properties.insert(name.to_string(), id);
        }
    }
    for id in first..arena.nodes.len() {
        if arena.nodes[id].embedded_resource {
            arena.nodes[id]
                .properties
                .insert("metadata".to_string(), object_meta);
        }
    }
    own.filter(|id| {
        let node = &arena.nodes[*id];
        !node.properties.is_empty() || !node.all_of.is_empty() || !node.any_of.is_empty()
    })
}

#[cfg(test)]
mod tests;
