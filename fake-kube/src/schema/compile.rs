//! Turns Swagger 2.0 definitions and CRD OpenAPI v3 schemas into one arena of typed nodes, once.
//!
//! Both dialects land in the same [`Node`] shape, from which one JSON Schema per kind is written
//! for the checks (`json_schema`) and by which apply and patches merge. The
//! difference that matters is what an object without `properties` means: in the built-in Swagger
//! document it is an opaque value (`RawExtension`, `FieldsV1`), in a structural CRD schema it is an
//! object whose every field would be pruned, so unknown fields there are rejected.

use std::collections::{BTreeMap, HashMap};

use regex::Regex;
use serde_json::{Map, Value};

/// Index of a node in [`Arena`].
pub(crate) type NodeId = usize;

/// JSON types a schema can require.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum JsonType {
    Object,
    Array,
    String,
    Integer,
    Number,
    Boolean,
}

impl JsonType {
    pub(crate) fn parse(name: &str) -> Option<JsonType> {
        Some(match name {
            "object" => JsonType::Object,
            "array" => JsonType::Array,
            "string" => JsonType::String,
            "integer" => JsonType::Integer,
            "number" => JsonType::Number,
            "boolean" => JsonType::Boolean,
            _ => return None,
        })
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            JsonType::Object => "object",
            JsonType::Array => "array",
            JsonType::String => "string",
            JsonType::Integer => "integer",
            JsonType::Number => "number",
            JsonType::Boolean => "boolean",
        }
    }
}

/// Value types Kubernetes decodes with custom code rather than by JSON type alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Special {
    #[default]
    None,
    /// `intstr.IntOrString`: an int32 or a string.
    IntOrString,
    /// `x-kubernetes-int-or-string` in a CRD: any integer or a string.
    IntOrStringAny,
    /// `resource.Quantity`.
    Quantity,
}

/// How a list merges under server-side apply and strategic merge patch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ListType {
    Atomic,
    Set,
    Map(Vec<String>),
}

/// What an object node says about keys not listed in `properties`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Additional {
    /// Not declared: rejected (CRD structural rule), or accepted when the node is opaque.
    Undeclared,
    /// `additionalProperties: true`.
    Any,
    /// `additionalProperties: false`.
    Forbidden,
    /// `additionalProperties: {schema}`: a map.
    Schema(NodeId),
}

/// One compiled schema node.
#[derive(Debug, Clone)]
pub(crate) struct Node {
    pub ty: Option<JsonType>,
    pub format: Option<String>,
    pub special: Special,
    pub properties: BTreeMap<String, NodeId>,
    pub additional: Additional,
    /// Swagger object with neither properties nor additionalProperties: anything goes below.
    pub opaque: bool,
    pub preserve_unknown: bool,
    pub embedded_resource: bool,
    /// Inside allOf/anyOf/oneOf/not: plain JSON-schema value validation, unknown fields allowed.
    pub junction: bool,
    pub items: Option<NodeId>,
    pub required: Vec<String>,
    pub enumeration: Option<Vec<Value>>,
    pub nullable: bool,
    pub pattern: Option<Regex>,
    pub min_length: Option<u64>,
    pub max_length: Option<u64>,
    pub min_items: Option<u64>,
    pub max_items: Option<u64>,
    pub min_properties: Option<u64>,
    pub max_properties: Option<u64>,
    pub minimum: Option<f64>,
    pub maximum: Option<f64>,
    pub exclusive_minimum: bool,
    pub exclusive_maximum: bool,
    pub multiple_of: Option<f64>,
    pub unique_items: bool,
    pub all_of: Vec<NodeId>,
    pub any_of: Vec<NodeId>,
    pub one_of: Vec<NodeId>,
    pub not: Option<NodeId>,
    pub list_type: Option<ListType>,
    pub map_atomic: bool,
    pub patch_merge: bool,
    pub patch_retain_keys: bool,
    pub patch_merge_key: Option<String>,
    pub default: Option<Value>,
}

impl Default for Node {
    fn default() -> Self {
        Node {
            ty: None,
            format: None,
            special: Special::None,
            properties: BTreeMap::new(),
            additional: Additional::Undeclared,
            opaque: false,
            preserve_unknown: false,
            embedded_resource: false,
            junction: false,
            items: None,
            required: Vec::new(),
            enumeration: None,
            nullable: false,
            pattern: None,
            min_length: None,
            max_length: None,
            min_items: None,
            max_items: None,
            min_properties: None,
            max_properties: None,
            minimum: None,
            maximum: None,
            exclusive_minimum: false,
            exclusive_maximum: false,
            multiple_of: None,
            unique_items: false,
            all_of: Vec::new(),
            any_of: Vec::new(),
            one_of: Vec::new(),
            not: None,
            list_type: None,
            map_atomic: false,
            patch_merge: false,
            patch_retain_keys: false,
            patch_merge_key: None,
            default: None,
        }
    }
}

/// Which schema language a document is written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dialect {
    Swagger,
    Structural,
}

/// All compiled nodes, plus the Swagger definitions by name.
#[derive(Debug, Default)]
pub(crate) struct Arena {
    pub nodes: Vec<Node>,
    definitions: HashMap<String, NodeId>,
}

impl Arena {
    pub(crate) fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id]
    }

    fn push(&mut self, node: Node) -> NodeId {
        self.nodes.push(node);
        self.nodes.len() - 1
    }
}

/// A compile failure, naming the schema location.
#[derive(Debug)]
pub(crate) struct CompileError {
    pub location: String,
    pub message: String,
}

/// Compiles Swagger definitions on demand (following `$ref`s, recursive ones included).
pub(crate) struct SwaggerCompiler<'a> {
    pub arena: &'a mut Arena,
    pub definitions: &'a Map<String, Value>,
}

impl SwaggerCompiler<'_> {
    /// The node for a definition name such as `io.k8s.api.apps.v1.StatefulSet`.
    pub(crate) fn definition(&mut self, name: &str) -> Result<NodeId, CompileError> {
        if let Some(id) = self.arena.definitions.get(name) {
            return Ok(*id);
        }
        let schema = self.definitions.get(name).ok_or_else(|| CompileError {
            location: name.to_string(),
            message: "no such definition".to_string(),
        })?;
        // Reserve the slot first so recursive definitions (JSONSchemaProps) refer to it.
        let id = self.arena.push(Node::default());
        self.arena.definitions.insert(name.to_string(), id);
        let mut node = self.compile(schema, name, false)?;
        match name {
            "io.k8s.apimachinery.pkg.util.intstr.IntOrString" => {
                node.special = Special::IntOrString;
                node.ty = None;
            }
            "io.k8s.apimachinery.pkg.api.resource.Quantity" => {
                node.special = Special::Quantity;
                node.ty = None;
            }
            _ => {}
        }
        self.arena.nodes[id] = node;
        Ok(id)
    }

    fn child(
        &mut self,
        schema: &Value,
        location: &str,
        junction: bool,
    ) -> Result<NodeId, CompileError> {
        if let Some(reference) = schema.get("$ref").and_then(Value::as_str) {
            let name = reference
                .strip_prefix("#/definitions/")
                .ok_or_else(|| CompileError {
                    location: location.to_string(),
                    message: format!("unsupported $ref {reference}"),
                })?;
            return self.definition(name);
        }
        let node = self.compile(schema, location, junction)?;
        Ok(self.arena.push(node))
    }

    fn compile(
        &mut self,
        schema: &Value,
        location: &str,
        junction: bool,
    ) -> Result<Node, CompileError> {
        let mut compiler = NodeCompiler {
            dialect: Dialect::Swagger,
            location,
            junction,
        };
        compiler.compile(schema, &mut |schema, location, junction| {
            self.child(schema, location, junction)
        })
    }
}

/// Compiles a CRD `openAPIV3Schema` (inline, no `$ref`s).
pub(crate) fn compile_structural(
    arena: &mut Arena,
    schema: &Value,
    location: &str,
) -> Result<NodeId, CompileError> {
    compile_structural_node(arena, schema, location, false)
}

fn compile_structural_node(
    arena: &mut Arena,
    schema: &Value,
    location: &str,
    junction: bool,
) -> Result<NodeId, CompileError> {
    let mut compiler = NodeCompiler {
        dialect: Dialect::Structural,
        location,
        junction,
    };
    let node = compiler.compile(schema, &mut |schema, location, junction| {
        compile_structural_node(arena, schema, location, junction)
    })?;
    Ok(arena.push(node))
}

struct NodeCompiler<'l> {
    dialect: Dialect,
    location: &'l str,
    junction: bool,
}

type ChildFn<'c> = dyn FnMut(&Value, &str, bool) -> Result<NodeId, CompileError> + 'c;

impl NodeCompiler<'_> {
    fn error(&self, message: impl Into<String>) -> CompileError {
        CompileError {
            location: self.location.to_string(),
            message: message.into(),
        }
    }

    fn compile(&mut self, schema: &Value, child: &mut ChildFn<'_>) -> Result<Node, CompileError> {
        let Some(map) = schema.as_object() else {
            // `true`/`false` schemas do not occur in Kubernetes documents; treat them as "anything".
            return Ok(Node {
                opaque: true,
                junction: self.junction,
                ..Node::default()
            });
        };
        let mut node = Node {
            junction: self.junction,
            ..Node::default()
        };
        self.read_value_keywords(map, &mut node)?;
        read_merge_keywords(map, &mut node);
        self.compile_children(map, &mut node, child)?;
        if node.embedded_resource {
            self.add_type_meta(&mut node, child)?;
        }
        node.opaque = self.dialect == Dialect::Swagger
            && matches!(node.ty, None | Some(JsonType::Object))
            && node.special == Special::None
            && node.properties.is_empty()
            && node.additional == Additional::Undeclared;
        Ok(node)
    }

    /// The keywords that judge the node's own value: type, format, flags, bounds, `enum`,
    /// `pattern` and `required`.
    fn read_value_keywords(
        &self,
        map: &Map<String, Value>,
        node: &mut Node,
    ) -> Result<(), CompileError> {
        if let Some(ty) = map.get("type").and_then(Value::as_str) {
            node.ty =
                Some(JsonType::parse(ty).ok_or_else(|| self.error(format!("unknown type {ty}")))?);
        }
        node.format = map
            .get("format")
            .and_then(Value::as_str)
            .map(str::to_string);
        if node.format.as_deref() == Some("int-or-string") {
            node.special = Special::IntOrString;
            node.ty = None;
        }
        if flag(map, "x-kubernetes-int-or-string") {
            node.special = Special::IntOrStringAny;
        }
        node.preserve_unknown = flag(map, "x-kubernetes-preserve-unknown-fields");
        node.embedded_resource = flag(map, "x-kubernetes-embedded-resource");
        node.nullable = flag(map, "nullable");
        node.unique_items = flag(map, "uniqueItems");
        node.exclusive_minimum = flag(map, "exclusiveMinimum");
        node.exclusive_maximum = flag(map, "exclusiveMaximum");
        node.min_length = map.get("minLength").and_then(Value::as_u64);
        node.max_length = map.get("maxLength").and_then(Value::as_u64);
        node.min_items = map.get("minItems").and_then(Value::as_u64);
        node.max_items = map.get("maxItems").and_then(Value::as_u64);
        node.min_properties = map.get("minProperties").and_then(Value::as_u64);
        node.max_properties = map.get("maxProperties").and_then(Value::as_u64);
        node.minimum = map.get("minimum").and_then(Value::as_f64);
        node.maximum = map.get("maximum").and_then(Value::as_f64);
        node.multiple_of = map.get("multipleOf").and_then(Value::as_f64);
        node.default = map.get("default").cloned();
        node.enumeration = map.get("enum").and_then(Value::as_array).cloned();
        if let Some(pattern) = map.get("pattern").and_then(Value::as_str) {
            node.pattern = Some(
                Regex::new(pattern)
                    .map_err(|err| self.error(format!("pattern {pattern:?}: {err}")))?,
            );
        }
        if let Some(required) = map.get("required").and_then(Value::as_array) {
            node.required = required
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect();
        }
        Ok(())
    }

    /// The sub-schemas, compiled through `child` in document order (which fixes their ids):
    /// properties, additional properties, items, then `allOf`/`anyOf`/`oneOf`/`not`.
    fn compile_children(
        &self,
        map: &Map<String, Value>,
        node: &mut Node,
        child: &mut ChildFn<'_>,
    ) -> Result<(), CompileError> {
        if let Some(properties) = map.get("properties").and_then(Value::as_object) {
            for (name, schema) in properties {
                let location = format!("{}.{name}", self.location);
                node.properties
                    .insert(name.clone(), child(schema, &location, self.junction)?);
            }
        }
        node.additional = match map.get("additionalProperties") {
            None => Additional::Undeclared,
            Some(Value::Bool(true)) => Additional::Any,
            Some(Value::Bool(false)) => Additional::Forbidden,
            Some(schema) => {
                let location = format!("{}[*]", self.location);
                Additional::Schema(child(schema, &location, self.junction)?)
            }
        };
        if let Some(items) = map.get("items") {
            let location = format!("{}[]", self.location);
            node.items = Some(child(items, &location, self.junction)?);
        }
        for (key, target) in [
            ("allOf", &mut node.all_of),
            ("anyOf", &mut node.any_of),
            ("oneOf", &mut node.one_of),
        ] {
            if let Some(branches) = map.get(key).and_then(Value::as_array) {
                for (index, branch) in branches.iter().enumerate() {
                    let location = format!("{}/{key}/{index}", self.location);
                    target.push(child(branch, &location, true)?);
                }
            }
        }
        if let Some(not) = map.get("not") {
            let location = format!("{}/not", self.location);
            node.not = Some(child(not, &location, true)?);
        }
        Ok(())
    }

    /// An embedded resource has `apiVersion` and `kind` strings even where its schema leaves
    /// them out.
    fn add_type_meta(&self, node: &mut Node, child: &mut ChildFn<'_>) -> Result<(), CompileError> {
        for name in ["apiVersion", "kind"] {
            if !node.properties.contains_key(name) {
                let string = child(
                    &serde_json::json!({"type": "string"}),
                    self.location,
                    self.junction,
                )?;
                node.properties.insert(name.to_string(), string);
            }
        }
        Ok(())
    }
}

/// How the node merges under server-side apply and strategic merge patch: map and list types,
/// patch strategy and merge key.
fn read_merge_keywords(map: &Map<String, Value>, node: &mut Node) {
    node.map_atomic = map.get("x-kubernetes-map-type").and_then(Value::as_str) == Some("atomic");
    node.list_type = match map.get("x-kubernetes-list-type").and_then(Value::as_str) {
        Some("atomic") => Some(ListType::Atomic),
        Some("set") => Some(ListType::Set),
        Some("map") => Some(ListType::Map(
            map.get("x-kubernetes-list-map-keys")
                .and_then(Value::as_array)
                .map(|keys| {
                    keys.iter()
                        .filter_map(Value::as_str)
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default(),
        )),
        _ => None,
    };
    if let Some(strategy) = map
        .get("x-kubernetes-patch-strategy")
        .and_then(Value::as_str)
    {
        node.patch_merge = strategy.split(',').any(|s| s == "merge");
        node.patch_retain_keys = strategy.split(',').any(|s| s == "retainKeys");
    }
    node.patch_merge_key = map
        .get("x-kubernetes-patch-merge-key")
        .and_then(Value::as_str)
        .map(str::to_string);
}

fn flag(map: &Map<String, Value>, key: &str) -> bool {
    map.get(key).and_then(Value::as_bool).unwrap_or(false)
}
