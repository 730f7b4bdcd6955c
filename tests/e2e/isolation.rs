//! Tenant isolation in `labforge up`, tried as an attacker would: two users whose names differ
//! only in where a dash goes, each with a JupyterLab. One's notebook cannot reach the other's
//! server over the container network, a local process cannot use a published port without the
//! notebook's secret, and neither user can name the other's container, log or workspace; the
//! owner's kernel still works through the proxy.

use crate::need;
use crate::support::embedded::{Session, up_with_jupyterlab};
use labforge_embedded::runtime::container_name;
use labforge_tests::embedded::RemoveNotebooksOnDrop;
use serde_json::json;
use std::process::Command;
use std::time::Duration;

fn podman(args: &[&str]) -> String {
    let out = Command::new("podman").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "podman {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[tokio::test]
async fn a_notebook_cannot_reach_another_and_a_port_is_no_way_in() {
    crate::init_crypto();
    // `alice`'s `x-lab` and `alice-x`'s `lab` once shared one container name.
    let alice = format!("iso{:x}", std::process::id());
    let mallory = format!("{alice}-x");
    let _cleanup = RemoveNotebooksOnDrop(vec![alice.clone(), mallory.clone()]);
    let dir = tempfile::tempdir().unwrap();
    let up = up_with_jupyterlab(&dir.path().join("data"), &[]).await;
    let a = Session::sign_in(&up, &alice, &need(up.add_user(&alice))).await;
    let m = Session::sign_in(&up, &mallory, &need(up.add_user(&mallory))).await;
    for (session, ns, name) in [(&a, &alice, "x-lab"), (&m, &mallory, "lab")] {
        let (code, body) = session
            .post(
                &format!("/api/namespaces/{ns}/notebooks"),
                json!({"name": name}),
            )
            .await;
        assert_eq!(code, 201, "{body}");
    }
    for (session, ns, name) in [(&a, &alice, "x-lab"), (&m, &mallory, "lab")] {
        session
            .wait_state(ns, name, "ready", Duration::from_secs(180))
            .await;
    }
    let (alice_container, mallory_container) = (
        container_name(&alice, "x-lab"),
        container_name(&mallory, "lab"),
    );
    assert_ne!(alice_container, mallory_container);
    let alice_ip = podman(&[
        "inspect",
        "--format",
        "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
        &alice_container,
    ]);
    assert!(!alice_ip.is_empty(), "alice's notebook has an address");

    // From a cell in mallory's notebook: alice's server, by its address, is out of reach.
    let prefix = format!("/notebook/{alice}/x-lab");
    let attack = format!(
        r#"
import urllib.request
try:
    urllib.request.urlopen("http://{alice_ip}:8888{prefix}/api/contents", timeout=5)
    print("REACHED")
except Exception as e:
    print("refused", type(e).__name__)
"#
    );
    let jupyter = m.jupyter(&mallory, "lab").await;
    let printed = need(jupyter.run_code(&attack).await);
    assert!(printed.contains("refused"), "mallory's cell: {printed}");

    // From this machine, on alice's published port: no secret, no files.
    let port = podman(&["port", &alice_container, "8888/tcp"]);
    let anonymous = reqwest::Client::new();
    // Not where `localhost` and `*.localhost` point: a page navigating there would hand the
    // notebook's server the cookies the browser holds for labforge's hosts.
    let published: std::net::SocketAddr = port.trim().parse().unwrap();
    assert!(
        published.ip().is_loopback() && published.ip().to_string() != "127.0.0.1",
        "published on {published}"
    );
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", published.port())).is_err(),
        "alice's server answers on localhost:{}",
        published.port()
    );
    let direct = anonymous
        .get(format!("http://{port}{prefix}/api/contents"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        direct.status(),
        403,
        "the published port without the secret"
    );
    let spoofed = anonymous
        .get(format!("http://{port}{prefix}/api/contents"))
        .header("authorization", "token guessed")
        .send()
        .await
        .unwrap();
    assert_eq!(spoofed.status(), 403, "a guessed token");
    // The secret the proxy sends is what opens it (so the 403s above are the secret's doing).
    let env = podman(&[
        "inspect",
        "--format",
        "{{range .Config.Env}}{{println .}}{{end}}",
        &alice_container,
    ]);
    let secret = env
        .lines()
        .find_map(|line| line.strip_prefix("LABFORGE_NOTEBOOK_SECRET="))
        .expect("the notebook's secret in its container's environment")
        .to_owned();
    let with_secret = anonymous
        .get(format!("http://{port}{prefix}/api/contents"))
        .header("authorization", format!("token {secret}"))
        .send()
        .await
        .unwrap();
    assert_eq!(with_secret.status(), 200);

    // Through the proxy, alice's own kernel works, and mallory is refused.
    let jupyter = a.jupyter(&alice, "x-lab").await;
    assert!(need(jupyter.run_code("print(6 * 7)").await).contains("42"));
    let refused = m.open_notebook(&alice, "x-lab").await.err();
    assert_eq!(
        refused.as_deref(),
        Some("the web app's notebook sign-in: HTTP 403")
    );

    // Each one's log is their own container's.
    let (code, _) = m
        .get(&format!("/api/namespaces/{alice}/notebooks/x-lab/logs"))
        .await;
    assert_eq!(code, 403);
    let (code, log) = a
        .get(&format!("/api/namespaces/{alice}/notebooks/x-lab/logs"))
        .await;
    assert_eq!(code, 200);
    assert!(log.to_string().contains(&prefix), "alice's log: {log}");
    assert!(!log.to_string().contains(&format!("/notebook/{mallory}/")));
    assert!(
        !log.to_string().contains(&secret),
        "the secret in the log: {log}"
    );
    assert!(!up.log().contains(&secret), "the secret in labforge's log");

    // Deleting a notebook removes its network too.
    let (code, _) = m
        .call(
            reqwest::Method::DELETE,
            &format!("/api/namespaces/{mallory}/notebooks/lab"),
            None,
        )
        .await;
    assert_eq!(code, 200);
    labforge_tests::eventually(
        "mallory's network removed",
        Duration::from_secs(60),
        || async {
            let gone = !Command::new("podman")
                .args(["network", "exists", &mallory_container])
                .status()
                .ok()?
                .success();
            gone.then_some(())
        },
    )
    .await;
}
