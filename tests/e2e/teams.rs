//! Teams on one `labforge up`: a team namespace with an owner and members added by the CLI and
//! the API, what `edit` and `view` members may do there (through the API and the proxy), a
//! notebook shared with one more user, and what ends when access is taken away: the revoked
//! user's open kernel websocket closes.

use crate::need;
use crate::support::embedded::{Session, container_id, up_with_jupyterlab};
use futures::StreamExt;
use labforge_tests::embedded::RemoveNotebooksOnDrop;
use labforge_tests::jupyter::KernelSocket;
use serde_json::json;
use std::time::Duration;

/// Waits for the server or the proxy to close `socket` (a close frame, an error or the end).
async fn closes_within(mut socket: KernelSocket, limit: Duration, what: &str) {
    use tokio_tungstenite::tungstenite::Message;
    let closed = tokio::time::timeout(limit, async {
        loop {
            match socket.next().await {
                None | Some(Err(_)) | Some(Ok(Message::Close(_))) => return,
                Some(Ok(_)) => {}
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "the websocket stayed open after {what}");
}

#[tokio::test]
async fn members_and_shares_decide_who_sees_opens_and_changes_a_teams_notebook() {
    crate::init_crypto();
    let id = format!("{:x}", std::process::id());
    let team = format!("team-{id}");
    let [alice, bob, carol, dave] = ["alice", "bob", "carol", "dave"].map(|u| format!("{u}-{id}"));
    let _cleanup = RemoveNotebooksOnDrop(vec![team.clone()]);
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let up = up_with_jupyterlab(&data, &[]).await;
    let admin = Session::sign_in(&up, "admin", up.admin_password.as_deref().unwrap()).await;
    let (mut sessions, mut passwords) = (Vec::new(), Vec::new());
    for user in [&alice, &bob, &carol, &dave] {
        let password = need(up.add_user(user));
        sessions.push(Session::sign_in(&up, user, &password).await);
        passwords.push(password);
    }
    let [alice_s, bob_s, carol_s, dave_s] = <[Session; 4]>::try_from(sessions).ok().unwrap();
    let cli = |args: &[&str]| {
        let out = crate::labforge()
            .arg("namespace")
            .args(args)
            .args(["--data-dir", &data.to_string_lossy()])
            .output()
            .unwrap();
        let text = |b: &[u8]| String::from_utf8_lossy(b).trim().to_owned();
        (out.status.success(), text(&out.stdout), text(&out.stderr))
    };

    // The namespace and its members, from the machine while labforge runs.
    let (ok, out, err) = cli(&["add", &team, "--owner", &alice]);
    assert!(ok, "{err}");
    assert_eq!(out, format!("namespace {team} added, owned by {alice}"));
    let (ok, _, err) = cli(&["add", &team, "--owner", &bob]);
    assert!(
        !ok && err.contains(&format!("namespace {team} exists already")),
        "{err}"
    );
    let (ok, _, err) = cli(&["add", "other-team", "--owner", "nobody"]);
    assert!(!ok && err.contains("no user nobody"), "{err}");
    for (user, role) in [(&bob, "edit"), (&carol, "view")] {
        let (ok, _, err) = cli(&["member", "add", &team, user, "--role", role]);
        assert!(ok, "{err}");
    }
    let (ok, _, err) = cli(&["member", "add", &team, &dave, "--role", "admin"]);
    assert!(!ok && err.contains("admin"), "a role that is none: {err}");
    let (ok, _, err) = cli(&["member", "add", &team, "nobody", "--role", "view"]);
    assert!(!ok && err.contains("no user nobody"), "{err}");
    let (ok, out, err) = cli(&["list"]);
    assert!(ok, "{err}");
    assert!(
        out.lines()
            .any(|line| line == format!("{team}\towner {alice}\t{bob} (edit), {carol} (view)")),
        "{out}"
    );

    // Each member sees the namespace with their role.
    let (status, body) = bob_s.get("/api/namespaces").await;
    assert_eq!(status, 200, "{body}");
    let membership = body["memberships"]
        .as_array()
        .unwrap()
        .iter()
        .find(|ns| ns["name"] == team.as_str())
        .cloned()
        .unwrap_or_else(|| panic!("{body}"));
    assert_eq!(membership["role"], "edit");
    assert_eq!(membership["owner"], alice.as_str());
    assert!(
        body["namespaces"]
            .as_array()
            .unwrap()
            .contains(&json!(team)),
        "{body}"
    );

    // edit creates and opens; view sees and is refused both.
    let notebooks = format!("/api/namespaces/{team}/notebooks");
    let (status, body) = bob_s
        .post(&notebooks, json!({"name": "lab", "workspace": "none"}))
        .await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = carol_s
        .post(&notebooks, json!({"name": "mine", "workspace": "none"}))
        .await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(
        body["error"],
        format!("{carol} may not create notebooks in namespace {team}")
    );
    bob_s
        .wait_state(&team, "lab", "ready", Duration::from_secs(180))
        .await;
    let (status, body) = carol_s.get(&notebooks).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = carol_s.get(&format!("{notebooks}/lab/events")).await;
    assert_eq!(status, 200, "{body}");
    let refused = carol_s.open_notebook(&team, "lab").await;
    assert!(
        refused.as_ref().is_err_and(|e| e.contains("HTTP 403")),
        "a viewer opens nothing: {:?}",
        refused.map(|v| v.host)
    );
    let (status, _) = dave_s.get(&format!("{notebooks}/lab")).await;
    assert_eq!(status, 403, "no member, no share: nothing to see");
    let bobs = bob_s.jupyter(&team, "lab").await;
    assert_eq!(need(bobs.run_code("print(6 * 7)").await).trim(), "42");

    // The same in a browser, one person per browser.
    let config = dir.path().join("teams.json");
    let names = [&alice, &bob, &carol, &dave];
    let person = |i: usize| json!([names[i], passwords[i]]);
    std::fs::write(
        &config,
        json!({
            "url": up.url, "team": team, "notebook": "lab",
            "owner": person(0), "editor": person(1), "viewer": person(2), "sharee": person(3),
            "admin": ["admin", up.admin_password],
            "newMember": dave,
            "screenshots": need(labforge_tests::artifacts_dir()),
        })
        .to_string(),
    )
    .unwrap();
    let output = labforge_tests::browser::run_script("teams.mjs", &[&config.to_string_lossy()])
        .unwrap_or_else(|e| panic!("{e}"));
    let seen: serde_json::Value = serde_json::from_str(output.lines().last().unwrap()).unwrap();
    assert!(
        seen["warning"]
            .as_str()
            .unwrap()
            .contains("opens it as you"),
        "{seen}"
    );
    assert!(
        seen["unknownUser"]
            .as_str()
            .unwrap()
            .ends_with("no user \"nobody-at-all\""),
        "{seen}"
    );
    assert!(
        seen["shares"]
            .as_str()
            .unwrap()
            .contains(&format!("Shared with {dave}")),
        "{seen}"
    );
    assert!(
        seen["sharedRow"]
            .as_str()
            .unwrap()
            .starts_with(&format!("lab {team} ready")),
        "{seen}"
    );
    assert!(
        seen["members"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m.as_str().unwrap().starts_with(&format!("{dave} (view)"))),
        "{seen}"
    );
    assert_eq!(
        seen["ownerLine"],
        format!("Owner: {alice}. You: owner."),
        "{seen}"
    );
    assert_eq!(seen["viewerForm"], false, "{seen}");
    assert_eq!(
        seen["quotaRow"],
        format!("{team} 0.5 of 1 1.0 GiB (no quota) 0 (no quota) 1 of 4 0 B (no quota)"),
        "{seen}"
    );
    assert_eq!(
        seen["quotaLine"],
        format!("Quota of {team}, in use: CPU 0.5 of 1 · running notebooks 1 of 4."),
        "{seen}"
    );
    assert_eq!(
        seen["resizeRefused"],
        format!(
            "namespace {team}'s quota for cpu is 1: 0 in use, 2 asked; stop a notebook or ask an admin for more"
        ),
        "{seen}"
    );
    assert_eq!(
        seen["resizeTooBig"], "5000 is more than the allowed 16",
        "{seen}"
    );
    assert_eq!(
        (&seen["resizeStatus"], &seen["resizeError"]),
        (&json!(200), &json!("")),
        "{seen}"
    );
    assert_eq!(
        seen["viewerLine"],
        format!("Owner: {alice}. You: view."),
        "{seen}"
    );
    assert!(
        seen["adminRow"]
            .as_str()
            .unwrap()
            .starts_with(&format!("{team} {alice} {bob} (edit)")),
        "{seen}"
    );

    // Members through the API: only the owner (or an admin) manages them.
    let member = |user: &str| format!("/api/namespaces/{team}/members/{user}");
    let (status, body) = carol_s.put(&member(&dave), json!({"role": "view"})).await;
    assert_eq!(status, 403, "{body}");
    let (status, body) = alice_s.put(&member(&dave), json!({"role": "view"})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["members"][&dave], "view");
    let (status, body) = alice_s.put(&member(&dave), json!({"role": "root"})).await;
    assert_eq!(
        (status, body["field"].as_str()),
        (422, Some("role")),
        "{body}"
    );
    let (status, body) = alice_s.delete(&member(&dave)).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = alice_s.delete(&member(&dave)).await;
    assert_eq!(status, 404, "{body}");
    let (status, body) = admin
        .post("/api/namespaces", json!({"name": team, "owner": alice}))
        .await;
    assert_eq!(status, 409, "{body}");
    let (status, body) = admin
        .post(
            "/api/namespaces",
            json!({"name": "Not A Name", "owner": alice}),
        )
        .await;
    assert_eq!(
        (status, body["field"].as_str()),
        (422, Some("name")),
        "{body}"
    );
    let (status, body) = alice_s
        .post(
            "/api/namespaces",
            json!({"name": "mine-too", "owner": alice}),
        )
        .await;
    assert_eq!(status, 403, "only admins add namespaces: {body}");

    // A share: dave sees and opens that notebook; the container is not restarted for it.
    let container = labforge_embedded::runtime::container_name(&team, "lab");
    let before = container_id(&container);
    let shares = format!("{notebooks}/lab/shares");
    let (status, body) = carol_s.post(&shares, json!({"user": dave})).await;
    assert_eq!(status, 403, "a viewer shares nothing: {body}");
    let (status, body) = bob_s.post(&shares, json!({"user": "nobody"})).await;
    assert_eq!(
        (status, body["field"].as_str()),
        (422, Some("user")),
        "{body}"
    );
    let (status, body) = bob_s.post(&shares, json!({"user": dave})).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["sharedWith"], json!([dave]));
    let (status, body) = dave_s.get("/api/shared").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["notebooks"][0]["name"], "lab", "{body}");
    assert_eq!(body["notebooks"][0]["namespace"], team.as_str(), "{body}");
    let (status, body) = dave_s
        .patch(&format!("{notebooks}/lab"), json!({"stopped": true}))
        .await;
    assert_eq!(status, 403, "a share opens, it changes nothing: {body}");
    // The proxy learns of the share when the runtime pushes the notebook's route again.
    let daves = labforge_tests::eventually(
        "the share reaches the proxy",
        Duration::from_secs(10),
        || async {
            let visit = dave_s.open_notebook(&team, "lab").await.ok()?;
            labforge_tests::jupyter::JupyterClient::connect_with(&visit.base, visit.headers(), None)
                .await
                .ok()
        },
    )
    .await;
    let daves_socket = need(daves.kernel_channels().await);
    assert_eq!(container_id(&container), before, "sharing restarts nothing");

    // Revoked: dave's websocket closes at once and the notebook no longer lets him in.
    let (status, body) = bob_s.delete(&format!("{shares}/{dave}")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["sharedWith"], json!([]));
    closes_within(
        daves_socket,
        Duration::from_secs(3),
        "the share was revoked",
    )
    .await;
    let again = dave_s.open_notebook(&team, "lab").await;
    assert!(again.is_err(), "revoked: {:?}", again.map(|v| v.host));
    let (status, _) = bob_s.delete(&format!("{shares}/{dave}")).await;
    assert_eq!(status, 404, "shared with him no more");

    // A member taken out by the CLI: their websocket closes within the session check.
    let bobs_socket = need(bobs.kernel_channels().await);
    let (ok, _, err) = cli(&["member", "remove", &team, &bob]);
    assert!(ok, "{err}");
    closes_within(bobs_socket, Duration::from_secs(6), "bob was taken out").await;
    let (status, body) = bob_s.get(&notebooks).await;
    assert_eq!(status, 403, "{body}");
}

/// JupyterLab's real-time collaboration through labforge: the owner and the user a notebook is
/// shared with, each in a browser of their own, edit one document and see each other's typing.
#[tokio::test]
async fn two_people_in_a_shared_notebook_see_each_others_edits() {
    crate::init_crypto();
    let id = format!("{:x}", std::process::id());
    let [alice, bob] = ["coedit-alice", "coedit-bob"].map(|u| format!("{u}-{id}"));
    let _cleanup = RemoveNotebooksOnDrop(vec![alice.clone()]);
    let dir = tempfile::tempdir().unwrap();
    let up = up_with_jupyterlab(&dir.path().join("data"), &[]).await;
    let passwords = [need(up.add_user(&alice)), need(up.add_user(&bob))];
    let owner = Session::sign_in(&up, &alice, &passwords[0]).await;
    let notebooks = format!("/api/namespaces/{alice}/notebooks");
    let (status, body) = owner
        .post(&notebooks, json!({"name": "lab", "workspace": "none"}))
        .await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = owner
        .post(&format!("{notebooks}/lab/shares"), json!({"user": bob}))
        .await;
    assert_eq!(status, 201, "{body}");
    owner
        .wait_state(&alice, "lab", "ready", Duration::from_secs(180))
        .await;
    let jupyter = owner.jupyter(&alice, "lab").await;
    let written = jupyter
        .run_code(
            "import nbformat as nbf\n\
             spec = {'name': 'python3', 'display_name': 'Python 3', 'language': 'python'}\n\
             book = nbf.v4.new_notebook(cells=[nbf.v4.new_code_cell('')], metadata={'kernelspec': spec})\n\
             nbf.write(book, 'together.ipynb')\n\
             print('written')",
        )
        .await;
    assert_eq!(need(written).trim(), "written");

    let config = dir.path().join("coedit.json");
    std::fs::write(
        &config,
        json!({
            "url": up.url, "namespace": alice, "notebook": "lab", "file": "together.ipynb",
            "owner": [alice, passwords[0]], "sharee": [bob, passwords[1]],
            "screenshots": need(labforge_tests::artifacts_dir()),
        })
        .to_string(),
    )
    .unwrap();
    let output = labforge_tests::browser::run_script("coedit.mjs", &[&config.to_string_lossy()])
        .unwrap_or_else(|e| panic!("{e}"));
    let seen: serde_json::Value = serde_json::from_str(output.lines().last().unwrap()).unwrap();
    assert_eq!(
        seen["shareeSaw"], "greeting = \"typed by the owner\"",
        "{seen}"
    );
    assert_eq!(
        seen["ownerSaw"], "greeting = \"typed by the owner\"  # and by the sharee",
        "{seen}"
    );
}
