//! Where VirtualServices come from, and the [`RouteStore`] that turns them into the live table.
//!
//! Every source (a Kubernetes watch, YAML files, the embedded mode's web app) feeds the same
//! store: it keeps the VirtualServices by namespace/name, rebuilds the whole [`RouteTable`] on a
//! change and swaps it in atomically (`arc-swap`), so requests never wait for an update and never
//! see half of one. A burst of watch events is applied as one rebuild.
//!
//! The watch reads one served version of `networking.istio.io` VirtualServices (v1, else v1beta1,
//! else v1alpha3): the API server stores each object once and serves it under every version, so
//! objects written as any of the three arrive through it.

use crate::activity::Activity;
use crate::heap_release::HeapRelease;
use crate::metrics::Metrics;
use crate::metrics::RefusalLabels;
use crate::routes::{CompiledVirtualService, Confinement, GatewayFilter, RouteTable, SharedNames};
use arc_swap::ArcSwap;
use futures::{FutureExt, StreamExt};
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher;
use labforge_crds::VirtualService;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

pub const ISTIO_GROUP: &str = "networking.istio.io";
/// Served versions in order of preference.
pub const VERSIONS: [&str; 3] = ["v1", "v1beta1", "v1alpha3"];

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("reading routes from {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("parsing routes in {}", path.display())]
    Yaml {
        path: PathBuf,
        #[source]
        source: serde_yaml_ng::Error,
    },
    #[error("{namespace}/{name}: not a VirtualService spec")]
    Spec {
        namespace: String,
        name: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("discovering the served versions of {ISTIO_GROUP}")]
    Discovery(#[source] kube::Error),
    #[error("the API server serves none of {ISTIO_GROUP} {VERSIONS:?}")]
    NoVersion,
}

/// A change to the known VirtualServices.
#[derive(Debug)]
pub enum Change {
    /// From a source profile owners write to (the Kubernetes watch, files): confined unless its
    /// namespace is trusted.
    Upsert(Box<VirtualService>),
    /// Registered by the embedded runtime itself ([`RouteStore::upsert`]): trusted.
    Register(Box<VirtualService>),
    Remove {
        namespace: String,
        name: String,
    },
    /// Everything known is replaced (a fresh list, a reloaded file).
    Replace(Listing),
}

/// A complete list of VirtualServices, compiled one by one as it arrives, so that the raw objects
/// of a large list are never all in memory at once beside the compiled routes: the peak heap
/// stays near what the routes need. Kept in arrival order until it replaces the store's records.
#[derive(Debug, Default)]
pub struct Listing(Vec<CompiledVirtualService>);

/// Compiled VirtualServices sorted by namespace and name, found by binary search. A sorted vector
/// rather than a map: its entry is the compiled VirtualService alone, whose owner already holds
/// the namespace and name, where a `BTreeMap` keyed by them adds a key to every entry and leaves
/// its nodes part-filled. An insert moves the entries after it, each a few words: less than the
/// table rebuild every change is followed by.
#[derive(Debug, Default)]
struct Records(Vec<CompiledVirtualService>);

impl Records {
    fn position(&self, namespace: &str, name: &str) -> Result<usize, usize> {
        self.0
            .binary_search_by(|known| known.namespace_and_name().cmp(&(namespace, name)))
    }

    fn insert(&mut self, compiled: CompiledVirtualService) {
        let (namespace, name) = compiled.namespace_and_name();
        match self.position(namespace, name) {
            Ok(known) => self.0[known] = compiled,
            Err(place) => self.0.insert(place, compiled),
        }
    }

    fn remove(&mut self, namespace: &str, name: &str) {
        if let Ok(known) = self.position(namespace, name) {
            self.0.remove(known);
        }
    }

    /// The records of `listing`; of two with the same namespace and name, the later one.
    fn from_listing(Listing(mut list): Listing) -> Self {
        // Stable: equal ones stay in arrival order, and the later one is kept below.
        list.sort_by(|a, b| a.namespace_and_name().cmp(&b.namespace_and_name()));
        list.dedup_by(|later, kept| {
            let same = later.namespace_and_name() == kept.namespace_and_name();
            if same {
                std::mem::swap(later, kept);
            }
            same
        });
        list.shrink_to_fit();
        Records(list)
    }
}

/// The known VirtualServices and the table built from them.
pub struct RouteStore {
    table: ArcSwap<RouteTable>,
    /// Compiled once when they arrive; the raw objects are not kept.
    records: Mutex<Records>,
    gateway: GatewayFilter,
    /// What VirtualServices from the watch and files may do ([`Change::Upsert`]).
    confinement: Confinement,
    activity: Arc<Activity>,
    names: SharedNames,
    metrics: Arc<Metrics>,
    /// Asked to give memory back after a complete list: its raw objects were freed between the
    /// compiled routes.
    heap: Arc<HeapRelease>,
    /// Set once a source delivered its first complete list.
    ready: AtomicBool,
}

impl RouteStore {
    pub fn new(
        gateway: GatewayFilter,
        confinement: Confinement,
        activity: Arc<Activity>,
        metrics: Arc<Metrics>,
        heap: Arc<HeapRelease>,
    ) -> Self {
        Self {
            table: ArcSwap::from_pointee(RouteTable::default()),
            records: Mutex::default(),
            gateway,
            confinement,
            activity,
            names: SharedNames::default(),
            metrics,
            heap,
            ready: AtomicBool::new(false),
        }
    }

    /// The current table (a cheap, lock-free snapshot).
    pub fn table(&self) -> arc_swap::Guard<Arc<RouteTable>> {
        self.table.load()
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// Adds or replaces a VirtualService the caller vouches for (the embedded runtime's own
    /// routes): not confined to its namespace.
    pub fn upsert(&self, vs: VirtualService) {
        self.apply([Change::Register(Box::new(vs))]);
    }

    pub fn remove(&self, namespace: &str, name: &str) {
        self.apply([Change::Remove {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        }]);
    }

    /// Replaces everything known with VirtualServices the caller vouches for, as
    /// [`Self::upsert`] does.
    pub fn replace_all(&self, list: Vec<VirtualService>) {
        let mut listing = Listing::default();
        for vs in list {
            if let Some(compiled) = self.compile(&vs, true) {
                listing.0.push(compiled);
            }
        }
        self.apply([Change::Replace(listing)]);
    }

    /// Compiles `vs`, from a source profile owners write to (confined unless its namespace is
    /// trusted), into a listing that will replace everything known.
    pub fn add_to(&self, listing: &mut Listing, vs: &VirtualService) {
        if let Some(compiled) = self.compile(vs, false) {
            listing.0.push(compiled);
        }
    }

    /// Applies changes and swaps in one rebuilt table.
    pub fn apply(&self, changes: impl IntoIterator<Item = Change>) {
        let mut records = self.records.lock().unwrap_or_else(PoisonError::into_inner);
        let mut complete_list = false;
        for change in changes {
            match change {
                Change::Upsert(vs) => self.update(&mut records, &vs, false),
                Change::Register(vs) => self.update(&mut records, &vs, true),
                Change::Remove { namespace, name } => records.remove(&namespace, &name),
                Change::Replace(listing) => {
                    *records = Records::from_listing(listing);
                    self.ready.store(true, Ordering::Release);
                    complete_list = true;
                }
            }
        }
        let table = RouteTable::from_compiled(&records.0);
        let keys: BTreeSet<&str> = records.0.iter().map(|r| r.key()).collect();
        self.activity.retain(&keys);
        drop(keys);
        drop(records);
        self.names.forget_unused();
        self.metrics.routes.set(table.rule_count() as i64);
        self.metrics
            .virtual_services
            .set(table.virtual_service_count() as i64);
        self.metrics.table_updates.inc();
        tracing::debug!(rules = table.rule_count(), "route table swapped");
        self.table.store(Arc::new(table));
        if complete_list {
            self.heap.request();
        }
    }

    /// Puts `vs` in `records`, or takes its earlier version out when none of it can be served.
    fn update(&self, records: &mut Records, vs: &VirtualService, trusted: bool) {
        match self.compile(vs, trusted) {
            Some(compiled) => records.insert(compiled),
            None => records.remove(
                vs.metadata.namespace.as_deref().unwrap_or_default(),
                vs.metadata.name.as_deref().unwrap_or_default(),
            ),
        }
    }

    fn compile(&self, vs: &VirtualService, trusted: bool) -> Option<CompiledVirtualService> {
        let confinement = (!trusted).then_some(&self.confinement);
        let (compiled, skipped) = CompiledVirtualService::compile(
            vs,
            &self.gateway,
            confinement,
            &self.activity,
            &self.names,
        );
        for s in &skipped {
            match s.refused {
                Some(refusal) => {
                    tracing::warn!(namespace = %s.namespace, name = %s.name, reason = %s.reason, refused = refusal.label(), "VirtualService rule refused");
                    self.metrics
                        .rules_refused
                        .get_or_create(&RefusalLabels {
                            reason: refusal.label(),
                        })
                        .inc();
                }
                None => {
                    tracing::warn!(namespace = %s.namespace, name = %s.name, reason = %s.reason, "VirtualService rule skipped")
                }
            }
        }
        compiled
    }
}

/// A VirtualService of any served version, from its JSON form.
pub fn from_dynamic(object: DynamicObject) -> Result<VirtualService, SourceError> {
    let namespace = object.metadata.namespace.clone().unwrap_or_default();
    let name = object.metadata.name.clone().unwrap_or_default();
    let spec = object
        .data
        .get("spec")
        .cloned()
        .unwrap_or(serde_json::Value::Object(Default::default()));
    let spec = serde_json::from_value(spec).map_err(|source| SourceError::Spec {
        namespace,
        name: name.clone(),
        source,
    })?;
    let mut vs = VirtualService::new(&name, spec);
    vs.metadata = object.metadata;
    Ok(vs)
}

/// Every VirtualService in multi-document YAML files (other kinds are ignored), passed to `each`
/// as it is read.
pub fn load_files(
    paths: &[PathBuf],
    mut each: impl FnMut(VirtualService),
) -> Result<(), SourceError> {
    use serde::Deserialize;
    for path in paths {
        let text = std::fs::read_to_string(path).map_err(|source| SourceError::Read {
            path: path.clone(),
            source,
        })?;
        for document in serde_yaml_ng::Deserializer::from_str(&text) {
            let value =
                serde_json::Value::deserialize(document).map_err(|source| SourceError::Yaml {
                    path: path.clone(),
                    source,
                })?;
            if value.is_null() || value["kind"] != "VirtualService" {
                continue;
            }
            let object: DynamicObject =
                serde_json::from_value(value).map_err(|source| SourceError::Spec {
                    namespace: String::new(),
                    name: path_name(path),
                    source,
                })?;
            each(from_dynamic(object)?);
        }
    }
    Ok(())
}

/// The routes of YAML files, compiled into a listing; nothing when any file is unusable.
pub fn load_listing(store: &RouteStore, paths: &[PathBuf]) -> Result<Listing, SourceError> {
    let mut listing = Listing::default();
    load_files(paths, |vs| store.add_to(&mut listing, &vs))?;
    Ok(listing)
}

fn path_name(path: &Path) -> String {
    path.display().to_string()
}

/// The version the watch uses: the most preferred one the server serves.
pub async fn served_version(client: &kube::Client) -> Result<&'static str, SourceError> {
    let group = kube::discovery::group(client, ISTIO_GROUP)
        .await
        .map_err(SourceError::Discovery)?;
    let served: Vec<String> = group.versions().map(str::to_owned).collect();
    VERSIONS
        .into_iter()
        .find(|v| served.iter().any(|s| s == v))
        .ok_or(SourceError::NoVersion)
}

/// Watches VirtualServices in every namespace and keeps `store` current, forever. Discovery is
/// retried until the group is served; watch errors back off and re-list (kube-runtime).
pub async fn watch_kubernetes(client: kube::Client, store: Arc<RouteStore>) {
    let version = loop {
        match served_version(&client).await {
            Ok(version) => break version,
            Err(err) => {
                tracing::warn!(error = %err, "VirtualService discovery; retrying");
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        }
    };
    tracing::info!(version, "watching VirtualServices");
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(ISTIO_GROUP, version, "VirtualService"),
        "virtualservices",
    );
    let api: kube::Api<DynamicObject> = kube::Api::all_with(client, &resource);
    let stream = watcher(api, watcher::Config::default()).default_backoff();
    futures::pin_mut!(stream);
    let mut listing: Option<Listing> = None;
    while let Some(first) = stream.next().await {
        // Take whatever else is already waiting, so a burst costs one rebuild.
        let mut batch = vec![first];
        while batch.len() < 4096 {
            match stream.next().now_or_never() {
                Some(Some(event)) => batch.push(event),
                _ => break,
            }
        }
        let mut changes = Vec::new();
        for event in batch {
            match event {
                Ok(watcher::Event::Init) => listing = Some(Listing::default()),
                Ok(watcher::Event::InitApply(object)) => {
                    if let (Some(listing), Some(vs)) = (listing.as_mut(), convert(object)) {
                        store.add_to(listing, &vs);
                    }
                }
                Ok(watcher::Event::InitDone) => {
                    changes.push(Change::Replace(listing.take().unwrap_or_default()));
                }
                Ok(watcher::Event::Apply(object)) => changes.push(applied(object)),
                Ok(watcher::Event::Delete(object)) => changes.push(Change::Remove {
                    namespace: object.metadata.namespace.unwrap_or_default(),
                    name: object.metadata.name.unwrap_or_default(),
                }),
                Err(err) => tracing::warn!(error = %err, "VirtualService watch"),
            }
        }
        if !changes.is_empty() {
            store.apply(changes);
        }
    }
}

/// The change a created or updated VirtualService makes. One this proxy cannot read takes its
/// earlier version out of the table: serving the rules its owner replaced would be worse than
/// serving none.
fn applied(object: DynamicObject) -> Change {
    let namespace = object.metadata.namespace.clone().unwrap_or_default();
    let name = object.metadata.name.clone().unwrap_or_default();
    match from_dynamic(object) {
        Ok(vs) => Change::Upsert(Box::new(vs)),
        Err(err) => {
            tracing::warn!(error = %err, %namespace, %name, "VirtualService not served");
            Change::Remove { namespace, name }
        }
    }
}

fn convert(object: DynamicObject) -> Option<VirtualService> {
    from_dynamic(object)
        .inspect_err(|err| tracing::warn!(error = %err, "VirtualService ignored"))
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routes::RequestView;
    use http::{HeaderMap, Method};

    /// A store that trusts namespace `ns`, where these tests' routes are.
    fn store() -> RouteStore {
        let mut registry = prometheus_client::registry::Registry::default();
        RouteStore::new(
            GatewayFilter(Some("kubeflow/kubeflow-gateway".into())),
            Confinement {
                trusted_namespaces: ["ns".to_owned()].into(),
                ..Confinement::default()
            },
            Arc::default(),
            Arc::new(Metrics::register(&mut registry)),
            Arc::default(),
        )
    }

    fn routed(store: &RouteStore, path: &str) -> Option<String> {
        let headers = HeaderMap::new();
        let table = store.table();
        let found = table.lookup(&RequestView {
            host: "x",
            authority: "x",
            scheme: "http",
            query: None,
            path,
            method: &Method::GET,
            headers: &headers,
        })?;
        Some(found.rule.destinations[0].authority.to_string())
    }

    #[test]
    fn an_update_that_cannot_be_read_stops_the_old_rules() {
        let object = |spec: serde_json::Value| -> DynamicObject {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "networking.istio.io/v1",
                "kind": "VirtualService",
                "metadata": {"name": "vs", "namespace": "ns"},
                "spec": spec
            }))
            .unwrap()
        };
        let store = store();
        store.apply([Change::Replace(Listing::default())]);
        store.apply([applied(object(serde_json::json!({
            "hosts": ["*"], "gateways": ["kubeflow/kubeflow-gateway"],
            "http": [{"match": [{"uri": {"prefix": "/r/"}}], "route": [{"destination": {"host": "up"}}]}]
        })))]);
        assert_eq!(routed(&store, "/r/x").as_deref(), Some("up:80"));
        // Rules in a shape this proxy does not read: the earlier ones are not served either.
        store.apply([applied(object(serde_json::json!({
            "hosts": ["*"], "gateways": ["kubeflow/kubeflow-gateway"],
            "http": [{"match": [{"uri": {"prefix": "/r/", "suffix": "x"}}], "route": "up"}]
        })))]);
        assert_eq!(routed(&store, "/r/x"), None);
    }

    #[test]
    fn files_of_every_version_load_and_other_kinds_are_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("routes.yaml");
        let mut yaml = String::new();
        for (i, version) in VERSIONS.iter().enumerate() {
            yaml.push_str(&format!(
                "---\napiVersion: networking.istio.io/{version}\nkind: VirtualService\n\
                 metadata: {{name: vs{i}, namespace: ns}}\n\
                 spec:\n  hosts: ['*']\n  gateways: [kubeflow/kubeflow-gateway]\n  http:\n\
                 \x20 - match: [{{uri: {{prefix: /r{i}/}}}}]\n    route: [{{destination: {{host: up{i}}}}}]\n"
            ));
        }
        yaml.push_str("---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n");
        std::fs::write(&path, yaml).unwrap();
        let mut loaded = 0;
        load_files(std::slice::from_ref(&path), |_| loaded += 1).unwrap();
        assert_eq!(loaded, 3);
        let store = store();
        assert!(!store.is_ready());
        let listing = load_listing(&store, &[path]).unwrap();
        assert!(!store.is_ready(), "a listing is applied only when complete");
        store.apply([Change::Replace(listing)]);
        assert!(store.is_ready());
        assert_eq!(routed(&store, "/r2/x").as_deref(), Some("up2:80"));
        store.remove("ns", "vs2");
        assert_eq!(routed(&store, "/r2/x"), None);
        assert_eq!(routed(&store, "/r0/x").as_deref(), Some("up0:80"));
    }

    #[test]
    fn the_later_of_two_listed_versions_wins_and_changes_find_their_record() {
        let vs = |name: &str, prefix: &str, host: &str| -> VirtualService {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "networking.istio.io/v1",
                "kind": "VirtualService",
                "metadata": {"name": name, "namespace": "ns"},
                "spec": {
                    "hosts": ["*"], "gateways": ["kubeflow/kubeflow-gateway"],
                    "http": [{"match": [{"uri": {"prefix": prefix}}],
                              "route": [{"destination": {"host": host}}]}]
                }
            }))
            .unwrap()
        };
        let store = store();
        // Out of order, and `b` twice: a list read from two files that both hold it.
        store.replace_all(vec![
            vs("c", "/c/", "c1"),
            vs("b", "/b/", "b1"),
            vs("a", "/a/", "a1"),
            vs("b", "/b/", "b2"),
        ]);
        assert_eq!(routed(&store, "/b/x").as_deref(), Some("b2:80"));
        assert_eq!(store.table().virtual_service_count(), 3);
        // An upsert replaces its record, a new one goes between the others, a removal takes only
        // its own.
        store.upsert(vs("a", "/a/", "a2"));
        store.upsert(vs("bb", "/bb/", "bb1"));
        store.remove("ns", "b");
        store.remove("ns", "absent");
        assert_eq!(routed(&store, "/a/x").as_deref(), Some("a2:80"));
        assert_eq!(routed(&store, "/bb/x").as_deref(), Some("bb1:80"));
        assert_eq!(routed(&store, "/b/x"), None);
        assert_eq!(routed(&store, "/c/x").as_deref(), Some("c1:80"));
        assert_eq!(store.table().virtual_service_count(), 3);
    }

    #[test]
    fn watched_routes_are_confined_and_the_runtimes_own_are_not() {
        let vs = |namespace: &str, name: &str, host: &str| -> VirtualService {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "networking.istio.io/v1",
                "kind": "VirtualService",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {
                    "hosts": ["*"], "gateways": ["kubeflow/kubeflow-gateway"],
                    "http": [{"match": [{"uri": {"prefix": format!("/notebook/{namespace}/{name}/")}}],
                              "route": [{"destination": {"host": host}}]}]
                }
            }))
            .unwrap()
        };
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = Arc::new(Metrics::register(&mut registry));
        let store = RouteStore::new(
            GatewayFilter(Some("kubeflow/kubeflow-gateway".into())),
            Confinement::default(),
            Arc::default(),
            metrics.clone(),
            Arc::default(),
        );
        // From the watch: bob's route to an IP is refused, counted, and the rest still served.
        let mut listing = Listing::default();
        store.add_to(&mut listing, &vs("bob", "ip", "10.0.0.7"));
        store.add_to(&mut listing, &vs("bob", "lab", "lab"));
        store.apply([Change::Replace(listing)]);
        assert_eq!(routed(&store, "/notebook/bob/ip/x"), None);
        // A short name is bob's own Service, not one of the proxy's namespace.
        assert_eq!(
            routed(&store, "/notebook/bob/lab/x").as_deref(),
            Some("lab.bob.svc.cluster.local:80")
        );
        store.apply([Change::Upsert(Box::new(vs("bob", "other", "web.kubeflow")))]);
        assert_eq!(routed(&store, "/notebook/bob/other/x"), None);
        let refused = |reason| {
            metrics
                .rules_refused
                .get_or_create(&RefusalLabels { reason })
                .get()
        };
        assert_eq!(refused("destination"), 2);
        // The embedded runtime's own route, to a loopback port, is served as it is.
        store.upsert(vs("alice", "lab", "127.0.0.1"));
        assert_eq!(
            routed(&store, "/notebook/alice/lab/x").as_deref(),
            Some("127.0.0.1:80")
        );
        assert_eq!(refused("destination"), 2);
    }
}
