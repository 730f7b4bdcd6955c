//! The three non-apply patch formats: JSON merge patch (RFC 7386) and JSON patch (RFC 6902),
//! both done by the `json-patch` crate (the one kube itself uses), and strategic merge patch,
//! which is Kubernetes' own and so written here: it merges lists by their schema's
//! `x-kubernetes-patch-merge-key` (containers by `name`, ports by `containerPort`) and honours the
//! `$patch`, `$retainKeys` and `$deleteFromPrimitiveList` directives.

use serde::Deserialize;
use serde_json::{Map, Value};

use super::schema::SchemaSet;
use super::schema::compile::NodeId;

/// RFC 7386: objects merge recursively, `null` deletes, anything else replaces.
pub(crate) use json_patch::merge as merge_patch;

/// Why a JSON patch was refused: the body is not a list of RFC 6902 operations, or one of them
/// failed (a `test` that did not match, a path that does not exist). The API server answers
/// either with 422.
#[derive(Debug, thiserror::Error)]
pub(crate) enum JsonPatchError {
    #[error("invalid JSON patch: {0}")]
    Malformed(#[source] serde_json::Error),
    #[error(transparent)]
    Failed(#[from] json_patch::PatchError),
}

/// RFC 6902 applied to `document`, all operations or none.
pub(crate) fn json_patch(mut document: Value, operations: &Value) -> Result<Value, JsonPatchError> {
    let operations =
        json_patch::Patch::deserialize(operations).map_err(JsonPatchError::Malformed)?;
    // A failed patch drops the document, so the crate's undo log (kept by `patch`) is not needed.
    json_patch::patch_unsafe(&mut document, &operations)?;
    Ok(document)
}

/// Strategic merge patch of `target` (whose schema is `node`) with `patch`.
pub(crate) fn strategic_merge(
    schemas: &SchemaSet,
    node: Option<NodeId>,
    target: &mut Value,
    patch: &Value,
) -> Result<(), String> {
    match patch {
        Value::Object(patch) => merge_object(schemas, node, target, patch),
        other => {
            *target = other.clone();
            Ok(())
        }
    }
}

fn merge_object(
    schemas: &SchemaSet,
    node: Option<NodeId>,
    target: &mut Value,
    patch: &Map<String, Value>,
) -> Result<(), String> {
    match patch.get("$patch").and_then(Value::as_str) {
        Some("replace") => {
            *target = strip_directives(&Value::Object(patch.clone()));
            return Ok(());
        }
        Some("delete") => {
            *target = Value::Null;
            return Ok(());
        }
        Some("merge") | None => {}
        Some(other) => return Err(format!("unknown patch directive {other:?}")),
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(map) = target else {
        return Ok(());
    };
    for (key, value) in patch {
        if let Some(field) = key.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(items)), Some(removed)) =
                (map.get_mut(field), value.as_array())
            {
                items.retain(|item| !removed.contains(item));
            }
            continue;
        }
        if key.starts_with('$') {
            continue;
        }
        if value.is_null() {
            map.remove(key);
            continue;
        }
        let child = schemas.child(node, key);
        let slot = map.entry(key.clone()).or_insert(Value::Null);
        match value {
            Value::Object(inner) if !schemas.map_atomic(child) => {
                merge_object(schemas, child, slot, inner)?
            }
            Value::Array(items) => merge_list(schemas, child, slot, items)?,
            other => *slot = other.clone(),
        }
        if slot.is_null() {
            map.remove(key);
        }
    }
    if let Some(keep) = patch.get("$retainKeys").and_then(Value::as_array) {
        map.retain(|key, _| keep.iter().any(|k| k.as_str() == Some(key)));
    }
    Ok(())
}

fn merge_list(
    schemas: &SchemaSet,
    node: Option<NodeId>,
    target: &mut Value,
    patch: &[Value],
) -> Result<(), String> {
    let schema = node.map(|id| schemas.node(id));
    let merge = schema.is_some_and(|s| s.patch_merge);
    if !merge {
        *target = strip_directives(&Value::Array(patch.to_vec()));
        return Ok(());
    }
    if !target.is_array() {
        *target = Value::Array(Vec::new());
    }
    let Value::Array(items) = target else {
        return Ok(());
    };
    let item_node = schemas.items(node);
    let Some(key) = schema.and_then(|s| s.patch_merge_key.clone()) else {
        for value in patch {
            if !items.contains(value) {
                items.push(value.clone());
            }
        }
        return Ok(());
    };
    let directive = |value: &Value| {
        value
            .get("$patch")
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    if patch
        .iter()
        .any(|value| directive(value).as_deref() == Some("replace"))
    {
        *items = patch
            .iter()
            .filter(|value| directive(value).is_none())
            .map(strip_directives)
            .collect();
        return Ok(());
    }
    for value in patch {
        let Value::Object(fields) = value else {
            items.push(value.clone());
            continue;
        };
        let wanted = fields.get(&key);
        let position =
            wanted.and_then(|wanted| items.iter().position(|item| item.get(&key) == Some(wanted)));
        if directive(value).as_deref() == Some("delete") {
            if let Some(wanted) = wanted {
                items.retain(|item| item.get(&key) != Some(wanted));
            }
            continue;
        }
        match position {
            Some(index) => merge_object(schemas, item_node, &mut items[index], fields)?,
            None => {
                let mut fresh = Value::Object(Map::new());
                merge_object(schemas, item_node, &mut fresh, fields)?;
                items.push(fresh);
            }
        }
    }
    Ok(())
}

fn strip_directives(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(key, _)| !key.starts_with('$'))
                .map(|(key, value)| (key.clone(), strip_directives(value)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(strip_directives).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn merge_patch_follows_rfc_7386() {
        let mut target = json!({"a": "b", "c": {"d": "e", "f": "g"}, "list": [1, 2]});
        merge_patch(
            &mut target,
            &json!({"a": "z", "c": {"f": null, "h": 1}, "list": [3]}),
        );
        assert_eq!(
            target,
            json!({"a": "z", "c": {"d": "e", "h": 1}, "list": [3]})
        );

        // The RFC's appendix examples.
        for (original, patch, result) in [
            (json!({"a": "b"}), json!({"a": "c"}), json!({"a": "c"})),
            (
                json!({"a": "b"}),
                json!({"b": "c"}),
                json!({"a": "b", "b": "c"}),
            ),
            (json!({"a": "b"}), json!({"a": null}), json!({})),
            (json!({"a": ["b"]}), json!({"a": "c"}), json!({"a": "c"})),
            (
                json!({"a": {"b": "c"}}),
                json!({"a": {"b": "d", "c": null}}),
                json!({"a": {"b": "d"}}),
            ),
            (json!(["a", "b"]), json!(["c", "d"]), json!(["c", "d"])),
            (
                json!({"e": null}),
                json!({"a": 1}),
                json!({"e": null, "a": 1}),
            ),
            (
                json!({}),
                json!({"a": {"bb": {"ccc": null}}}),
                json!({"a": {"bb": {}}}),
            ),
        ] {
            let mut target = original.clone();
            merge_patch(&mut target, &patch);
            assert_eq!(target, result, "{original} + {patch}");
        }
    }

    #[test]
    fn json_patch_operations() {
        let document = json!({"metadata": {"labels": {"a/b": "1"}}, "list": [1, 2, 3]});
        let patched = json_patch(
            document.clone(),
            &json!([
                {"op": "test", "path": "/list/0", "value": 1},
                {"op": "add", "path": "/list/-", "value": 4},
                {"op": "remove", "path": "/list/1"},
                {"op": "replace", "path": "/metadata/labels/a~1b", "value": "2"},
                {"op": "copy", "from": "/list/0", "path": "/first"},
                {"op": "move", "from": "/first", "path": "/moved"},
            ]),
        )
        .unwrap();
        assert_eq!(
            patched,
            json!({"metadata": {"labels": {"a/b": "2"}}, "list": [1, 3, 4], "moved": 1})
        );
        assert!(
            json_patch(
                document.clone(),
                &json!([{"op": "test", "path": "/list/0", "value": 9}])
            )
            .is_err()
        );
        assert!(
            json_patch(
                document.clone(),
                &json!([{"op": "remove", "path": "/nope"}])
            )
            .is_err()
        );
        // Not a list of operations, or an operation the RFC does not have: refused as malformed.
        for malformed in [
            json!({"op": "remove", "path": "/list/0"}),
            json!([{"op": "frobnicate", "path": "/list/0"}]),
            json!([{"op": "add", "path": "/list/-"}]),
        ] {
            assert!(matches!(
                json_patch(document.clone(), &malformed),
                Err(JsonPatchError::Malformed(_))
            ));
        }
        assert!(
            json_patch(
                document.clone(),
                &json!([{"op": "replace", "path": "/list/7", "value": 0}])
            )
            .is_err()
        );
    }
}
