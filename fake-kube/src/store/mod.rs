//! The object store: every object once, in its storage version, under one global resourceVersion
//! counter, with a bounded history of watch events.
//!
//! Every write goes through one path (`finish_update`/`insert_new`) that restores server-owned
//! metadata, keeps `.status` and the main resource apart for kinds with a status subresource,
//! validates, bumps `generation` on spec changes, and turns a write that changes nothing into a
//! no-op: no new resourceVersion, no event, not counted. Deletion honours finalizers and cascades
//! to dependents by `ownerReferences`.

mod delete;
mod write;

use std::collections::{BTreeMap, VecDeque};
use std::hash::{BuildHasher, Hasher};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use serde_json::{Map, Value, json};

use super::apply::Managed;
use super::catalog::{ResourceId, ResourceInfo};
use super::schema::SchemaSet;
use super::selector::{FieldSelector, LabelSelector};
use super::status::ApiError;

/// Which objects a list or watch wants.
#[derive(Debug, Clone, Default)]
pub(crate) struct Filter {
    pub namespace: Option<String>,
    pub labels: LabelSelector,
    pub fields: FieldSelector,
}

impl Filter {
    pub(crate) fn matches(&self, object: &Value) -> bool {
        if let Some(namespace) = &self.namespace
            && object
                .pointer("/metadata/namespace")
                .and_then(Value::as_str)
                != Some(namespace.as_str())
        {
            return false;
        }
        self.labels.matches(object) && self.fields.matches(object)
    }
}

/// What kind of change a watch event reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventType {
    Added,
    Modified,
    Deleted,
}

/// One change, kept for watches that resume from a resourceVersion.
#[derive(Debug)]
pub(crate) struct Event {
    pub rv: u64,
    pub resource: ResourceId,
    pub kind: EventType,
    pub object: Value,
    /// The object before a modification (to turn selector transitions into ADDED/DELETED).
    pub old: Option<Value>,
}

/// A resource, the version a request speaks and the namespace in its path.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Target<'a> {
    pub resource: ResourceId,
    pub version: &'a str,
    pub namespace: Option<&'a str>,
}

/// Options shared by writes.
#[derive(Debug, Clone, Default)]
pub(crate) struct WriteOptions {
    pub dry_run: bool,
    /// Field manager (from `fieldManager`, else the User-Agent's product).
    pub manager: String,
    pub force: bool,
}

/// The patch formats a PATCH may carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PatchKind {
    Merge,
    Strategic,
    Json,
    Apply,
}

/// DeleteOptions that matter here.
#[derive(Debug, Clone, Default)]
pub(crate) struct DeleteOptions {
    pub dry_run: bool,
    pub propagation: Propagation,
    pub uid: Option<String>,
    pub resource_version: Option<String>,
}

/// What happens to an object's dependents when it is deleted (`propagationPolicy`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum Propagation {
    /// Removed now; its dependents are deleted after it.
    #[default]
    Background,
    /// Kept (with `deletionTimestamp` and the `foregroundDeletion` finalizer) until every
    /// dependent whose owner reference has `blockOwnerDeletion` is gone.
    Foreground,
    /// Removed now; its dependents lose their owner reference to it.
    Orphan,
}

/// The result of a write, in storage form.
#[derive(Debug, Clone)]
pub(crate) struct Outcome {
    pub object: Value,
    /// False for a no-op (nothing stored, no event).
    pub changed: bool,
    pub created: bool,
}

/// The result of a delete.
#[derive(Debug, Clone)]
pub(crate) enum Deletion {
    /// Removed; the last state of the object.
    Removed(Value),
    /// Kept with `deletionTimestamp` until its finalizers are gone.
    Pending { object: Value, changed: bool },
}

type Key = (String, String);

#[derive(Debug, Clone)]
struct Stored {
    object: Value,
    managed: Managed,
}

struct Inner {
    rv: u64,
    objects: Vec<BTreeMap<Key, Stored>>,
    history: VecDeque<Arc<Event>>,
    /// Events with a resourceVersion up to this one are no longer kept.
    compacted: u64,
    random: u64,
    /// Every removal as `Kind namespace/name`, in order (kept apart from the watch history,
    /// which is compacted).
    removals: Vec<String>,
}

/// Which part of an object a field manager's set covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    Whole,
    Main,
    Status,
}

/// Metadata the server owns; clients cannot set or change it.
const SERVER_METADATA: &[&str] = &[
    "uid",
    "resourceVersion",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "generation",
    "managedFields",
    "selfLink",
];

pub(crate) struct Store {
    schemas: Arc<SchemaSet>,
    inner: Mutex<Inner>,
    history_limit: usize,
    notify: tokio::sync::watch::Sender<u64>,
}

fn metadata_mut(object: &mut Value) -> &mut Map<String, Value> {
    if !object.get("metadata").is_some_and(Value::is_object) {
        object["metadata"] = json!({});
    }
    match object.get_mut("metadata") {
        Some(Value::Object(map)) => map,
        _ => unreachable!("metadata was just made an object"),
    }
}

fn meta_str<'a>(object: &'a Value, field: &str) -> Option<&'a str> {
    object.get("metadata")?.get(field)?.as_str()
}

fn now() -> String {
    let now = jiff::Timestamp::now();
    jiff::Timestamp::from_second(now.as_second())
        .unwrap_or(now)
        .to_string()
}

fn finalizers(object: &Value) -> &[Value] {
    object
        .pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// The part of an object whose change bumps `generation`: all but metadata (and status when it
/// is a subresource).
fn spec_part(object: &Value, has_status: bool) -> Value {
    let mut object = object.clone();
    if let Some(map) = object.as_object_mut() {
        map.remove("metadata");
        map.remove("apiVersion");
        map.remove("kind");
        if has_status {
            map.remove("status");
        }
    }
    object
}

/// What field ownership covers: no identity, no server fields, one half of a status subresource.
fn tracked(object: &Value, part: Part) -> Value {
    let mut object = object.clone();
    let Some(map) = object.as_object_mut() else {
        return object;
    };
    map.remove("apiVersion");
    map.remove("kind");
    match part {
        Part::Status => map.retain(|key, _| key == "status"),
        Part::Main => {
            map.remove("status");
        }
        Part::Whole => {}
    }
    if let Some(Value::Object(metadata)) = map.get_mut("metadata") {
        for field in SERVER_METADATA.iter().chain(&["name", "namespace"]) {
            metadata.remove(*field);
        }
        if metadata.is_empty() {
            map.remove("metadata");
        }
    }
    object
}

fn strip_nulls(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.retain(|_, v| !v.is_null());
            map.values_mut().for_each(strip_nulls);
        }
        Value::Array(items) => items.iter_mut().for_each(strip_nulls),
        _ => {}
    }
}

impl Store {
    pub(crate) fn new(schemas: Arc<SchemaSet>, history_limit: usize) -> Self {
        let seed = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish()
            | 1;
        let resources = schemas.catalog.resources.len();
        let (notify, _) = tokio::sync::watch::channel(1);
        Store {
            schemas,
            inner: Mutex::new(Inner {
                rv: 1,
                objects: vec![BTreeMap::new(); resources],
                history: VecDeque::new(),
                compacted: 0,
                random: seed,
                removals: Vec::new(),
            }),
            history_limit: history_limit.max(1),
            notify,
        }
    }

    /// Removed objects as `Kind namespace/name`, in the order they went.
    pub(crate) fn removals(&self) -> Vec<String> {
        self.lock().removals.clone()
    }

    pub(crate) fn schemas(&self) -> &SchemaSet {
        &self.schemas
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn resource(&self, id: ResourceId) -> &ResourceInfo {
        self.schemas.resource(id)
    }

    /// A receiver that sees the latest resourceVersion after every write.
    pub(crate) fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.notify.subscribe()
    }

    fn key(&self, target: Target<'_>, name: &str) -> Key {
        let namespace = if self.resource(target.resource).namespaced {
            target.namespace.unwrap_or_default()
        } else {
            ""
        };
        (namespace.to_string(), name.to_string())
    }

    pub(crate) fn get(&self, target: Target<'_>, name: &str) -> Result<Value, ApiError> {
        let inner = self.lock();
        inner.objects[target.resource]
            .get(&self.key(target, name))
            .map(|stored| stored.object.clone())
            .ok_or_else(|| ApiError::not_found(self.resource(target.resource), name))
    }

    /// Matching objects and the resourceVersion the list is consistent with.
    pub(crate) fn list(&self, resource: ResourceId, filter: &Filter) -> (Vec<Value>, u64) {
        let inner = self.lock();
        let items = inner.objects[resource]
            .values()
            .filter(|stored| filter.matches(&stored.object))
            .map(|stored| stored.object.clone())
            .collect();
        (items, inner.rv)
    }

    /// Events after `after` (all resources), with the current resourceVersion; `Err(compacted)`
    /// when some of them are no longer kept.
    pub(crate) fn events_after(&self, after: u64) -> Result<(Vec<Arc<Event>>, u64), u64> {
        let inner = self.lock();
        if after < inner.compacted {
            return Err(inner.compacted);
        }
        let start = inner.history.partition_point(|event| event.rv <= after);
        Ok((inner.history.range(start..).cloned().collect(), inner.rv))
    }

    /// Forgets every kept event, as an etcd compaction does: watches resuming from an older
    /// resourceVersion get 410 Expired.
    pub(crate) fn compact(&self) {
        let mut inner = self.lock();
        inner.history.clear();
        inner.compacted = inner.rv;
    }

    fn random(inner: &mut Inner) -> u64 {
        // xorshift64*: enough for names and uids in tests.
        let mut x = inner.random;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        inner.random = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn new_uid(inner: &mut Inner) -> String {
        let high = Self::random(inner);
        let low = Self::random(inner);
        format!(
            "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
            high >> 32,
            (high >> 16) & 0xffff,
            high & 0x0fff,
            ((low >> 48) & 0x3fff) | 0x8000,
            low & 0xffff_ffff_ffff
        )
    }

    fn record(
        &self,
        inner: &mut Inner,
        resource: ResourceId,
        kind: EventType,
        object: &Value,
        old: Option<Value>,
    ) {
        inner.history.push_back(Arc::new(Event {
            rv: inner.rv,
            resource,
            kind,
            object: object.clone(),
            old,
        }));
        while inner.history.len() > self.history_limit {
            if let Some(dropped) = inner.history.pop_front() {
                inner.compacted = dropped.rv;
            }
        }
    }

    fn bump(inner: &mut Inner, object: &mut Value) {
        inner.rv += 1;
        metadata_mut(object).insert("resourceVersion".into(), Value::from(inner.rv.to_string()));
    }

    fn notify(&self, inner: &Inner) {
        self.notify.send_replace(inner.rv);
    }

    /// Checks `apiVersion`/`kind` of a body against the request, and sets them.
    fn type_meta(&self, target: Target<'_>, object: &mut Value) -> Result<(), ApiError> {
        let resource = self.resource(target.resource);
        let api_version = resource.api_version(target.version);
        let Some(map) = object.as_object_mut() else {
            return Err(ApiError::bad_request(
                "the request body must be a JSON object".into(),
            ));
        };
        for (field, expected) in [
            ("apiVersion", api_version.as_str()),
            ("kind", resource.kind.as_str()),
        ] {
            match map.get(field).and_then(Value::as_str) {
                None | Some("") => {
                    map.insert(field.to_string(), Value::from(expected));
                }
                Some(actual) if actual != expected => {
                    return Err(ApiError::bad_request(format!(
                        "the {field} of the object ({actual}) does not match the {field} of the request ({expected})"
                    )));
                }
                Some(_) => {}
            }
        }
        Ok(())
    }

    fn validate(
        &self,
        target: Target<'_>,
        name: &str,
        object: &mut Value,
        old: Option<&Value>,
    ) -> Result<(), ApiError> {
        self.schemas
            .normalize(target.resource, target.version, object);
        let errors = self
            .schemas
            .check(target.resource, target.version, object, old);
        if errors.is_empty() {
            Ok(())
        } else {
            Err(ApiError::invalid(
                self.resource(target.resource),
                name,
                &errors,
            ))
        }
    }

    fn storage_form(&self, target: Target<'_>, object: &mut Value) {
        object["apiVersion"] = Value::from(self.resource(target.resource).storage_api_version());
    }

    fn part(&self, target: Target<'_>, subresource: Option<&str>) -> Part {
        if subresource == Some("status") {
            Part::Status
        } else if self.resource(target.resource).has_status {
            Part::Main
        } else {
            Part::Whole
        }
    }

    fn manager_key(manager: &str, part: Part) -> String {
        if part == Part::Status {
            format!("{manager}|status")
        } else {
            manager.to_string()
        }
    }
}
