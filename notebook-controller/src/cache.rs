//! Watch caches of everything a reconcile reads, so that a resync of an idle cluster sends no
//! request at all.
//!
//! Each kind is watched once: the same stream fills its store and triggers reconciles of the
//! Notebook it belongs to. A store can lag behind the API server (most often behind a write of
//! our own), so a child missing from its store is read from the server before it is created,
//! and until a store has its first full list, reads go to the server.

use futures::{FutureExt, Stream, StreamExt};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Event as CoreEvent, Pod, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use labforge_crds::VirtualService;
use labforge_crds::notebook::NOTEBOOK_NAME_LABEL;
use serde::de::DeserializeOwned;
use std::fmt::Debug;
use std::sync::Arc;

/// The stores reconciles read from.
#[derive(Clone)]
pub struct Caches {
    pub stateful_sets: Store<StatefulSet>,
    pub services: Store<Service>,
    pub virtual_services: Store<VirtualService>,
    pub network_policies: Store<NetworkPolicy>,
    /// Notebook pods (those with the `notebook-name` label).
    pub pods: Store<Pod>,
    /// Warning events of the whole cluster, re-emitted on the Notebook whose pod or StatefulSet
    /// they are about.
    pub warnings: Store<CoreEvent>,
}

/// The writing halves of [`Caches`], consumed by [`Feeds::new`].
pub struct CacheWriters {
    stateful_sets: reflector::store::Writer<StatefulSet>,
    services: reflector::store::Writer<Service>,
    virtual_services: reflector::store::Writer<VirtualService>,
    network_policies: reflector::store::Writer<NetworkPolicy>,
    pods: reflector::store::Writer<Pod>,
    warnings: reflector::store::Writer<CoreEvent>,
}

/// Empty caches and the writers that fill them.
pub fn caches() -> (Caches, CacheWriters) {
    let (stateful_sets, stateful_sets_writer) = reflector::store();
    let (services, services_writer) = reflector::store();
    let (virtual_services, virtual_services_writer) = reflector::store();
    let (network_policies, network_policies_writer) = reflector::store();
    let (pods, pods_writer) = reflector::store();
    let (warnings, warnings_writer) = reflector::store();
    (
        Caches {
            stateful_sets,
            services,
            virtual_services,
            network_policies,
            pods,
            warnings,
        },
        CacheWriters {
            stateful_sets: stateful_sets_writer,
            services: services_writer,
            virtual_services: virtual_services_writer,
            network_policies: network_policies_writer,
            pods: pods_writer,
            warnings: warnings_writer,
        },
    )
}

/// A watch stream that fills a store on its way to the controller.
pub type Feed<K> = std::pin::Pin<Box<dyn Stream<Item = Result<K, watcher::Error>> + Send>>;

/// One watch per kind, each filling its cache.
pub struct Feeds {
    pub stateful_sets: Feed<StatefulSet>,
    pub services: Feed<Service>,
    pub virtual_services: Feed<VirtualService>,
    pub network_policies: Feed<NetworkPolicy>,
    pub pods: Feed<Pod>,
    pub warnings: Feed<CoreEvent>,
}

impl Feeds {
    pub fn new(client: &Client, writers: CacheWriters) -> Self {
        // Children carry the label too, so the controller caches its own objects, not every
        // StatefulSet and Service of the cluster.
        let labelled = || watcher::Config::default().labels(NOTEBOOK_NAME_LABEL);
        Self {
            stateful_sets: feed(client, labelled(), writers.stateful_sets),
            services: feed(client, labelled(), writers.services),
            virtual_services: feed(client, labelled(), writers.virtual_services),
            network_policies: feed(client, labelled(), writers.network_policies),
            pods: feed(client, labelled(), writers.pods),
            warnings: feed(
                client,
                watcher::Config::default().fields("type=Warning"),
                writers.warnings,
            ),
        }
    }
}

fn feed<K>(client: &Client, config: watcher::Config, writer: reflector::store::Writer<K>) -> Feed<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    watcher(Api::<K>::all(client.clone()), config)
        .default_backoff()
        // Server-side apply's bookkeeping is most of an object's size and never read here.
        .modify(|object: &mut K| object.managed_fields_mut().clear())
        .reflect(writer)
        .touched_objects()
        .boxed()
}

/// Whether `store` holds a complete list (it is empty until the first list arrives).
pub fn is_ready<K>(store: &Store<K>) -> bool
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    matches!(store.wait_until_ready().now_or_never(), Some(Ok(())))
}

/// The cached object, if the cache is complete and has it.
pub fn cached<K>(store: &Store<K>, namespace: &str, name: &str) -> Option<Arc<K>>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    if !is_ready(store) {
        return None;
    }
    store.get(&ObjectRef::new(name).within(namespace))
}

/// Cached warning events about `kind` `name` in `namespace`, or `None` until the cache is
/// complete.
pub fn warnings_about(
    store: &Store<CoreEvent>,
    namespace: &str,
    kind: &str,
    name: &str,
) -> Option<Vec<Arc<CoreEvent>>> {
    is_ready(store).then(|| {
        store.state_filter(|event| {
            event.namespace().as_deref() == Some(namespace)
                && event.involved_object.kind.as_deref() == Some(kind)
                && event.involved_object.name.as_deref() == Some(name)
        })
    })
}
