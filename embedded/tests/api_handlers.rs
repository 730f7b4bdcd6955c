//! The API's handlers through its router, over the embedded store and local users, without a
//! server, a container engine or a browser: each request goes through axum's `Router` with
//! `oneshot`, as a client's would, and the answers are checked as clients read them.

use axum::Router;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use axum::response::Response;
use http_body_util::BodyExt as _;
use labforge_crds::notebook::Notebook;
use labforge_embedded::store::Store;
use labforge_web::api::ApiState;
use labforge_web::model::NotebookState;
use labforge_web::users::LocalAuth;
use labforge_web::workloads::{Claim, LogStream, StorageClasses, WorkloadError, Workloads};
use serde_json::{Value, json};
use std::sync::Arc;
use tower::ServiceExt as _;

/// Notebooks run nowhere here: what would ask the engine says so, and no volume exists yet.
struct NoEngine;

#[async_trait::async_trait]
impl Workloads for NoEngine {
    async fn logs(&self, _: &str, _: &str, _: bool, _: u32) -> Result<LogStream, WorkloadError> {
        Err(WorkloadError::NotFound("no engine in this test".into()))
    }
    async fn recent_logs(&self, _: &str, _: &str, _: u32) -> Result<String, WorkloadError> {
        Ok(String::new())
    }
    async fn claims(&self, _: &str) -> Result<Vec<Claim>, WorkloadError> {
        Ok(Vec::new())
    }
    async fn remove_claim(&self, _: &str, _: &str) -> Result<(), WorkloadError> {
        Ok(())
    }
    async fn storage_classes(&self) -> Result<StorageClasses, WorkloadError> {
        Ok(StorageClasses::default())
    }
    async fn pod_defaults(&self, _: &str) -> Result<Vec<Value>, WorkloadError> {
        Ok(Vec::new())
    }
    async fn pod(&self, _: &Notebook, _: NotebookState) -> Result<Value, WorkloadError> {
        Err(WorkloadError::NotFound("no engine in this test".into()))
    }
}

/// The API router over a fresh data dir, with users alice and bob (their passwords returned).
fn api() -> (tempfile::TempDir, Router, String, String) {
    let dir = tempfile::tempdir().expect("a data dir");
    let auth = Arc::new(
        LocalAuth::open(dir.path(), labforge_web::users::SESSION_COOKIE).expect("users open"),
    );
    let alice = auth.users.add("alice", false).expect("alice added");
    let bob = auth.users.add("bob", false).expect("bob added");
    let store = Arc::new(Store::open(&dir.path().join("store")).expect("the store opens"));
    let state = ApiState {
        backend: store,
        access: auth.clone(),
        local_users: Some(auth),
        sign_in: Some(Arc::new(
            labforge_web::sign_in::SignIn::new(1, 4).expect("password checks"),
        )),
        saves: None,
        config: Arc::new(labforge_web::config::default_spawner("registry.local")),
        workloads: Arc::new(NoEngine),
        activity: Arc::default(),
        secure_cookies: false,
        notebook_links: None,
        image_check: None,
        usage: None,
        idle_after: std::time::Duration::from_secs(3600),
        base_path: Default::default(),
        saves_registry: None,
        preparing: Arc::new(labforge_web::preparing::ImagesBeingPrepared::new([])),
        audit: Arc::new(labforge_web::audit::AuditFiles::new(
            dir.path().join("audit"),
        )),
    };
    (dir, labforge_web::api::router(state), alice, bob)
}

/// Who sends requests through the router: a signed-in user's session, or no one.
struct Visitor<'a> {
    app: &'a Router,
    cookie: Option<String>,
}

impl Visitor<'_> {
    /// One request, answered.
    async fn answer(&self, method: Method, path: &str, body: Option<Value>) -> Response {
        let mut request = Request::builder().method(method).uri(path);
        if let Some(cookie) = &self.cookie {
            request = request.header(header::COOKIE, cookie);
        }
        let request = match body {
            Some(body) => request
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(body.to_string())),
            None => request.body(Body::empty()),
        }
        .expect("a request");
        self.app.clone().oneshot(request).await.expect("an answer")
    }

    /// One request; the answer's status and JSON body.
    async fn send(&self, method: Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let answer = self.answer(method, path, body).await;
        let status = answer.status();
        let bytes = answer
            .into_body()
            .collect()
            .await
            .expect("a body")
            .to_bytes();
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    async fn get(&self, path: &str) -> (StatusCode, Value) {
        self.send(Method::GET, path, None).await
    }
}

/// Signs `user` in: the session carries the cookie the answer set, as a browser's would.
async fn sign_in<'a>(app: &'a Router, user: &str, password: &str) -> Visitor<'a> {
    let answer = Visitor { app, cookie: None }
        .answer(
            Method::POST,
            "/api/login",
            Some(json!({"username": user, "password": password})),
        )
        .await;
    assert_eq!(answer.status(), StatusCode::OK, "{user} signs in");
    let set_cookie = answer.headers()[header::SET_COOKIE]
        .to_str()
        .expect("a cookie")
        .to_owned();
    Visitor {
        app,
        cookie: Some(set_cookie.split(';').next().expect("name=value").to_owned()),
    }
}

#[tokio::test]
async fn a_namespaces_routes_refuse_no_one_with_401_and_another_user_with_403() {
    let (_dir, app, _, bob) = api();
    let no_one = Visitor {
        app: &app,
        cookie: None,
    };
    let (status, body) = no_one.get("/api/namespaces/alice/notebooks").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");

    let bob = sign_in(&app, "bob", &bob).await;
    for (method, path) in [
        (Method::GET, "/api/namespaces/alice/notebooks"),
        (Method::GET, "/api/namespaces/alice/volumes"),
        (Method::GET, "/api/namespaces/alice/quota"),
        (Method::DELETE, "/api/namespaces/alice/notebooks/lab"),
    ] {
        let (status, body) = bob.send(method.clone(), path, None).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{method} {path}: {body}");
        assert!(
            body["error"]
                .as_str()
                .is_some_and(|e| e.contains("bob may not") && e.contains("namespace alice")),
            "{method} {path}: {body}"
        );
        // Kubeflow's envelope rides along.
        assert_eq!(body["success"], false, "{body}");
        assert_eq!(body["status"], 403, "{body}");
    }
}

#[tokio::test]
async fn a_notebook_is_created_read_stopped_and_deleted_through_the_handlers() {
    let (_dir, app, alice, _) = api();
    let alice = sign_in(&app, "alice", &alice).await;
    let notebooks = "/api/namespaces/alice/notebooks";
    let lab = "/api/namespaces/alice/notebooks/lab";
    let (status, body) = alice
        .send(Method::POST, notebooks, Some(json!({"name": "lab"})))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");

    let (status, listed) = alice.get(notebooks).await;
    assert_eq!(status, StatusCode::OK, "{listed}");
    assert_eq!(listed["notebooks"][0]["name"], "lab", "{listed}");

    let (status, stopped) = alice
        .send(Method::PATCH, lab, Some(json!({"stopped": true})))
        .await;
    assert_eq!(status, StatusCode::OK, "{stopped}");
    let (_, read) = alice.get(lab).await;
    assert_eq!(read["notebook"]["state"], "stopped", "{read}");

    let (status, body) = alice.send(Method::DELETE, lab, None).await;
    assert!(status.is_success(), "{status} {body}");
    let (status, body) = alice.get(lab).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
}

#[tokio::test]
async fn bad_input_is_refused_naming_the_field_and_nothing_is_made() {
    let (_dir, app, alice, _) = api();
    let alice = sign_in(&app, "alice", &alice).await;
    let notebooks = "/api/namespaces/alice/notebooks";
    let (status, body) = alice
        .send(
            Method::POST,
            notebooks,
            Some(json!({"name": "Bad Name", "cpu": "lots"})),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let fields: Vec<&str> = body["errors"]
        .as_array()
        .map(|errors| errors.iter().filter_map(|e| e["field"].as_str()).collect())
        .unwrap_or_default();
    assert!(
        fields.contains(&"name") && fields.contains(&"cpu"),
        "{body}"
    );
    let (_, listed) = alice.get(notebooks).await;
    assert_eq!(listed["notebooks"], json!([]), "{listed}");

    let (status, body) = alice
        .send(
            Method::PATCH,
            "/api/namespaces/alice/notebooks/lab",
            Some(json!({"stopped": true})),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
}
