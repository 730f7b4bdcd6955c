//! Tasks that run as long as their server does, each named for the part of it it is.
//!
//! A server made of several tasks (a listener, a watch, a reconcile loop) must not carry on when
//! one of them dies: the part is gone and nothing would say so. [`Supervised::first_ended`]
//! returns the first part to end, by returning, failing or panicking, as a [`PartEnded`] error,
//! and the binary exits with it. Dropping a [`Supervised`] aborts every task in it.

use std::collections::HashMap;
use std::future::Future;

/// Why a server stopped serving: one of its parts ended, which none does while it runs.
#[derive(Debug, thiserror::Error)]
pub enum PartEnded {
    #[error("the {part} ended")]
    Ended {
        part: &'static str,
        /// Why, when the part said.
        #[source]
        source: Option<std::io::Error>,
    },
    #[error("the {part} panicked: {message}")]
    Panicked { part: &'static str, message: String },
}

impl PartEnded {
    /// The part that ended.
    pub fn part(&self) -> &'static str {
        match self {
            Self::Ended { part, .. } | Self::Panicked { part, .. } => part,
        }
    }
}

/// Tasks that run as long as their server does, each named for its part.
#[derive(Default)]
pub struct Supervised {
    set: tokio::task::JoinSet<std::io::Result<()>>,
    names: HashMap<tokio::task::Id, &'static str>,
}

impl Supervised {
    /// Runs `run` as part `part`; it is expected to run until the server stops.
    pub fn spawn(
        &mut self,
        part: &'static str,
        run: impl Future<Output = std::io::Result<()>> + Send + 'static,
    ) {
        let handle = self.set.spawn(run);
        self.names.insert(handle.id(), part);
    }

    /// Runs `run`, which returns nothing, as part `part`.
    pub fn spawn_unit(
        &mut self,
        part: &'static str,
        run: impl Future<Output = ()> + Send + 'static,
    ) {
        self.spawn(part, async move {
            run.await;
            Ok(())
        });
    }

    /// The first part to end, as the error it is; never, when there is none.
    pub async fn first_ended(&mut self) -> PartEnded {
        let Some(ended) = self.set.join_next_with_id().await else {
            return std::future::pending().await;
        };
        let name = |id| self.names.get(&id).copied().unwrap_or("task");
        match ended {
            Ok((id, result)) => PartEnded::Ended {
                part: name(id),
                source: result.err(),
            },
            Err(error) if error.is_panic() => PartEnded::Panicked {
                part: name(error.id()),
                message: panic_message(error.into_panic()),
            },
            Err(error) => PartEnded::Ended {
                part: name(error.id()),
                source: None,
            },
        }
    }
}

/// What a panic said, when it said it as text.
fn panic_message(panic: Box<dyn std::any::Any + Send>) -> String {
    match panic.downcast::<String>() {
        Ok(message) => *message,
        Err(panic) => panic
            .downcast_ref::<&str>()
            .map_or_else(|| "no message".to_owned(), |message| (*message).to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_first_part_to_end_is_named_with_its_error() {
        let mut tasks = Supervised::default();
        tasks.spawn("route watch", std::future::pending());
        tasks.spawn("admin server", async {
            Err(std::io::Error::other("listener closed"))
        });
        match tasks.first_ended().await {
            PartEnded::Ended { part, source } => {
                assert_eq!(part, "admin server");
                assert_eq!(
                    source.map(|e| e.to_string()).as_deref(),
                    Some("listener closed")
                );
            }
            other => panic!("{other:?}"),
        }

        let mut tasks = Supervised::default();
        tasks.spawn("admin server", std::future::pending());
        tasks.spawn_unit("heap release", async {});
        assert_eq!(
            tasks.first_ended().await.to_string(),
            "the heap release ended"
        );
    }

    #[tokio::test]
    async fn a_part_that_panics_is_named_with_its_message() {
        let mut tasks = Supervised::default();
        tasks.spawn("admin server", std::future::pending());
        tasks.spawn("route watch", async {
            panic!("watch broke after {} tries", 3)
        });
        assert_eq!(
            tasks.first_ended().await.to_string(),
            "the route watch panicked: watch broke after 3 tries"
        );
    }

    #[tokio::test]
    async fn dropping_the_set_stops_its_parts() {
        let (sender, receiver) = tokio::sync::oneshot::channel::<()>();
        let mut tasks = Supervised::default();
        tasks.spawn_unit("watch", async move {
            let _held = sender;
            std::future::pending::<()>().await;
        });
        tokio::task::yield_now().await;
        drop(tasks);
        // The task's end drops its sender; a task left running would keep it, and time out here.
        let ended = tokio::time::timeout(std::time::Duration::from_secs(5), receiver)
            .await
            .expect("the part stopped when its set was dropped");
        assert!(
            ended.is_err(),
            "the part ended by being stopped, not by sending"
        );
    }
}
