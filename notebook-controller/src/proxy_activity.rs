//! The proxy's per-route activity as a culling source, read from every replica.
//!
//! Each proxy replica counts only the requests it serves, so asking one replica through its
//! Service would see a share of a notebook's traffic and cull notebooks that are in use through
//! another. When the configured URL names a Service
//! (`http://<service>.<namespace>[.svc[.<domain>]]:<port>`), the replicas are the ready endpoints
//! of its EndpointSlices, at the endpoint port behind the URL's Service port; all of them are
//! asked and the newest activity wins. Any replica that cannot answer makes the answer an error
//! rather than part of the traffic: the culler then decides without this source for that pass,
//! on its other sources and the last activity it recorded, as it does for a source that does not
//! apply (Jupyter's API on a code-server notebook). Any other URL (embedded mode, a single
//! address) is asked as it is.

use crate::culler::{ActivityError, ActivitySource};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use labforge_crds::Notebook;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How long a list of replicas is used before the EndpointSlices are read again: a culling
/// round over 1,000 notebooks reads them once, and a new replica is asked within seconds.
const REPLICAS_FOR: Duration = Duration::from_secs(10);

/// The proxy's view: the last successful response or websocket traffic on the notebook's route,
/// read from the proxy's admin endpoint `<base>/activity/<namespace>/<name>` of every replica.
/// For servers without Jupyter's API (code-server, RStudio) it is the only source; for Jupyter it
/// also sees plain page and file traffic. The culler takes the newest of all sources.
pub struct ProxyActivity {
    http: reqwest::Client,
    /// The proxy's admin address, e.g. `http://labforge-proxy.kubeflow:8081`.
    base_url: String,
    /// The Service `base_url` names, when it names one and a client can look it up.
    service: Option<ServiceReplicas>,
}

/// Finds the replicas behind a Service.
struct ServiceReplicas {
    client: kube::Client,
    namespace: String,
    name: String,
    scheme: String,
    port: u16,
    known: Mutex<Option<(Instant, Arc<[String]>)>>,
}

impl ProxyActivity {
    /// Asks `base_url` as it is: one proxy (embedded mode, tests).
    pub fn new(base_url: impl Into<String>) -> Self {
        Self {
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .unwrap_or_default(),
            base_url: base_url.into().trim_end_matches('/').to_owned(),
            service: None,
        }
    }

    /// Asks every ready replica of the Service `base_url` names, found with `client`; a URL that
    /// names no Service is asked as it is.
    pub fn in_cluster(base_url: impl Into<String>, client: kube::Client) -> Self {
        let mut activity = Self::new(base_url);
        activity.service =
            service_of(&activity.base_url).map(|(namespace, name, scheme, port)| ServiceReplicas {
                client,
                namespace,
                name,
                scheme,
                port,
                known: Mutex::new(None),
            });
        activity
    }

    /// Base URLs of the replicas to ask.
    async fn replicas(&self) -> Result<Arc<[String]>, String> {
        match &self.service {
            None => Ok(Arc::from([self.base_url.clone()])),
            Some(service) => service.replicas(&self.base_url).await,
        }
    }

    async fn ask(
        &self,
        replica: &str,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Timestamp>, String> {
        let url = format!("{replica}/activity/{namespace}/{name}");
        let response = self
            .http
            .get(&url)
            .send()
            .await
            .map_err(|e| format!("GET {url}: {e}"))?;
        if response.status() == reqwest::StatusCode::NOT_FOUND {
            // The proxy has no route for it (yet): nothing to say.
            return Ok(None);
        }
        if !response.status().is_success() {
            return Err(format!("GET {url}: HTTP {}", response.status()));
        }
        let body: serde_json::Value = response
            .json()
            .await
            .map_err(|e| format!("GET {url}: {e}"))?;
        match &body["last_activity"] {
            serde_json::Value::Null => Ok(None),
            value => value
                .as_str()
                .and_then(|t| t.parse().ok())
                .map(Some)
                .ok_or_else(|| format!("GET {url}: last_activity {value} is no timestamp")),
        }
    }
}

#[async_trait::async_trait]
impl ActivitySource for ProxyActivity {
    async fn last_activity(&self, notebook: &Notebook) -> Result<Option<Timestamp>, ActivityError> {
        let (namespace, name) = (
            notebook.namespace().unwrap_or_default(),
            notebook.name_any(),
        );
        let error = |message: String| ActivityError {
            notebook: name.clone(),
            message,
        };
        let replicas = self.replicas().await.map_err(error)?;
        let answers = futures::future::join_all(
            replicas
                .iter()
                .map(|replica| self.ask(replica, &namespace, &name)),
        )
        .await;
        let mut newest = None;
        for answer in answers {
            newest = newest.max(answer.map_err(error)?);
        }
        Ok(newest)
    }
}

impl ServiceReplicas {
    async fn replicas(&self, base_url: &str) -> Result<Arc<[String]>, String> {
        if let Some((read, replicas)) = &*self.known.lock().unwrap_or_else(PoisonError::into_inner)
            && read.elapsed() < REPLICAS_FOR
        {
            return Ok(replicas.clone());
        }
        let replicas = self.read(base_url).await?;
        *self.known.lock().unwrap_or_else(PoisonError::into_inner) =
            Some((Instant::now(), replicas.clone()));
        Ok(replicas)
    }

    async fn read(&self, base_url: &str) -> Result<Arc<[String]>, String> {
        let (namespace, name) = (&self.namespace, &self.name);
        let services: Api<Service> = Api::namespaced(self.client.clone(), namespace);
        let Some(service) = services
            .get_opt(name)
            .await
            .map_err(|e| format!("reading Service {namespace}/{name}: {e}"))?
        else {
            // Not a Service after all (an outside name that looks like one): ask the URL.
            return Ok(Arc::from([base_url.to_owned()]));
        };
        let port_name = service
            .spec
            .and_then(|spec| spec.ports)
            .unwrap_or_default()
            .into_iter()
            .find(|p| p.port == i32::from(self.port))
            .map(|p| p.name)
            .ok_or_else(|| format!("Service {namespace}/{name} has no port {}", self.port))?;
        let slices: Api<EndpointSlice> = Api::namespaced(self.client.clone(), namespace);
        let listed = slices
            .list(&ListParams::default().labels(&format!("kubernetes.io/service-name={name}")))
            .await
            .map_err(|e| format!("listing the EndpointSlices of {namespace}/{name}: {e}"))?;
        let replicas: Vec<String> = listed
            .items
            .iter()
            .flat_map(|slice| replica_urls(slice, port_name.as_deref(), &self.scheme))
            .collect();
        if replicas.is_empty() {
            return Err(format!("Service {namespace}/{name} has no ready endpoint"));
        }
        Ok(replicas.into())
    }
}

/// `scheme://address:port` of each ready endpoint of `slice`, at its port named `port_name`
/// (a Service port and its endpoints' port share the name; an unnamed port is the only one).
fn replica_urls(slice: &EndpointSlice, port_name: Option<&str>, scheme: &str) -> Vec<String> {
    let Some(port) = slice
        .ports
        .iter()
        .flatten()
        // An unnamed port reads as `""` in a slice and as no name in its Service.
        .find(|p| p.name.as_deref().unwrap_or("") == port_name.unwrap_or(""))
        .and_then(|p| p.port)
    else {
        return Vec::new();
    };
    slice
        .endpoints
        .iter()
        // An unknown readiness counts as ready (the API's rule); a terminating replica is not.
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) != Some(false))
        // The addresses of one endpoint are the same replica: the first is used (the API's rule).
        .filter_map(|e| e.addresses.first())
        .map(|address| match address.parse::<IpAddr>() {
            Ok(IpAddr::V6(v6)) => format!("{scheme}://[{v6}]:{port}"),
            _ => format!("{scheme}://{address}:{port}"),
        })
        .collect()
}

/// (namespace, name, scheme, port) of the Service a URL's host names: `<service>.<namespace>`,
/// `<service>.<namespace>.svc` or `<service>.<namespace>.svc.<domain>`.
fn service_of(base_url: &str) -> Option<(String, String, String, u16)> {
    let url = reqwest::Url::parse(base_url).ok()?;
    let port = url.port_or_known_default()?;
    let host = url.domain()?;
    let labels: Vec<&str> = host.split('.').collect();
    let (name, namespace) = match labels.as_slice() {
        [name, namespace] | [name, namespace, "svc", ..] => (*name, *namespace),
        _ => return None,
    };
    Some((
        namespace.to_owned(),
        name.to_owned(),
        url.scheme().to_owned(),
        port,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_that_name_a_service_are_read_as_one() {
        let service = |url: &str| {
            service_of(url).map(|(ns, name, scheme, port)| format!("{scheme} {ns}/{name}:{port}"))
        };
        assert_eq!(
            service("http://labforge-proxy.kubeflow:8081").as_deref(),
            Some("http kubeflow/labforge-proxy:8081")
        );
        assert_eq!(
            service("http://labforge-proxy.kubeflow.svc.cluster.local:8081/").as_deref(),
            Some("http kubeflow/labforge-proxy:8081")
        );
        assert_eq!(
            service("http://labforge-proxy.kubeflow.svc").as_deref(),
            Some("http kubeflow/labforge-proxy:80")
        );
        for direct in [
            "http://127.0.0.1:8081",
            "http://[::1]:8081",
            "http://localhost:8081",
            "http://proxy.example.org:8081",
        ] {
            assert_eq!(service(direct), None, "{direct}");
        }
    }

    #[test]
    fn ready_endpoints_at_the_named_port_are_the_replicas() {
        let slice: EndpointSlice = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "labforge-proxy-x1", "namespace": "kubeflow"},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080}, {"name": "http-admin", "port": 9091}],
            "endpoints": [
                {"addresses": ["10.0.0.1"], "conditions": {"ready": true}},
                {"addresses": ["10.0.0.2", "10.0.0.9"]},
                {"addresses": ["10.0.0.3"], "conditions": {"ready": false, "terminating": true}},
            ],
        }))
        .unwrap();
        assert_eq!(
            replica_urls(&slice, Some("http-admin"), "http"),
            ["http://10.0.0.1:9091", "http://10.0.0.2:9091"]
        );
        assert!(replica_urls(&slice, Some("metrics"), "http").is_empty());
        let v6: EndpointSlice = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "v6"},
            "addressType": "IPv6",
            "ports": [{"name": "", "port": 9091}],
            "endpoints": [{"addresses": ["fd00::1"]}],
        }))
        .unwrap();
        assert_eq!(replica_urls(&v6, None, "http"), ["http://[fd00::1]:9091"]);
    }
}
