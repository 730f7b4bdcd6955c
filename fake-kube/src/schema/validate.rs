//! What the API server does around schema checks: Kubernetes field paths
//! (`spec.template.spec.containers[0].image`, `metadata.labels[app]`) and the changes decoding
//! makes before an object is checked (nulls dropped, defaults filled, quantities canonical).

use serde_json::Value;

use super::compile::{Additional, Arena, Node, NodeId, Special};
use super::quantity::canonical_quantity;

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
