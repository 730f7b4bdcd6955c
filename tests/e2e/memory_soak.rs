//! Memory that stays flat: `labforge up` as a class uses it all day. Rounds of sign-ins spaced
//! past the blocking pool's keep-alive (shortened here, so that each meets a fresh pool), wrong
//! passwords at once, a notebook created, made ready and deleted, and every few rounds a save;
//! the server's resident size is sampled from `/proc` after each round. The last third of the
//! samples must stay within 10 % of the first third (their medians).
//!
//! `make test` runs the short form (50 sign-ins, 10 cycles, 4 saves); `make drills` sets
//! `LABFORGE_SOAK=full` for 300 sign-ins, 100 cycles and 20 saves.

use crate::need;
use crate::support::embedded::{Session, up_with_jupyterlab};
use labforge_tests::embedded::RemoveNotebooksOnDrop;
use serde_json::json;
use std::time::{Duration, Instant};

/// How much work the soak does.
struct SoakSize {
    sign_ins: usize,
    cycles: usize,
    saves: usize,
}

impl SoakSize {
    fn from_env() -> Self {
        match std::env::var("LABFORGE_SOAK").as_deref() {
            Ok("full") => Self {
                sign_ins: 300,
                cycles: 100,
                saves: 20,
            },
            _ => Self {
                sign_ins: 50,
                cycles: 10,
                saves: 4,
            },
        }
    }
}

/// Saves in the round before the first sample.
const WARM_UP_SAVES: usize = 5;

/// Idle blocking-pool threads are kept this long; sign-ins come further apart than that.
const KEEP_ALIVE_MS: u64 = 100;

#[tokio::test]
async fn resident_memory_stays_flat_over_sign_ins_notebook_cycles_and_saves() {
    crate::init_crypto();
    let size = SoakSize::from_env();
    let user = format!("soak-{:x}", std::process::id());
    let _cleanup = RemoveNotebooksOnDrop(vec![user.clone()]);
    let dir = tempfile::tempdir().unwrap();
    let keep_alive = KEEP_ALIVE_MS.to_string();
    let up = up_with_jupyterlab(
        &dir.path().join("data"),
        &["--blocking-thread-keep-alive-ms", &keep_alive],
    )
    .await;
    let password = need(up.add_user(&user));
    let session = Session::sign_in(&up, &user, &password).await;
    let notebooks = format!("/api/namespaces/{user}/notebooks");

    let sign_ins_per_round = size.sign_ins.div_ceil(size.cycles);
    let save_every = size.cycles.div_ceil(size.saves.max(1));
    // `saves` saves in this round, each of a file written for it.
    let round = |index: usize, saves: usize| {
        let (up, session, user, password, notebooks) =
            (&up, &session, &user, &password, &notebooks);
        async move {
            for _ in 0..sign_ins_per_round {
                tokio::time::sleep(Duration::from_millis(KEEP_ALIVE_MS * 2)).await;
                need(up.sign_in(user, password).await);
            }
            // Wrong passwords at once, for names nobody has: each costs a full hash.
            let wrong = (0..5).map(|i| {
                let http = session.http.clone();
                let url = format!("{}/api/login", up.url);
                async move {
                    http.post(url)
                        .json(&json!({"username": format!("nobody-{index}-{i}"), "password": "x"}))
                        .send()
                        .await
                        .unwrap()
                        .status()
                        .as_u16()
                }
            });
            for status in futures::future::join_all(wrong).await {
                assert!(
                    matches!(status, 401 | 503),
                    "wrong password answered {status}"
                );
            }
            // The next good sign-in clears the address's failures.
            need(up.sign_in(user, password).await);

            let (code, created) = session.post(notebooks, json!({"name": "soak"})).await;
            assert_eq!(code, 201, "{created}");
            session
                .wait_state(user, "soak", "ready", Duration::from_secs(120))
                .await;
            for save in 0..saves {
                // A file to keep: a save with none makes no image, and so measures less.
                let container = labforge_embedded::runtime::container_name(user, "soak");
                let wrote = std::process::Command::new("podman")
                    .args(["exec", &container, "sh", "-c"])
                    .arg(format!("echo {index} > /tmp/soak-{index}-{save}"))
                    .status()
                    .unwrap();
                assert!(wrote.success(), "writing a file in {container}");
                let (code, save) = session
                    .post(&format!("{notebooks}/soak/saves"), json!({}))
                    .await;
                assert_eq!(code, 202, "{save}");
                let (events, progress) = session
                    .save_progress(user, save["id"].as_str().unwrap())
                    .await;
                assert_eq!(progress.last().unwrap()["phase"], "done", "{events}");
            }
            let (code, body) = session
                .call(reqwest::Method::DELETE, &format!("{notebooks}/soak"), None)
                .await;
            assert_eq!(code, 200, "{body}");
            let deadline = Instant::now() + Duration::from_secs(60);
            while session.get(&format!("{notebooks}/soak")).await.0 != 404 {
                assert!(Instant::now() < deadline, "soak not deleted within 60 s");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };

    // One round first: the hashing threads, the base image's index, the connection pools and
    // the allocator's arenas reach their working size. Saves take a few to reach theirs (the
    // heap grows over the first four or five, then stays put), so this round saves five times.
    round(0, WARM_UP_SAVES).await;
    let started = Instant::now();
    let mut samples = Vec::with_capacity(size.cycles);
    for index in 0..size.cycles {
        round(index, usize::from(index.is_multiple_of(save_every))).await;
        samples.push(up.resident_kib().expect("labforge up's VmRSS"));
    }
    // Medians of the first and last thirds: a save that lands just before a sample moves that
    // one sample by a few MiB, while growth per sign-in, cycle or save moves them all.
    let third = samples.len() / 3;
    let median = |part: &[u64]| {
        let mut part = part.to_vec();
        part.sort_unstable();
        part[part.len() / 2]
    };
    let first = median(&samples[..third]);
    let last = median(&samples[samples.len() - third..]);
    eprintln!(
        "soak: {} sign-ins, {} cycles, {} saves in {:?}; VmRSS KiB per round: {samples:?}; \
         median of the first third {first}, of the last third {last} ({:+.1} %)",
        size.cycles * (sign_ins_per_round + 1),
        size.cycles,
        size.cycles.div_ceil(save_every),
        started.elapsed(),
        (last as f64 / first as f64 - 1.0) * 100.0,
    );
    assert!(
        (last as f64) <= first as f64 * 1.10,
        "resident memory grew from {first} KiB to {last} KiB: {samples:?}"
    );
}
