//! A cluster as the suites stand one up: the fake API server (with its kubelet), the controller
//! and the web app running in-process under `deploy/`'s ServiceAccounts and RBAC, and Notebook
//! objects to give them.

use super::deploy::{CONTROLLER_USER, WEB_USER, client_as_deployed};
use crate::init_crypto;
use labforge_crds::Notebook;
use labforge_notebook_controller::BuilderConfig;
use labforge_notebook_controller::culler::CullingConfig;
use labforge_notebook_controller::service::ServeOptions;
use labforge_notebook_controller::service::serve;
use labforge_proxy::authz::TrustedHeader;
use labforge_tests::fake_kube::FakeApiServer;
use labforge_tests::fake_kube::FakeApiServerOptions;
use serde_json::Value;
use serde_json::json;
use tokio::task::JoinHandle;
pub fn notebook(namespace: &str, name: &str) -> Notebook {
    serde_json::from_value(json!({
        "apiVersion": "kubeflow.org/v1",
        "kind": "Notebook",
        "metadata": { "name": name, "namespace": namespace, "labels": { "team": "ml" } },
        "spec": { "template": { "spec": { "containers": [{
            "name": name,
            "image": "kubeflownotebookswg/jupyter-scipy:v1.9.0",
            "resources": { "limits": { "cpu": "1", "memory": "2Gi" } }
        }] } } }
    }))
    .unwrap()
}

pub fn serve_options(culling: CullingConfig, jupyter_base_url: Option<String>) -> ServeOptions {
    ServeOptions {
        builder: BuilderConfig::default(),
        culling,
        admin_addr: "127.0.0.1:0".parse().unwrap(),
        leader_election: None,
        jupyter_base_url,
        proxy_activity_url: None,
        resync: labforge_notebook_controller::controller::DEFAULT_RESYNC,
    }
}

/// Starts the controller loop in this process; aborted when the handle drops.
pub struct RunningController(JoinHandle<()>);

impl RunningController {
    /// The controller as `deploy/` runs it: under its ServiceAccount, with `deploy/`'s RBAC.
    pub async fn deployed(server: &FakeApiServer, options: ServeOptions) -> Self {
        let client = client_as_deployed(server, CONTROLLER_USER).await;
        Self::start(client, options)
    }

    pub fn start(client: kube::Client, options: ServeOptions) -> Self {
        RunningController(tokio::spawn(async move {
            if let Err(err) = serve(client, options).await {
                panic!("controller failed: {err}");
            }
        }))
    }
}

impl Drop for RunningController {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A fake cluster whose StatefulSets get pods that run (the fake's kubelet).
pub async fn fake_cluster() -> FakeApiServer {
    init_crypto();
    FakeApiServer::start(FakeApiServerOptions {
        kubelet: true,
        ..FakeApiServerOptions::default()
    })
    .await
    .unwrap()
}

pub struct Client {
    http: reqwest::Client,
    base: String,
}

/// `labforge web` in cluster mode on a loopback port, as `deploy/` runs it: under its
/// ServiceAccount with `deploy/`'s RBAC, the default spawner catalog.
pub struct WebApp {
    pub base: String,
    serving: tokio::task::JoinHandle<()>,
}

impl WebApp {
    pub async fn start(
        server: &FakeApiServer,
        save_registry: Option<&str>,
        notebook_domain: Option<&str>,
    ) -> WebApp {
        let options = labforge_web::cluster::WebOptions {
            header: TrustedHeader::default(),
            spawner: labforge_web::config::default_spawner("registry.example.com"),
            save_registry: save_registry.map(str::to_owned),
            notebook_domain: notebook_domain.map(str::to_owned),
            base_path: Default::default(),
        };
        Self::serve(server, options).await
    }

    /// The web app with `options`, otherwise as [`Self::start`].
    pub async fn serve(
        server: &FakeApiServer,
        options: labforge_web::cluster::WebOptions,
    ) -> WebApp {
        let app =
            labforge_web::cluster::router(client_as_deployed(server, WEB_USER).await, options)
                .await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let serving = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        WebApp { base, serving }
    }

    pub fn client(&self) -> Client {
        Client {
            http: reqwest::Client::new(),
            base: self.base.clone(),
        }
    }
}

impl Drop for WebApp {
    fn drop(&mut self) {
        self.serving.abort();
    }
}

impl Client {
    pub async fn call(
        &self,
        user: Option<&str>,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(user) = user {
            request = request.header("kubeflow-userid", user);
        }
        labforge_tests::send_json(request, body).await
    }

    pub async fn get(&self, user: Option<&str>, path: &str) -> (u16, Value) {
        self.call(user, reqwest::Method::GET, path, None).await
    }

    pub async fn post(&self, user: Option<&str>, path: &str, body: Value) -> (u16, Value) {
        self.call(user, reqwest::Method::POST, path, Some(body))
            .await
    }

    pub async fn patch(&self, user: Option<&str>, path: &str, body: Value) -> (u16, Value) {
        self.call(user, reqwest::Method::PATCH, path, Some(body))
            .await
    }
}
