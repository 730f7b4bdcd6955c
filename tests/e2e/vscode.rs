//! The code-server (VSCode in the browser) image from `images/build codeserver`, as a notebook of
//! `labforge up`: created through the API, opened in Chromium through the proxy (which rewrites the
//! notebook prefix to `/`), with a workspace file read in the editor and a command run in the
//! integrated terminal over its websocket; the proxy's activity shows in the notebook's view.

use crate::need;
use labforge_tests::embedded::{LabforgeUp, RemoveNotebooksOnDrop};
use serde_json::{Value, json};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// Removes the image pulled from this run's registry, however the test ends. The reference names
/// this run's registry port, so no one else uses it; without this, every run would leave a copy of
/// the image's tag behind in podman's storage.
struct RemoveImageOnDrop(Option<String>);

impl Drop for RemoveImageOnDrop {
    fn drop(&mut self) {
        if let Some(image) = &self.0 {
            let _ = Command::new("podman").args(["rmi", image]).output();
        }
    }
}

/// `podman exec` in the notebook's container, as the image's user.
fn exec(container: &str, script: &str) -> String {
    let out = Command::new("podman")
        .args(["exec", container, "sh", "-c", script])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "podman exec {container} {script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test]
async fn vscode_notebook_edits_and_runs_a_terminal_through_the_proxy() {
    crate::init_crypto();
    let agent = need(labforge_tests::agent::agent_binary());
    let dir = tempfile::tempdir().unwrap();
    let user = format!("vscode-{:x}", std::process::id());
    // Declared before `up`, dropped after it in reverse order: labforge stops (and cannot start
    // the container again), then the container goes, then the image it ran.
    let mut pulled = RemoveImageOnDrop(None);
    let _notebooks = RemoveNotebooksOnDrop(vec![user.clone()]);
    let up = need(
        LabforgeUp::start(
            Path::new(env!("CARGO_BIN_EXE_labforge")),
            &dir.path().join("data"),
            &agent,
        )
        .await,
    );
    let image = need(labforge_tests::push_layout(
        "codeserver",
        &up.registry,
        "labforge/codeserver:latest",
    ));
    pulled.0 = Some(image.clone());
    let password = need(up.add_user(&user));

    // labforge's server closes a keep-alive connection after 30 s without a request (its header
    // read timeout), and the browser session takes about that long: a pooled connection reused
    // just as the server closes it fails the request, so none is kept that long.
    let http = reqwest::Client::builder()
        .pool_idle_timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let cookie = need(up.sign_in(&user, &password).await);

    let notebook_api = format!("{}/api/namespaces/{user}/notebooks", up.url);
    let created = http
        .post(&notebook_api)
        .header("cookie", &cookie)
        .json(&json!({
            "name": "code",
            "serverType": "vscode",
            "image": image,
            "cpuLimit": "2",
            "memoryLimit": "2Gi",
        }))
        .send()
        .await
        .unwrap();
    let status = created.status();
    let body = created.text().await.unwrap();
    assert_eq!(status, 201, "{body}");

    // Ready once code-server answers on `/` in the container (the route's rewrite target); the
    // first start pulls the image from the local registry.
    let started = Instant::now();
    let get_notebook = || async {
        let response = http
            .get(format!("{notebook_api}/code"))
            .header("cookie", &cookie)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        response.json::<Value>().await.unwrap()
    };
    let view = loop {
        let view = get_notebook().await;
        if view["notebook"]["state"] == "ready" {
            break view;
        }
        if started.elapsed() > Duration::from_secs(240) {
            let events = http
                .get(format!("{notebook_api}/code/events"))
                .header("cookie", &cookie)
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap();
            panic!(
                "not ready within 240 s: {view}\nevents: {events}\nlog:\n{}",
                up.log()
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    eprintln!("create -> code-server ready: {:?}", started.elapsed());
    assert_eq!(view["notebook"]["serverType"], "group-one", "{view}");
    // On its own host, which Chromium resolves to this machine by itself.
    let port = up.url.rsplit(':').next().unwrap();
    let host = format!(
        "{}.localhost:{port}",
        labforge_crds::host::notebook_host_label(&user, "code")
    );
    let url = format!("http://{host}/notebook/{user}/code/");

    // code-server runs with `--auth none`: the proxy is what keeps others out.
    let anonymous = reqwest::Client::new()
        .get(format!("http://127.0.0.1:{port}/notebook/{user}/code/"))
        .header("host", &host)
        .header("sec-fetch-mode", "cors")
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), 401);

    let container = labforge_embedded::runtime::container_name(&user, "code");
    // Nor does its published port, to a local process without the per-notebook secret: no
    // workbench, only code-server's login; and not on localhost's address at all.
    let published = Command::new("podman")
        .args(["port", &container, "8888/tcp"])
        .output()
        .unwrap();
    let published: std::net::SocketAddr = String::from_utf8_lossy(&published.stdout)
        .trim()
        .parse()
        .unwrap();
    assert_eq!(
        published.ip().to_string(),
        labforge_embedded::runtime::PUBLISH_ADDRESS
    );
    let no_redirects = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    for cookie in ["", "code-server-session=guessed"] {
        let direct = no_redirects
            .get(format!("http://{published}/"))
            .header("cookie", cookie)
            .send()
            .await
            .unwrap();
        let status = direct.status().as_u16();
        let location = direct
            .headers()
            .get("location")
            .and_then(|l| l.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let body = direct.text().await.unwrap_or_default();
        assert!(
            status == 302 && location.contains("login") && !body.contains("workbench"),
            "code-server's own port with cookie {cookie:?}: {status} {location} {body:.200}"
        );
    }
    // The secret the route presents is what opens it (so the logins above are its doing).
    let secret = exec(&container, "printenv LABFORGE_NOTEBOOK_SECRET");
    let with_secret = no_redirects
        .get(format!("http://{published}/"))
        .header("cookie", format!("code-server-session={}", secret.trim()))
        .send()
        .await
        .unwrap();
    // code-server sends a signed-in `/` on to its folder, never to its login.
    let opened = with_secret
        .headers()
        .get("location")
        .and_then(|l| l.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    assert!(
        with_secret.status() == 200 || (with_secret.status() == 302 && !opened.contains("login")),
        "with the secret: {} {opened}",
        with_secret.status()
    );
    // Another user is refused at the notebook's sign-in.
    let mallory = format!("{user}-m");
    let mallory_password = need(up.add_user(&mallory));
    let mallory_session =
        crate::support::embedded::Session::sign_in(&up, &mallory, &mallory_password).await;
    assert_eq!(
        mallory_session
            .open_notebook(&user, "code")
            .await
            .err()
            .as_deref(),
        Some("the web app's notebook sign-in: HTTP 403")
    );
    exec(
        &container,
        "echo hello-from-workspace > /home/jovyan/hello.txt",
    );
    assert_eq!(exec(&container, "id -u").trim(), "1000");

    let before_browser = jiff::Timestamp::now();
    let screenshot = need(labforge_tests::artifacts_dir()).join("vscode-notebook.png");
    let browsed = Instant::now();
    let printed = need(labforge_tests::browser::run_script(
        "open-vscode.mjs",
        &[
            "--cookie",
            &cookie,
            "--web",
            &up.url,
            "--open",
            "hello.txt",
            "--expect",
            "hello-from-workspace",
            "--run",
            "python3 -c 'print(\"vscode-%d\" % (6*7))' > /home/jovyan/from-terminal.txt",
            "--terminal-creates",
            "from-terminal.txt",
            "--terminal-expect",
            "vscode-42",
            "--screenshot",
            &screenshot.to_string_lossy(),
            &url,
        ],
    ));
    eprintln!("{printed}browser session: {:?}", browsed.elapsed());
    assert!(printed.contains("vscode: ok"), "{printed}");
    assert!(
        screenshot.metadata().unwrap().len() > 10_000,
        "empty screenshot"
    );

    // Python's own tools work for the notebook's user: a venv with pip in it.
    assert!(
        exec(
            &container,
            "python3 -m venv /tmp/venv && /tmp/venv/bin/pip --version"
        )
        .starts_with("pip "),
        "pip in a venv"
    );

    // What the terminal ran (Python), it ran in the notebook's container, as jovyan.
    assert_eq!(
        exec(
            &container,
            "cat /home/jovyan/from-terminal.txt; stat -c %u /home/jovyan/from-terminal.txt"
        ),
        "vscode-42\n1000\n"
    );

    // The proxy saw the session (websocket reads count): the view reports it as activity.
    let view = get_notebook().await;
    let last_activity: jiff::Timestamp = view["notebook"]["lastActivity"]
        .as_str()
        .unwrap_or_else(|| panic!("no lastActivity after the browser session: {view}"))
        .parse()
        .unwrap();
    assert!(
        last_activity >= before_browser - jiff::SignedDuration::from_secs(1),
        "lastActivity {last_activity} predates the browser session ({before_browser})"
    );
}
