//! The three non-apply patch formats: JSON merge patch (RFC 7386), JSON patch (RFC 6902) and
//! strategic merge patch, which merges lists by their schema's `x-kubernetes-patch-merge-key`
//! (containers by `name`, ports by `containerPort`) and honours the `$patch`, `$retainKeys` and
//! `$deleteFromPrimitiveList` directives.

use serde_json::{Map, Value};

use super::schema::SchemaSet;
use super::schema::compile::NodeId;

/// RFC 7386: objects merge recursively, `null` deletes, anything else replaces.
pub(crate) fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Value::Object(map) = target {
        for (key, value) in patch {
            if value.is_null() {
                map.remove(key);
            } else {
                merge_patch(map.entry(key.clone()).or_insert(Value::Null), value);
            }
        }
    }
}

/// RFC 6902 on a copy of `document`; the error names the failing operation.
pub(crate) fn json_patch(document: &Value, operations: &Value) -> Result<Value, String> {
    let operations = operations
        .as_array()
        .ok_or("a JSON patch must be an array of operations")?;
    let mut document = document.clone();
    for (index, operation) in operations.iter().enumerate() {
        apply_operation(&mut document, operation)
            .map_err(|why| format!("operation {index}: {why}"))?;
    }
    Ok(document)
}

fn apply_operation(document: &mut Value, operation: &Value) -> Result<(), String> {
    let text = |key: &str| {
        operation
            .get(key)
            .and_then(Value::as_str)
            .ok_or_else(|| format!("missing {key:?}"))
    };
    let op = text("op")?;
    let path = parse_pointer(text("path")?)?;
    let value = || {
        operation
            .get("value")
            .cloned()
            .ok_or_else(|| "missing \"value\"".to_string())
    };
    match op {
        "add" => add(document, &path, value()?),
        "remove" => remove(document, &path).map(drop),
        "replace" => {
            let target = get_mut(document, &path)?;
            *target = value()?;
            Ok(())
        }
        "move" => {
            let from = parse_pointer(text("from")?)?;
            let moved = remove(document, &from)?;
            add(document, &path, moved)
        }
        "copy" => {
            let from = parse_pointer(text("from")?)?;
            let copied = get_mut(document, &from)?.clone();
            add(document, &path, copied)
        }
        "test" => {
            if *get_mut(document, &path)? == value()? {
                Ok(())
            } else {
                Err(format!("test failed at {}", join_pointer(&path)))
            }
        }
        other => Err(format!("unknown op {other:?}")),
    }
}

fn parse_pointer(pointer: &str) -> Result<Vec<String>, String> {
    if pointer.is_empty() {
        return Ok(Vec::new());
    }
    let rest = pointer
        .strip_prefix('/')
        .ok_or_else(|| format!("invalid JSON pointer {pointer:?}"))?;
    Ok(rest
        .split('/')
        .map(|part| part.replace("~1", "/").replace("~0", "~"))
        .collect())
}

fn join_pointer(path: &[String]) -> String {
    path.iter().map(|p| format!("/{p}")).collect()
}

fn array_index(part: &str, len: usize, allow_end: bool) -> Result<usize, String> {
    if allow_end && part == "-" {
        return Ok(len);
    }
    let index: usize = part
        .parse()
        .map_err(|_| format!("invalid array index {part:?}"))?;
    let limit = if allow_end {
        len
    } else {
        len.saturating_sub(1)
    };
    if index > limit || (!allow_end && len == 0) {
        return Err(format!("array index {index} out of bounds"));
    }
    Ok(index)
}

fn get_mut<'a>(document: &'a mut Value, path: &[String]) -> Result<&'a mut Value, String> {
    let mut current = document;
    for part in path {
        current = match current {
            Value::Object(map) => map
                .get_mut(part)
                .ok_or_else(|| format!("path {} does not exist", join_pointer(path)))?,
            Value::Array(items) => {
                let index = array_index(part, items.len(), false)?;
                &mut items[index]
            }
            _ => return Err(format!("path {} does not exist", join_pointer(path))),
        };
    }
    Ok(current)
}

fn add(document: &mut Value, path: &[String], value: Value) -> Result<(), String> {
    let Some((last, parent)) = path.split_last() else {
        *document = value;
        return Ok(());
    };
    match get_mut(document, parent)? {
        Value::Object(map) => {
            map.insert(last.clone(), value);
            Ok(())
        }
        Value::Array(items) => {
            let index = array_index(last, items.len(), true)?;
            items.insert(index, value);
            Ok(())
        }
        _ => Err(format!(
            "cannot add below a scalar at {}",
            join_pointer(parent)
        )),
    }
}

fn remove(document: &mut Value, path: &[String]) -> Result<Value, String> {
    let (last, parent) = path
        .split_last()
        .ok_or("cannot remove the whole document")?;
    match get_mut(document, parent)? {
        Value::Object(map) => map
            .remove(last)
            .ok_or_else(|| format!("unable to remove nonexistent key {last:?}")),
        Value::Array(items) => {
            let index = array_index(last, items.len(), false)?;
            Ok(items.remove(index))
        }
        _ => Err(format!(
            "cannot remove below a scalar at {}",
            join_pointer(parent)
        )),
    }
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
            &document,
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
                &document,
                &json!([{"op": "test", "path": "/list/0", "value": 9}])
            )
            .is_err()
        );
        assert!(json_patch(&document, &json!([{"op": "remove", "path": "/nope"}])).is_err());
        assert!(
            json_patch(
                &document,
                &json!([{"op": "replace", "path": "/list/7", "value": 0}])
            )
            .is_err()
        );
    }
}
