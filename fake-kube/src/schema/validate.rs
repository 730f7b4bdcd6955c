//! The schema walker: checks a JSON value against compiled nodes and names every failing field
//! with a Kubernetes field path (`spec.template.spec.containers[0].image`, `metadata.labels[app]`).
//!
//! Unknown fields are rejected wherever the schema does not preserve them, which is what
//! `fieldValidation=Strict` does: a misspelt field in a builder fails a test instead of vanishing.

use std::collections::BTreeSet;

use base64::Engine as _;
use serde_json::Value;

use super::FieldError;
use super::compile::{Additional, Arena, JsonType, ListType, Node, NodeId, Special};
use super::quantity::{canonical_quantity, parse_quantity};

/// Kubernetes' own wording for a malformed quantity.
const QUANTITY_RULE: &str =
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'";

pub(crate) fn child_path(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_string()
    } else {
        format!("{path}.{name}")
    }
}

pub(crate) fn index_path(path: &str, index: usize) -> String {
    format!("{path}[{index}]")
}

pub(crate) fn key_path(path: &str, key: &str) -> String {
    format!("{path}[{key}]")
}

/// Collects every violation below one root.
pub(crate) struct Walker<'a> {
    arena: &'a Arena,
    allow_unknown: bool,
    pub errors: Vec<FieldError>,
}

impl<'a> Walker<'a> {
    pub(crate) fn new(arena: &'a Arena) -> Self {
        Walker {
            arena,
            allow_unknown: false,
            errors: Vec::new(),
        }
    }

    /// A walker that checks only the declared fields (for a CRD's extra `metadata` rules).
    pub(crate) fn allowing_unknown(arena: &'a Arena) -> Self {
        Walker {
            allow_unknown: true,
            ..Walker::new(arena)
        }
    }

    fn passes(&self, id: NodeId, value: &Value, path: &str) -> bool {
        let mut branch = Walker::new(self.arena);
        branch.check(id, value, path);
        branch.errors.is_empty()
    }

    /// Checks `value` against node `id`; `path` names `value`.
    pub(crate) fn check(&mut self, id: NodeId, value: &Value, path: &str) {
        let node = self.arena.node(id);
        if value.is_null() {
            if !(node.nullable || node.opaque || node.preserve_unknown || node.junction)
                && (node.ty.is_some() || node.special != Special::None)
            {
                self.errors
                    .push(FieldError::type_invalid(path, value, expected(node)));
            }
            return;
        }
        if !self.check_type(node, value, path) {
            return;
        }
        self.check_value(node, value, path);
        match value {
            Value::Object(map) => self.check_object(node, map, path),
            Value::Array(items) => self.check_array(node, items, path),
            _ => {}
        }
        self.check_junctions(node, value, path);
    }

    /// Returns false (after recording why) when the value has the wrong JSON type.
    fn check_type(&mut self, node: &Node, value: &Value, path: &str) -> bool {
        match node.special {
            Special::IntOrString | Special::IntOrStringAny => {
                let any_integer = node.special == Special::IntOrStringAny;
                let ok = value.is_string()
                    || value
                        .as_i64()
                        .is_some_and(|n| any_integer || i32::try_from(n).is_ok());
                if !ok {
                    self.errors
                        .push(FieldError::type_invalid(path, value, "integer or string"));
                }
                return ok;
            }
            Special::Quantity => {
                let text = match value {
                    Value::String(text) => text.clone(),
                    Value::Number(number) => number.to_string(),
                    _ => {
                        self.errors
                            .push(FieldError::type_invalid(path, value, "string"));
                        return false;
                    }
                };
                if parse_quantity(&text).is_err() {
                    self.errors
                        .push(FieldError::invalid(path, value, QUANTITY_RULE));
                    return false;
                }
                return true;
            }
            Special::None => {}
        }
        let Some(ty) = node.ty else { return true };
        let ok = match ty {
            JsonType::Object => value.is_object(),
            JsonType::Array => value.is_array(),
            JsonType::String => value.is_string(),
            JsonType::Integer => value.is_i64() || value.is_u64(),
            JsonType::Number => value.is_number(),
            JsonType::Boolean => value.is_boolean(),
        };
        if !ok {
            self.errors
                .push(FieldError::type_invalid(path, value, ty.name()));
        }
        ok
    }

    fn check_value(&mut self, node: &Node, value: &Value, path: &str) {
        if let Some(allowed) = &node.enumeration
            && !allowed.contains(value)
        {
            self.errors
                .push(FieldError::not_supported(path, value, allowed));
        }
        match value {
            Value::String(text) => self.check_string(node, value, text, path),
            Value::Number(number) => {
                if node.format.as_deref() == Some("int32")
                    && number.as_i64().is_none_or(|n| i32::try_from(n).is_err())
                {
                    self.errors.push(FieldError::invalid(
                        path,
                        value,
                        "must fit in a 32-bit integer",
                    ));
                }
                if number.is_f64() && node.format.as_deref() == Some("int64") {
                    self.errors
                        .push(FieldError::type_invalid(path, value, "integer"));
                }
                if let Some(n) = number.as_f64() {
                    self.check_number(node, value, n, path);
                }
            }
            _ => {}
        }
    }

    fn check_string(&mut self, node: &Node, value: &Value, text: &str, path: &str) {
        let malformed = match node.format.as_deref() {
            Some("date-time") if node.special == Special::None => text
                .parse::<jiff::Timestamp>()
                .is_err()
                .then_some("must be an RFC 3339 date-time"),
            Some("byte") => base64::engine::general_purpose::STANDARD
                .decode(text)
                .is_err()
                .then_some("must be base64-encoded"),
            _ => None,
        };
        if let Some(why) = malformed {
            self.errors.push(FieldError::invalid(path, value, why));
        }
        if let Some(pattern) = &node.pattern
            && !pattern.is_match(text)
        {
            self.errors.push(FieldError::invalid(
                path,
                value,
                &format!("must match the regular expression '{}'", pattern.as_str()),
            ));
        }
        let length = text.chars().count() as u64;
        if let Some(max) = node.max_length
            && length > max
        {
            self.errors.push(FieldError::too_long(path, max));
        }
        if let Some(min) = node.min_length
            && length < min
        {
            self.errors.push(FieldError::invalid(
                path,
                value,
                &format!("must be at least {min} characters long"),
            ));
        }
    }

    fn check_number(&mut self, node: &Node, value: &Value, n: f64, path: &str) {
        if let Some(min) = node.minimum
            && (n < min || (node.exclusive_minimum && n <= min))
        {
            self.errors.push(FieldError::invalid(
                path,
                value,
                &format!("must be greater than or equal to {min}"),
            ));
        }
        if let Some(max) = node.maximum
            && (n > max || (node.exclusive_maximum && n >= max))
        {
            self.errors.push(FieldError::invalid(
                path,
                value,
                &format!("must be less than or equal to {max}"),
            ));
        }
        if let Some(step) = node.multiple_of
            && step != 0.0
            && (n / step).fract() != 0.0
        {
            self.errors.push(FieldError::invalid(
                path,
                value,
                &format!("must be a multiple of {step}"),
            ));
        }
    }

    fn check_object(&mut self, node: &Node, map: &serde_json::Map<String, Value>, path: &str) {
        for name in &node.required {
            if !map.contains_key(name) {
                self.errors
                    .push(FieldError::required(&child_path(path, name)));
            }
        }
        let unknown_allowed = self.allow_unknown
            || node.preserve_unknown
            || node.opaque
            || node.junction
            || node.special != Special::None
            || node.additional == Additional::Any;
        for (key, child) in map {
            if let Some(id) = node.properties.get(key) {
                self.check(*id, child, &child_path(path, key));
            } else if let Additional::Schema(id) = node.additional {
                self.check(id, child, &key_path(path, key));
            } else if !unknown_allowed {
                self.errors
                    .push(FieldError::unknown(&child_path(path, key)));
            }
        }
        let count = map.len() as u64;
        if let Some(max) = node.max_properties
            && count > max
        {
            self.errors.push(FieldError::too_many(path, count, max));
        }
        if let Some(min) = node.min_properties
            && count < min
        {
            self.errors.push(FieldError::invalid(
                path,
                &Value::from(count),
                &format!("must have at least {min} properties"),
            ));
        }
    }

    fn check_array(&mut self, node: &Node, items: &[Value], path: &str) {
        if let Some(id) = node.items {
            for (index, item) in items.iter().enumerate() {
                self.check(id, item, &index_path(path, index));
            }
        }
        let count = items.len() as u64;
        if let Some(max) = node.max_items
            && count > max
        {
            self.errors.push(FieldError::too_many(path, count, max));
        }
        if let Some(min) = node.min_items
            && count < min
        {
            self.errors.push(FieldError::invalid(
                path,
                &Value::from(count),
                &format!("must have at least {min} items"),
            ));
        }
        match &node.list_type {
            Some(ListType::Map(keys)) => {
                let mut seen = BTreeSet::new();
                for (index, item) in items.iter().enumerate() {
                    let key: Vec<Value> = keys
                        .iter()
                        .map(|k| item.get(k).cloned().unwrap_or(Value::Null))
                        .collect();
                    let text = serde_json::to_string(&key).unwrap_or_default();
                    if !seen.insert(text) {
                        self.errors.push(FieldError::duplicate(
                            &index_path(path, index),
                            &Value::Array(key),
                        ));
                    }
                }
            }
            Some(ListType::Set) => self.check_unique(items, path),
            _ if node.unique_items => self.check_unique(items, path),
            _ => {}
        }
    }

    fn check_unique(&mut self, items: &[Value], path: &str) {
        for (index, item) in items.iter().enumerate() {
            if items[..index].contains(item) {
                self.errors
                    .push(FieldError::duplicate(&index_path(path, index), item));
            }
        }
    }

    fn check_junctions(&mut self, node: &Node, value: &Value, path: &str) {
        for id in &node.all_of {
            self.check(*id, value, path);
        }
        if !node.any_of.is_empty() && !node.any_of.iter().any(|id| self.passes(*id, value, path)) {
            self.errors.push(FieldError::invalid(
                path,
                value,
                "must validate at least one schema (anyOf)",
            ));
        }
        if !node.one_of.is_empty() {
            let passing = node
                .one_of
                .iter()
                .filter(|id| self.passes(**id, value, path))
                .count();
            if passing != 1 {
                self.errors.push(FieldError::invalid(
                    path,
                    value,
                    &format!(
                        "must validate one and only one schema (oneOf), but {passing} matched"
                    ),
                ));
            }
        }
        if let Some(id) = node.not
            && self.passes(id, value, path)
        {
            self.errors.push(FieldError::invalid(
                path,
                value,
                "must not validate the schema (not)",
            ));
        }
    }
}

fn expected(node: &Node) -> &'static str {
    match node.special {
        Special::IntOrString | Special::IntOrStringAny => "integer or string",
        Special::Quantity => "string",
        Special::None => node.ty.map_or("any", JsonType::name),
    }
}

/// Applies what the API server does to a decoded object before validating it: `null` members of
/// non-nullable fields are dropped (Go decoding, CRD pruning) and CRD `default`s are filled in.
pub(crate) fn normalize(arena: &Arena, id: NodeId, value: &mut Value) {
    let node = arena.node(id);
    if node.junction {
        return;
    }
    if node.special == Special::Quantity {
        // Built-in kinds store quantities canonical (custom resources keep what was written).
        let text = match value {
            Value::String(text) => Some(text.clone()),
            Value::Number(number) => Some(number.to_string()),
            _ => None,
        };
        if let Some(canonical) = text.as_deref().and_then(canonical_quantity) {
            *value = Value::String(canonical);
        }
        return;
    }
    match value {
        Value::Object(map) => {
            map.retain(|key, child| {
                !child.is_null()
                    || child_node(node, key).is_some_and(|child| arena.node(child).nullable)
                    || (child_node(node, key).is_none() && (node.preserve_unknown || node.opaque))
            });
            for (name, child) in &node.properties {
                if !map.contains_key(name)
                    && let Some(default) = &arena.node(*child).default
                {
                    map.insert(name.clone(), default.clone());
                }
            }
            for (key, child) in map.iter_mut() {
                if let Some(child_id) = child_node(node, key) {
                    normalize(arena, child_id, child);
                }
            }
        }
        Value::Array(items) => {
            if let Some(items_id) = node.items {
                for item in items {
                    normalize(arena, items_id, item);
                }
            }
        }
        _ => {}
    }
}

fn child_node(node: &Node, key: &str) -> Option<NodeId> {
    node.properties.get(key).copied().or(match node.additional {
        Additional::Schema(id) => Some(id),
        _ => None,
    })
}
