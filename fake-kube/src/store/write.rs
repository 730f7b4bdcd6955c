//! Create, update, patch and server-side apply: every write ends in `finish_update` (or
//! `insert_new`), where server-owned metadata is restored, the status subresource is respected,
//! the object is validated, `generation` is bumped on spec changes, and an unchanged object is a
//! no-op.

use serde_json::{Value, json};

use super::{
    EventType, Inner, Key, Outcome, Part, PatchKind, SERVER_METADATA, Store, Stored, Target,
    WriteOptions, finalizers, meta_str, metadata_mut, now, spec_part, strip_nulls, tracked,
};
use crate::apply::{self, ApplyRequest, Managed};
use crate::patch;
use crate::schema::FieldError;
use crate::status::ApiError;

impl Store {
    /// POST: creates an object (`generateName` supported).
    pub(crate) fn create(
        &self,
        target: Target<'_>,
        body: Value,
        options: &WriteOptions,
    ) -> Result<Outcome, ApiError> {
        let mut inner = self.lock();
        let outcome = self.insert_new(&mut inner, target, body, options, None)?;
        self.notify(&inner);
        Ok(outcome)
    }

    fn insert_new(
        &self,
        inner: &mut Inner,
        target: Target<'_>,
        mut object: Value,
        options: &WriteOptions,
        managed: Option<Managed>,
    ) -> Result<Outcome, ApiError> {
        let resource = self.resource(target.resource);
        self.type_meta(target, &mut object)?;
        self.clear_new_metadata(target, &mut object)?;
        let name = self.new_name(inner, target, &mut object);
        self.initialise_new(inner, target, &name, &mut object);
        self.validate(target, &name, &mut object, None)?;
        let key = self.key(target, &name);
        if inner.objects[target.resource].contains_key(&key) {
            return Err(ApiError::already_exists(resource, &name));
        }
        let managed = managed.unwrap_or_else(|| self.created_fields(target, options, &object));
        self.storage_form(target, &mut object);
        if options.dry_run {
            return Ok(Outcome {
                object,
                changed: false,
                created: true,
            });
        }
        Self::bump(inner, &mut object);
        self.record(inner, target.resource, EventType::Added, &object, None);
        inner.objects[target.resource].insert(
            key,
            Stored {
                object: object.clone(),
                managed,
            },
        );
        Ok(Outcome {
            object,
            changed: true,
            created: true,
        })
    }

    /// Metadata a create does not choose: no resourceVersion (refused), no server-owned fields
    /// (dropped), and the namespace of the URL (or none, for a cluster-scoped kind).
    fn clear_new_metadata(&self, target: Target<'_>, object: &mut Value) -> Result<(), ApiError> {
        let metadata = metadata_mut(object);
        if metadata
            .get("resourceVersion")
            .and_then(Value::as_str)
            .is_some_and(|rv| !rv.is_empty())
        {
            return Err(ApiError::bad_request(
                "resourceVersion should not be set on objects to be created".into(),
            ));
        }
        for field in SERVER_METADATA {
            metadata.remove(*field);
        }
        if self.resource(target.resource).namespaced {
            let namespace = target.namespace.unwrap_or_default();
            match metadata.get("namespace").and_then(Value::as_str) {
                Some(given) if !given.is_empty() && given != namespace => {
                    return Err(ApiError::bad_request(
                        "the namespace of the provided object does not match the namespace sent on the request".into(),
                    ));
                }
                _ => {
                    metadata.insert("namespace".into(), Value::from(namespace));
                }
            }
        } else {
            metadata.remove("namespace");
        }
        Ok(())
    }

    /// The object's name, else one made from `generateName` that no stored object has (empty
    /// when neither is given, which validation refuses).
    fn new_name(&self, inner: &mut Inner, target: Target<'_>, object: &mut Value) -> String {
        let metadata = metadata_mut(object);
        let mut name = metadata
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        if name.is_empty()
            && let Some(prefix) = metadata
                .get("generateName")
                .and_then(Value::as_str)
                .map(str::to_string)
        {
            const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
            loop {
                let mut random = Self::random(inner);
                let suffix: String = (0..5)
                    .map(|_| {
                        let c = ALPHABET[(random % ALPHABET.len() as u64) as usize] as char;
                        random /= ALPHABET.len() as u64;
                        c
                    })
                    .collect();
                name = format!("{prefix}{suffix}");
                if !inner.objects[target.resource].contains_key(&self.key(target, &name)) {
                    break;
                }
            }
        }
        name
    }

    /// What the server sets on a new object: name, uid, creation time and first generation; a
    /// status subresource starts empty, whatever the body says.
    fn initialise_new(
        &self,
        inner: &mut Inner,
        target: Target<'_>,
        name: &str,
        object: &mut Value,
    ) {
        let resource = self.resource(target.resource);
        let uid = Self::new_uid(inner);
        let metadata = metadata_mut(object);
        if !name.is_empty() {
            metadata.insert("name".into(), Value::from(name));
        }
        metadata.insert("uid".into(), Value::from(uid));
        metadata.insert("creationTimestamp".into(), Value::from(now()));
        if resource.has_generation {
            metadata.insert("generation".into(), Value::from(1));
        }
        if resource.has_status
            && let Some(map) = object.as_object_mut()
        {
            map.remove("status");
        }
    }

    /// The managed fields of a created object: all of its fields, owned by the creator.
    fn created_fields(
        &self,
        target: Target<'_>,
        options: &WriteOptions,
        object: &Value,
    ) -> Managed {
        let part = self.part(target, None);
        let mut managed = Managed::new();
        let root = self.schemas.root(target.resource, target.version);
        let empty = json!({});
        apply::record_update(
            &self.schemas,
            root,
            &mut managed,
            &Self::manager_key(&options.manager, part),
            &empty,
            &tracked(object, part),
        );
        managed
    }

    /// PUT of the object or its status.
    pub(crate) fn update(
        &self,
        target: Target<'_>,
        name: &str,
        subresource: Option<&str>,
        mut body: Value,
        options: &WriteOptions,
    ) -> Result<Outcome, ApiError> {
        let resource = self.resource(target.resource);
        self.type_meta(target, &mut body)?;
        match meta_str(&body, "name") {
            Some(given) if given == name => {}
            given => {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({}) does not match the name on the URL ({name})",
                    given.unwrap_or_default()
                )));
            }
        }
        if resource.namespaced
            && let Some(given) = meta_str(&body, "namespace").filter(|ns| !ns.is_empty())
            && Some(given) != target.namespace
        {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request".into(),
            ));
        }
        let mut inner = self.lock();
        let key = self.key(target, name);
        let current = inner.objects[target.resource]
            .get(&key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(resource, name))?;
        let outcome = self.finish_update(
            &mut inner,
            target,
            &key,
            &current,
            body,
            subresource,
            options,
            None,
        )?;
        self.notify(&inner);
        Ok(outcome)
    }

    /// PATCH (merge, strategic, JSON patch or server-side apply) of the object or its status.
    pub(crate) fn patch(
        &self,
        target: Target<'_>,
        name: &str,
        subresource: Option<&str>,
        kind: PatchKind,
        body: &Value,
        options: &WriteOptions,
    ) -> Result<Outcome, ApiError> {
        let resource = self.resource(target.resource);
        let mut inner = self.lock();
        let key = self.key(target, name);
        let current = inner.objects[target.resource].get(&key).cloned();
        let outcome = match (kind, current) {
            (PatchKind::Apply, None) if subresource.is_none() => {
                let applied = self.applied_config(target, name, body)?;
                let part = self.part(target, None);
                let mut managed = Managed::new();
                let set = apply::field_set(
                    &self.schemas,
                    self.schemas.root(target.resource, target.version),
                    &tracked(&applied, part),
                );
                if !set.is_empty() {
                    managed.insert(Self::manager_key(&options.manager, part), set);
                }
                self.insert_new(&mut inner, target, applied, options, Some(managed))?
            }
            (_, None) => return Err(ApiError::not_found(resource, name)),
            (kind, Some(current)) => {
                let mut live = current.object.clone();
                live["apiVersion"] = Value::from(resource.api_version(target.version));
                let root = self.schemas.root(target.resource, target.version);
                let mut managed = None;
                let patched = match kind {
                    PatchKind::Merge => {
                        patch::merge_patch(&mut live, body);
                        live
                    }
                    PatchKind::Strategic => {
                        if resource.custom {
                            return Err(ApiError::unsupported_media_type(
                                "application/strategic-merge-patch+json",
                                "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
                            ));
                        }
                        patch::strategic_merge(&self.schemas, root, &mut live, body).map_err(
                            |why| {
                                ApiError::bad_request(format!(
                                    "invalid strategic merge patch: {why}"
                                ))
                            },
                        )?;
                        live
                    }
                    PatchKind::Json => patch::json_patch(live, body).map_err(|why| {
                        ApiError::unprocessable(format!(
                            "the server rejected our request due to an error in our request: {why}"
                        ))
                    })?,
                    PatchKind::Apply => {
                        let applied = self.applied_config(target, name, body)?;
                        self.check_precondition(target, name, &current.object, &applied)?;
                        let part = self.part(target, subresource);
                        let request = ApplyRequest {
                            live: &live,
                            managed: &current.managed,
                            manager: &Self::manager_key(&options.manager, part),
                            applied: &applied,
                            force: options.force,
                        };
                        let result = apply::apply(&self.schemas, root, &request, &|value| {
                            tracked(value, part)
                        })
                        .map_err(|conflicts| {
                            let conflicts: Vec<(String, String)> = conflicts
                                .into_iter()
                                .map(|c| (c.manager, c.field))
                                .collect();
                            ApiError::apply_conflicts(resource, name, &conflicts)
                        })?;
                        managed = Some(result.managed);
                        result.object
                    }
                };
                self.finish_update(
                    &mut inner,
                    target,
                    &key,
                    &current,
                    patched,
                    subresource,
                    options,
                    managed,
                )?
            }
        };
        self.notify(&inner);
        Ok(outcome)
    }

    /// An apply body: YAML or JSON object with `apiVersion`, `kind` and the URL's name.
    fn applied_config(
        &self,
        target: Target<'_>,
        name: &str,
        body: &Value,
    ) -> Result<Value, ApiError> {
        let mut applied = body.clone();
        if applied.get("apiVersion").is_none() || applied.get("kind").is_none() {
            return Err(ApiError::bad_request(
                "apply patches must set apiVersion and kind".into(),
            ));
        }
        self.type_meta(target, &mut applied)?;
        match meta_str(&applied, "name") {
            None => {
                metadata_mut(&mut applied).insert("name".into(), Value::from(name));
            }
            Some(given) if given != name => {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({given}) does not match the name on the URL ({name})"
                )));
            }
            Some(_) => {}
        }
        strip_nulls(&mut applied);
        Ok(applied)
    }

    /// A resourceVersion in a body is a precondition: it must be the stored one.
    fn check_precondition(
        &self,
        target: Target<'_>,
        name: &str,
        current: &Value,
        body: &Value,
    ) -> Result<(), ApiError> {
        match meta_str(body, "resourceVersion") {
            Some(rv) if !rv.is_empty() && Some(rv) != meta_str(current, "resourceVersion") => {
                Err(ApiError::stale(self.resource(target.resource), name))
            }
            _ => Ok(()),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn finish_update(
        &self,
        inner: &mut Inner,
        target: Target<'_>,
        key: &Key,
        current: &Stored,
        mut new: Value,
        subresource: Option<&str>,
        options: &WriteOptions,
        applied_managed: Option<Managed>,
    ) -> Result<Outcome, ApiError> {
        let resource = self.resource(target.resource);
        let name = key.1.as_str();
        self.check_precondition(target, name, &current.object, &new)?;
        let mut old = current.object.clone();
        old["apiVersion"] = Value::from(resource.api_version(target.version));
        self.check_update_body(target, name, &mut new)?;
        let part = self.part(target, subresource);
        new = keep_unwritten_part(part, &old, new);
        restore_server_metadata(&old, &mut new);
        self.check_no_new_finalizers(target, name, &old, &new)?;
        self.validate(target, name, &mut new, Some(&old))?;
        self.storage_form(target, &mut new);
        self.storage_form(target, &mut old);
        self.bump_generation_on_spec_change(target, &old, &mut new);
        let managed = applied_managed
            .unwrap_or_else(|| self.updated_fields(target, part, options, current, &old, &new));
        if new == old {
            if !options.dry_run
                && let Some(stored) = inner.objects[target.resource].get_mut(key)
            {
                stored.managed = managed;
            }
            return Ok(Outcome {
                object: old,
                changed: false,
                created: false,
            });
        }
        if options.dry_run {
            return Ok(Outcome {
                object: new,
                changed: false,
                created: false,
            });
        }
        if new.pointer("/metadata/deletionTimestamp").is_some() && finalizers(&new).is_empty() {
            inner.objects[target.resource].remove(key);
            let object = self.remove(inner, target.resource, new, false);
            return Ok(Outcome {
                object,
                changed: true,
                created: false,
            });
        }
        Self::bump(inner, &mut new);
        self.record(
            inner,
            target.resource,
            EventType::Modified,
            &new,
            Some(current.object.clone()),
        );
        inner.objects[target.resource].insert(
            key.clone(),
            Stored {
                object: new.clone(),
                managed,
            },
        );
        Ok(Outcome {
            object: new,
            changed: true,
            created: false,
        })
    }

    /// The written object must be a JSON object of the target's kind, named as the URL.
    fn check_update_body(
        &self,
        target: Target<'_>,
        name: &str,
        new: &mut Value,
    ) -> Result<(), ApiError> {
        if !new.is_object() {
            return Err(ApiError::bad_request(
                "the object must be a JSON object".into(),
            ));
        }
        self.type_meta(target, new)?;
        if meta_str(new, "name").is_some_and(|given| given != name) {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({}) does not match the name on the URL ({name})",
                meta_str(new, "name").unwrap_or_default()
            )));
        }
        Ok(())
    }

    /// An object being deleted may lose finalizers but not gain any.
    fn check_no_new_finalizers(
        &self,
        target: Target<'_>,
        name: &str,
        old: &Value,
        new: &Value,
    ) -> Result<(), ApiError> {
        if old.pointer("/metadata/deletionTimestamp").is_some() {
            let before = finalizers(old);
            if finalizers(new).iter().any(|f| !before.contains(f)) {
                return Err(ApiError::invalid(
                    self.resource(target.resource),
                    name,
                    &[FieldError::forbidden(
                        "metadata.finalizers",
                        "no new finalizers can be added if the object is being deleted",
                    )],
                ));
            }
        }
        Ok(())
    }

    /// `generation` counts changes to the spec (all but metadata, and status when it is a
    /// subresource).
    fn bump_generation_on_spec_change(&self, target: Target<'_>, old: &Value, new: &mut Value) {
        let resource = self.resource(target.resource);
        if resource.has_generation
            && spec_part(old, resource.has_status) != spec_part(new, resource.has_status)
        {
            let generation = old
                .pointer("/metadata/generation")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            metadata_mut(new).insert("generation".into(), Value::from(generation + 1));
        }
    }

    /// The managed fields after an update (not an apply): the writer takes the fields it changed.
    fn updated_fields(
        &self,
        target: Target<'_>,
        part: Part,
        options: &WriteOptions,
        current: &Stored,
        old: &Value,
        new: &Value,
    ) -> Managed {
        let mut managed = current.managed.clone();
        apply::record_update(
            &self.schemas,
            self.schemas.root(target.resource, target.version),
            &mut managed,
            &Self::manager_key(&options.manager, part),
            &tracked(old, part),
            &tracked(new, part),
        );
        managed
    }
}

/// A write covers its part only: through the status subresource only the status changes, and
/// elsewhere the stored status stays when status is a subresource.
fn keep_unwritten_part(part: Part, old: &Value, mut new: Value) -> Value {
    match part {
        Part::Status => {
            let mut merged = old.clone();
            match new.get("status") {
                Some(status) => merged["status"] = status.clone(),
                None => {
                    if let Some(map) = merged.as_object_mut() {
                        map.remove("status");
                    }
                }
            }
            merged
        }
        Part::Main => {
            if let Some(map) = new.as_object_mut() {
                match old.get("status") {
                    Some(status) => map.insert("status".into(), status.clone()),
                    None => map.remove("status"),
                };
            }
            new
        }
        Part::Whole => new,
    }
}

/// Server-owned metadata, the name and the namespace stay as stored, whatever the write says.
fn restore_server_metadata(old: &Value, new: &mut Value) {
    let old_metadata = old
        .get("metadata")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let metadata = metadata_mut(new);
    for field in SERVER_METADATA.iter().chain(&["name", "namespace"]) {
        match old_metadata.get(*field) {
            Some(value) => metadata.insert(field.to_string(), value.clone()),
            None => metadata.remove(*field),
        };
    }
}
