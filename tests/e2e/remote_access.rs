//! Reaching a notebook from one's own tools on a real `labforge up`: API tokens (made, listed,
//! refused when revoked, another user's reaching nothing), `labforge login`, `labforge ssh` and
//! the real OpenSSH client (`ssh`, `scp`, `rsync`, `ssh -L`) through `labforge config-ssh`'s entries, the
//! bytes carried by the web app's websocket to the agent's SSH server in the container.

use crate::need;
use crate::support::embedded::{Session, up_with_jupyterlab};
use labforge_tests::embedded::RemoveNotebooksOnDrop;
use serde_json::json;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).trim().to_owned()
}

/// `labforge` with the CLI's config in `config` and, when given, a token in the environment.
fn labforge(config: &Path, token: Option<(&str, &str)>) -> Command {
    let mut command = crate::labforge();
    command
        .env("XDG_CONFIG_HOME", config)
        .env_remove("LABFORGE_URL")
        .env_remove("LABFORGE_TOKEN");
    if let Some((url, token)) = token {
        command
            .env("LABFORGE_URL", url)
            .env("LABFORGE_TOKEN", token);
    }
    command
}

/// OpenSSH's `program` with the config `labforge config-ssh` wrote, and nothing of this user's.
fn openssh(program: &str, ssh_config: &Path, config: &Path) -> Command {
    let mut command = Command::new(program);
    command
        .env("XDG_CONFIG_HOME", config)
        .env_remove("LABFORGE_URL")
        .env_remove("LABFORGE_TOKEN")
        .arg("-F")
        .arg(ssh_config)
        .args(["-o", "BatchMode=yes", "-o", "ConnectTimeout=30"]);
    command
}

fn run(command: &mut Command) -> Output {
    command.stdin(Stdio::null()).output().expect("runs")
}

#[tokio::test]
async fn tokens_let_the_cli_and_openssh_into_ones_own_notebook_and_nobody_elses() {
    crate::init_crypto();
    let id = format!("{:x}", std::process::id());
    let [alice, bob] = ["alice", "bob"].map(|u| format!("{u}-ssh-{id}"));
    let _cleanup = RemoveNotebooksOnDrop(vec![alice.clone(), bob.clone()]);
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let up = up_with_jupyterlab(&data, &[]).await;
    let admin = Session::sign_in(&up, "admin", up.admin_password.as_deref().unwrap()).await;
    let alice_password = need(up.add_user(&alice));
    let bob_password = need(up.add_user(&bob));
    let alice_s = Session::sign_in(&up, &alice, &alice_password).await;
    let bob_s = Session::sign_in(&up, &bob, &bob_password).await;
    let url = up.url.trim_end_matches('/').to_owned();

    let created = alice_s
        .post(
            &format!("/api/namespaces/{alice}/notebooks"),
            json!({"name": "lab", "workspace": "none", "cpu": "0.5"}),
        )
        .await;
    assert_eq!(created.0, 201, "{}", created.1);

    // Tokens through the API: the secret once, then never; bad input named.
    let (status, made) = alice_s
        .post("/api/tokens", json!({"name": "laptop", "expiresIn": "1h"}))
        .await;
    assert_eq!(status, 201, "{made}");
    let laptop = made["token"].as_str().unwrap().to_owned();
    let laptop_id = made["id"].as_str().unwrap().to_owned();
    let (status, listed) = alice_s.get("/api/tokens").await;
    assert_eq!(status, 200);
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(listed[0]["name"], "laptop");
    assert!(listed[0].get("token").is_none() && !listed.to_string().contains(&laptop));
    let (status, again) = alice_s.post("/api/tokens", json!({"name": "laptop"})).await;
    assert_eq!(
        (status, again["field"].as_str()),
        (409, Some("name")),
        "{again}"
    );
    let (status, bad) = alice_s
        .post("/api/tokens", json!({"name": "x", "expiresIn": "forever"}))
        .await;
    assert_eq!(
        (status, bad["field"].as_str()),
        (422, Some("expiresIn")),
        "{bad}"
    );
    let stored = std::fs::read_to_string(data.join("tokens.json")).unwrap();
    assert!(!stored.contains(&laptop), "tokens are stored hashed");

    // A bearer token reaches the API as its user, and only what its user may.
    let bearer = |token: &str, path: &str| {
        let (url, token) = (url.clone(), token.to_owned());
        let path = path.to_owned();
        async move {
            let response = reqwest::Client::new()
                .get(format!("{url}{path}"))
                .bearer_auth(token)
                .send()
                .await
                .unwrap();
            let status = response.status().as_u16();
            (
                status,
                response
                    .json::<serde_json::Value>()
                    .await
                    .unwrap_or_default(),
            )
        }
    };
    let (_, got) = bearer(&laptop, &format!("/api/namespaces/{alice}/notebooks/lab")).await;
    let port = url.rsplit(':').next().unwrap();
    assert_eq!(
        got["notebook"]["address"],
        format!("http://lab--{alice}.localhost:{port}/notebook/{alice}/lab/"),
        "the whole address a browser opens: {got}"
    );
    let minted = reqwest::Client::new()
        .post(format!("{url}/api/tokens"))
        .bearer_auth(&laptop)
        .json(&json!({"name": "minted by a token"}))
        .send()
        .await
        .unwrap();
    assert_eq!(minted.status(), 403, "a token makes no tokens");
    let (status, me) = bearer(&laptop, "/api/whoami").await;
    assert_eq!((status, me["name"].as_str()), (200, Some(alice.as_str())));
    let (status, _) = bob_s.post("/api/tokens", json!({"name": "bobs"})).await;
    assert_eq!(status, 201);
    let (_, bobs) = bob_s.get("/api/tokens").await;
    let bob_token_id = bobs[0]["id"].as_str().unwrap().to_owned();
    let (_, bob_made) = bob_s.post("/api/tokens", json!({"name": "cli"})).await;
    let bob_token = bob_made["token"].as_str().unwrap().to_owned();
    let (status, _) = bearer(&bob_token, &format!("/api/namespaces/{alice}/notebooks")).await;
    assert_eq!(status, 403, "bob's token reaches nothing of alice's");
    let (status, nothing) = bearer("lft_made-up", "/api/whoami").await;
    assert_eq!(status, 401);
    assert!(
        nothing["error"]
            .as_str()
            .unwrap()
            .contains("revoked, expired or unknown")
    );

    // While it starts, the list says why at every step: nothing says only "starting".
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut reasons = Vec::new();
    loop {
        let (_, list) = alice_s
            .get(&format!("/api/namespaces/{alice}/notebooks"))
            .await;
        let lab = &list["notebooks"][0];
        match lab["state"].as_str() {
            Some("ready") => break,
            Some("starting") => {
                let reason = lab["reason"].as_str().unwrap_or_default().to_owned();
                assert!(
                    !reason.is_empty(),
                    "starting with no reason after {reasons:?}"
                );
                if reasons.last() != Some(&reason) {
                    reasons.push(reason);
                }
            }
            other => panic!("{other:?}: {lab}"),
        }
        assert!(Instant::now() < deadline, "not ready: {reasons:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        reasons
            .iter()
            .any(|r| r.contains("waiting for its server to answer")),
        "{reasons:?}"
    );

    // `labforge login` with a password makes a token of its own and keeps it, mode 0600.
    let config = dir.path().join("config");
    let mut login = labforge(&config, None)
        .args(["login", &url, "--user", &alice, "--password-stdin"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write as _;
        let mut stdin = login.stdin.take().unwrap();
        writeln!(stdin, "{alice_password}").unwrap();
    }
    let out = login.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains(&format!("as {alice}")),
        "{}",
        text(&out.stderr)
    );
    let credentials = config.join("labforge/credentials.json");
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(&credentials)
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let (_, tokens) = alice_s.get("/api/tokens").await;
    assert_eq!(
        tokens.as_array().unwrap().len(),
        2,
        "login made one: {tokens}"
    );

    // `labforge ssh`: a command's output and its exit code.
    let out = run(labforge(&config, None).args([
        "ssh",
        &format!("{alice}/lab"),
        "--",
        "python3",
        "-c",
        "print(6*7)",
    ]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "42");
    let out = run(labforge(&config, None).args([
        "ssh",
        &format!("{alice}/lab"),
        "--",
        "sh",
        "-c",
        "echo to-stderr >&2; exit 7",
    ]));
    assert_eq!(out.status.code(), Some(7));
    assert_eq!(text(&out.stderr), "to-stderr");
    let out =
        run(labforge(&config, None).args(["ssh", &format!("{alice}/lab"), "--", "id", "-un"]));
    assert_eq!(text(&out.stdout), "jovyan", "as the container's user");

    // OpenSSH through `labforge config-ssh`'s entries: a command, scp both ways, ssh -L.
    let ssh_config = dir.path().join("ssh_config");
    let out = run(labforge(&config, None)
        .args(["config-ssh", "--ssh-config"])
        .arg(&ssh_config));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let host = format!("lab.{alice}.labforge");
    assert!(
        text(&out.stderr).contains(&format!("ssh {host}")),
        "{}",
        text(&out.stderr)
    );
    let out =
        run(openssh("ssh", &ssh_config, &config).args([&host, "python3 -c 'print(6*7)'; exit 3"]));
    assert_eq!(text(&out.stdout), "42", "{}", text(&out.stderr));
    assert_eq!(out.status.code(), Some(3));
    let local = dir.path().join("sent.txt");
    std::fs::write(&local, "from the laptop\n").unwrap();
    let out = run(openssh("scp", &ssh_config, &config)
        .arg(&local)
        .arg(format!("{host}:sent.txt")));
    assert!(out.status.success(), "scp up: {}", text(&out.stderr));
    let back = dir.path().join("back.txt");
    let out = run(openssh("scp", &ssh_config, &config)
        .arg(format!("{host}:sent.txt"))
        .arg(&back));
    assert!(out.status.success(), "scp down: {}", text(&out.stderr));
    assert_eq!(std::fs::read_to_string(&back).unwrap(), "from the laptop\n");
    let tree = dir.path().join("tree");
    std::fs::create_dir_all(tree.join("sub")).unwrap();
    std::fs::write(tree.join("sub/deep.txt"), "synced\n").unwrap();
    let ssh_command = format!("ssh -F {} -o BatchMode=yes", ssh_config.display());
    let out = run(Command::new("rsync")
        .env("XDG_CONFIG_HOME", &config)
        .args(["-a", "-e", &ssh_command])
        .arg(format!("{}/", tree.display()))
        .arg(format!("{host}:tree/")));
    assert!(out.status.success(), "rsync: {}", text(&out.stderr));
    let out = run(openssh("ssh", &ssh_config, &config).args([&host, "cat tree/sub/deep.txt"]));
    assert_eq!(text(&out.stdout), "synced", "{}", text(&out.stderr));

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut forward = openssh("ssh", &ssh_config, &config)
        .args([
            "-N",
            "-L",
            &format!("127.0.0.1:{port}:127.0.0.1:8888"),
            &host,
        ])
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let jupyter = format!("http://127.0.0.1:{port}/notebook/{alice}/lab/api");
    let deadline = Instant::now() + Duration::from_secs(30);
    let answer = loop {
        match reqwest::get(&jupyter).await {
            Ok(response) => break response.json::<serde_json::Value>().await.unwrap(),
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await
            }
            Err(err) => panic!("nothing answered on the forwarded port: {err}"),
        }
    };
    assert!(
        answer["version"].is_string(),
        "Jupyter's own answer, forwarded: {answer}"
    );
    let _ = forward.kill();
    let _ = forward.wait();

    // SSH counts as activity for culling (nothing else opens this notebook), and each
    // connection is in the audit trail.
    let last_activity = || async {
        let (_, view) = alice_s
            .get(&format!("/api/namespaces/{alice}/notebooks/lab"))
            .await;
        let last = view["notebook"]["lastActivity"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        last.parse::<jiff::Timestamp>().unwrap()
    };
    let before = last_activity().await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let out = run(labforge(&config, None).args(["ssh", &format!("{alice}/lab"), "--", "true"]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(last_activity().await > before, "an SSH session is activity");
    let audit = run(crate::labforge()
        .args(["audit", "--user", &alice, "--json", "--data-dir"])
        .arg(&data));
    assert!(
        text(&audit.stdout).contains("\"notebook ssh\""),
        "{}",
        text(&audit.stdout)
    );

    // bob's token reaches nothing of alice's: refused with the reason, nothing run.
    let bobs = Some((url.as_str(), bob_token.as_str()));
    let out = run(labforge(&config, bobs).args([
        "ssh",
        &format!("{alice}/lab"),
        "--",
        "touch",
        "/tmp/bob-was-here",
    ]));
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("may not"),
        "{}",
        text(&out.stderr)
    );
    let out = run(labforge(&config, None).args([
        "ssh",
        &format!("{alice}/lab"),
        "--",
        "ls",
        "/tmp/bob-was-here",
    ]));
    assert!(!out.status.success(), "bob ran nothing");

    // Revoking a token refuses it at once and closes the connection it holds open.
    let laptops = Some((url.as_str(), laptop.as_str()));
    let mut held = labforge(&config, laptops)
        .args(["ssh", &format!("{alice}/lab"), "--", "sleep", "60"])
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        alice_s.delete(&format!("/api/tokens/{laptop_id}")).await.0,
        204
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    while held.try_wait().unwrap().is_none() {
        assert!(
            Instant::now() < deadline,
            "the revoked token's connection stayed open"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let said = text(&held.wait_with_output().unwrap().stderr);
    assert!(said.contains("access to this notebook ended"), "{said}");
    let out = run(labforge(&config, laptops).args(["ssh", &format!("{alice}/lab"), "--", "true"]));
    assert!(
        text(&out.stderr).contains("revoked, expired or unknown"),
        "{}",
        text(&out.stderr)
    );

    // An admin sees every user's tokens and revokes any; a user revokes none of another's.
    assert_eq!(
        bob_s.delete(&format!("/api/tokens/{laptop_id}")).await.0,
        404
    );
    let (status, all) = admin.get("/api/admin/tokens").await;
    assert_eq!(status, 200);
    let users: Vec<&str> = all
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["user"].as_str())
        .collect();
    assert!(
        users.contains(&alice.as_str()) && users.contains(&bob.as_str()),
        "{all}"
    );
    assert_eq!(bob_s.get("/api/admin/tokens").await.0, 403);
    assert_eq!(
        admin.delete(&format!("/api/tokens/{bob_token_id}")).await.0,
        204
    );

    // The same in Chromium, one person per browser: the Tokens page as alice, bob and an admin.
    let walk = dir.path().join("tokens.json");
    std::fs::write(
        &walk,
        json!({
            "url": up.url.trim_end_matches('/'),
            "alice": [alice, alice_password], "bob": [bob, bob_password],
            "admin": ["admin", up.admin_password],
            "screenshots": need(labforge_tests::artifacts_dir()),
        })
        .to_string(),
    )
    .unwrap();
    let output = labforge_tests::browser::run_script("tokens.mjs", &[&walk.to_string_lossy()])
        .unwrap_or_else(|e| panic!("{e}"));
    let seen: serde_json::Value = serde_json::from_str(output.lines().last().unwrap()).unwrap();
    assert!(
        seen["emptyName"].as_str().unwrap().contains("name must be"),
        "{seen}"
    );
    let browser_token = seen["token"].as_str().unwrap();
    assert!(browser_token.starts_with("lft_"), "{seen}");
    assert!(
        seen["aliceRow"]
            .as_str()
            .unwrap()
            .starts_with("from the browser"),
        "{seen}"
    );
    assert_eq!(seen["aliceOverflows"], false, "{seen}");
    assert_eq!(seen["secretAfterReload"], false, "the secret is shown once");
    assert_eq!(
        seen["loginCommand"],
        format!("labforge login {url}"),
        "{seen}"
    );
    assert_eq!(seen["bobSeesAlices"], 0, "{seen}");
    assert_eq!(seen["bobSeesAllTokens"], 0, "{seen}");
    let admin_rows = seen["adminRows"].to_string();
    assert!(
        admin_rows.contains(&alice) && admin_rows.contains("bobs laptop"),
        "{seen}"
    );
    assert_eq!(seen["aliceLeft"], 0, "{seen}");
    let (status, _) = bearer(browser_token, "/api/whoami").await;
    assert_eq!(status, 401, "revoked on the page, refused by the API");

    // A stopped notebook says so, rather than hang.
    assert_eq!(
        alice_s
            .patch(
                &format!("/api/namespaces/{alice}/notebooks/lab"),
                json!({"stopped": true})
            )
            .await
            .0,
        200
    );
    alice_s
        .wait_state(&alice, "lab", "stopped", Duration::from_secs(60))
        .await;
    let out = run(labforge(&config, None).args(["ssh", &format!("{alice}/lab"), "--", "true"]));
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("is stopped: start it first"),
        "{}",
        text(&out.stderr)
    );

    // `labforge logout` revokes and forgets its token.
    let out = run(labforge(&config, None).arg("logout"));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(!credentials.exists());
    let (_, left) = alice_s.get("/api/tokens").await;
    assert_eq!(left.as_array().unwrap().len(), 0, "{left}");
    let out = run(labforge(&config, None).args(["ssh", &format!("{alice}/lab")]));
    assert!(
        text(&out.stderr).contains("not signed in"),
        "{}",
        text(&out.stderr)
    );
}

/// A web app alice runs in her notebook (tests/fixtures/port-app, on port 8050) is listed by the
/// API with the address of its own host and opens there in Chromium, its websocket included,
/// through the agent in the container: no port is published. Bob may neither list nor open it
/// until alice opens it to everyone; bad sharing requests name their field; a port nothing
/// listens on and a stopped notebook each get a page that says so.
#[tokio::test]
async fn a_web_app_in_a_notebook_opens_at_its_ports_own_host_for_whom_its_owner_shares_it_with() {
    crate::init_crypto();
    let id = format!("{:x}", std::process::id());
    let [alice, bob] = ["alice", "bob"].map(|u| format!("{u}-port-{id}"));
    let _cleanup = RemoveNotebooksOnDrop(vec![alice.clone(), bob.clone()]);
    let dir = tempfile::tempdir().unwrap();
    let up = up_with_jupyterlab(&dir.path().join("data"), &[]).await;
    let alice_password = need(up.add_user(&alice));
    let bob_password = need(up.add_user(&bob));
    let alice_s = Session::sign_in(&up, &alice, &alice_password).await;
    let bob_s = Session::sign_in(&up, &bob, &bob_password).await;
    let notebook = format!("/api/namespaces/{alice}/notebooks/app");
    let created = alice_s
        .post(
            &format!("/api/namespaces/{alice}/notebooks"),
            json!({"name": "app", "workspace": "none", "cpu": "0.5"}),
        )
        .await;
    assert_eq!(created.0, 201, "{}", created.1);
    alice_s
        .wait_state(&alice, "app", "ready", Duration::from_secs(180))
        .await;
    let container = format!("labforge-{alice}_app");
    let app = labforge_tests::repo_root().join("tests/fixtures/port-app/app.py");
    assert!(
        run(Command::new("podman")
            .arg("cp")
            .arg(&app)
            .arg(format!("{container}:/tmp/app.py")))
        .status
        .success()
    );
    let started = run(Command::new("podman").args([
        "exec",
        "-d",
        &container,
        "python3",
        "/tmp/app.py",
        "8050",
    ]));
    assert!(started.status.success(), "{}", text(&started.stderr));
    // Nothing is published for it: the container's only published port is the notebook's own.
    let published = run(Command::new("podman").args(["port", &container]));
    assert!(
        !text(&published.stdout).contains("8050"),
        "{}",
        text(&published.stdout)
    );

    let deadline = Instant::now() + Duration::from_secs(30);
    let listed = loop {
        let (status, body) = alice_s.get(&format!("{notebook}/ports")).await;
        assert_eq!(status, 200, "{body}");
        if body["ports"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["port"] == 8050)
        {
            break body;
        }
        assert!(Instant::now() < deadline, "8050 never listed: {body}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let port = up
        .url
        .trim_end_matches('/')
        .rsplit(':')
        .next()
        .unwrap()
        .to_owned();
    assert_eq!(
        listed["ports"],
        json!([{"port": 8050, "sharing": "private",
                "address": format!("http://8050--app--{alice}.localhost:{port}/")}]),
        "the notebook's own server is not listed"
    );
    assert_eq!(bob_s.get(&format!("{notebook}/ports")).await.0, 403);
    let share = |port: &str| format!("{notebook}/ports/{port}");
    let (status, bad) = alice_s
        .put(&share("8050"), json!({"sharing": "world"}))
        .await;
    assert_eq!(
        (status, bad["field"].as_str()),
        (422, Some("sharing")),
        "{bad}"
    );
    let (status, bad) = alice_s.put(&share("0"), json!({"sharing": "all"})).await;
    assert_eq!(
        (status, bad["field"].as_str()),
        (422, Some("port")),
        "{bad}"
    );
    let refused = bob_s.put(&share("8050"), json!({"sharing": "all"})).await;
    assert_eq!(refused.0, 403, "{}", refused.1);

    let walk = dir.path().join("ports.json");
    std::fs::write(
        &walk,
        json!({
            "url": up.url.trim_end_matches('/'),
            "notebook": format!("{alice}/app"), "port": 8050,
            "alice": [alice, alice_password], "bob": [bob, bob_password],
            "screenshots": need(labforge_tests::artifacts_dir()),
        })
        .to_string(),
    )
    .unwrap();
    let output = labforge_tests::browser::run_script("ports.mjs", &[&walk.to_string_lossy()])
        .unwrap_or_else(|e| panic!("{e}"));
    let seen: serde_json::Value = serde_json::from_str(output.lines().last().unwrap()).unwrap();
    let address = format!("http://8050--app--{alice}.localhost:{port}/");
    assert_eq!(seen["address"], address, "{seen}");
    assert_eq!(seen["sharing"], "private", "{seen}");
    let says = |key: &str, status: u64, words: &str| {
        assert_eq!(seen[key][0], status, "{key}: {seen}");
        assert!(
            seen[key][1].as_str().unwrap().contains(words),
            "{key}: {seen}"
        );
    };
    assert!(
        seen["aliceSees"]
            .as_str()
            .unwrap()
            .contains("Hello from port 8050 echo: ping over the port"),
        "the page, and its websocket through the port's host: {seen}"
    );
    says(
        "nothingListens",
        502,
        "nothing listens on port 1 in this notebook",
    );
    says("bobBefore", 403, "may not open port 8050");
    says("bobAfter", 200, "echo: ping over the port");
    says("stopped", 502, "the notebook is not running");
    assert_eq!(
        seen["stoppedCard"], "The notebook is not running.",
        "{seen}"
    );
    let (status, stopped) = alice_s.get(&format!("{notebook}/ports")).await;
    assert_eq!(status, 409, "{stopped}");
    assert!(
        stopped["error"]
            .as_str()
            .unwrap()
            .contains("is not running"),
        "{stopped}"
    );
}
