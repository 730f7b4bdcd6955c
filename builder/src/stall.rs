//! Bounding a registry's silence rather than its requests.
//!
//! A registry that accepts connections and then stops answering (a hung proxy in front of it, a
//! full disk behind it) would hold a save forever: no request has a timeout, since uploading a
//! large layer may rightly take many minutes, and reqwest's read timeout runs from the start of a
//! request, upload included. What is bounded instead is silence: a request must be answered, and
//! an upload must keep taking bytes, within the stall timeout.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::time::Instant;

/// How long a registry may be silent unless configured. A registry answers an upload's last
/// request only once it has verified and stored the blob, which for a registry on object
/// storage means a server-side copy: minutes for a layer of several GiB.
pub const DEFAULT_STALL_TIMEOUT: Duration = Duration::from_secs(300);

/// When an upload last moved: marked each time its body hands a chunk to the connection.
#[derive(Clone, Debug)]
pub struct Progress {
    started: Instant,
    /// Milliseconds from `started` to the last mark.
    last: Arc<AtomicU64>,
}

impl Default for Progress {
    fn default() -> Self {
        Self {
            started: Instant::now(),
            last: Arc::default(),
        }
    }
}

impl Progress {
    pub fn mark(&self) {
        let elapsed = self.started.elapsed().as_millis();
        self.last.store(
            u64::try_from(elapsed).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    fn last(&self) -> Instant {
        self.started + Duration::from_millis(self.last.load(Ordering::Relaxed))
    }
}

/// The other side said nothing (and, for an upload, took nothing) for `quiet`.
#[derive(Debug, thiserror::Error)]
#[error("no answer for {} s", quiet.as_secs_f64())]
pub struct Stalled {
    pub quiet: Duration,
}

/// Runs `work` until it ends or nothing happened for `limit`: since `progress` was last marked
/// (or made), or without one, since `work` started. An upload that was already silent for
/// `limit` when its closing step starts is given up at once.
pub async fn within<F: Future>(
    limit: Duration,
    progress: Option<&Progress>,
    work: F,
) -> Result<F::Output, Stalled> {
    let started = Instant::now();
    let quiet_since = || progress.map_or(started, Progress::last);
    tokio::pin!(work);
    loop {
        tokio::select! {
            output = &mut work => return Ok(output),
            () = tokio::time::sleep_until(quiet_since() + limit) => {
                if quiet_since() + limit <= Instant::now() {
                    return Err(Stalled { quiet: limit });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn silence_ends_the_work_and_progress_holds_it_off() {
        let limit = Duration::from_secs(10);
        let silent = within(limit, None, std::future::pending::<()>()).await;
        assert!(matches!(silent, Err(Stalled { quiet }) if quiet == limit));

        // Work that moves every 5 s runs for 60 s, far past the limit, and ends on its own.
        let progress = Progress::default();
        let moving = {
            let progress = progress.clone();
            async move {
                for _ in 0..12 {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    progress.mark();
                }
                "done"
            }
        };
        let started = Instant::now();
        assert_eq!(
            within(limit, Some(&progress), moving).await.unwrap(),
            "done"
        );
        assert_eq!(started.elapsed(), Duration::from_secs(60));

        // Once it stops moving, it is given up `limit` after its last move.
        let stops = {
            let progress = progress.clone();
            async move {
                tokio::time::sleep(Duration::from_secs(3)).await;
                progress.mark();
                std::future::pending::<()>().await
            }
        };
        let started = Instant::now();
        assert!(within(limit, Some(&progress), stops).await.is_err());
        assert_eq!(started.elapsed(), Duration::from_secs(13));

        // Silent for longer than the limit already: given up without waiting again.
        tokio::time::sleep(limit).await;
        let started = Instant::now();
        assert!(
            within(limit, Some(&progress), std::future::pending::<()>())
                .await
                .is_err()
        );
        assert_eq!(started.elapsed(), Duration::ZERO);
    }
}
