//! The catalog's images pulled into the engine in the background when `labforge up` starts, so
//! that the first notebook of each image does not wait for its pull (code-server's first pull
//! took 18.5 s of a 25 s start). An image its registry does not have yet (`scripts/up` seeds the
//! local registry as each image's build finishes, which can be minutes after the start) is tried
//! again, less and less often, until it is there. Until then the spawner form says it is being
//! prepared.

use super::engine::Engine;
use labforge_web::preparing::ImagesBeingPrepared;
use std::sync::Arc;
use std::time::Duration;

/// The first wait before trying again, doubled each round up to [`LONGEST_WAIT`].
const FIRST_WAIT: Duration = Duration::from_secs(5);
const LONGEST_WAIT: Duration = Duration::from_secs(60);
/// Rounds after which a missing image is warned about (about five minutes); it is still tried.
const WARN_AFTER: usize = 8;

/// Pulls each of `images` the engine does not hold yet, one at a time, telling `preparing`
/// as each is ready.
pub async fn pull_catalog(
    engine: Engine,
    mut images: Vec<String>,
    preparing: Arc<ImagesBeingPrepared>,
) {
    images.sort();
    images.dedup();
    let mut wait = FIRST_WAIT;
    for round in 1.. {
        let mut missing = Vec::new();
        for image in images {
            if engine.image_present(&image).await {
                preparing.done(&image);
                continue;
            }
            match engine.pull(&image).await {
                Ok(()) => {
                    tracing::info!(%image, "catalog image pulled ahead of its first notebook");
                    preparing.done(&image);
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
        if round == WARN_AFTER {
            tracing::warn!(
                images = ?missing,
                "catalog images not pulled yet (is each in its registry?); still trying every minute"
            );
        }
        images = missing;
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(LONGEST_WAIT);
    }
}
