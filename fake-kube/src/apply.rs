//! Server-side apply, simplified but structural: each field manager owns a set of field paths
//! (as in `managedFields`), an apply merges the applied configuration into the live object by the
//! schema's list types (`containers` by `name`, sets by value, atomic lists whole), removes the
//! fields the manager applied last time but no longer sends (unless someone else owns them), and
//! reports conflicts with other managers unless forced.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::schema::SchemaSet;
use super::schema::compile::{ListType, NodeId};

/// One step of a field path, as in `fieldsV1` (`f:`, `k:`, `v:`, `i:`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum PathElement {
    Field(String),
    Key(String),
    Value(String),
}

pub(crate) type FieldPath = Vec<PathElement>;

/// A set of owned field paths, as a tree; `member` marks a path owned as a whole.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct FieldSet {
    member: bool,
    children: BTreeMap<PathElement, FieldSet>,
}

impl FieldSet {
    pub(crate) fn is_empty(&self) -> bool {
        !self.member && self.children.values().all(FieldSet::is_empty)
    }

    /// Every member path.
    pub(crate) fn members(&self) -> Vec<FieldPath> {
        let mut out = Vec::new();
        self.collect_members(&mut Vec::new(), &mut out);
        out
    }

    fn collect_members(&self, prefix: &mut FieldPath, out: &mut Vec<FieldPath>) {
        if self.member {
            out.push(prefix.clone());
        }
        for (element, child) in &self.children {
            prefix.push(element.clone());
            child.collect_members(prefix, out);
            prefix.pop();
        }
    }

    fn at(&self, path: &[PathElement]) -> Option<&FieldSet> {
        let mut current = self;
        for element in path {
            current = current.children.get(element)?;
        }
        Some(current)
    }

    pub(crate) fn has_member(&self, path: &[PathElement]) -> bool {
        self.at(path).is_some_and(|set| set.member)
    }

    /// Whether the path or anything below it is owned. (A list-map item's own membership means
    /// the item exists, not that all of it is owned, so ancestors do not count.)
    pub(crate) fn touches(&self, path: &[PathElement]) -> bool {
        self.at(path).is_some_and(|set| !set.is_empty())
    }

    pub(crate) fn insert(&mut self, path: &[PathElement]) {
        let mut current = self;
        for element in path {
            current = current.children.entry(element.clone()).or_default();
        }
        current.member = true;
    }

    pub(crate) fn remove(&mut self, path: &[PathElement]) {
        let Some((first, rest)) = path.split_first() else {
            self.member = false;
            return;
        };
        if let Some(child) = self.children.get_mut(first) {
            child.remove(rest);
            if child.is_empty() {
                self.children.remove(first);
            }
        }
    }
}

/// The fields an (applied or stored) value sets, per the schema.
pub(crate) fn field_set(schemas: &SchemaSet, node: Option<NodeId>, value: &Value) -> FieldSet {
    let mut set = FieldSet::default();
    collect(schemas, node, value, &mut set);
    set
}

fn collect(schemas: &SchemaSet, node: Option<NodeId>, value: &Value, out: &mut FieldSet) {
    match value {
        Value::Object(map) => {
            for (key, child) in map {
                let child_node = schemas.child(node, key);
                let entry = out
                    .children
                    .entry(PathElement::Field(key.clone()))
                    .or_default();
                if is_leaf(schemas, child_node, child) {
                    entry.member = true;
                } else {
                    collect(schemas, child_node, child, entry);
                }
            }
        }
        Value::Array(items) => match schemas.list_type(node) {
            ListType::Map(keys) => {
                let item_node = schemas.items(node);
                for item in items {
                    let entry = out
                        .children
                        .entry(PathElement::Key(item_key(item, &keys)))
                        .or_default();
                    entry.member = true;
                    collect(schemas, item_node, item, entry);
                }
            }
            ListType::Set => {
                for item in items {
                    out.children
                        .entry(PathElement::Value(canonical(item)))
                        .or_default()
                        .member = true;
                }
            }
            ListType::Atomic => out.member = true,
        },
        _ => out.member = true,
    }
}

fn is_leaf(schemas: &SchemaSet, node: Option<NodeId>, value: &Value) -> bool {
    match value {
        Value::Object(map) => map.is_empty() || schemas.map_atomic(node),
        Value::Array(items) => items.is_empty() || schemas.list_type(node) == ListType::Atomic,
        _ => true,
    }
}

fn canonical(value: &Value) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

fn item_key(item: &Value, keys: &[String]) -> String {
    let key: Map<String, Value> = keys
        .iter()
        .map(|k| (k.clone(), item.get(k).cloned().unwrap_or(Value::Null)))
        .collect();
    canonical(&Value::Object(key))
}

/// The value at a field path.
pub(crate) fn value_at<'a>(
    schemas: &SchemaSet,
    mut node: Option<NodeId>,
    mut value: &'a Value,
    path: &[PathElement],
) -> Option<&'a Value> {
    for element in path {
        match element {
            PathElement::Field(name) => {
                value = value.get(name)?;
                node = schemas.child(node, name);
            }
            PathElement::Key(key) => {
                let ListType::Map(keys) = schemas.list_type(node) else {
                    return None;
                };
                value = value
                    .as_array()?
                    .iter()
                    .find(|item| item_key(item, &keys) == *key)?;
                node = schemas.items(node);
            }
            PathElement::Value(text) => {
                value = value
                    .as_array()?
                    .iter()
                    .find(|item| canonical(item) == *text)?;
                node = schemas.items(node);
            }
        }
    }
    Some(value)
}

/// Removes the value at a field path, then empty objects it leaves behind unless `keep` owns them.
fn remove_at(
    schemas: &SchemaSet,
    node: Option<NodeId>,
    value: &mut Value,
    path: &[PathElement],
    depth: usize,
    keep: &FieldSet,
) {
    let Some(element) = path.get(depth) else {
        return;
    };
    let last = depth + 1 == path.len();
    match element {
        PathElement::Field(name) => {
            let child_node = schemas.child(node, name);
            let Some(map) = value.as_object_mut() else {
                return;
            };
            if last {
                map.remove(name);
                return;
            }
            if let Some(child) = map.get_mut(name) {
                remove_at(schemas, child_node, child, path, depth + 1, keep);
                if child.as_object().is_some_and(Map::is_empty) && !keep.touches(&path[..=depth]) {
                    map.remove(name);
                }
            }
        }
        PathElement::Key(key) => {
            let ListType::Map(keys) = schemas.list_type(node) else {
                return;
            };
            let item_node = schemas.items(node);
            let Some(items) = value.as_array_mut() else {
                return;
            };
            let Some(index) = items.iter().position(|item| item_key(item, &keys) == *key) else {
                return;
            };
            if last {
                items.remove(index);
            } else {
                remove_at(schemas, item_node, &mut items[index], path, depth + 1, keep);
            }
        }
        PathElement::Value(text) => {
            if let Some(items) = value.as_array_mut() {
                items.retain(|item| canonical(item) != *text);
            }
        }
    }
}

/// Whether a path names one of the key fields of a list-map item (kept while the item lives).
fn is_item_key_field(path: &[PathElement]) -> bool {
    let [.., PathElement::Key(key), PathElement::Field(name)] = path else {
        return false;
    };
    serde_json::from_str::<Map<String, Value>>(key).is_ok_and(|keys| keys.contains_key(name))
}

/// Merges an applied configuration into the live object, list types respected.
pub(crate) fn merge(schemas: &SchemaSet, node: Option<NodeId>, live: &mut Value, applied: &Value) {
    match (live, applied) {
        (Value::Object(live), Value::Object(applied)) if !schemas.map_atomic(node) => {
            for (key, value) in applied {
                let child = schemas.child(node, key);
                match live.get_mut(key) {
                    Some(existing) => merge(schemas, child, existing, value),
                    None => {
                        live.insert(key.clone(), value.clone());
                    }
                }
            }
        }
        (Value::Array(live), Value::Array(applied)) => match schemas.list_type(node) {
            ListType::Map(keys) => {
                let item_node = schemas.items(node);
                for item in applied {
                    let key = item_key(item, &keys);
                    match live
                        .iter_mut()
                        .find(|existing| item_key(existing, &keys) == key)
                    {
                        Some(existing) => merge(schemas, item_node, existing, item),
                        None => live.push(item.clone()),
                    }
                }
            }
            ListType::Set => {
                for item in applied {
                    if !live.contains(item) {
                        live.push(item.clone());
                    }
                }
            }
            ListType::Atomic => *live = applied.clone(),
        },
        (live, applied) => *live = applied.clone(),
    }
}

/// A field another manager owns with a different value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Conflict {
    pub manager: String,
    pub field: String,
}

/// Renders a field path the way apply conflicts name fields (`.spec.replicas`).
pub(crate) fn display_path(path: &[PathElement]) -> String {
    path.iter()
        .map(|element| match element {
            PathElement::Field(name) => format!(".{name}"),
            PathElement::Key(key) => format!("[{key}]"),
            PathElement::Value(value) => format!("[={value}]"),
        })
        .collect()
}

/// Field ownership of one object: manager key (`name` or `name|status`) to owned paths.
pub(crate) type Managed = BTreeMap<String, FieldSet>;

/// The result of applying: the new object and the new ownership.
pub(crate) struct Applied {
    pub object: Value,
    pub managed: Managed,
}

/// One apply request against a live object.
pub(crate) struct ApplyRequest<'a> {
    pub live: &'a Value,
    pub managed: &'a Managed,
    pub manager: &'a str,
    /// The applied configuration, already cleaned of server-owned fields.
    pub applied: &'a Value,
    pub force: bool,
}

/// Server-side apply by `request.manager` onto `request.live`. `tracked` strips what ownership
/// does not cover (identity, server fields, the other half of a status subresource) before sets
/// are computed and before the merge.
pub(crate) fn apply(
    schemas: &SchemaSet,
    root: Option<NodeId>,
    request: &ApplyRequest<'_>,
    tracked: &dyn Fn(&Value) -> Value,
) -> Result<Applied, Vec<Conflict>> {
    let ApplyRequest {
        live,
        managed,
        manager,
        applied,
        force,
    } = *request;
    let new_set = field_set(schemas, root, &tracked(applied));
    let mut managed = managed.clone();
    let mut conflicts = Vec::new();
    for (other, owned) in managed
        .iter_mut()
        .filter(|(other, _)| other.as_str() != manager)
    {
        for path in new_set.members() {
            if owned.has_member(&path)
                && value_at(schemas, root, live, &path) != value_at(schemas, root, applied, &path)
            {
                if force {
                    owned.remove(&path);
                } else {
                    conflicts.push(Conflict {
                        manager: other.split('|').next().unwrap_or_default().to_string(),
                        field: display_path(&path),
                    });
                }
            }
        }
    }
    if !conflicts.is_empty() {
        return Err(conflicts);
    }
    let previous = managed.remove(manager).unwrap_or_default();
    let others = managed.values().fold(FieldSet::default(), |mut all, set| {
        for path in set.members() {
            all.insert(&path);
        }
        all
    });
    let mut object = live.clone();
    merge(schemas, root, &mut object, &tracked(applied));
    let mut removed: Vec<FieldPath> = previous
        .members()
        .into_iter()
        .filter(|path| !new_set.touches(path) && !others.touches(path) && !is_item_key_field(path))
        .collect();
    // Deepest first, so an emptied parent is judged after its children are gone.
    removed.sort_by_key(|path| std::cmp::Reverse(path.len()));
    let mut keep = others.clone();
    for path in new_set.members() {
        keep.insert(&path);
    }
    for path in &removed {
        remove_at(schemas, root, &mut object, path, 0, &keep);
    }
    managed.retain(|_, set| !set.is_empty());
    if !new_set.is_empty() {
        managed.insert(manager.to_string(), new_set);
    }
    Ok(Applied { object, managed })
}

/// Records a non-apply write: `manager` owns what it changed; what it changed or removed is no
/// longer owned by anyone else.
pub(crate) fn record_update(
    schemas: &SchemaSet,
    root: Option<NodeId>,
    managed: &mut Managed,
    manager: &str,
    old: &Value,
    new: &Value,
) {
    let old_set = field_set(schemas, root, old);
    let new_set = field_set(schemas, root, new);
    let changed: Vec<FieldPath> = new_set
        .members()
        .into_iter()
        .filter(|path| value_at(schemas, root, old, path) != value_at(schemas, root, new, path))
        .collect();
    let removed: Vec<FieldPath> = old_set
        .members()
        .into_iter()
        .filter(|path| !new_set.has_member(path))
        .collect();
    if changed.is_empty() && removed.is_empty() {
        return;
    }
    for set in managed.values_mut() {
        for path in changed.iter().chain(&removed) {
            set.remove(path);
        }
    }
    let mine = managed.entry(manager.to_string()).or_default();
    for path in &changed {
        mine.insert(path);
    }
    managed.retain(|_, set| !set.is_empty());
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::FakeApiServerOptions;

    fn schemas() -> SchemaSet {
        SchemaSet::load(&FakeApiServerOptions::default()).unwrap()
    }

    fn deployment_root(schemas: &SchemaSet) -> Option<NodeId> {
        let id = schemas.catalog.by_kind("apps", "v1", "Deployment").unwrap();
        schemas.root(id, "v1")
    }

    fn run(
        schemas: &SchemaSet,
        root: Option<NodeId>,
        live: &Value,
        managed: &Managed,
        applied: &Value,
        force: bool,
    ) -> Result<Applied, Vec<Conflict>> {
        let request = ApplyRequest {
            live,
            managed,
            manager: "ctl",
            applied,
            force,
        };
        apply(schemas, root, &request, &|value: &Value| value.clone())
    }

    #[test]
    fn apply_merges_lists_by_key_and_removes_dropped_fields() {
        let schemas = schemas();
        let root = deployment_root(&schemas);
        let first = json!({"spec": {"replicas": 1, "template": {"spec": {"containers": [
            {"name": "a", "image": "a:1", "env": [{"name": "X", "value": "1"}, {"name": "Y", "value": "2"}]}
        ]}}}});
        let applied = run(&schemas, root, &json!({}), &Managed::new(), &first, false).unwrap();
        assert_eq!(applied.object, first);

        // Someone else adds a sidecar container and a label; the applier then drops env Y.
        let mut live = applied.object.clone();
        let mut managed = applied.managed.clone();
        let edited = {
            let mut edited = live.clone();
            edited["spec"]["template"]["spec"]["containers"]
                .as_array_mut()
                .unwrap()
                .push(json!({"name": "sidecar", "image": "s:1"}));
            edited["metadata"] = json!({"labels": {"team": "x"}});
            edited
        };
        record_update(&schemas, root, &mut managed, "kubectl", &live, &edited);
        live = edited;
        let second = json!({"spec": {"replicas": 1, "template": {"spec": {"containers": [
            {"name": "a", "image": "a:2", "env": [{"name": "X", "value": "1"}]}
        ]}}}});
        let applied = run(&schemas, root, &live, &managed, &second, false).unwrap();
        let containers = &applied.object["spec"]["template"]["spec"]["containers"];
        assert_eq!(
            containers,
            &json!([{"name": "a", "image": "a:2", "env": [{"name": "X", "value": "1"}]}, {"name": "sidecar", "image": "s:1"}])
        );
        assert_eq!(applied.object["metadata"]["labels"]["team"], "x");
    }

    #[test]
    fn dropped_fields_take_emptied_parents_with_them_unless_owned() {
        let schemas = schemas();
        let root = deployment_root(&schemas);
        let first = json!({"spec": {"template": {"metadata": {"annotations": {"a": "1"}}}}});
        let applied = run(&schemas, root, &json!({}), &Managed::new(), &first, false).unwrap();
        let second = json!({"spec": {"replicas": 1}});
        let pruned = run(
            &schemas,
            root,
            &applied.object,
            &applied.managed,
            &second,
            false,
        )
        .unwrap();
        assert_eq!(pruned.object, second);

        // A label someone else set keeps the template metadata alive.
        let mut managed = applied.managed.clone();
        let mut labelled = applied.object.clone();
        labelled["spec"]["template"]["metadata"]["labels"] = json!({"l": "v"});
        record_update(
            &schemas,
            root,
            &mut managed,
            "kubectl",
            &applied.object,
            &labelled,
        );
        let kept = run(&schemas, root, &labelled, &managed, &second, false).unwrap();
        assert_eq!(
            kept.object,
            json!({"spec": {"replicas": 1, "template": {"metadata": {"labels": {"l": "v"}}}}})
        );
    }

    #[test]
    fn apply_conflicts_unless_forced() {
        let schemas = schemas();
        let root = deployment_root(&schemas);
        let config = json!({"spec": {"replicas": 1}});
        let applied = run(&schemas, root, &json!({}), &Managed::new(), &config, false).unwrap();
        let mut managed = applied.managed;
        let scaled = json!({"spec": {"replicas": 5}});
        record_update(
            &schemas,
            root,
            &mut managed,
            "hpa",
            &applied.object,
            &scaled,
        );
        let conflicts = run(&schemas, root, &scaled, &managed, &config, false)
            .err()
            .unwrap();
        assert_eq!(
            conflicts,
            vec![Conflict {
                manager: "hpa".into(),
                field: ".spec.replicas".into()
            }]
        );
        let forced = run(&schemas, root, &scaled, &managed, &config, true).unwrap();
        assert_eq!(forced.object["spec"]["replicas"], 1);
    }
}
