//! The catalog's images pulled into the engine in the background when `labforge up` starts, so
//! that the first notebook of each image does not wait for its pull (code-server's first pull
//! took 18.5 s of a 25 s start). An image its registry does not have yet (`scripts/up` seeds the
//! local registry just after the start) is tried again, less and less often, for some minutes.

use super::engine::Engine;
use std::time::Duration;

/// The first wait before trying again, doubled each round up to [`LONGEST_WAIT`].
const FIRST_WAIT: Duration = Duration::from_secs(5);
const LONGEST_WAIT: Duration = Duration::from_secs(60);
/// Rounds before giving up (about five minutes in all).
const ROUNDS: usize = 8;

/// Pulls each of `images` the engine does not hold yet, one at a time.
pub async fn pull_catalog(engine: Engine, mut images: Vec<String>) {
    images.sort();
    images.dedup();
    let mut wait = FIRST_WAIT;
    for _ in 0..ROUNDS {
        let mut missing = Vec::new();
        for image in images {
            if engine.image_present(&image).await {
                continue;
            }
            match engine.pull(&image).await {
                Ok(()) => {
                    tracing::info!(%image, "catalog image pulled ahead of its first notebook")
                }
                Err(err) => {
                    tracing::debug!(%image, error = %err, "catalog image not pulled yet");
                    missing.push(image);
                }
            }
        }
        if missing.is_empty() {
            return;
        }
        images = missing;
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(LONGEST_WAIT);
    }
    tracing::warn!(
        ?images,
        "catalog images not pulled ahead: the first notebook of each pulls it"
    );
}
