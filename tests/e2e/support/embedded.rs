//! `labforge up` as the suites drive it: started with the JupyterLab image in its registry, a
//! signed-in API session, a notebook opened on its own host, and the Python a kernel runs to
//! change and check an environment.

use crate::need;
use labforge_tests::embedded::LabforgeUp;
use labforge_tests::jupyter::JupyterClient;
use serde_json::{Value, json};
use std::process::Command;
use std::time::{Duration, Instant};

/// A signed-in API client.
pub struct Session {
    pub http: reqwest::Client,
    pub base: String,
    pub cookie: String,
    /// The certificate `labforge up` serves, when it serves HTTPS (PEM).
    pub certificate: Option<Vec<u8>>,
}

impl Session {
    pub async fn sign_in(up: &LabforgeUp, user: &str, password: &str) -> Self {
        let certificate = up.certificate();
        // Idle connections are let go before the proxy closes them (after 30 s without a
        // request): a request sent on one the proxy is closing fails (IncompleteMessage).
        let mut http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .pool_idle_timeout(std::time::Duration::from_secs(20));
        if let Some(pem) = &certificate {
            http = http.add_root_certificate(reqwest::Certificate::from_pem(pem).unwrap());
        }
        // The app's host by its name (`*.localhost` is this machine to browsers, not to the
        // resolver here).
        let url = reqwest::Url::parse(&up.url).unwrap();
        if let (Some(host), Some(port)) = (url.host_str(), url.port()) {
            http = http.resolve(host, std::net::SocketAddr::from(([127, 0, 0, 1], port)));
        }
        let http = http.build().unwrap();
        let response = http
            .post(format!("{}/api/login", up.url))
            .json(&json!({"username": user, "password": password}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "login of {user}");
        let set_cookie = response.headers()["set-cookie"]
            .to_str()
            .unwrap()
            .to_owned();
        assert!(
            set_cookie.contains("HttpOnly") && set_cookie.contains("SameSite=Lax"),
            "{set_cookie}"
        );
        // Every `labforge up` here serves the web app on localhost or a name below it, where
        // browsers keep `__Host-` cookies over plain HTTP too: no page of another host can set
        // one beside it.
        assert!(
            set_cookie.starts_with("__Host-labforge_session=")
                && set_cookie.split("; ").any(|a| a == "Secure")
                && set_cookie.split("; ").any(|a| a == "Path=/"),
            "a __Host- session cookie: {set_cookie}"
        );
        Self {
            http,
            base: up.url.clone(),
            cookie: set_cookie.split(';').next().unwrap().to_owned(),
            certificate,
        }
    }

    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let request = self
            .http
            .request(method, format!("{}{path}", self.base))
            .header("cookie", &self.cookie);
        labforge_tests::send_json(request, body).await
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        self.call(reqwest::Method::GET, path, None).await
    }

    pub async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.call(reqwest::Method::POST, path, Some(body)).await
    }

    pub async fn patch(&self, path: &str, body: Value) -> (u16, Value) {
        self.call(reqwest::Method::PATCH, path, Some(body)).await
    }

    pub async fn put(&self, path: &str, body: Value) -> (u16, Value) {
        self.call(reqwest::Method::PUT, path, Some(body)).await
    }

    pub async fn delete(&self, path: &str) -> (u16, Value) {
        self.call(reqwest::Method::DELETE, path, None).await
    }

    /// Follows save `id` to its end: the stream's text and each progress event.
    pub async fn save_progress(&self, ns: &str, id: &str) -> (String, Vec<Value>) {
        let events = self
            .http
            .get(format!("{}/api/namespaces/{ns}/saves/{id}", self.base))
            .header("cookie", &self.cookie)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let progress = events
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .map(|d| serde_json::from_str(d).unwrap())
            .collect();
        (events, progress)
    }

    pub async fn wait_state(&self, ns: &str, name: &str, want: &str, timeout: Duration) -> Value {
        let path = format!("/api/namespaces/{ns}/notebooks/{name}");
        let deadline = Instant::now() + timeout;
        loop {
            let (status, body) = self.get(&path).await;
            assert_eq!(status, 200, "{body}");
            if body["notebook"]["state"] == want {
                return body;
            }
            if Instant::now() > deadline {
                let (_, events) = self.get(&format!("{path}/events")).await;
                panic!("{ns}/{name} not {want} within {timeout:?}: {body}\nevents: {events}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The port `labforge up` serves every host on.
    pub fn port(&self) -> u16 {
        self.base.rsplit(':').next().unwrap().parse().unwrap()
    }

    /// The web app's host name, every notebook's host below it.
    fn domain(&self) -> String {
        reqwest::Url::parse(&self.base)
            .unwrap()
            .host_str()
            .unwrap()
            .to_owned()
    }

    /// `labforge up`'s address as a URL, for requests that name the host they are for in `Host`
    /// (the resolver here does not know `*.localhost`, browsers do).
    fn at_address(&self) -> String {
        let scheme = self.base.split("://").next().unwrap();
        format!("{scheme}://127.0.0.1:{}", self.port())
    }

    /// Notebook `ns/name`'s own host, as `labforge up` serves it.
    pub fn notebook_host(&self, ns: &str, name: &str) -> String {
        format!(
            "{}.{}:{}",
            labforge_crds::host::notebook_host_label(ns, name),
            self.domain(),
            self.port()
        )
    }

    /// Opens notebook `ns/name` as a browser does, step by step: the old path URL sends it to
    /// the notebook's host, which sends it to the web app with a state cookie, which sends it
    /// back with a one-time code, which the host trades for its own cookie.
    pub async fn open_notebook(&self, ns: &str, name: &str) -> Result<NotebookVisit, String> {
        let host = self.notebook_host(ns, name);
        let at_host = self.at_address();
        let path = format!("/notebook/{ns}/{name}/lab?reset");
        let old = self
            .http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap();
        expect_redirect("the old path URL", &old)?;
        assert_eq!(location(&old), format!("//{host}{path}"));
        let (state, code_path) = self.code_for(ns, name, &path).await?;
        let redeemed = self
            .http
            .get(format!("{at_host}{code_path}"))
            .header("host", &host)
            .header("cookie", &state)
            .send()
            .await
            .unwrap();
        expect_redirect("the code", &redeemed)?;
        assert_eq!(location(&redeemed), path, "back where the visit was going");
        self.assert_secure_exactly_under_tls(&redeemed, "labforge_notebook");
        Ok(NotebookVisit {
            host,
            base: format!("{at_host}/notebook/{ns}/{name}"),
            cookie: set_cookie(&redeemed, "labforge_notebook").expect("the notebook's cookie"),
            state,
            code_path,
        })
    }

    /// The state cookie and one-time code path a browser gets for notebook `ns/name`, going
    /// to `path`: its host's redirect, then the web app's.
    pub async fn code_for(
        &self,
        ns: &str,
        name: &str,
        path: &str,
    ) -> Result<(String, String), String> {
        let host = self.notebook_host(ns, name);
        let visit = self
            .http
            .get(format!("{}{path}", self.at_address()))
            .header("host", &host)
            .send()
            .await
            .unwrap();
        expect_redirect("the notebook's host without a cookie", &visit)?;
        let state = set_cookie(&visit, "labforge_notebook_state").expect("a state cookie");
        self.assert_secure_exactly_under_tls(&visit, "labforge_notebook_state");
        let sign_in = location(&visit);
        let sign_in_path = sign_in
            .strip_prefix(&format!("//{}:{}", self.domain(), self.port()))
            .unwrap_or_else(|| panic!("sent to the web app: {sign_in}"));
        let web = self
            .http
            .get(format!("{}{sign_in_path}", self.base))
            .header("cookie", &self.cookie)
            .send()
            .await
            .unwrap();
        expect_redirect("the web app's notebook sign-in", &web)?;
        let back = location(&web);
        let code_path = back
            .strip_prefix(&format!("//{host}"))
            .unwrap_or_else(|| panic!("sent back to the notebook's host: {back}"))
            .to_owned();
        Ok((state, code_path))
    }

    /// Cookie `name` of `response` carries `Secure` exactly when `labforge up` serves TLS.
    fn assert_secure_exactly_under_tls(&self, response: &reqwest::Response, name: &str) {
        let line = set_cookie_line(response, name).unwrap_or_default();
        assert_eq!(
            line.contains("; Secure"),
            self.certificate.is_some(),
            "{name} is secure exactly when TLS is on: {line}"
        );
    }

    /// A Jupyter client on notebook `ns/name`'s own host, signed in to it.
    pub async fn jupyter(&self, ns: &str, name: &str) -> JupyterClient {
        let visit = self.open_notebook(ns, name).await.unwrap();
        need(
            JupyterClient::connect_with(&visit.base, visit.headers(), self.certificate.as_deref())
                .await,
        )
    }
}

/// Where a redirect sends the client.
fn location(response: &reqwest::Response) -> String {
    response.headers()["location"].to_str().unwrap().to_owned()
}

/// The whole `Set-Cookie` line of the cookie `name` a response sets (attributes included).
fn set_cookie_line<'r>(response: &'r reqwest::Response, name: &str) -> Option<&'r str> {
    response
        .headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|c| c.starts_with(&format!("{name}=")))
}

/// `name=value` of the cookie `name` a response sets.
fn set_cookie(response: &reqwest::Response, name: &str) -> Option<String> {
    set_cookie_line(response, name).map(|c| c.split(';').next().unwrap_or_default().to_owned())
}

/// `Ok` for a redirect; else which step answered what.
fn expect_redirect(step: &str, response: &reqwest::Response) -> Result<(), String> {
    if response.status() == 302 {
        Ok(())
    } else {
        Err(format!("{step}: HTTP {}", response.status().as_u16()))
    }
}

/// A browser signed in to a notebook's host.
pub struct NotebookVisit {
    /// `Host` of the notebook's own host, port included.
    pub host: String,
    /// `http(s)://127.0.0.1:PORT/notebook/<ns>/<name>`: sent with [`Self::host`] as Host (the
    /// resolver here does not know `*.localhost`, browsers do).
    pub base: String,
    /// `labforge_notebook=…`
    pub cookie: String,
    /// The state cookie that came with the code, and the code's path (used up).
    pub state: String,
    pub code_path: String,
}

impl NotebookVisit {
    pub fn headers(&self) -> reqwest::header::HeaderMap {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert("host", self.host.parse().unwrap());
        headers.insert("cookie", self.cookie.parse().unwrap());
        headers
    }
}

/// `labforge up` (this build) with its data in `data` and `extra` arguments, its registry holding
/// the JupyterLab image its catalog offers.
pub async fn up_with_jupyterlab(data: &std::path::Path, extra: &[&str]) -> LabforgeUp {
    let agent = need(labforge_tests::agent::agent_binary());
    let up = need(
        LabforgeUp::start_with(
            std::path::Path::new(env!("CARGO_BIN_EXE_labforge")),
            data,
            &agent,
            extra,
        )
        .await,
    );
    need(labforge_tests::push_layout(
        "jupyterlab",
        &up.registry,
        "labforge/jupyterlab:latest",
    ));
    up
}

pub fn container_id(name: &str) -> String {
    let out = Command::new("podman")
        .args(["inspect", "--format", "{{.Id}}", name])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// A pure-Python wheel built and installed by pip inside the kernel: a real `pip install` that
/// needs no index, so the suite does not depend on PyPI being reachable from containers.
pub const PIP_INSTALL: &str = r#"
import os, subprocess, sys, tempfile, zipfile
name, version = "labforge_probe", "1.0"
wheel = os.path.join(tempfile.mkdtemp(), f"{name}-{version}-py3-none-any.whl")
info = f"{name}-{version}.dist-info"
files = {
    f"{name}/__init__.py": "ANSWER = 42\n",
    f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
    f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: labforge-e2e\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
files[f"{info}/RECORD"] = "".join(f"{path},,\n" for path in list(files) + [f"{info}/RECORD"])
with zipfile.ZipFile(wheel, "w") as archive:
    for path, text in files.items():
        archive.writestr(path, text)
result = subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--disable-pip-version-check", wheel], capture_output=True, text=True)
print("pip exit", result.returncode, result.stderr[-500:])
with open("/home/jovyan/notes.txt", "w") as notes:
    notes.write("kept in the workspace")
"#;

pub const CHECK: &str = r#"
import labforge_probe, sys
print("answer", labforge_probe.ANSWER, "from", labforge_probe.__file__)
print("notes", open("/home/jovyan/notes.txt").read())
"#;
