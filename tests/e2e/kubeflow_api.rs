//! labforge's web app as a drop-in for Kubeflow's jupyter web app, in a cluster (the fake API
//! server) under `/jupyter/`: the requests Kubeflow's Angular client sends, replayed from
//! fixtures taken from Kubeflow's code (`tests/fixtures/kubeflow/`), and every field that client
//! reads checked present with the type it expects; then labforge's own pages inside a page that
//! frames them as the central dashboard does.

use crate::support::cluster::{Client, WebApp};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::Api;
use kube::api::{DynamicObject, PostParams};
use kube::discovery::ApiResource;
use labforge_crds::notebook::Notebook;
use labforge_proxy::authz::TrustedHeader;
use labforge_tests::fake_kube::{FakeApiServer, FakeApiServerOptions};
use labforge_web::base_path::BasePath;
use labforge_web::cluster::WebOptions;
use labforge_web::config::SpawnerConfig;
use serde_json::{Value, json};
use std::path::PathBuf;

const ALICE: &str = "alice@example.com";
const BOB: &str = "bob@example.com";
const ROOT: &str = "root@example.com";

fn fixture(name: &str) -> PathBuf {
    labforge_tests::repo_root()
        .join("tests/fixtures/kubeflow")
        .join(name)
}

fn json_fixture(name: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixture(name)).unwrap()).unwrap()
}

/// The values at `pointer` in `value`, `*` standing for every element of an array.
fn values_at<'a>(value: &'a Value, pointer: &str) -> Vec<&'a Value> {
    let mut found = vec![value];
    for token in pointer.split('/').skip(1) {
        let token = token.replace("~1", "/").replace("~0", "~");
        found = found
            .into_iter()
            .flat_map(|v| -> Vec<&Value> {
                match (token.as_str(), v) {
                    ("*", Value::Array(items)) => items.iter().collect(),
                    (key, Value::Object(fields)) => fields.get(key).into_iter().collect(),
                    (index, Value::Array(items)) => index
                        .parse::<usize>()
                        .ok()
                        .and_then(|i| items.get(i))
                        .into_iter()
                        .collect(),
                    _ => Vec::new(),
                }
            })
            .collect();
    }
    found
}

fn type_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Every field Kubeflow's client reads from the answer to `request` (a key of
/// `client-reads.json`) is in `answer`, with the type the client expects.
fn check_client_reads(request: &str, answer: &Value) {
    let reads = json_fixture("client-reads.json");
    let fields = reads[request]
        .as_object()
        .unwrap_or_else(|| panic!("client-reads.json has no {request}"));
    for (pointer, expected) in fields {
        let found = values_at(answer, pointer);
        assert!(
            !found.is_empty(),
            "{request}: {pointer} is missing from {answer:#}"
        );
        for value in found {
            assert_eq!(
                type_of(value),
                expected.as_str().unwrap(),
                "{request}: {pointer} is {value} in {answer:#}"
            );
        }
    }
}

/// A fake cluster as Kubeflow has it: alice edits `alice` and `team`, root is a cluster admin;
/// PodDefaults are installed, two storage classes exist (one the default).
async fn kubeflow_cluster() -> FakeApiServer {
    crate::init_crypto();
    let server = FakeApiServer::start(FakeApiServerOptions {
        extra_crds: vec![fixture("poddefaults.kubeflow.org.yaml")],
        ..Default::default()
    })
    .await
    .unwrap();
    server.set_access_rule(|spec| {
        let user = spec["user"].as_str().unwrap_or_default();
        let namespace = spec["resourceAttributes"]["namespace"].as_str();
        user == ROOT || (user == ALICE && matches!(namespace, Some("alice" | "team")))
    });
    let client = server.client();
    let classes: Api<k8s_openapi::api::storage::v1::StorageClass> = Api::all(client.clone());
    for (name, default) in [("fast", "false"), ("standard", "true")] {
        let class = serde_json::from_value(json!({
            "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": name, "annotations": {"storageclass.kubernetes.io/is-default-class": default}},
            "provisioner": "example.com/disk",
        }))
        .unwrap();
        classes
            .create(&PostParams::default(), &class)
            .await
            .unwrap();
    }
    let resource = ApiResource {
        group: "kubeflow.org".into(),
        version: "v1alpha1".into(),
        api_version: "kubeflow.org/v1alpha1".into(),
        kind: "PodDefault".into(),
        plural: "poddefaults".into(),
    };
    let pod_defaults: Api<DynamicObject> = Api::namespaced_with(client.clone(), "alice", &resource);
    let pod_default: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "kubeflow.org/v1alpha1", "kind": "PodDefault",
        "metadata": {"name": "access-ml-pipeline", "namespace": "alice"},
        "spec": {"desc": "Allow access to Kubeflow Pipelines",
                 "selector": {"matchLabels": {"access-ml-pipeline": "true"}}},
    }))
    .unwrap();
    pod_defaults
        .create(&PostParams::default(), &pod_default)
        .await
        .unwrap();
    server
}

/// The web app as the Kubeflow overlay runs it: under `/jupyter/`, with Kubeflow's own spawner
/// config.
fn under_jupyter() -> WebOptions {
    let spawner =
        SpawnerConfig::parse(&std::fs::read_to_string(fixture("spawner_ui_config.yaml")).unwrap())
            .unwrap();
    WebOptions {
        header: TrustedHeader::default(),
        spawner,
        save_registry: None,
        notebook_domain: None,
        base_path: BasePath::parse("/jupyter/").unwrap(),
    }
}

async fn web_under_jupyter(server: &FakeApiServer) -> WebApp {
    WebApp::serve(server, under_jupyter()).await
}

#[tokio::test]
async fn kubeflows_client_requests_get_every_field_it_reads() {
    let server = kubeflow_cluster().await;
    let web = web_under_jupyter(&server).await;
    let api: Client = web.client();
    let notebooks: Api<Notebook> = Api::namespaced(server.client(), "alice");

    // The form as Kubeflow's client posts it, for Kubeflow's own default config.
    let form = json_fixture("create-notebook.json");
    let (status, created) = api
        .post(
            Some(ALICE),
            "/jupyter/api/namespaces/alice/notebooks",
            form.clone(),
        )
        .await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["success"], true);
    assert_eq!(created["message"], "Notebook created successfully.");
    let stored = notebooks.get("my-nb").await.unwrap();
    let annotations = stored.metadata.annotations.clone().unwrap();
    assert_eq!(annotations["notebooks.kubeflow.org/server-type"], "jupyter");
    assert_eq!(annotations["notebooks.kubeflow.org/creator"], ALICE);
    let container = stored.container().unwrap();
    let resources = container.resources.clone().unwrap();
    let amount = |map: &Option<
        std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    >,
                  key: &str| {
        labforge_crds::quantity::value(&map.as_ref().unwrap()[key].0).unwrap()
    };
    assert_eq!(amount(&resources.requests, "cpu"), 0.5);
    assert_eq!(amount(&resources.limits, "cpu"), 0.6);
    assert_eq!(amount(&resources.requests, "memory"), 1024f64.powi(3));
    assert!((amount(&resources.limits, "memory") - 1.2 * 1024f64.powi(3)).abs() < 1.0);
    let mounts: Vec<&str> = container
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| m.mount_path.as_str())
        .collect();
    assert!(
        mounts.contains(&"/home/jovyan") && mounts.contains(&"/dev/shm"),
        "{mounts:?}"
    );
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(server.client(), "alice");
    assert!(claims.get_opt("my-nb-workspace").await.unwrap().is_some());

    // RStudio (group-two), no workspace, a PodDefault configuration chosen in the form.
    let mut rstudio = form.clone();
    rstudio["name"] = "rs".into();
    rstudio["serverType"] = "group-two".into();
    rstudio["image"] = "ghcr.io/kubeflow/kubeflow/notebook-servers/rstudio-tidyverse:latest".into();
    rstudio["configurations"] = json!(["access-ml-pipeline"]);
    rstudio.as_object_mut().unwrap().remove("workspace");
    let (status, answer) = api
        .post(
            Some(ALICE),
            "/jupyter/api/namespaces/alice/notebooks",
            rstudio,
        )
        .await;
    assert_eq!(status, 201, "{answer}");
    let stored = notebooks.get("rs").await.unwrap();
    let annotations = stored.metadata.annotations.clone().unwrap();
    assert_eq!(
        annotations["notebooks.kubeflow.org/server-type"],
        "group-two"
    );
    assert_eq!(annotations["notebooks.kubeflow.org/http-rewrite-uri"], "/");
    assert_eq!(
        annotations["notebooks.kubeflow.org/http-headers-request-set"],
        r#"{"X-RStudio-Root-Path":"/notebook/alice/rs/"}"#
    );
    assert_eq!(
        stored.metadata.labels.as_ref().unwrap()["access-ml-pipeline"],
        "true"
    );
    assert!(claims.get_opt("rs-workspace").await.unwrap().is_none());

    // A new workspace the user named, mounted where an admin's form says, as Kubeflow takes it.
    let mut named = form.clone();
    named["name"] = "named".into();
    named["workspace"]["newPvc"]["metadata"]["name"] = "team-space".into();
    named["workspace"]["mount"] = "/workspace".into();
    let (status, answer) = api
        .post(
            Some(ALICE),
            "/jupyter/api/namespaces/alice/notebooks",
            named,
        )
        .await;
    assert_eq!(status, 201, "{answer}");
    assert!(claims.get_opt("team-space").await.unwrap().is_some());
    let stored = notebooks.get("named").await.unwrap();
    let mounted = stored
        .container()
        .unwrap()
        .volume_mounts
        .iter()
        .flatten()
        .any(|m| m.mount_path == "/workspace");
    assert!(mounted, "{:?}", stored.container().unwrap().volume_mounts);

    let (status, list) = api
        .get(Some(ALICE), "/jupyter/api/namespaces/alice/notebooks")
        .await;
    assert_eq!(status, 200, "{list}");
    check_client_reads("list", &list);
    let types: Vec<&str> = values_at(&list, "/notebooks/*/serverType")
        .into_iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        types.contains(&"jupyter") && types.contains(&"group-two"),
        "{types:?}"
    );
    assert_eq!(values_at(&list, "/notebooks/0/status/phase")[0], "waiting");

    let (status, one) = api
        .get(Some(ALICE), "/jupyter/api/namespaces/alice/notebooks/my-nb")
        .await;
    assert_eq!(status, 200, "{one}");
    check_client_reads("notebook", &one);

    // The notebook's pod and its container's log, as the kubelet has them.
    let pods: Api<Pod> = Api::namespaced(server.client(), "alice");
    let pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "my-nb-0", "namespace": "alice", "labels": {"notebook-name": "my-nb"}},
        "spec": {"containers": [{"name": "my-nb", "image": "lab:1", "env": [
            {"name": "LABFORGE_NOTEBOOK_SECRET", "value": "s3cret"},
            {"name": "NB_PREFIX", "value": "/notebook/alice/my-nb"}]}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    server.set_log_source(|ns, pod, container| {
        (ns == "alice" && pod == "my-nb-0" && container == "my-nb")
            .then(|| "[I] Jupyter Server is running\nline two\n".to_owned())
    });
    let base = "/jupyter/api/namespaces/alice/notebooks/my-nb";
    let (status, pod) = api.get(Some(ALICE), &format!("{base}/pod")).await;
    assert_eq!(status, 200, "{pod}");
    check_client_reads("pod", &pod);
    // The notebook's secret (what its route presents to its server) is not handed out.
    let env = pod["pod"]["spec"]["containers"][0]["env"].to_string();
    assert!(
        env.contains("NB_PREFIX") && !env.contains("s3cret"),
        "{env}"
    );
    let (status, logs) = api
        .get(Some(ALICE), &format!("{base}/pod/my-nb-0/logs"))
        .await;
    assert_eq!(status, 200, "{logs}");
    check_client_reads("logs", &logs);
    assert_eq!(logs["logs"][1], "line two");
    let (status, other) = api
        .get(Some(ALICE), &format!("{base}/pod/someone-else-0/logs"))
        .await;
    assert_eq!(status, 404, "only the notebook's own pod: {other}");
    check_client_reads("error", &other);
    let (status, none) = api
        .get(
            Some(ALICE),
            "/jupyter/api/namespaces/alice/notebooks/rs/pod",
        )
        .await;
    assert_eq!(
        (status, none["log"].as_str()),
        (404, Some("No pod detected."))
    );

    let (_, events) = api.get(Some(ALICE), &format!("{base}/events")).await;
    check_client_reads("events", &events);

    let (_, config) = api.get(Some(ALICE), "/jupyter/api/config").await;
    check_client_reads("config", &config);
    assert_eq!(
        config["config"]["cpu"]["limitFactor"], "1.2",
        "served as written"
    );
    let (_, gpus) = api.get(Some(ALICE), "/jupyter/api/gpus").await;
    check_client_reads("gpus", &gpus);
    assert_eq!(gpus["vendors"], json!([]), "no node has a GPU");

    let (_, pvcs) = api
        .get(Some(ALICE), "/jupyter/api/namespaces/alice/pvcs")
        .await;
    check_client_reads("pvcs", &pvcs);
    assert_eq!(
        pvcs["pvcs"][0],
        json!({"name": "my-nb-workspace", "size": "5Gi", "mode": "ReadWriteOnce"})
    );
    let (_, pod_defaults) = api
        .get(Some(ALICE), "/jupyter/api/namespaces/alice/poddefaults")
        .await;
    check_client_reads("poddefaults", &pod_defaults);
    assert_eq!(
        pod_defaults["poddefaults"][0]["label"],
        "access-ml-pipeline"
    );

    let (_, namespaces) = api.get(Some(ALICE), "/jupyter/api/namespaces").await;
    check_client_reads("namespaces", &namespaces);
    assert_eq!(namespaces["namespaces"], json!(["alice"]));
    let (_, everyone) = api.get(Some(ROOT), "/jupyter/api/namespaces").await;
    assert!(
        everyone["namespaces"]
            .as_array()
            .unwrap()
            .contains(&json!("alice"))
    );
    let (_, classes) = api.get(Some(ALICE), "/jupyter/api/storageclasses").await;
    check_client_reads("storageclasses", &classes);
    assert_eq!(classes["storageClasses"], json!(["fast", "standard"]));
    let (_, default) = api
        .get(Some(ALICE), "/jupyter/api/storageclasses/default")
        .await;
    check_client_reads("defaultStorageClass", &default);
    assert_eq!(default["defaultStorageClass"], "standard");
    let (_, info) = api.get(Some(ALICE), "/jupyter/info").await;
    check_client_reads("info", &info);
    assert_eq!(info["user"], ALICE);

    // Stop and start as the index page does.
    let (status, stopped) = api.patch(Some(ALICE), base, json!({"stopped": true})).await;
    assert_eq!(status, 200, "{stopped}");
    let (_, list) = api
        .get(Some(ALICE), "/jupyter/api/namespaces/alice/notebooks")
        .await;
    let phase = |list: &Value, name: &str| {
        list["notebooks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["name"] == name)
            .map(|n| n["status"]["phase"].clone())
    };
    assert_eq!(phase(&list, "my-nb"), Some(json!("stopped")));
    assert_eq!(
        api.patch(Some(ALICE), base, json!({"stopped": false}))
            .await
            .0,
        200
    );

    // Refusals in Kubeflow's failure envelope, the field named.
    let refusal = |change: Value| {
        let mut body = form.clone();
        body["name"] = "other".into();
        for (key, value) in change.as_object().unwrap() {
            body[key] = value.clone();
        }
        api.post(Some(ALICE), "/jupyter/api/namespaces/alice/notebooks", body)
    };
    let (status, refused) = refusal(json!({"cpus": "1"})).await;
    assert_eq!(status, 422, "{refused}");
    check_client_reads("error", &refused);
    assert!(
        refused["log"].as_str().unwrap().contains("cpus"),
        "{refused}"
    );
    let (status, refused) = refusal(json!({"namespace": "team"})).await;
    assert_eq!(
        (status, refused["field"].as_str()),
        (422, Some("namespace")),
        "{refused}"
    );
    let (status, refused) = api
        .get(Some(BOB), "/jupyter/api/namespaces/alice/notebooks")
        .await;
    assert_eq!(status, 403, "{refused}");
    check_client_reads("error", &refused);
    assert!(notebooks.get_opt("other").await.unwrap().is_none());

    let (status, deleted) = api
        .call(
            Some(ALICE),
            reqwest::Method::DELETE,
            "/jupyter/api/namespaces/alice/notebooks/rs",
            None,
        )
        .await;
    assert_eq!(status, 200, "{deleted}");
    assert_eq!(deleted["message"], "Notebook rs successfully deleted.");

    // Every route Kubeflow's client calls is in the API's document.
    let (_, document) = api.get(None, "/jupyter/api/openapi.json").await;
    for path in [
        "/info",
        "/api/config",
        "/api/gpus",
        "/api/namespaces",
        "/api/storageclasses",
        "/api/storageclasses/default",
        "/api/namespaces/{ns}/notebooks",
        "/api/namespaces/{ns}/notebooks/{name}",
        "/api/namespaces/{ns}/notebooks/{name}/events",
        "/api/namespaces/{ns}/notebooks/{name}/pod",
        "/api/namespaces/{ns}/notebooks/{name}/pod/{pod}/logs",
        "/api/namespaces/{ns}/pvcs",
        "/api/namespaces/{ns}/poddefaults",
    ] {
        assert!(
            document["paths"][path].is_object(),
            "{path} is not documented"
        );
    }
    assert!(document["components"]["schemas"]["KubeflowForm"].is_object());

    // A gateway that rewrites the prefix away reaches the same app.
    assert_eq!(
        api.get(Some(ALICE), "/api/namespaces/alice/notebooks")
            .await
            .0,
        200
    );
}

#[tokio::test]
async fn pages_links_and_redirects_stay_under_the_base_path() {
    let server = kubeflow_cluster().await;
    let web = web_under_jupyter(&server).await;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let get = |path: &str| {
        http.get(format!("{}{path}", web.base))
            .header("kubeflow-userid", ALICE)
            .send()
    };
    let bare = get("/jupyter").await.unwrap();
    assert_eq!(bare.status(), 308);
    assert_eq!(bare.headers()["location"], "/jupyter/");

    let page = get("/jupyter/?ns=team").await.unwrap();
    assert_eq!(page.status(), 200);
    // Framed by the dashboard on this origin, by no other.
    assert_eq!(page.headers()["x-frame-options"], "SAMEORIGIN");
    assert_eq!(
        page.headers()["content-security-policy"],
        "frame-ancestors 'self'"
    );
    let html = page.text().await.unwrap();
    assert!(html.contains(r#"<base href="/jupyter/">"#), "{html}");
    assert!(html.contains("Notebooks in <code>team</code>"), "{html}");
    assert!(html.contains(r#"<a href="new?ns=team">"#), "{html}");
    // Every link is relative to the base: none names a path of its own.
    let links = html.replace(r#"<base href="/jupyter/">"#, "");
    for attribute in ["href=\"/", "src=\"/"] {
        assert!(!links.contains(attribute), "{attribute} in {html}");
    }
    let script = get("/jupyter/static/common.js").await.unwrap();
    assert_eq!(script.status(), 200);
    // The dashboard's links to the notebooks app open its pages.
    let links = json_fixture("centraldashboard-links.json");
    let to_notebooks: Vec<&str> = values_at(&links, "/menuLinks/*/link")
        .into_iter()
        .chain(values_at(&links, "/quickLinks/*/link"))
        .filter_map(Value::as_str)
        .filter(|link| link.starts_with("/jupyter/"))
        .collect();
    assert_eq!(to_notebooks, ["/jupyter/", "/jupyter/new"]);
    for link in to_notebooks {
        let page = get(link).await.unwrap();
        assert_eq!(page.status(), 200, "{link}");
        assert!(page.text().await.unwrap().contains("<main"), "{link}");
    }
    // Another user's namespace is refused by name.
    let refused = http
        .get(format!("{}/jupyter/?ns=team", web.base))
        .header("kubeflow-userid", BOB)
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 403);
    assert!(
        refused
            .text()
            .await
            .unwrap()
            .contains("may not list notebooks in namespace team")
    );
}

#[tokio::test]
async fn the_pages_follow_the_dashboards_namespace_inside_its_iframe() {
    let server = kubeflow_cluster().await;
    let app = labforge_web::cluster::router(
        crate::support::deploy::client_as_deployed(&server, crate::support::deploy::WEB_USER).await,
        under_jupyter(),
    )
    .await;
    // The central dashboard's part, on the same origin: the app in an iframe, and its namespace
    // selector's messages.
    let app = axum::Router::new()
        .route(
            "/",
            axum::routing::get(|| async {
                axum::response::Html(include_str!("../browser/dashboard.html"))
            }),
        )
        .merge(app);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let serving = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let team: Api<Notebook> = Api::namespaced(server.client(), "team");
    let shared: Notebook = serde_json::from_value(json!({
        "apiVersion": "kubeflow.org/v1", "kind": "Notebook",
        "metadata": {"name": "shared", "namespace": "team",
                     "annotations": {"notebooks.kubeflow.org/creator": ROOT}},
        "spec": {"template": {"spec": {"containers": [{"name": "shared", "image": "lab:1"}]}}},
    }))
    .unwrap();
    team.create(&PostParams::default(), &shared).await.unwrap();

    let dir = tempfile::tempdir().unwrap();
    let config = json!({"url": url, "user": ALICE, "namespace": "team", "own": "alice"});
    // Chromium runs beside this test's runtime, which serves the app meanwhile.
    let result = crate::need(
        tokio::task::spawn_blocking(move || {
            labforge_tests::browser::run_with_config("dashboard.mjs", dir.path(), &config)
        })
        .await
        .unwrap(),
    );
    serving.abort();
    assert_eq!(
        result["outside"],
        json!([]),
        "every request under /jupyter/: {result}"
    );
    assert_eq!(result["created"], "from-dashboard", "{result}");
    let created = team.get("from-dashboard").await.unwrap();
    assert_eq!(
        created.metadata.annotations.unwrap()["notebooks.kubeflow.org/creator"],
        ALICE
    );
}
