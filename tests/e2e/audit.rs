//! The audit trail of `labforge up`: what users change and every notebook sign-in, recorded as
//! they are answered, read back by admins (API) and on the machine (`labforge audit`).

use crate::need;
use crate::support::embedded::{Session, up_with_jupyterlab};
use labforge_tests::embedded::RemoveNotebooksOnDrop;
use labforge_tests::eventually;
use serde_json::{Value, json};
use std::time::Duration;

#[tokio::test]
async fn changes_and_sign_ins_are_recorded_and_read_back_by_admins_and_the_cli() {
    crate::init_crypto();
    let (alice, bob) = (
        format!("audit-alice-{:x}", std::process::id()),
        format!("audit-bob-{:x}", std::process::id()),
    );
    let _cleanup = RemoveNotebooksOnDrop(vec![alice.clone(), bob.clone()]);
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let up = up_with_jupyterlab(&data, &[]).await;
    let admin_password = up
        .admin_password
        .clone()
        .expect("the first start made an admin");
    let alice_password = need(up.add_user(&alice));
    let bob_password = need(up.add_user(&bob));
    let admin = Session::sign_in(&up, "admin", &admin_password).await;
    let alice_session = Session::sign_in(&up, &alice, &alice_password).await;
    let bob_session = Session::sign_in(&up, &bob, &bob_password).await;

    // What happens: a create, a refused delete of someone else's notebook, a wrong password, a
    // notebook sign-in that is refused and one that is granted, and a stop.
    let (status, body) = alice_session
        .post(
            &format!("/api/namespaces/{alice}/notebooks"),
            json!({"name": "lab", "workspace": "none"}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let (status, _) = bob_session
        .delete(&format!("/api/namespaces/{alice}/notebooks/lab"))
        .await;
    assert_eq!(status, 403);
    let wrong = reqwest::Client::new()
        .post(format!("{}/api/login", up.url))
        .json(&json!({"username": bob, "password": "not-it"}))
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 401);
    let sign_in = format!(
        "/notebook-sign-in?namespace={alice}&name=lab&state=ab12&return=/notebook/{alice}/lab/"
    );
    let (status, _) = bob_session.get(&sign_in).await;
    assert_eq!(status, 403, "bob may not open alice's notebook");
    let (status, _) = alice_session.get(&sign_in).await;
    assert!(
        (300..400).contains(&status),
        "alice is sent on with a code: {status}"
    );
    let (status, body) = alice_session
        .patch(
            &format!("/api/namespaces/{alice}/notebooks/lab"),
            json!({"stopped": true}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    // Reads are not recorded.
    let (status, _) = alice_session
        .get(&format!("/api/namespaces/{alice}/notebooks"))
        .await;
    assert_eq!(status, 200);

    let trail = |query: String| {
        let admin = &admin;
        async move {
            let (status, body) = admin.get(&format!("/api/admin/audit{query}")).await;
            assert_eq!(status, 200, "{body}");
            body["records"].as_array().cloned().unwrap_or_default()
        }
    };
    let seen = |records: &[Value]| -> Vec<String> {
        records
            .iter()
            .map(|r| {
                format!(
                    "{} | {} | {}/{} | {} {}",
                    r["user"].as_str().unwrap(),
                    r["action"].as_str().unwrap(),
                    r["namespace"].as_str().unwrap_or_default(),
                    r["object"].as_str().unwrap_or_default(),
                    r["status"],
                    r["result"].as_str().unwrap()
                )
            })
            .collect()
    };
    let in_alices = trail(format!("?namespace={alice}")).await;
    assert_eq!(
        seen(&in_alices),
        [
            format!(
                "{alice} | POST /api/namespaces/{alice}/notebooks | {alice}/notebooks | 201 ok"
            ),
            format!(
                "{bob} | DELETE /api/namespaces/{alice}/notebooks/lab | {alice}/notebooks/lab | 403 refused"
            ),
            format!("{bob} | notebook sign-in | {alice}/notebooks/lab | 403 refused"),
            format!("{alice} | notebook sign-in | {alice}/notebooks/lab | 302 ok"),
            format!(
                "{alice} | PATCH /api/namespaces/{alice}/notebooks/lab | {alice}/notebooks/lab | 200 ok"
            ),
        ]
    );
    // Each names when and from where: the proxy's view of the client, loopback here.
    for record in &in_alices {
        assert_eq!(record["from"], "127.0.0.1", "{record}");
        assert!(
            record["time"]
                .as_str()
                .unwrap()
                .parse::<jiff::Timestamp>()
                .is_ok()
        );
    }
    let bobs = seen(&trail(format!("?user={bob}")).await);
    assert!(
        bobs.contains(&format!("{bob} | POST /api/login | / | 401 refused")),
        "a wrong password is recorded under the name tried: {bobs:?}"
    );
    assert!(trail("?since=2999-01-01T00:00:00Z".into()).await.is_empty());
    let (status, body) = admin.get("/api/admin/audit?since=yesterday").await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"].as_str().unwrap_or_default().contains("since"),
        "{body}"
    );
    let (status, _) = alice_session.get("/api/admin/audit").await;
    assert_eq!(status, 403, "admins only");

    // On the machine: the same lines, filtered, as a person reads them and as JSON.
    let cli = |args: &[&str]| {
        let out = crate::labforge()
            .args(["audit", "--data-dir", &data.to_string_lossy()])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let json_lines = cli(&["--namespace", &alice, "--json"]);
    let from_cli: Vec<Value> = json_lines
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(from_cli, in_alices);
    let text = cli(&["--user", &alice, "--since", "1h"]);
    assert!(
        text.contains(&format!(
            "  {alice} from 127.0.0.1: PATCH /api/namespaces/{alice}/notebooks/lab on {alice}/notebooks/lab → 200 ok"
        )),
        "{text}"
    );
    assert!(!text.contains(&bob), "only alice's: {text}");
    let bad = crate::labforge()
        .args([
            "audit",
            "--data-dir",
            &data.to_string_lossy(),
            "--since",
            "last week",
        ])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--since"));
    eventually("the stop done", Duration::from_secs(60), || async {
        let (_, body) = alice_session
            .get(&format!("/api/namespaces/{alice}/notebooks/lab"))
            .await;
        (body["notebook"]["state"] == "stopped").then_some(())
    })
    .await;
}
