//! Deletion: finalizers keep an object (with `deletionTimestamp`) until they are removed;
//! removal cascades to dependents by `ownerReferences` (or orphans them) and empties a deleted
//! namespace. A foreground deletion keeps the owner, with the `foregroundDeletion` finalizer,
//! until every dependent that blocks owner deletion is gone, as the garbage collector does.

use serde_json::Value;

use super::{
    DeleteOptions, Deletion, EventType, Filter, Inner, Key, Propagation, Store, Target, finalizers,
    meta_str, metadata_mut, now,
};

/// The finalizer a foreground deletion holds its object with.
const FOREGROUND: &str = "foregroundDeletion";
use crate::catalog::ResourceId;
use crate::status::ApiError;

impl Store {
    /// DELETE of one object.
    pub(crate) fn delete(
        &self,
        target: Target<'_>,
        name: &str,
        options: &DeleteOptions,
    ) -> Result<Deletion, ApiError> {
        let resource = self.resource(target.resource);
        let mut inner = self.lock();
        let key = self.key(target, name);
        let current = inner.objects[target.resource]
            .get(&key)
            .map(|stored| stored.object.clone())
            .ok_or_else(|| ApiError::not_found(resource, name))?;
        if let Some(uid) = &options.uid
            && meta_str(&current, "uid") != Some(uid.as_str())
        {
            return Err(ApiError::conflict(
                resource,
                name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    meta_str(&current, "uid").unwrap_or_default()
                ),
            ));
        }
        if let Some(rv) = &options.resource_version
            && meta_str(&current, "resourceVersion") != Some(rv.as_str())
        {
            return Err(ApiError::conflict(
                resource,
                name,
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                    meta_str(&current, "resourceVersion").unwrap_or_default()
                ),
            ));
        }
        if options.dry_run {
            return Ok(if finalizers(&current).is_empty() {
                Deletion::Removed(current)
            } else {
                Deletion::Pending {
                    object: current,
                    changed: false,
                }
            });
        }
        let deletion = self.delete_object(&mut inner, target.resource, &key, options.propagation);
        self.notify(&inner);
        Ok(deletion.unwrap_or(Deletion::Removed(current)))
    }

    /// DELETE of a collection: every matching object, as single deletes.
    pub(crate) fn delete_collection(
        &self,
        resource: ResourceId,
        filter: &Filter,
        options: &DeleteOptions,
    ) -> Vec<Value> {
        let mut inner = self.lock();
        let keys: Vec<Key> = inner.objects[resource]
            .iter()
            .filter(|(_, stored)| filter.matches(&stored.object))
            .map(|(key, _)| key.clone())
            .collect();
        let mut deleted = Vec::new();
        for key in keys {
            if options.dry_run {
                if let Some(stored) = inner.objects[resource].get(&key) {
                    deleted.push(stored.object.clone());
                }
                continue;
            }
            match self.delete_object(&mut inner, resource, &key, options.propagation) {
                Some(Deletion::Removed(object) | Deletion::Pending { object, .. }) => {
                    deleted.push(object)
                }
                None => {}
            }
        }
        self.notify(&inner);
        deleted
    }

    /// Deletes one stored object: marks it when finalizers (or, in the foreground, dependents)
    /// hold it, else removes it and cascades.
    fn delete_object(
        &self,
        inner: &mut Inner,
        resource: ResourceId,
        key: &Key,
        propagation: Propagation,
    ) -> Option<Deletion> {
        let stored = inner.objects[resource].get(key)?.clone();
        let uid = meta_str(&stored.object, "uid")
            .unwrap_or_default()
            .to_string();
        let waiting = finalizers(&stored.object).iter().any(|f| f == FOREGROUND);
        if propagation == Propagation::Foreground && !waiting {
            let dependents = Self::dependents(inner, &uid);
            if !dependents.is_empty() {
                let marked = self.mark_deleted(inner, resource, key, Some(FOREGROUND));
                // A dependent with dependents of its own goes in the foreground too, so the
                // owner waits for the whole tree; one already waiting is not walked again, so a
                // walk over an ownership cycle ends (the cycle itself stays waiting: this fake
                // has no garbage collector to break it).
                for (id, dependent, _) in dependents {
                    self.delete_object(inner, id, &dependent, Propagation::Foreground);
                }
                self.release_foreground(inner, resource, key);
                return Some(match inner.objects[resource].get(key) {
                    Some(held) => Deletion::Pending {
                        object: held.object.clone(),
                        changed: marked,
                    },
                    None => Deletion::Removed(stored.object),
                });
            }
        }
        if !finalizers(&stored.object).is_empty() {
            let changed = self.mark_deleted(inner, resource, key, None);
            let object = inner.objects[resource].get(key)?.object.clone();
            return Some(Deletion::Pending { object, changed });
        }
        inner.objects[resource].remove(key);
        Some(Deletion::Removed(self.remove(
            inner,
            resource,
            stored.object,
            propagation == Propagation::Orphan,
        )))
    }

    /// Sets `deletionTimestamp` (once) and adds `finalizer`; whether anything changed.
    fn mark_deleted(
        &self,
        inner: &mut Inner,
        resource: ResourceId,
        key: &Key,
        finalizer: Option<&str>,
    ) -> bool {
        let Some(stored) = inner.objects[resource].get(key).cloned() else {
            return false;
        };
        let mut object = stored.object.clone();
        let has_generation = self.resource(resource).has_generation;
        let metadata = metadata_mut(&mut object);
        if !metadata.contains_key("deletionTimestamp") {
            metadata.insert("deletionTimestamp".into(), Value::from(now()));
            metadata.insert("deletionGracePeriodSeconds".into(), Value::from(0));
            if has_generation {
                let generation = metadata
                    .get("generation")
                    .and_then(Value::as_i64)
                    .unwrap_or(0);
                metadata.insert("generation".into(), Value::from(generation + 1));
            }
        }
        if let Some(finalizer) = finalizer {
            let list = metadata
                .entry("finalizers")
                .or_insert_with(|| Value::Array(Vec::new()));
            if let Value::Array(list) = list
                && !list.iter().any(|f| f == finalizer)
            {
                list.push(Value::from(finalizer));
            }
        }
        if object == stored.object {
            return false;
        }
        self.store_modified(inner, resource, key, stored.object, object);
        true
    }

    /// Objects with an owner reference to `uid`, and whether that reference blocks the owner's
    /// deletion.
    fn dependents(inner: &Inner, uid: &str) -> Vec<(ResourceId, Key, bool)> {
        let mut found = Vec::new();
        for (id, objects) in inner.objects.iter().enumerate() {
            for (key, stored) in objects {
                let reference = stored
                    .object
                    .pointer("/metadata/ownerReferences")
                    .and_then(Value::as_array)
                    .and_then(|owners| {
                        owners
                            .iter()
                            .find(|o| o.get("uid").and_then(Value::as_str) == Some(uid))
                    });
                if let Some(reference) = reference {
                    let blocks = reference.get("blockOwnerDeletion") == Some(&Value::Bool(true));
                    found.push((id, key.clone(), blocks));
                }
            }
        }
        found
    }

    /// Ends a foreground deletion once no dependent blocks it: the finalizer goes, and with the
    /// last finalizer the object.
    fn release_foreground(&self, inner: &mut Inner, resource: ResourceId, key: &Key) {
        let Some(stored) = inner.objects[resource].get(key).cloned() else {
            return;
        };
        if !finalizers(&stored.object).iter().any(|f| f == FOREGROUND) {
            return;
        }
        let uid = meta_str(&stored.object, "uid").unwrap_or_default();
        if Self::dependents(inner, uid)
            .iter()
            .any(|(_, _, blocks)| *blocks)
        {
            return;
        }
        let mut object = stored.object.clone();
        if let Some(Value::Array(list)) = metadata_mut(&mut object).get_mut("finalizers") {
            list.retain(|f| f != FOREGROUND);
        }
        if finalizers(&object).is_empty() {
            metadata_mut(&mut object).remove("finalizers");
            inner.objects[resource].remove(key);
            self.remove(inner, resource, object, false);
            return;
        }
        self.store_modified(inner, resource, key, stored.object, object);
    }

    /// Records the removal of an object already taken out of the map, then deletes (or orphans)
    /// its dependents, and the contents of a deleted namespace; an owner waiting in the
    /// foreground for this object may then go.
    pub(super) fn remove(
        &self,
        inner: &mut Inner,
        resource: ResourceId,
        mut object: Value,
        orphan: bool,
    ) -> Value {
        Self::bump(inner, &mut object);
        self.record(inner, resource, EventType::Deleted, &object, None);
        inner.removals.push(format!(
            "{} {}/{}",
            self.resource(resource).kind,
            meta_str(&object, "namespace").unwrap_or_default(),
            meta_str(&object, "name").unwrap_or_default()
        ));
        let uid = meta_str(&object, "uid").unwrap_or_default().to_string();
        let info = self.resource(resource);
        let namespace_removed = (!info.custom && info.group.is_empty() && info.kind == "Namespace")
            .then(|| meta_str(&object, "name").unwrap_or_default().to_string());
        let mut dependents: Vec<(ResourceId, Key, bool)> = Self::dependents(inner, &uid)
            .into_iter()
            .map(|(id, key, _)| (id, key, false))
            .collect();
        if let Some(ns) = namespace_removed.as_deref().filter(|ns| !ns.is_empty()) {
            for (id, objects) in inner.objects.iter().enumerate() {
                dependents.extend(
                    objects
                        .keys()
                        .filter(|key| key.0 == ns)
                        .map(|key| (id, key.clone(), true)),
                );
            }
        }
        for (id, key, contained) in dependents {
            if orphan && !contained {
                self.orphan(inner, id, &key, &uid);
            } else {
                self.delete_object(inner, id, &key, Propagation::Background);
            }
        }
        let owners: Vec<String> = object
            .pointer("/metadata/ownerReferences")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|o| o.get("uid").and_then(Value::as_str).map(str::to_string))
            .collect();
        for owner in owners {
            if let Some((id, key)) = Self::find_uid(inner, &owner) {
                self.release_foreground(inner, id, &key);
            }
        }
        object
    }

    fn find_uid(inner: &Inner, uid: &str) -> Option<(ResourceId, Key)> {
        inner.objects.iter().enumerate().find_map(|(id, objects)| {
            objects
                .iter()
                .find(|(_, stored)| meta_str(&stored.object, "uid") == Some(uid))
                .map(|(key, _)| (id, key.clone()))
        })
    }

    /// Drops owner references to `owner_uid` (orphan propagation).
    fn orphan(&self, inner: &mut Inner, resource: ResourceId, key: &Key, owner_uid: &str) {
        let Some(stored) = inner.objects[resource].get(key).cloned() else {
            return;
        };
        let mut object = stored.object.clone();
        let metadata = metadata_mut(&mut object);
        if let Some(Value::Array(owners)) = metadata.get_mut("ownerReferences") {
            owners.retain(|o| o.get("uid").and_then(Value::as_str) != Some(owner_uid));
            if owners.is_empty() {
                metadata.remove("ownerReferences");
            }
        }
        self.store_modified(inner, resource, key, stored.object, object);
    }

    /// Stores `object` in place of `old` at `key`, with a new resourceVersion and a MODIFIED
    /// event.
    fn store_modified(
        &self,
        inner: &mut Inner,
        resource: ResourceId,
        key: &Key,
        old: Value,
        mut object: Value,
    ) {
        Self::bump(inner, &mut object);
        self.record(inner, resource, EventType::Modified, &object, Some(old));
        if let Some(slot) = inner.objects[resource].get_mut(key) {
            slot.object = object;
        }
    }
}
