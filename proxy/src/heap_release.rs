//! Giving memory back to the operating system when a burst of connections ends.
//!
//! Each connection holds buffers of tens of KiB (hyper's, on the client side and the upstream
//! side). glibc keeps what a serving thread frees in that thread's arena, and returns only the top
//! of an arena by itself, so a proxy that once served 200 connections would stay resident at that
//! size. This counts open connections, client and upstream. Each time the count falls to half of
//! its highest since the last release, it asks the allocator to give back what is free
//! ([`labforge_heap::release_free_memory`]), on a blocking thread, off the serving threads. A
//! complete new route list (the file at start, a watch's initial list) asks for the same, since
//! its raw objects were freed while the compiled routes stayed.

use prometheus_client::metrics::counter::Counter;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// Below this many connections at their highest, a burst's buffers are not worth a release.
pub const MIN_BURST: usize = 32;

/// Releases are at least this far apart: connections that come and go in waves do not make the
/// serving threads wait on arena locks more than once a second.
const MIN_INTERVAL: Duration = Duration::from_secs(1);

#[derive(Debug, Default)]
pub struct HeapRelease {
    open: AtomicUsize,
    /// The most connections open at once since the last release was asked for.
    highest: AtomicUsize,
    wanted: Notify,
}

/// A connection counted as open until this is dropped.
#[must_use = "the connection counts as open until this is dropped"]
#[derive(Debug)]
pub struct OpenConnection(Arc<HeapRelease>);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.closed();
    }
}

impl HeapRelease {
    /// Counts a connection as open until the returned value is dropped.
    pub fn open_connection(self: &Arc<Self>) -> OpenConnection {
        let open = self.open.fetch_add(1, Ordering::Relaxed) + 1;
        self.highest.fetch_max(open, Ordering::Relaxed);
        OpenConnection(self.clone())
    }

    fn closed(&self) {
        let open = self.open.fetch_sub(1, Ordering::Relaxed) - 1;
        let highest = self.highest.load(Ordering::Relaxed);
        // One of the threads that see the count cross half the highest asks; the highest starts
        // again from the connections still open.
        if highest >= MIN_BURST
            && open <= highest / 2
            && self
                .highest
                .compare_exchange(highest, open, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            self.wanted.notify_one();
        }
    }

    /// Asks for a release (at most one is pending at a time).
    pub fn request(&self) {
        self.wanted.notify_one();
    }

    /// Releases free memory whenever asked, forever, counting the releases in `releases`.
    pub async fn release_when_asked(self: Arc<Self>, releases: Counter) {
        loop {
            self.wanted.notified().await;
            let started = Instant::now();
            match tokio::task::spawn_blocking(labforge_heap::release_free_memory).await {
                Ok(released) => {
                    releases.inc();
                    tracing::debug!(
                        released,
                        took = ?started.elapsed(),
                        open = self.open.load(Ordering::Relaxed),
                        "free memory given back to the system"
                    );
                }
                // The runtime is shutting down.
                Err(_) => return,
            }
            tokio::time::sleep(MIN_INTERVAL).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt as _;

    fn asked(heap: &HeapRelease) -> bool {
        heap.wanted.notified().now_or_never().is_some()
    }

    #[test]
    fn a_release_is_asked_each_time_a_burst_halves() {
        let heap = Arc::new(HeapRelease::default());
        let mut open: Vec<OpenConnection> = (0..100).map(|_| heap.open_connection()).collect();
        assert!(!asked(&heap));
        open.truncate(51);
        assert!(!asked(&heap), "51 of 100 still open");
        open.truncate(50);
        assert!(asked(&heap), "half of 100 closed");
        assert!(!asked(&heap), "asked once");
        // The highest is now 50: the next half is 25.
        open.truncate(26);
        assert!(!asked(&heap));
        open.truncate(25);
        assert!(asked(&heap));
        // New connections raise the highest again.
        open.extend((0..75).map(|_| heap.open_connection()));
        open.truncate(51);
        assert!(!asked(&heap));
        open.truncate(50);
        assert!(asked(&heap));
    }

    #[test]
    fn small_bursts_ask_for_nothing() {
        let heap = Arc::new(HeapRelease::default());
        let open: Vec<OpenConnection> =
            (0..MIN_BURST - 1).map(|_| heap.open_connection()).collect();
        drop(open);
        assert!(!asked(&heap));
        assert_eq!(heap.open.load(Ordering::Relaxed), 0);
    }

    #[tokio::test]
    async fn a_request_releases_and_is_counted() {
        let heap = Arc::new(HeapRelease::default());
        let releases = Counter::default();
        let task = tokio::spawn(heap.clone().release_when_asked(releases.clone()));
        heap.request();
        let deadline = Instant::now() + Duration::from_secs(5);
        while releases.get() == 0 {
            assert!(Instant::now() < deadline, "no release within 5 s");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        task.abort();
    }
}
