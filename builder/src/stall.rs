//! Bounding a registry's silence rather than its requests.
//!
//! A registry that accepts connections and then stops answering (a hung proxy in front of it, a
//! full disk behind it) would hold a save forever: no request has a timeout, since uploading a
//! large layer may rightly take many minutes, and reqwest's read timeout runs from the start of a
//! request, upload included. What is bounded instead is silence: a request must be answered, and
//! an upload must keep taking bytes, within the stall timeout.

use futures::{Stream, StreamExt};
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

/// `stream`, ended by an error (`what` and how long it was quiet) once no item came for
/// `limit`: a download that stops moving fails instead of waiting forever.
pub fn moving<S, T>(
    limit: Duration,
    stream: S,
    what: String,
) -> impl Stream<Item = std::io::Result<T>> + Send + 'static
where
    S: Stream<Item = std::io::Result<T>> + Send + Unpin + 'static,
    T: Send + 'static,
{
    futures::stream::unfold(Some(stream), move |stream| {
        let what = what.clone();
        async move {
            let mut stream = stream?;
            match tokio::time::timeout(limit, stream.next()).await {
                Ok(Some(item)) => Some((item, Some(stream))),
                Ok(None) => None,
                Err(_) => {
                    let quiet = Stalled { quiet: limit };
                    let error = std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("{what}: {quiet}"),
                    );
                    Some((Err(error), None))
                }
            }
        }
    })
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

    #[tokio::test(start_paused = true)]
    async fn a_stream_that_stops_moving_ends_with_an_error_naming_it() {
        let limit = Duration::from_secs(10);
        // Two items 8 s apart (each within the limit), then nothing.
        let items = futures::stream::unfold(0, |n| async move {
            if n == 2 {
                std::future::pending::<()>().await;
            }
            tokio::time::sleep(Duration::from_secs(8)).await;
            Some((Ok::<_, std::io::Error>(n), n + 1))
        })
        .boxed();
        let started = Instant::now();
        let got: Vec<_> = moving(limit, items, "the layer".into()).collect().await;
        assert_eq!(started.elapsed(), Duration::from_secs(26));
        assert_eq!(got.len(), 3);
        assert_eq!(*got[0].as_ref().unwrap(), 0);
        assert_eq!(*got[1].as_ref().unwrap(), 1);
        let error = got[2].as_ref().unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::TimedOut);
        assert_eq!(error.to_string(), "the layer: no answer for 10 s");

        // A stream that ends is passed through as it is.
        let ended: Vec<_> = moving(
            limit,
            futures::stream::iter([Ok::<_, std::io::Error>(7)]),
            "x".into(),
        )
        .collect()
        .await;
        assert_eq!(ended.len(), 1);
    }
}
