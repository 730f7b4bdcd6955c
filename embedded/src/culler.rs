//! Culling in the embedded mode: the controller's loop
//! ([`labforge_notebook_controller::culler::cull_forever`]) over the store and the runtime.
//!
//! Running means the runtime published the notebook's port; activity is Jupyter's, asked on that
//! port with the notebook's secret, and the proxy's, read in-process. A culled notebook gets
//! Kubeflow's stop annotation, an event, and the web app's mark that the culler stopped it, so
//! users see "culled" rather than "stopped". The store answers at once, so a pass never ends
//! early: a write to a notebook deleted meanwhile is only logged.

use crate::runtime::Runtime;
use crate::store::{Store, StoreError};
use jiff::Timestamp;
use labforge_crds::Notebook;
use labforge_crds::notebook::{LAST_ACTIVITY_ANNOTATION, STOP_ANNOTATION};
use labforge_notebook_controller::culler::{ActivitySource, CullPlatform, JupyterActivity};
use labforge_proxy::activity::Activity;
use labforge_proxy::routes::activity_key;
use labforge_web::api::STOPPED_BY_ANNOTATION;
use std::convert::Infallible;
use std::sync::Arc;

/// The embedded mode's [`CullPlatform`].
pub struct StoreCulling {
    store: Arc<Store>,
    runtime: Arc<Runtime>,
    /// The proxy's per-route activity.
    activity: Arc<Activity>,
    jupyter: JupyterActivity,
}

impl StoreCulling {
    pub fn new(store: Arc<Store>, runtime: Arc<Runtime>, activity: Arc<Activity>) -> Self {
        let ports = runtime.clone();
        let secrets = runtime.secrets.clone();
        let jupyter = JupyterActivity::new(move |ns, name| {
            format!(
                "http://{}:{}{}",
                crate::runtime::PUBLISH_ADDRESS,
                ports.port_of(ns, name).unwrap_or(0),
                labforge_notebook_controller::builders::route_prefix(ns, name)
            )
        })
        .with_authorization(move |ns, name| format!("token {}", secrets.of(ns, name)));
        Self {
            store,
            runtime,
            activity,
            jupyter,
        }
    }
}

/// The notebook's namespace and name, as the store keys it.
fn key(notebook: &Notebook) -> (String, String) {
    (
        notebook.metadata.namespace.clone().unwrap_or_default(),
        notebook.metadata.name.clone().unwrap_or_default(),
    )
}

/// A failed write is a notebook deleted since the pass listed it: nothing left to cull.
fn deleted_meanwhile(result: Result<Notebook, StoreError>) {
    if let Err(err) = result {
        tracing::debug!(error = %err, "culling a notebook deleted meanwhile");
    }
}

#[async_trait::async_trait]
impl CullPlatform for StoreCulling {
    type Error = Infallible;

    async fn notebooks(&self) -> Result<Vec<Notebook>, Infallible> {
        Ok(self.store.list(None))
    }

    fn is_running(&self, notebook: &Notebook) -> bool {
        let (ns, name) = key(notebook);
        self.runtime.port_of(&ns, &name).is_some()
    }

    async fn observed_activity(&self, notebook: &Notebook) -> Option<Timestamp> {
        let (ns, name) = key(notebook);
        // A server that does not answer says nothing; the proxy's traffic still counts.
        let from_jupyter = self.jupyter.last_activity(notebook).await.ok().flatten();
        from_jupyter.max(self.activity.get(&activity_key(&ns, &name)))
    }

    async fn record_activity(
        &self,
        notebook: &Notebook,
        last: Timestamp,
    ) -> Result<(), Infallible> {
        let (ns, name) = key(notebook);
        deleted_meanwhile(self.store.update(&ns, &name, |nb| {
            nb.metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert(LAST_ACTIVITY_ANNOTATION.into(), last.to_string());
        }));
        Ok(())
    }

    async fn stop_culled(
        &self,
        notebook: &Notebook,
        idle_since: Timestamp,
        now: Timestamp,
    ) -> Result<(), Infallible> {
        let (ns, name) = key(notebook);
        tracing::info!(notebook = %format!("{ns}/{name}"), %idle_since, "culling idle notebook");
        self.store.record_event(
            &ns,
            &name,
            "Normal",
            "Culled",
            &format!("stopped: idle since {idle_since}"),
        );
        // The last activity stays for the web app's lists to show; its Start renews it.
        deleted_meanwhile(self.store.update(&ns, &name, |nb| {
            let annotations = nb.metadata.annotations.get_or_insert_with(Default::default);
            annotations.insert(STOP_ANNOTATION.into(), now.to_string());
            annotations.insert(STOPPED_BY_ANNOTATION.into(), "culler".into());
        }));
        Ok(())
    }
}
