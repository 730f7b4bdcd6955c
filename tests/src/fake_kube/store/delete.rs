//! Deletion: finalizers keep an object (with `deletionTimestamp`) until they are removed;
//! removal cascades to dependents by `ownerReferences` (or orphans them) and empties a deleted
//! namespace.

use serde_json::Value;

use super::{
    DeleteOptions, Deletion, EventType, Filter, Inner, Key, Store, Target, finalizers, meta_str,
    metadata_mut, now,
};
use crate::fake_kube::catalog::ResourceId;
use crate::fake_kube::status::ApiError;

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
        let deletion = self.delete_object(&mut inner, target.resource, &key, options.orphan);
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
            match self.delete_object(&mut inner, resource, &key, options.orphan) {
                Some(Deletion::Removed(object) | Deletion::Pending { object, .. }) => {
                    deleted.push(object)
                }
                None => {}
            }
        }
        self.notify(&inner);
        deleted
    }

    /// Deletes one stored object: marks it when finalizers hold it, else removes it and cascades.
    fn delete_object(
        &self,
        inner: &mut Inner,
        resource: ResourceId,
        key: &Key,
        orphan: bool,
    ) -> Option<Deletion> {
        let stored = inner.objects[resource].get(key)?.clone();
        if !finalizers(&stored.object).is_empty() {
            if stored
                .object
                .pointer("/metadata/deletionTimestamp")
                .is_some()
            {
                return Some(Deletion::Pending {
                    object: stored.object,
                    changed: false,
                });
            }
            let mut object = stored.object.clone();
            let has_generation = self.resource(resource).has_generation;
            let metadata = metadata_mut(&mut object);
            metadata.insert("deletionTimestamp".into(), Value::from(now()));
            metadata.insert("deletionGracePeriodSeconds".into(), Value::from(0));
            if has_generation {
                let generation = metadata
                    .get("generation")
                    .and_then(Value::as_i64)
                    .unwrap_or(0);
                metadata.insert("generation".into(), Value::from(generation + 1));
            }
            Self::bump(inner, &mut object);
            self.record(
                inner,
                resource,
                EventType::Modified,
                &object,
                Some(stored.object.clone()),
            );
            if let Some(slot) = inner.objects[resource].get_mut(key) {
                slot.object = object.clone();
            }
            return Some(Deletion::Pending {
                object,
                changed: true,
            });
        }
        inner.objects[resource].remove(key);
        Some(Deletion::Removed(self.remove(
            inner,
            resource,
            stored.object,
            orphan,
        )))
    }

    /// Records the removal of an object already taken out of the map, then deletes (or orphans)
    /// its dependents, and the contents of a deleted namespace.
    pub(super) fn remove(
        &self,
        inner: &mut Inner,
        resource: ResourceId,
        mut object: Value,
        orphan: bool,
    ) -> Value {
        Self::bump(inner, &mut object);
        self.record(inner, resource, EventType::Deleted, &object, None);
        let uid = meta_str(&object, "uid").unwrap_or_default().to_string();
        let info = self.resource(resource);
        let namespace_removed = (!info.custom && info.group.is_empty() && info.kind == "Namespace")
            .then(|| meta_str(&object, "name").unwrap_or_default().to_string());
        let mut dependents = Vec::new();
        for (id, objects) in inner.objects.iter().enumerate() {
            for (key, stored) in objects {
                let owned = stored
                    .object
                    .pointer("/metadata/ownerReferences")
                    .and_then(Value::as_array)
                    .is_some_and(|owners| {
                        owners
                            .iter()
                            .any(|o| o.get("uid").and_then(Value::as_str) == Some(&uid))
                    });
                let contained = namespace_removed
                    .as_deref()
                    .is_some_and(|ns| !ns.is_empty() && key.0 == ns);
                if owned || contained {
                    dependents.push((id, key.clone(), contained));
                }
            }
        }
        for (id, key, contained) in dependents {
            if orphan && !contained {
                self.orphan(inner, id, &key, &uid);
            } else {
                self.delete_object(inner, id, &key, false);
            }
        }
        object
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
        Self::bump(inner, &mut object);
        self.record(
            inner,
            resource,
            EventType::Modified,
            &object,
            Some(stored.object),
        );
        if let Some(slot) = inner.objects[resource].get_mut(key) {
            slot.object = object;
        }
    }
}
