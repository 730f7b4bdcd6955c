//! Value checks through the `jsonschema` crate: the compiled schemas are written out as one JSON
//! Schema (2020-12) document and every served kind is checked by its validator.
//!
//! What JSON Schema cannot say is spelled in its terms here: Kubernetes quantities and base64
//! `byte` strings as formats; int-or-string's int32 range, Go's integers (no `1.0`) and list-map
//! keys as keywords; unknown fields as `additionalProperties: false` wherever the schema does not
//! preserve them (what `fieldValidation=Strict` does). Errors come back as Kubernetes field errors
//! with Kubernetes field paths (`spec.template.spec.containers[0].image`, `metadata.labels[app]`).

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::OnceLock;

use base64::Engine as _;
use jsonschema::error::{TypeKind, ValidationErrorKind};
use jsonschema::paths::LocationSegment;
use jsonschema::{Keyword, ValidationError, Validator};
use serde_json::{Map, Value, json};

use super::FieldError;
use super::compile::{Additional, Arena, JsonType, ListType, Node, NodeId, Special};
use super::quantity::parse_quantity;
use super::validate::{child_path, index_path, key_path};

/// Kubernetes' own wording for a malformed quantity.
const QUANTITY_RULE: &str =
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'";

/// Keywords of our own, for what JSON Schema has no word for.
const GO_INTEGER: &str = "x-labforge-go-integer";
const INT32: &str = "x-labforge-int32";
const LIST_MAP_KEYS: &str = "x-kubernetes-list-map-keys";

/// How a definition treats fields its schema does not declare.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Fields {
    /// Rejected, unless the schema preserves them.
    Strict,
    /// Accepted everywhere below (a CRD's extra `metadata` rules: ObjectMeta judged the fields).
    Loose,
}

fn def_name(id: NodeId, fields: Fields) -> String {
    match fields {
        Fields::Strict => format!("s{id}"),
        Fields::Loose => format!("l{id}"),
    }
}

fn reference(id: NodeId, fields: Fields) -> Value {
    json!({ "$ref": format!("#/$defs/{}", def_name(id, fields)) })
}

/// One validator per root node, each compiled on first use (a server meets a handful of kinds)
/// from a document holding the definitions that root reaches.
pub(crate) struct Validators {
    options: jsonschema::ValidationOptions<'static>,
    compiled: HashMap<(NodeId, Fields), OnceLock<Result<Validator, String>>>,
}

impl std::fmt::Debug for Validators {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Validators")
            .field("roots", &self.compiled.len())
            .finish()
    }
}

impl Validators {
    /// Validators for `strict` roots (whole objects) and `loose` ones (a CRD's metadata rules).
    pub(crate) fn build(strict: &BTreeSet<NodeId>, loose: &BTreeSet<NodeId>) -> Self {
        let roots = strict
            .iter()
            .map(|id| (*id, Fields::Strict))
            .chain(loose.iter().map(|id| (*id, Fields::Loose)));
        let options = jsonschema::options()
            .with_draft(jsonschema::Draft::Draft202012)
            .should_validate_formats(true)
            .with_format("quantity", |text| parse_quantity(text).is_ok())
            .with_format("byte", |text| {
                base64::engine::general_purpose::STANDARD
                    .decode(text)
                    .is_ok()
            })
            .with_keyword(GO_INTEGER, |_, _, _| {
                Ok(Box::new(Rule {
                    holds: go_integer,
                    message: "must be of type integer",
                }))
            })
            .with_keyword(INT32, |_, _, _| {
                Ok(Box::new(Rule {
                    holds: int32,
                    message: "must fit in a 32-bit integer",
                }))
            })
            .with_keyword(LIST_MAP_KEYS, |_, keys, _| {
                Ok(Box::new(ListMapKeys(
                    keys.as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(Value::as_str)
                        .map(str::to_owned)
                        .collect(),
                )))
            });
        Validators {
            options,
            compiled: roots
                .into_iter()
                .map(|root| (root, OnceLock::new()))
                .collect(),
        }
    }

    fn validator(&self, arena: &Arena, id: NodeId, fields: Fields) -> Result<&Validator, String> {
        let Some(slot) = self.compiled.get(&(id, fields)) else {
            return Err(format!("no schema root {}", def_name(id, fields)));
        };
        slot.get_or_init(|| {
            let schema = json!({
                "$schema": "https://json-schema.org/draft/2020-12/schema",
                "$ref": format!("#/$defs/{}", def_name(id, fields)),
                "$defs": definitions(arena, [(id, fields)].into_iter()),
            });
            self.options.build(&schema).map_err(|err| {
                format!(
                    "compiling the JSON Schema of {}: {err}",
                    def_name(id, fields)
                )
            })
        })
        .as_ref()
        .map_err(Clone::clone)
    }

    /// Every violation of `value` against root `id`; `path` names `value`.
    pub(crate) fn check(
        &self,
        arena: &Arena,
        id: NodeId,
        value: &Value,
        path: &str,
    ) -> Vec<FieldError> {
        self.errors(arena, id, Fields::Strict, value, path)
    }

    /// Like [`Self::check`], with unknown fields accepted everywhere below.
    pub(crate) fn check_loose(
        &self,
        arena: &Arena,
        id: NodeId,
        value: &Value,
        path: &str,
    ) -> Vec<FieldError> {
        self.errors(arena, id, Fields::Loose, value, path)
    }

    fn errors(
        &self,
        arena: &Arena,
        id: NodeId,
        fields: Fields,
        value: &Value,
        path: &str,
    ) -> Vec<FieldError> {
        match self.validator(arena, id, fields) {
            Ok(validator) => validator
                .iter_errors(value)
                .flat_map(|error| field_errors(arena, id, path, &error))
                .collect(),
            Err(message) => vec![FieldError::invalid(path, &Value::Null, &message)],
        }
    }
}

/// The definitions `roots` reach, each written once.
fn definitions(arena: &Arena, roots: impl Iterator<Item = (NodeId, Fields)>) -> Map<String, Value> {
    let mut defs = Map::new();
    let mut queue: VecDeque<(NodeId, Fields)> = roots.collect();
    while let Some((id, fields)) = queue.pop_front() {
        let name = def_name(id, fields);
        if defs.contains_key(&name) {
            continue;
        }
        let (schema, reached) = node_schema(arena.node(id), fields);
        defs.insert(name, schema);
        queue.extend(reached.into_iter().map(|id| (id, fields)));
    }
    defs
}

/// One node as a JSON Schema, and the nodes it refers to.
fn node_schema(node: &Node, fields: Fields) -> (Value, Vec<NodeId>) {
    let mut reached = Vec::new();
    let mut refer = |id: NodeId| {
        reached.push(id);
        reference(id, fields)
    };
    let mut schema = Map::new();
    // Go decoding drops a null where the field cannot hold one; an untyped field takes anything.
    let null_allowed = node.nullable || node.opaque || node.preserve_unknown || node.junction;
    type_keywords(node, null_allowed, &mut schema);
    bound_keywords(node, null_allowed, &mut schema);
    member_keywords(node, fields, &mut schema, &mut refer);
    combinator_keywords(node, &mut schema, &mut refer);
    // A null the field may hold is not checked further (Go never sees it), but the keywords
    // that judge every type (enum aside, which lists null) would refuse it.
    let judges_null = ["allOf", "anyOf", "oneOf", "not"]
        .iter()
        .any(|keyword| schema.contains_key(*keyword));
    let schema = if null_allowed && judges_null {
        json!({ "if": { "type": "null" }, "else": Value::Object(schema) })
    } else {
        Value::Object(schema)
    };
    (schema, reached)
}

/// `type`, and the formats and keywords of our own by which Kubernetes decodes it.
fn type_keywords(node: &Node, null_allowed: bool, schema: &mut Map<String, Value>) {
    let mut types: Vec<&str> = match (node.special, node.ty) {
        (Special::IntOrString | Special::IntOrStringAny, _) => vec!["integer", "string"],
        (Special::Quantity, _) => vec!["string", "number"],
        (Special::None, Some(ty)) => vec![ty.name()],
        (Special::None, None) => Vec::new(),
    };
    if !types.is_empty() {
        if null_allowed {
            types.push("null");
        }
        schema.insert("type".into(), json!(types));
    }
    match node.special {
        Special::IntOrString => {
            schema.insert(INT32.into(), Value::Bool(true));
            schema.insert(GO_INTEGER.into(), Value::Bool(true));
        }
        Special::IntOrStringAny => {
            schema.insert(GO_INTEGER.into(), Value::Bool(true));
        }
        Special::Quantity => {
            schema.insert("format".into(), json!("quantity"));
        }
        _ => {}
    }
    if node.special == Special::None {
        match node.format.as_deref() {
            Some("date-time") => {
                schema.insert("format".into(), json!("date-time"));
            }
            Some("byte") => {
                schema.insert("format".into(), json!("byte"));
            }
            Some("int32") => {
                schema.insert(INT32.into(), Value::Bool(true));
            }
            _ => {}
        }
        if matches!(node.ty, Some(JsonType::Integer)) || node.format.as_deref() == Some("int64") {
            schema.insert(GO_INTEGER.into(), Value::Bool(true));
        }
    }
}

/// The values a node admits: `enum`, `pattern`, sizes, ranges and `multipleOf`.
fn bound_keywords(node: &Node, null_allowed: bool, schema: &mut Map<String, Value>) {
    if let Some(values) = &node.enumeration {
        let mut values = values.clone();
        if null_allowed {
            values.push(Value::Null);
        }
        schema.insert("enum".into(), Value::Array(values));
    }
    if let Some(pattern) = &node.pattern {
        schema.insert("pattern".into(), json!(pattern.as_str()));
    }
    for (keyword, limit) in [
        ("minLength", node.min_length),
        ("maxLength", node.max_length),
        ("minItems", node.min_items),
        ("maxItems", node.max_items),
        ("minProperties", node.min_properties),
        ("maxProperties", node.max_properties),
    ] {
        if let Some(limit) = limit {
            schema.insert(keyword.into(), json!(limit));
        }
    }
    if let Some(min) = node.minimum {
        let keyword = if node.exclusive_minimum {
            "exclusiveMinimum"
        } else {
            "minimum"
        };
        schema.insert(keyword.into(), json!(min));
    }
    if let Some(max) = node.maximum {
        let keyword = if node.exclusive_maximum {
            "exclusiveMaximum"
        } else {
            "maximum"
        };
        schema.insert(keyword.into(), json!(max));
    }
    if let Some(step) = node.multiple_of.filter(|step| *step != 0.0) {
        schema.insert("multipleOf".into(), json!(step));
    }
}

/// What a list's items and an object's fields must be: list type, `required`, `properties`,
/// `additionalProperties` (unknown fields) and `items`.
fn member_keywords(
    node: &Node,
    fields: Fields,
    schema: &mut Map<String, Value>,
    refer: &mut impl FnMut(NodeId) -> Value,
) {
    match &node.list_type {
        Some(ListType::Map(keys)) => {
            schema.insert(LIST_MAP_KEYS.into(), json!(keys));
        }
        Some(ListType::Set) => {
            schema.insert("uniqueItems".into(), Value::Bool(true));
        }
        _ if node.unique_items => {
            schema.insert("uniqueItems".into(), Value::Bool(true));
        }
        _ => {}
    }
    if !node.required.is_empty() {
        schema.insert("required".into(), json!(node.required));
    }
    if !node.properties.is_empty() {
        let properties: Map<String, Value> = node
            .properties
            .iter()
            .map(|(name, id)| (name.clone(), refer(*id)))
            .collect();
        schema.insert("properties".into(), Value::Object(properties));
    }
    let unknown_allowed = fields == Fields::Loose
        || node.preserve_unknown
        || node.opaque
        || node.junction
        || node.special != Special::None
        || node.additional == Additional::Any;
    match node.additional {
        Additional::Schema(id) => {
            schema.insert("additionalProperties".into(), refer(id));
        }
        _ if !unknown_allowed => {
            schema.insert("additionalProperties".into(), Value::Bool(false));
        }
        _ => {}
    }
    if let Some(id) = node.items {
        schema.insert("items".into(), refer(id));
    }
}

/// `allOf`, `anyOf`, `oneOf` and `not`: schemas the whole value must also (or must not) match.
fn combinator_keywords(
    node: &Node,
    schema: &mut Map<String, Value>,
    refer: &mut impl FnMut(NodeId) -> Value,
) {
    for (keyword, ids) in [
        ("allOf", &node.all_of),
        ("anyOf", &node.any_of),
        ("oneOf", &node.one_of),
    ] {
        if !ids.is_empty() {
            let branches: Vec<Value> = ids.iter().map(|id| refer(*id)).collect();
            schema.insert(keyword.into(), Value::Array(branches));
        }
    }
    if let Some(id) = node.not {
        schema.insert("not".into(), refer(id));
    }
}

/// A check JSON Schema has no keyword for: a test of the value and what its failure says.
struct Rule {
    holds: fn(&Value) -> bool,
    message: &'static str,
}

impl<'i> Keyword<'i> for Rule {
    fn validate(&self, instance: &'i Value) -> Result<(), ValidationError<'i>> {
        if (self.holds)(instance) {
            Ok(())
        } else {
            Err(ValidationError::custom(self.message))
        }
    }

    fn is_valid(&self, instance: &'i Value) -> bool {
        (self.holds)(instance)
    }
}

/// Go decodes integer fields from integers only: `1.0`, which JSON Schema counts as an integer,
/// is refused (`1.5` is refused by `type` already).
fn go_integer(value: &Value) -> bool {
    value
        .as_number()
        .is_none_or(|n| n.is_i64() || n.is_u64() || n.as_f64().is_some_and(|f| f.fract() != 0.0))
}

/// An int32 field (or int-or-string's integer) must fit in 32 bits; a float is the type's or
/// [`go_integer`]'s to refuse.
fn int32(value: &Value) -> bool {
    value
        .as_number()
        .is_none_or(|n| n.is_f64() || n.as_i64().is_some_and(|n| i32::try_from(n).is_ok()))
}

/// Items of a list-map must differ in their keys.
struct ListMapKeys(Vec<String>);

impl ListMapKeys {
    /// The index of the first item whose keys an earlier item has, with those keys.
    fn first_duplicate(&self, instance: &Value) -> Option<(usize, Value)> {
        let items = instance.as_array()?;
        let mut seen = BTreeSet::new();
        items.iter().enumerate().find_map(|(index, item)| {
            let key: Vec<Value> = self
                .0
                .iter()
                .map(|k| item.get(k).cloned().unwrap_or(Value::Null))
                .collect();
            let text = serde_json::to_string(&key).unwrap_or_default();
            (!seen.insert(text)).then_some((index, Value::Array(key)))
        })
    }
}

impl<'i> Keyword<'i> for ListMapKeys {
    fn validate(&self, instance: &'i Value) -> Result<(), ValidationError<'i>> {
        match self.first_duplicate(instance) {
            None => Ok(()),
            Some((index, key)) => Err(ValidationError::custom(format!(
                "{index}\u{0}{}",
                serde_json::to_string(&key).unwrap_or_default()
            ))),
        }
    }

    fn is_valid(&self, instance: &'i Value) -> bool {
        self.first_duplicate(instance).is_none()
    }
}

/// The Kubernetes field path of `error`'s instance below `root` (named `path`), and the node
/// there when the schema declares it.
fn field_path(
    arena: &Arena,
    root: NodeId,
    path: &str,
    error: &ValidationError<'_>,
) -> (String, Option<NodeId>) {
    let mut field = path.to_owned();
    let mut node = Some(root);
    for segment in error.instance_path().segments() {
        match segment {
            LocationSegment::Property(key) => {
                let declared = node.map(|id| arena.node(id));
                match declared {
                    Some(n) if n.properties.contains_key(key.as_ref()) => {
                        field = child_path(&field, &key);
                        node = n.properties.get(key.as_ref()).copied();
                    }
                    Some(Node {
                        additional: Additional::Schema(id),
                        ..
                    }) => {
                        field = key_path(&field, &key);
                        node = Some(*id);
                    }
                    _ => {
                        field = child_path(&field, &key);
                        node = None;
                    }
                }
            }
            LocationSegment::Index(index) => {
                field = index_path(&field, index);
                node = node.and_then(|id| arena.node(id).items);
            }
        }
    }
    (field, node)
}

/// A schema's limit as written: `0`, not the `0.0` it was stored as.
fn number(limit: &Value) -> String {
    match limit.as_f64() {
        Some(f) if f.fract() == 0.0 && f.abs() < 1e15 => format!("{}", f as i64),
        _ => limit.to_string(),
    }
}

fn expected(kind: &TypeKind) -> String {
    let names: BTreeSet<String> = match kind {
        TypeKind::Single(ty) => [ty.to_string()].into(),
        TypeKind::Multiple(types) => types.iter().map(|ty| ty.to_string()).collect(),
    };
    let names: BTreeSet<&str> = names
        .iter()
        .map(String::as_str)
        .filter(|name| *name != "null")
        .collect();
    if names.contains("integer") && names.contains("string") {
        "integer or string".into()
    } else if names.contains("string") {
        // A quantity: written as a string, a number is read as one.
        "string".into()
    } else {
        names.into_iter().next().unwrap_or("any").to_owned()
    }
}

/// `error` as the API server's field errors.
fn field_errors(
    arena: &Arena,
    root: NodeId,
    path: &str,
    error: &ValidationError<'_>,
) -> Vec<FieldError> {
    let (field, _) = field_path(arena, root, path, error);
    let value = error.instance().as_ref();
    let invalid = |detail: &str| vec![FieldError::invalid(&field, value, detail)];
    match error.kind() {
        ValidationErrorKind::Required { property } => {
            vec![FieldError::required(&child_path(
                &field,
                property.as_str().unwrap_or_default(),
            ))]
        }
        ValidationErrorKind::AdditionalProperties { unexpected } => unexpected
            .iter()
            .map(|key| FieldError::unknown(&child_path(&field, key)))
            .collect(),
        ValidationErrorKind::FalseSchema => vec![FieldError::unknown(&field)],
        ValidationErrorKind::Type { kind } => {
            vec![FieldError::type_invalid(&field, value, &expected(kind))]
        }
        ValidationErrorKind::Enum { options } => {
            let allowed: Vec<Value> = options
                .as_array()
                .into_iter()
                .flatten()
                .filter(|v| !v.is_null())
                .cloned()
                .collect();
            vec![FieldError::not_supported(&field, value, &allowed)]
        }
        ValidationErrorKind::Pattern { pattern } => {
            invalid(&format!("must match the regular expression '{pattern}'"))
        }
        ValidationErrorKind::Format { format } => invalid(match format.as_str() {
            "quantity" => QUANTITY_RULE,
            "byte" => "must be base64-encoded",
            "date-time" => "must be an RFC 3339 date-time",
            _ => "is not in the expected format",
        }),
        ValidationErrorKind::MaxLength { limit } => vec![FieldError::too_long(&field, *limit)],
        ValidationErrorKind::MinLength { limit } => {
            invalid(&format!("must be at least {limit} characters long"))
        }
        ValidationErrorKind::MaxItems { limit } => {
            let count = value.as_array().map_or(0, Vec::len) as u64;
            vec![FieldError::too_many(&field, count, *limit)]
        }
        ValidationErrorKind::MaxProperties { limit } => {
            let count = value.as_object().map_or(0, Map::len) as u64;
            vec![FieldError::too_many(&field, count, *limit)]
        }
        ValidationErrorKind::MinItems { limit } => {
            let count = value.as_array().map_or(0, Vec::len) as u64;
            vec![FieldError::invalid(
                &field,
                &Value::from(count),
                &format!("must have at least {limit} items"),
            )]
        }
        ValidationErrorKind::MinProperties { limit } => {
            let count = value.as_object().map_or(0, Map::len) as u64;
            vec![FieldError::invalid(
                &field,
                &Value::from(count),
                &format!("must have at least {limit} properties"),
            )]
        }
        ValidationErrorKind::Minimum { limit }
        | ValidationErrorKind::ExclusiveMinimum { limit } => invalid(&format!(
            "must be greater than or equal to {}",
            number(limit)
        )),
        ValidationErrorKind::Maximum { limit }
        | ValidationErrorKind::ExclusiveMaximum { limit } => {
            invalid(&format!("must be less than or equal to {}", number(limit)))
        }
        ValidationErrorKind::MultipleOf { multiple_of } => {
            invalid(&format!("must be a multiple of {multiple_of}"))
        }
        ValidationErrorKind::UniqueItems => {
            let items = value.as_array().map(Vec::as_slice).unwrap_or_default();
            items
                .iter()
                .enumerate()
                .filter(|(index, item)| items[..*index].contains(item))
                .map(|(index, item)| FieldError::duplicate(&index_path(&field, index), item))
                .collect()
        }
        ValidationErrorKind::AnyOf { .. } => invalid("must validate at least one schema (anyOf)"),
        ValidationErrorKind::OneOfNotValid { .. } => {
            invalid("must validate one and only one schema (oneOf), but 0 matched")
        }
        ValidationErrorKind::OneOfMultipleValid { .. } => {
            invalid("must validate one and only one schema (oneOf), but more than one matched")
        }
        ValidationErrorKind::Not { .. } => invalid("must not validate the schema (not)"),
        ValidationErrorKind::Custom { keyword, message } if keyword == LIST_MAP_KEYS => {
            let (index, key) = message.split_once('\u{0}').unwrap_or(("0", "null"));
            let key: Value = serde_json::from_str(key).unwrap_or(Value::Null);
            vec![FieldError::duplicate(
                &index_path(&field, index.parse().unwrap_or(0)),
                &key,
            )]
        }
        ValidationErrorKind::Custom { keyword, .. } if keyword == GO_INTEGER => {
            vec![FieldError::type_invalid(&field, value, "integer")]
        }
        ValidationErrorKind::Custom { message, .. } => invalid(message),
        _ => invalid(&error.to_string()),
    }
}
