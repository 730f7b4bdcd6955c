//! The binaries run with the Deployments' arguments against the fake API server: the proxy
//! serves notebooks first and the web app at the root, with Istio and without.

use crate::deploy::deployment_checks::{Invocation, deployment_container, flag_value};
use crate::deploy::{NO_ISTIO_CRD, WEB_ROUTE, documents, find};
use crate::support::deploy::{PROXY_USER, WEB_USER, build, deploy_dir, identity, strings};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use labforge_proxy::activity::Activity;
use labforge_proxy::authz::{Decision, Identity, StaticAccess, authorize};
use labforge_proxy::routes::{GatewayFilter, RequestView, RouteTable};
use labforge_tests::fake_kube::{FakeApiServer, FakeApiServerOptions};
use serde::Deserialize;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The VirtualService the controller writes for `crds/samples/jupyterlab.yaml` (alice/jupyter),
/// rendered by the binary with the controller Deployment's environment.
pub(super) fn rendered_notebook_virtual_service() -> Value {
    let base = build(&deploy_dir());
    let controller = deployment_container(&base, "labforge-notebook-controller");
    let mut render = crate::labforge();
    render
        .args(["render", "-f"])
        .arg(labforge_tests::repo_root().join("crds/samples/jupyterlab.yaml"))
        .env_remove("ISTIO_GATEWAY")
        .env_remove("ISTIO_HOST")
        .env_remove("CLUSTER_DOMAIN");
    for env in controller["env"].as_array().unwrap() {
        if let Some(value) = env["value"].as_str() {
            render.env(env["name"].as_str().unwrap(), value);
        }
    }
    let output = render.output().unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_yaml_ng::Deserializer::from_str(std::str::from_utf8(&output.stdout).unwrap())
        .map(|doc| Value::deserialize(doc).unwrap())
        .find(|d| d["kind"] == "VirtualService")
        .expect("render yields a VirtualService")
}

/// The proxy Deployment's route table, from the web app's route and a notebook's: the notebook's
/// prefix wins over `/` whichever is older, the web app is open to every signed-in user, a notebook
/// is guarded by its namespace, which RBAC decides (the Deployment names no one).
#[tokio::test]
pub(super) async fn the_proxy_serves_notebooks_first_and_the_web_app_at_root() {
    let base = build(&deploy_dir());
    let proxy = deployment_container(&base, "labforge-proxy");
    let args = strings(&proxy["args"]);
    let values = |flag: &str| -> Vec<String> {
        args.windows(2)
            .filter(|w| w[0] == flag)
            .map(|w| w[1].clone())
            .collect()
    };
    let gateway = GatewayFilter(flag_value(proxy, "--gateway"));
    assert_eq!(
        flag_value(proxy, "--access"),
        None,
        "RBAC decides who opens a notebook (a SubjectAccessReview, the default)"
    );
    for flag in ["--admin", "--member"] {
        assert!(values(flag).is_empty(), "{flag} is for --access static");
    }
    // Nobody is anybody's member: what the shared namespaces alone open.
    let access = StaticAccess {
        shared: values("--shared-namespace").into_iter().collect(),
        ..StaticAccess::default()
    };

    let web_service = find(&base, "Service", "labforge-web").unwrap();
    let web_destination = format!(
        "{}.{}.svc.cluster.local:{}",
        web_service["metadata"]["name"].as_str().unwrap(),
        web_service["metadata"]["namespace"].as_str().unwrap(),
        web_service["spec"]["ports"][0]["port"]
    );
    for (web_created, notebook_created) in [
        ("2020-01-01T00:00:00Z", "2030-01-01T00:00:00Z"),
        ("2030-01-01T00:00:00Z", "2020-01-01T00:00:00Z"),
    ] {
        let mut web: Value = documents(WEB_ROUTE).remove(0);
        web["metadata"]["creationTimestamp"] = web_created.into();
        let mut notebook = rendered_notebook_virtual_service();
        notebook["metadata"]["creationTimestamp"] = notebook_created.into();
        let virtual_services: Vec<labforge_crds::VirtualService> = [web, notebook]
            .into_iter()
            .map(|v| serde_json::from_value(v).unwrap())
            .collect();
        let (table, skipped) = RouteTable::build(&virtual_services, &gateway, &Activity::default());
        assert!(skipped.is_empty(), "{skipped:?}");
        assert_eq!(
            table.virtual_service_count(),
            2,
            "both are bound to the proxy's gateway"
        );
        let method = http::Method::GET;
        let headers = http::HeaderMap::new();
        let lookup = |path: &str| {
            let found = table
                .lookup(&RequestView {
                    host: "labforge.example.com",
                    authority: "labforge.example.com",
                    scheme: "https",
                    query: None,
                    path,
                    method: &method,
                    headers: &headers,
                })
                .unwrap_or_else(|| panic!("{path} has no route"));
            (
                found.rule.destinations[0].authority.to_string(),
                found
                    .rule
                    .namespaces()
                    .map(str::to_owned)
                    .collect::<Vec<_>>(),
            )
        };
        for path in [
            "/",
            "/api/config",
            "/notebooks/alice/jupyter",
            "/static/app.js",
        ] {
            let (destination, namespaces) = lookup(path);
            assert_eq!(destination, web_destination, "{path}");
            let anyone = Identity {
                user: "anyone@example.com".into(),
            };
            assert_eq!(
                authorize(
                    Some(&anyone),
                    namespaces.iter().map(String::as_str),
                    &[],
                    &access
                )
                .await,
                Decision::Allow,
                "{path}"
            );
            assert_eq!(
                authorize(None, namespaces.iter().map(String::as_str), &[], &access).await,
                Decision::Unauthenticated
            );
        }
        let (destination, namespaces) = lookup("/notebook/alice/jupyter/lab");
        assert_eq!(destination, "jupyter.alice.svc.cluster.local:80");
        let alice = Identity {
            user: "alice@example.com".into(),
        };
        assert_eq!(namespaces, ["alice"]);
        assert_eq!(
            authorize(
                Some(&alice),
                namespaces.iter().map(String::as_str),
                &[],
                &access
            )
            .await,
            Decision::Forbidden,
            "a notebook's namespace is not shared"
        );
    }
}

/// A child process killed when the test ends, its standard error kept for failure messages.
pub(super) struct Running {
    child: std::process::Child,
    name: String,
    log: PathBuf,
}

impl Running {
    fn log(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        format!("{} said:\n{text}", self.name)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the container runs, with its arguments and environment, addresses moved to loopback.
pub(super) fn start(
    container: &Value,
    replace: &[(&str, String)],
    extra: &[String],
    kubeconfig: &Path,
) -> Running {
    let invocation = Invocation::of("deploy/", container);
    let mut args = invocation.args.clone();
    for (flag, value) in replace {
        let at = args.iter().position(|a| a == flag).unwrap() + 1;
        args[at] = value.clone();
    }
    args.extend_from_slice(extra);
    let log = kubeconfig.with_file_name(format!("{}.log", invocation.name.replace(' ', "-")));
    let mut command = invocation.command();
    command
        .args(&args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("KUBECONFIG", kubeconfig)
        .env("LABFORGE_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    for env in container["env"].as_array().unwrap() {
        match env["value"].as_str() {
            Some(value) => {
                command.env(env["name"].as_str().unwrap(), value);
            }
            // An optional ConfigMap key some overlay sets; the builds run here leave it unset.
            None => assert_eq!(
                env["valueFrom"]["configMapKeyRef"]["optional"], true,
                "{env}"
            ),
        }
    }
    Running {
        child: command.spawn().unwrap(),
        name: invocation.name,
        log,
    }
}

/// Polls `url` until it answers 200; fails at once with its log when a process exits.
pub(super) async fn until_ok(
    url: &str,
    user: Option<&str>,
    processes: &mut [&mut Running],
) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        for process in processes.iter_mut() {
            if let Some(status) = process.child.try_wait().unwrap() {
                panic!("{} exited ({status}); {}", process.name, process.log());
            }
        }
        if let Some((200, body)) = get(url, user).await {
            return body;
        }
        if std::time::Instant::now() > deadline {
            let logs: Vec<String> = processes.iter().map(|p| p.log()).collect();
            panic!("{url} did not answer 200 within 30 s; {}", logs.join("\n"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub(super) async fn get(url: &str, user: Option<&str>) -> Option<(u16, String)> {
    let mut request = reqwest::Client::new().get(url);
    if let Some(user) = user {
        request = request.header("kubeflow-userid", user);
    }
    let response = request.send().await.ok()?;
    let status = response.status().as_u16();
    Some((status, response.text().await.ok()?))
}

/// Without Istio: the overlay's objects apply to an API server (the fake, with the overlay's
/// VirtualService CRD in place of Istio's); the web app and the proxy, started with their
/// Deployments' arguments and environment, answer their probes; a signed-in request to the
/// proxy reaches the web app through the web route, which answers with the ConfigMap's catalog;
/// and a notebook's route opens to whom the API server's SubjectAccessReviews allow, one review
/// per user and namespace.
#[tokio::test(flavor = "multi_thread")]
pub(super) async fn without_istio_the_proxy_brings_requests_to_the_web_app() {
    crate::init_crypto();
    let server = FakeApiServer::start(FakeApiServerOptions {
        extra_crds: vec![labforge_tests::repo_root().join(NO_ISTIO_CRD)],
        ..FakeApiServerOptions::default()
    })
    .await
    .unwrap();
    let client = server.client();
    let mut objects = build(&deploy_dir().join("overlays/no-istio"));
    // kubectl's order: namespaces and CRDs first.
    objects.sort_by_key(|o| match o["kind"].as_str().unwrap() {
        "Namespace" => 0,
        "CustomResourceDefinition" => 1,
        _ => 2,
    });
    for object in &objects {
        let api_version = object["apiVersion"].as_str().unwrap();
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        let gvk = GroupVersionKind::gvk(group, version, object["kind"].as_str().unwrap());
        let (resource, _) = kube::discovery::pinned_kind(&client, &gvk)
            .await
            .unwrap_or_else(|e| panic!("{gvk:?}: {e}"));
        let api: Api<DynamicObject> = match object["metadata"]["namespace"].as_str() {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
            None => Api::all_with(client.clone(), &resource),
        };
        let dynamic: DynamicObject = serde_json::from_value(object.clone()).unwrap();
        api.create(&PostParams::default(), &dynamic)
            .await
            .unwrap_or_else(|e| panic!("creating {:?}: {e}", identity(object)));
    }

    let dir = tempfile::tempdir().unwrap();
    // Each binary acts as its Deployment's service account, with deploy/'s RBAC (stored above).
    let web_kubeconfig = dir.path().join("web-kubeconfig");
    server
        .write_kubeconfig_as(&web_kubeconfig, WEB_USER)
        .unwrap();
    let proxy_kubeconfig = dir.path().join("proxy-kubeconfig");
    server
        .write_kubeconfig_as(&proxy_kubeconfig, PROXY_USER)
        .unwrap();
    let base = build(&deploy_dir());
    let spawner = dir.path().join("spawner.json");
    std::fs::write(
        &spawner,
        find(&base, "ConfigMap", "labforge-web-spawner").unwrap()["data"]["spawner.json"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    let free = || labforge_tests::tools::free_port().unwrap();
    let (web_port, proxy_port, admin_port) = (free(), free(), free());
    let notebook = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let notebook_addr = notebook.local_addr().unwrap();
    let notebook_task = tokio::spawn(async move {
        let app = axum::Router::new().fallback(|| async { "the notebook" });
        axum::serve(notebook, app).await.unwrap();
    });

    let web_container = deployment_container(&base, "labforge-web");
    let mut web = start(
        web_container,
        &[
            ("--listen", format!("127.0.0.1:{web_port}")),
            ("--spawner-config", spawner.display().to_string()),
        ],
        &[],
        &web_kubeconfig,
    );
    let proxy_container = deployment_container(&base, "labforge-proxy");
    let mut proxy = start(
        proxy_container,
        &[
            ("--listen", format!("127.0.0.1:{proxy_port}")),
            ("--admin-addr", format!("127.0.0.1:{admin_port}")),
        ],
        // What cluster DNS does for the web app's Service and the notebook's.
        &[
            "--upstream".into(),
            format!("labforge-web.kubeflow.svc.cluster.local:80=127.0.0.1:{web_port}"),
            "--upstream".into(),
            format!("jupyter.alice.svc.cluster.local:80={notebook_addr}"),
        ],
        &proxy_kubeconfig,
    );

    let probe = |container: &Value, probe: &str, port: u16| {
        format!(
            "http://127.0.0.1:{port}{}",
            container[probe]["httpGet"]["path"].as_str().unwrap()
        )
    };
    for (container, port) in [(web_container, web_port), (proxy_container, admin_port)] {
        for kind in ["livenessProbe", "readinessProbe"] {
            until_ok(
                &probe(container, kind, port),
                None,
                &mut [&mut web, &mut proxy],
            )
            .await;
        }
    }

    let through_proxy = format!("http://127.0.0.1:{proxy_port}/api/config");
    let body = until_ok(
        &through_proxy,
        Some("alice@example.com"),
        &mut [&mut web, &mut proxy],
    )
    .await;
    let config: Value = serde_json::from_str(&body).unwrap();
    let images: Vec<&str> = config["images"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["image"].as_str().unwrap())
        .collect();
    assert!(
        images.contains(&"kubeflownotebookswg/jupyter-scipy:v1.9.0"),
        "{config}"
    );
    let (status, _) = get(&through_proxy, None).await.unwrap();
    assert_eq!(status, 401, "no user header, no entry");

    // RBAC as the API server answers it: alice in her namespace, root everywhere.
    let reviews = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let asked = reviews.clone();
    server.set_access_rule(move |spec| {
        let user = spec["user"].as_str().unwrap_or_default();
        let attributes = &spec["resourceAttributes"];
        let namespace = attributes["namespace"].as_str().unwrap_or_default();
        asked.lock().unwrap().push(format!("{user} {namespace}"));
        attributes["group"] == "kubeflow.org"
            && attributes["resource"] == "notebooks"
            && attributes["verb"] == "update"
            && (user == "root@example.com" || (user == "alice@example.com" && namespace == "alice"))
    });
    let notebook_route = rendered_notebook_virtual_service();
    let version = notebook_route["apiVersion"].as_str().unwrap();
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(
            "networking.istio.io",
            version.rsplit('/').next().unwrap(),
            "VirtualService",
        ),
        "virtualservices",
    );
    Api::<DynamicObject>::namespaced_with(client.clone(), "alice", &resource)
        .create(
            &PostParams::default(),
            &serde_json::from_value(notebook_route).unwrap(),
        )
        .await
        .unwrap();
    let lab = format!("http://127.0.0.1:{proxy_port}/notebook/alice/jupyter/lab");
    let body = until_ok(&lab, Some("alice@example.com"), &mut [&mut web, &mut proxy]).await;
    assert_eq!(body, "the notebook");
    for (user, expected) in [
        ("alice@example.com", 200),
        ("root@example.com", 200),
        ("bob@example.com", 403),
        ("bob@example.com", 403),
    ] {
        let (status, _) = get(&lab, Some(user)).await.unwrap();
        assert_eq!(status, expected, "{user}");
    }
    let notebook_reviews: Vec<String> = reviews
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r.ends_with(" alice"))
        .cloned()
        .collect();
    assert_eq!(
        notebook_reviews,
        [
            "alice@example.com alice",
            "root@example.com alice",
            "bob@example.com alice"
        ],
        "one review per user and namespace; answers are cached"
    );
    notebook_task.abort();
}
