//! `labforge up` as a team's server: HTTPS on its one port, with the notebooks' own hosts, their
//! kernels' websockets and saves going through it.

use crate::need;
use crate::support::embedded::{CHECK, PIP_INSTALL, Session, up_with_jupyterlab};
use labforge_tests::embedded::RemoveNotebooksOnDrop;
use serde_json::json;
use std::process::Command;
use std::time::Duration;

/// Under `--tls-self-signed`: plain HTTP to the port is sent to HTTPS; sign-in, the notebook's
/// own host (its cookie), a kernel over `wss://`, a save and a start on the saved image all work
/// over TLS, with `Secure` cookies; the certificate is kept across restarts and its fingerprint
/// printed. A certificate path that does not exist stops the start, naming it.
#[tokio::test]
async fn a_team_server_under_tls_serves_everything_over_https() {
    crate::init_crypto();
    let binary = std::path::Path::new(env!("CARGO_BIN_EXE_labforge"));
    let dir = tempfile::tempdir().unwrap();

    let refused = Command::new(binary)
        .args(["up", "--data-dir"])
        .arg(dir.path().join("refused"))
        .args(["--listen", "127.0.0.1:0", "--engine", "sh"])
        .args(["--tls-cert", "/nonexistent/cert.pem"])
        .args(["--tls-key", "/nonexistent/key.pem"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert!(stderr.contains("/nonexistent/cert.pem"), "{stderr}");
    assert!(
        !dir.path().join("refused").join("users.json").exists(),
        "nothing set up"
    );

    let alice = format!("tls-alice-{:x}", std::process::id());
    let _cleanup = RemoveNotebooksOnDrop(vec![alice.clone()]);
    let data = dir.path().join("data");
    // A certificate cannot carry `*.localhost` (a wildcard needs two labels after it): the
    // default domain is refused with --tls-self-signed, one more label serves.
    let refused = Command::new(binary)
        .args(["up", "--data-dir"])
        .arg(dir.path().join("refused"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--engine",
            "sh",
            "--tls-self-signed",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert!(stderr.contains("--notebook-domain"), "{stderr}");
    let mut up = up_with_jupyterlab(
        &data,
        &[
            "--tls-self-signed",
            "--notebook-domain",
            "labforge.localhost",
        ],
    )
    .await;
    assert!(
        up.url.starts_with("https://labforge.localhost:"),
        "{}",
        up.url
    );
    let fingerprint =
        labforge_embedded::self_signed::fingerprint_of(&data.join("tls").join("cert.pem")).unwrap();
    let printed = up.stdout();
    assert!(
        printed.contains(&fingerprint) && printed.contains("made now"),
        "{printed}"
    );

    // Plain HTTP on the same port: the same URL over HTTPS, on the app's host and a notebook's.
    let port = up.url.rsplit(':').next().unwrap().to_owned();
    let plain = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    for host in [
        format!("labforge.localhost:{port}"),
        format!("lab--{alice}.labforge.localhost:{port}"),
    ] {
        let response = plain
            .get(format!("http://127.0.0.1:{port}/notebooks?x=1"))
            .header("host", &host)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 307, "{host}");
        assert_eq!(
            response.headers()["location"],
            format!("https://{host}/notebooks?x=1").as_str()
        );
    }

    // The certificate covers every notebook's host by its name (`*.labforge.localhost`), as
    // browsers reach them; the app's own host by name is what Session uses below.
    let notebook_host = format!("lab--{alice}.labforge.localhost");
    let address: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let by_name = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&up.certificate().unwrap()).unwrap())
        .resolve(&notebook_host, address)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let visit = by_name
        .get(format!(
            "https://{notebook_host}:{port}/notebook/{alice}/lab/lab"
        ))
        .header("sec-fetch-mode", "navigate")
        .send()
        .await
        .unwrap();
    assert_eq!(visit.status(), 302, "sent to sign in, over TLS by name");

    // Sign-in (Session checks the cookie is Secure), create, and a kernel on the notebook's own
    // host over wss:// (open_notebook checks its cookie is Secure).
    let password = need(up.add_user(&alice));
    let a = Session::sign_in(&up, &alice, &password).await;
    let notebooks = format!("/api/namespaces/{alice}/notebooks");
    let (code, created) = a.post(&notebooks, json!({"name": "lab"})).await;
    assert_eq!(code, 201, "{created}");
    a.wait_state(&alice, "lab", "ready", Duration::from_secs(120))
        .await;
    let jupyter = a.jupyter(&alice, "lab").await;
    let installed = need(jupyter.run_code(PIP_INSTALL).await);
    assert!(installed.starts_with("pip exit 0"), "{installed}");

    // Save, and follow the save's progress over HTTPS.
    let (code, save) = a
        .post(&format!("{notebooks}/lab/saves"), json!({"tag": "tls"}))
        .await;
    assert_eq!(code, 202, "{save}");
    let (events, progress) = a.save_progress(&alice, save["id"].as_str().unwrap()).await;
    let last = progress.last().unwrap();
    assert_eq!(last["phase"], "done", "{events}");
    let (_, images) = a.get(&format!("/api/namespaces/{alice}/images")).await;
    let saved = images["images"][0]["image"].as_str().unwrap().to_owned();

    // A restart keeps the certificate, so browsers that trusted it keep trusting it.
    up = need(up.restart().await);
    let printed = up.stdout();
    assert!(
        printed.contains(&fingerprint) && printed.contains("kept from before"),
        "{printed}"
    );

    // Start again on the saved image: the package came with it.
    let a = Session::sign_in(&up, &alice, &password).await;
    let (code, stopped) = a
        .patch(&format!("{notebooks}/lab"), json!({"stopped": true}))
        .await;
    assert_eq!(code, 200, "{stopped}");
    a.wait_state(&alice, "lab", "stopped", Duration::from_secs(60))
        .await;
    let (code, moved) = a
        .patch(
            &format!("{notebooks}/lab"),
            json!({"stopped": false, "image": saved}),
        )
        .await;
    assert_eq!(code, 200, "{moved}");
    a.wait_state(&alice, "lab", "ready", Duration::from_secs(120))
        .await;
    let checked = need(a.jupyter(&alice, "lab").await.run_code(CHECK).await);
    assert!(checked.contains("answer 42"), "{checked}");
}

/// `labforge service install` writes a unit `systemd-analyze verify` accepts without a warning,
/// running this binary's `up` with the arguments given, and makes the first admin on the
/// installer's terminal, so that no password reaches the system journal.
#[test]
fn the_service_unit_runs_up_and_systemd_accepts_it() {
    let binary = std::path::Path::new(env!("CARGO_BIN_EXE_labforge"));
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let install_with = |extra: &[&str]| {
        Command::new(binary)
            .args(["service", "install", "--unit-dir"])
            .arg(dir.path())
            .args(extra)
            .arg("--data-dir")
            .arg(&data)
            .args(["--listen", "0.0.0.0:8443", "--tls-self-signed"])
            .args(["--notebook-domain", "lab.example.com", "--agent"])
            .arg(dir.path().join("labforge-agent"))
            .output()
            .unwrap()
    };
    let install = || install_with(&[]);
    let first = install();
    let printed = String::from_utf8_lossy(&first.stdout);
    assert!(
        first.status.success(),
        "{printed}{}",
        String::from_utf8_lossy(&first.stderr)
    );
    assert!(
        printed.contains("Sign in as admin with password"),
        "{printed}"
    );
    let again = install();
    assert!(again.status.success());
    assert!(
        !String::from_utf8_lossy(&again.stdout).contains("password"),
        "the admin is made once"
    );

    let unit_path = dir.path().join("labforge.service");
    let unit = std::fs::read_to_string(&unit_path).unwrap();
    let exec = format!(
        "ExecStart={} up --data-dir {} --listen 0.0.0.0:8443",
        binary.canonicalize().unwrap().display(),
        data.display()
    );
    assert!(unit.contains(&exec), "{unit}");
    assert!(unit.contains(" --tls-self-signed\n"), "{unit}");
    let verify = Command::new(need(labforge_tests::tools::locate("systemd-analyze")))
        .args(["verify", "--man=no"])
        .arg(&unit_path)
        .output()
        .unwrap();
    let complaints = String::from_utf8_lossy(&verify.stderr);
    assert!(
        verify.status.success() && complaints.trim().is_empty(),
        "{complaints}\n{unit}"
    );

    // Scheduled backups: a relative directory is refused before anything is written.
    let refused = install_with(&["--backup-to", "backups"]);
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("absolute path"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    assert!(!dir.path().join("labforge-backup.timer").exists());
    let scheduled = install_with(&[
        "--backup-to",
        "s3://team-backups/lab",
        "--backup-keep",
        "7",
        "--backup-on",
        "*-*-* 03:00",
    ]);
    assert!(
        scheduled.status.success(),
        "{}",
        String::from_utf8_lossy(&scheduled.stderr)
    );
    let service = std::fs::read_to_string(dir.path().join("labforge-backup.service")).unwrap();
    assert!(
        service.contains(&format!(
            "ExecStart={} backup s3://team-backups/lab --keep 7 --data-dir {} --quiet",
            binary.canonicalize().unwrap().display(),
            data.display()
        )),
        "{service}"
    );
    let timer = std::fs::read_to_string(dir.path().join("labforge-backup.timer")).unwrap();
    assert!(timer.contains("OnCalendar=*-*-* 03:00\n"), "{timer}");
    let verify = Command::new(need(labforge_tests::tools::locate("systemd-analyze")))
        .args(["verify", "--man=no"])
        .arg(dir.path().join("labforge-backup.service"))
        .arg(dir.path().join("labforge-backup.timer"))
        .output()
        .unwrap();
    let complaints = String::from_utf8_lossy(&verify.stderr);
    assert!(
        verify.status.success() && complaints.trim().is_empty(),
        "{complaints}\n{service}\n{timer}"
    );
}

/// The fixture's user and password (`tests/fixtures/data-dir-format-0`: a data dir as labforge
/// wrote it before data dirs carried a format; one user with a stopped notebook `lab`).
const FORMAT_0_USER: (&str, &str) = ("ada", "2YyzreXHk0aIpVQzvsWG");

/// An older data dir is migrated at start (its users and notebooks as they were, the format
/// recorded); a data dir of a newer format is refused with the versions named, and left as it was.
#[tokio::test]
async fn an_older_data_dir_is_migrated_and_a_newer_one_is_refused_untouched() {
    crate::init_crypto();
    let binary = std::path::Path::new(env!("CARGO_BIN_EXE_labforge"));
    let agent = need(labforge_tests::agent::agent_binary());
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let fixture = labforge_tests::repo_root().join("tests/fixtures/data-dir-format-0");
    let copied = Command::new("cp")
        .arg("-a")
        .arg(&fixture)
        .arg(&data)
        .status()
        .unwrap();
    assert!(copied.success());

    let mut up = need(labforge_tests::embedded::LabforgeUp::start(binary, &data, &agent).await);
    assert!(up.admin_password.is_none(), "the fixture has its admin");
    let format: serde_json::Value =
        serde_json::from_slice(&std::fs::read(data.join("format.json")).unwrap()).unwrap();
    assert_eq!(format["format"], labforge_embedded::data_dir::FORMAT);
    let (user, password) = FORMAT_0_USER;
    let session = Session::sign_in(&up, user, password).await;
    let (code, listed) = session
        .get(&format!("/api/namespaces/{user}/notebooks"))
        .await;
    assert_eq!(code, 200, "{listed}");
    assert_eq!(listed["notebooks"][0]["name"], "lab", "{listed}");
    assert_eq!(listed["notebooks"][0]["state"], "stopped", "{listed}");
    assert!(up.stop());

    // A newer labforge's data: refused, naming both versions, and nothing in it changed.
    std::fs::write(
        data.join("format.json"),
        r#"{"format": 99, "writtenBy": "99.0.0"}"#,
    )
    .unwrap();
    let before = tree(&data);
    let refused = Command::new(binary)
        .args(["up", "--data-dir"])
        .arg(&data)
        .args(["--listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert!(
        stderr.contains("format 99") && stderr.contains("99.0.0") && stderr.contains("up to 1"),
        "{stderr}"
    );
    assert_eq!(tree(&data), before, "the data dir is as it was");
}

/// Every file under `dir` but the instance lock, with its contents.
fn tree(dir: &std::path::Path) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_owned()];
    while let Some(path) = pending.pop() {
        if path.is_dir() {
            pending.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
        } else if path.file_name().is_some_and(|n| n != "labforge.lock") {
            files.push((path.clone(), std::fs::read(&path).unwrap()));
        }
    }
    files.sort();
    files
}

/// `labforge status` shows the running instance, its users, notebooks, saved images and disk
/// use. A backup taken while a notebook runs, the data dir wiped (its registry kept: images stay
/// in the registry) and the backup restored: users sign in with their passwords, the notebook
/// and its saved image are listed, and the running notebook is adopted, not restarted. A restore
/// into a data dir that has data is refused.
#[tokio::test]
async fn status_shows_the_instance_and_a_backup_made_while_running_restores_it() {
    crate::init_crypto();
    let binary = std::path::Path::new(env!("CARGO_BIN_EXE_labforge"));
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let alice = format!("backup-alice-{:x}", std::process::id());
    let _cleanup = RemoveNotebooksOnDrop(vec![alice.clone()]);
    let mut up = up_with_jupyterlab(&data, &[]).await;
    let password = need(up.add_user(&alice));
    let a = Session::sign_in(&up, &alice, &password).await;
    let notebooks = format!("/api/namespaces/{alice}/notebooks");
    assert_eq!(a.post(&notebooks, json!({"name": "lab"})).await.0, 201);
    a.wait_state(&alice, "lab", "ready", Duration::from_secs(120))
        .await;
    // A file to keep, so that the save makes an image.
    let container = labforge_embedded::runtime::container_name(&alice, "lab");
    let wrote = Command::new("podman")
        .args(["exec", &container, "sh", "-c", "echo kept > /tmp/kept"])
        .status()
        .unwrap();
    assert!(wrote.success());
    let (code, save) = a
        .post(&format!("{notebooks}/lab/saves"), json!({"tag": "kept"}))
        .await;
    assert_eq!(code, 202, "{save}");
    let (events, progress) = a.save_progress(&alice, save["id"].as_str().unwrap()).await;
    assert_eq!(progress.last().unwrap()["phase"], "done", "{events}");

    // The admin's view of it on the command line.
    let status = |json: bool| {
        let mut command = Command::new(binary);
        command.arg("status").arg("--data-dir").arg(&data);
        if json {
            command.arg("--json");
        }
        let out = command.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let shown: serde_json::Value = serde_json::from_str(&status(true)).unwrap();
    assert_eq!(shown["running"]["url"], format!("{}/", up.url), "{shown}");
    assert_eq!(
        shown["running"]["registry"],
        up.registry.as_str(),
        "{shown}"
    );
    assert_eq!(shown["running"]["pid"], up.pid(), "{shown}");
    assert_eq!(shown["notebooks"], json!({"ready": 1}), "{shown}");
    assert_eq!(
        (shown["users"].as_u64(), shown["admins"].as_u64()),
        (Some(2), Some(1))
    );
    assert_eq!(shown["savedImages"], 1, "{shown}");
    assert!(shown["savedLayerBytes"].as_u64().unwrap() > 0, "{shown}");
    assert!(shown["disk"]["registry"].as_u64().unwrap() > 0, "{shown}");
    assert!(
        shown["engineStorage"]
            .as_array()
            .is_some_and(|e| !e.is_empty()),
        "{shown}"
    );
    let text = status(false);
    assert!(
        text.contains("Instance:      running, pid") && text.contains("1 ready"),
        "{text}"
    );

    let backups = dir.path().join("backups");
    let backup = Command::new(binary)
        .arg("backup")
        .arg(&backups)
        .arg("--data-dir")
        .arg(&data)
        .output()
        .unwrap();
    assert!(
        backup.status.success(),
        "{}",
        String::from_utf8_lossy(&backup.stderr)
    );
    let text = status(false);
    assert!(
        text.contains("Last backup:   ") && text.contains(&format!("to {}", backups.display())),
        "{text}"
    );
    let running = crate::support::embedded::container_id(&container);
    assert!(up.stop());
    assert!(status(false).contains("Instance:      not running"));

    // The data dir lost, the engine's containers and volumes not.
    let old = dir.path().join("data.old");
    std::fs::rename(&data, &old).unwrap();
    let restore = |into: &std::path::Path, keep: bool| {
        let mut command = Command::new(binary);
        command
            .arg("restore")
            .arg(&backups)
            .arg("--data-dir")
            .arg(into);
        if keep {
            command.arg("--keep-existing-volumes");
        }
        command.output().unwrap()
    };
    let refused = restore(&data, false);
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("already exists in the container engine"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    let restored = restore(&data, true);
    assert!(
        restored.status.success(),
        "{}",
        String::from_utf8_lossy(&restored.stderr)
    );
    assert!(
        String::from_utf8_lossy(&restored.stdout).contains("Kept the engine's own volumes"),
        "{}",
        String::from_utf8_lossy(&restored.stdout)
    );
    let again = restore(&data, true);
    assert!(!again.status.success());
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("already holds labforge data"),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );

    let up = need(up.restart().await);
    assert!(up.admin_password.is_none(), "the admin came back too");
    let a = Session::sign_in(&up, &alice, &password).await;
    a.wait_state(&alice, "lab", "ready", Duration::from_secs(60))
        .await;
    assert_eq!(
        crate::support::embedded::container_id(&container),
        running,
        "adopted, not restarted"
    );
    let (_, images) = a.get(&format!("/api/namespaces/{alice}/images")).await;
    assert!(
        images["images"][0]["image"]
            .as_str()
            .is_some_and(|image| image.ends_with(&format!("/{alice}/lab:kept"))),
        "{images}"
    );
}

/// On a team's server, the admin opens bob's notebook, and bob's page tries to make the admin's
/// browser bob's (his own valid session planted beside the admin's, and after 200 cookies of its
/// own), to sign the admin out with a form, and to lock the admin out of notebooks by having
/// sign-in codes made: in Chromium, against both setups: the web app on the notebooks' site
/// (`--notebook-domain labforge.localhost`: notebook hosts are its subdomains) and on a site of
/// its own (`--app-host labforge.localhost --notebook-domain notebooks.localhost`, `localhost`
/// being a top-level name to browsers). The web app never takes bob's session for the admin's.
#[tokio::test]
async fn a_notebooks_page_cannot_switch_sign_out_or_lock_out_its_visitor() {
    crate::init_crypto();
    let suffix = format!("{:x}", std::process::id());
    // Each setup's users of their own: a container outlives the `up` that ran it.
    let users = |setup: &str| {
        (
            format!("ta-alice-{setup}-{suffix}"),
            format!("ta-bob-{setup}-{suffix}"),
        )
    };
    let _cleanup = RemoveNotebooksOnDrop(
        ["same", "own"]
            .into_iter()
            .flat_map(|setup| {
                let (alice, bob) = users(setup);
                [alice, bob]
            })
            .collect(),
    );
    let dir = tempfile::tempdir().unwrap();
    let screenshots = need(labforge_tests::artifacts_dir());
    for (setup, args, plant_domains) in [
        (
            "same-site",
            &["--notebook-domain", "labforge.localhost"][..],
            &["labforge.localhost"][..],
        ),
        (
            "own-site",
            &[
                "--notebook-domain",
                "notebooks.localhost",
                "--app-host",
                "labforge.localhost",
            ][..],
            &["labforge.localhost", "notebooks.localhost"][..],
        ),
    ] {
        let (alice, bob) = users(&setup[..setup.find('-').unwrap()]);
        let data = dir.path().join(setup);
        let up = up_with_jupyterlab(&data, &[&["--tls-self-signed"][..], args].concat()).await;
        assert!(
            up.url.starts_with("https://labforge.localhost:"),
            "{}",
            up.url
        );
        let alice_password = need(up.add_user(&alice));
        let bob_password = need(up.add_user(&bob));
        let a = Session::sign_in(&up, &alice, &alice_password).await;
        let b = Session::sign_in(&up, &bob, &bob_password).await;
        for (session, ns, name) in [(&a, &alice, "lab"), (&b, &bob, "bobs")] {
            let (code, created) = session
                .post(
                    &format!("/api/namespaces/{ns}/notebooks"),
                    json!({ "name": name }),
                )
                .await;
            assert_eq!(code, 201, "{created}");
        }
        a.wait_state(&alice, "lab", "ready", Duration::from_secs(180))
            .await;
        b.wait_state(&bob, "bobs", "ready", Duration::from_secs(180))
            .await;
        let bob_token = b.cookie.split_once('=').unwrap().1.to_owned();
        let seen = need(labforge_tests::browser::run_with_config(
            "team-attacks.mjs",
            dir.path(),
            &json!({
                "name": setup,
                "url": up.url,
                "plantDomains": plant_domains,
                "bobToken": bob_token,
                "aliceNs": alice,
                "bobNs": bob,
                "admin": ["admin", up.admin_password.clone().unwrap()],
                "screenshots": screenshots,
            }),
        ));
        eprintln!("{setup}: {seen:#}");
        let admin = json!({"status": 200, "name": "admin", "error": null});
        assert_eq!(seen["before"], admin, "{setup}: {seen}");
        assert_eq!(
            seen["sessionCookies"],
            json!([{"name": "__Host-labforge_session", "secure": true, "httpOnly": true,
                    "path": "/", "domain": "labforge.localhost"}]),
            "{setup}"
        );
        let bobs_host = format!("https://bobs--{bob}.");
        assert!(
            seen["bobsPage"]["url"]
                .as_str()
                .unwrap()
                .starts_with(&bobs_host),
            "{setup}: {seen}"
        );
        // Planted: no __Host- cookie reaches the web app from bob's page; a plain one may, on
        // the same site, and is not the web app's session.
        let reached: Vec<&str> = seen["appCookiesAfterPlant"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|c| c.as_str())
            .collect();
        let exact = reached
            .iter()
            .filter(|c| **c == "__Host-labforge_session")
            .count();
        assert_eq!(exact, 1, "{setup}: {reached:?}");
        let lookalikes = reached
            .iter()
            .filter(|c| c.contains("labforge_session") && **c != "__Host-labforge_session")
            .count();
        if setup == "same-site" {
            assert!(lookalikes >= 1, "planted beside it: {reached:?}");
        } else {
            assert_eq!(lookalikes, 0, "out of the page's reach: {reached:?}");
        }
        assert_eq!(seen["afterPlant"], admin, "{setup}: {seen}");
        // Signed out by bob's page: refused, the admin still signed in.
        assert_eq!(seen["signOutForm"]["status"], 403, "{setup}: {seen}");
        assert!(
            seen["signOutForm"]["body"]
                .as_str()
                .unwrap()
                .contains("a page of another origin"),
            "{setup}: {seen}"
        );
        assert_eq!(seen["afterSignOut"], admin, "{setup}: {seen}");
        // Codes asked for by bob's page: alice's notebook still opens for the admin.
        assert_eq!(seen["aliceAfterFlood"]["status"], 200, "{setup}: {seen}");
        assert!(
            seen["aliceAfterFlood"]["url"]
                .as_str()
                .unwrap()
                .starts_with(&format!("https://lab--{alice}.")),
            "{setup}: {seen}"
        );
        // Pushed out and planted again: never bob. On the same site, bob's page can push the
        // admin's cookie out and make every request too large to serve (431): signed out, not
        // someone else. On a site of its own, the web app's cookies are out of its reach.
        if setup == "same-site" {
            assert!(seen["afterPush"]["name"].is_null(), "{seen}");
            assert!(
                [401, 431].contains(&seen["afterPush"]["status"].as_u64().unwrap()),
                "{seen}"
            );
        } else {
            assert_eq!(seen["afterPush"], admin, "{setup}: {seen}");
            assert_eq!(seen["pageAfterPush"], 200, "{setup}: {seen}");
            // Nor is the web app served on the notebooks' site: their domain sends to its host.
            let port = up.url.rsplit(':').next().unwrap().to_owned();
            let address: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
            let on_notebooks_site = reqwest::Client::builder()
                .add_root_certificate(
                    reqwest::Certificate::from_pem(&up.certificate().unwrap()).unwrap(),
                )
                .resolve("notebooks.localhost", address)
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .unwrap()
                .get(format!("https://notebooks.localhost:{port}/login?next=x"))
                .send()
                .await
                .unwrap();
            assert_eq!(on_notebooks_site.status(), 302);
            assert_eq!(
                on_notebooks_site.headers()["location"],
                format!("//labforge.localhost:{port}/login?next=x").as_str()
            );
        }
        let log = up.log();
        assert!(!log.contains(&bob_token), "no session token in the log");
    }
}
