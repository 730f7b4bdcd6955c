//! Checking passwords at sign-in: on a few long-lived threads, throttled, the same work for every
//! name.
//!
//! argon2 is costly on purpose: each check fills a large block of memory (its default memory
//! cost) and takes a noticeable time. On tokio's blocking pool, every check on a fresh thread
//! would leave its block in that thread's allocator arena (glibc keeps a freed block of that size
//! for reuse rather than returning it), so a server would grow by a block with each sign-in that
//! came after the pool's idle threads had gone, and by one more per concurrent wrong password.
//! Here a fixed set of threads does every check, each reusing its own block, and a bounded queue
//! stands before them: memory stays at `threads` blocks whatever the number of sign-ins, and a
//! flood of attempts is answered "busy" rather than queued.
//!
//! Failed attempts slow down later ones, per user name and per client address (exponential
//! backoff after a few free tries); a name that does not exist costs the same hash as one that
//! does, so the answer's timing does not tell which names exist.

use crate::users::{User, Users, password_matches, random_token};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Failures one name is allowed before each further attempt has to wait.
const FREE_FAILURES_PER_NAME: u32 = 5;
/// The same for one address, which a class behind one NAT shares: a good sign-in from it clears
/// its count.
const FREE_FAILURES_PER_ADDRESS: u32 = 20;
/// The longest wait one name or address is made to keep between attempts.
const MAX_DELAY: Duration = Duration::from_secs(60);
/// A name or address that failed this long ago starts afresh.
const FORGET_AFTER: Duration = Duration::from_secs(15 * 60);
/// Names and addresses remembered at most (each a few dozen bytes); past it the oldest go.
const MAX_REMEMBERED: usize = 10_000;

/// Why a sign-in was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SignInError {
    #[error("wrong user name or password")]
    Wrong,
    #[error("too many failed sign-ins; try again in {} s", .0.as_secs().max(1))]
    Throttled(Duration),
    #[error("too many sign-ins at once; try again shortly")]
    Busy,
}

/// Password checks on a fixed set of threads behind a bounded queue.
pub struct PasswordChecks {
    queue: SyncSender<Job>,
    /// Checks run so far (the work done, whether the name exists or not).
    completed: Arc<AtomicU64>,
}

type Job = Box<dyn FnOnce() + Send>;

impl PasswordChecks {
    /// `threads` checking threads with room for `waiting` more checks queued.
    pub fn start(threads: usize, waiting: usize) -> std::io::Result<Self> {
        let (queue, jobs) = std::sync::mpsc::sync_channel::<Job>(waiting);
        let jobs = Arc::new(Mutex::new(jobs));
        let completed = Arc::new(AtomicU64::new(0));
        for i in 0..threads.max(1) {
            let jobs = jobs.clone();
            std::thread::Builder::new()
                .name(format!("password-check-{i}"))
                .spawn(move || run_checks(&jobs))?;
        }
        Ok(Self { queue, completed })
    }

    /// Whether `password` matches the PHC string `hash`; [`SignInError::Busy`] when the queue
    /// is full.
    pub async fn matches(&self, password: String, hash: String) -> Result<bool, SignInError> {
        let (answer, answered) = tokio::sync::oneshot::channel();
        let completed = self.completed.clone();
        let job: Job = Box::new(move || {
            let matched = password_matches(&password, &hash);
            completed.fetch_add(1, Ordering::Relaxed);
            let _ = answer.send(matched);
            labforge_heap::release_free_memory();
        });
        self.queue.try_send(job).map_err(|err| match err {
            TrySendError::Full(_) | TrySendError::Disconnected(_) => SignInError::Busy,
        })?;
        answered.await.map_err(|_| SignInError::Busy)
    }

    /// How many checks have run.
    pub fn completed(&self) -> u64 {
        self.completed.load(Ordering::Relaxed)
    }
}

/// One checking thread's life: take the next check until the queue's sender is gone.
fn run_checks(jobs: &Mutex<Receiver<Job>>) {
    loop {
        let job = match jobs.lock() {
            Ok(jobs) => match jobs.recv() {
                Ok(job) => job,
                Err(_) => return,
            },
            Err(_) => return,
        };
        job();
    }
}

/// What is throttled: a user name, or the address a request came from.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Key {
    Name(String),
    Address(String),
}

#[derive(Clone, Copy, Debug)]
struct Failures {
    count: u32,
    last: Instant,
}

impl Key {
    fn free_failures(&self) -> u32 {
        match self {
            Key::Name(_) => FREE_FAILURES_PER_NAME,
            Key::Address(_) => FREE_FAILURES_PER_ADDRESS,
        }
    }
}

impl Failures {
    /// When the next attempt may be made, after `free` failures that cost no wait.
    fn next_allowed(&self, free: u32) -> Instant {
        if self.count < free {
            return self.last;
        }
        let doublings = (self.count - free).min(16);
        let delay = Duration::from_secs(1u64 << doublings).min(MAX_DELAY);
        self.last + delay
    }
}

/// Failed sign-ins per name and per address, forgotten after [`FORGET_AFTER`].
#[derive(Default)]
pub struct Throttle {
    failures: Mutex<HashMap<Key, Failures>>,
}

impl Throttle {
    /// How long the attempt for `keys` has to wait, if at all.
    fn wait(&self, keys: &[Key], now: Instant) -> Option<Duration> {
        let failures = self.failures.lock().ok()?;
        keys.iter()
            .filter_map(|key| Some((key, failures.get(key)?)))
            .map(|(key, f)| {
                f.next_allowed(key.free_failures())
                    .saturating_duration_since(now)
            })
            .filter(|wait| !wait.is_zero())
            .max()
    }

    fn failed(&self, keys: &[Key], now: Instant) {
        let Ok(mut failures) = self.failures.lock() else {
            return;
        };
        if failures.len() + keys.len() > MAX_REMEMBERED {
            failures.retain(|_, f| now.saturating_duration_since(f.last) < FORGET_AFTER);
        }
        while failures.len() + keys.len() > MAX_REMEMBERED {
            let Some(oldest) = failures
                .iter()
                .min_by_key(|(_, f)| f.last)
                .map(|(key, _)| key.clone())
            else {
                break;
            };
            failures.remove(&oldest);
        }
        for key in keys {
            let entry = failures.entry(key.clone()).or_insert(Failures {
                count: 0,
                last: now,
            });
            if now.saturating_duration_since(entry.last) >= FORGET_AFTER {
                entry.count = 0;
            }
            entry.count = entry.count.saturating_add(1);
            entry.last = now;
        }
    }

    fn succeeded(&self, keys: &[Key]) {
        if let Ok(mut failures) = self.failures.lock() {
            for key in keys {
                failures.remove(key);
            }
        }
    }
}

/// Signing local users in: the throttle, the checks, and a decoy hash for unknown names.
pub struct SignIn {
    checks: PasswordChecks,
    throttle: Throttle,
    /// A hash of a random password with the same parameters as real ones: unknown names are
    /// checked against it.
    decoy: String,
}

impl SignIn {
    /// Checks on `threads` threads, `waiting` more queued.
    pub fn new(threads: usize, waiting: usize) -> Result<Self, crate::users::UserError> {
        let decoy = crate::users::hash_password(&random_token(15)?)?;
        // That hash's block, freed on this thread, is not reused by the checks' threads.
        labforge_heap::release_free_memory();
        let checks =
            PasswordChecks::start(threads, waiting).map_err(crate::users::UserError::Threads)?;
        Ok(Self {
            checks,
            throttle: Throttle::default(),
            decoy,
        })
    }

    /// As many checking threads as cores, at most two: sign-ins are rare next to the work
    /// notebooks do, and each thread keeps one argon2 memory block.
    pub fn for_this_machine() -> Result<Self, crate::users::UserError> {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self::new(cores.min(2), 32)
    }

    /// The user `name`, if `password` is theirs and neither the name nor `address` has to wait.
    pub async fn check(
        &self,
        users: &Users,
        name: &str,
        password: &str,
        address: Option<&str>,
    ) -> Result<User, SignInError> {
        let mut keys = vec![Key::Name(name.to_owned())];
        if let Some(address) = address {
            keys.push(Key::Address(address.to_owned()));
        }
        if let Some(wait) = self.throttle.wait(&keys, Instant::now()) {
            return Err(SignInError::Throttled(wait));
        }
        if let Err(err) = users.refresh() {
            tracing::warn!(error = %err, "re-reading the users file");
        }
        let user = users.get(name);
        let hash = user
            .as_ref()
            .map_or_else(|| self.decoy.clone(), |u| u.password_hash.clone());
        let matched = self.checks.matches(password.to_owned(), hash).await?;
        match user {
            Some(user) if matched => {
                self.throttle.succeeded(&keys);
                Ok(user)
            }
            _ => {
                self.throttle.failed(&keys, Instant::now());
                Err(SignInError::Wrong)
            }
        }
    }

    /// How many password checks have run (each sign-in attempt not throttled or refused busy).
    pub fn checks_completed(&self) -> u64 {
        self.checks.completed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(n: &str) -> Vec<Key> {
        vec![Key::Name(n.into())]
    }

    #[test]
    fn failures_past_the_free_ones_wait_longer_each_time() {
        let throttle = Throttle::default();
        let start = Instant::now();
        for i in 0..FREE_FAILURES_PER_NAME {
            assert_eq!(
                throttle.wait(&name("a"), start),
                None,
                "failure {i} is free"
            );
            throttle.failed(&name("a"), start);
        }
        assert_eq!(
            throttle.wait(&name("a"), start),
            Some(Duration::from_secs(1))
        );
        assert_eq!(
            throttle.wait(&name("b"), start),
            None,
            "other names are free"
        );
        throttle.failed(&name("a"), start);
        assert_eq!(
            throttle.wait(&name("a"), start),
            Some(Duration::from_secs(2))
        );
        let later = start + Duration::from_secs(2);
        assert_eq!(throttle.wait(&name("a"), later), None);
        for _ in 0..20 {
            throttle.failed(&name("a"), later);
        }
        assert_eq!(throttle.wait(&name("a"), later), Some(MAX_DELAY));
        // Either key makes the attempt wait.
        let both = vec![Key::Name("c".into()), Key::Address("a".into())];
        assert_eq!(throttle.wait(&both, later), None);
        let by_address = vec![Key::Address("10.0.0.1".into())];
        for _ in 0..FREE_FAILURES_PER_ADDRESS {
            throttle.failed(&by_address, later);
        }
        assert_eq!(
            throttle.wait(&by_address, later),
            Some(Duration::from_secs(1)),
            "an address has more free failures than a name"
        );
        let mixed = vec![Key::Name("c".into()), Key::Address("10.0.0.1".into())];
        assert!(throttle.wait(&mixed, later).is_some());
        // A success clears; time clears.
        throttle.succeeded(&name("a"));
        assert_eq!(throttle.wait(&name("a"), later), None);
        let much_later = later + FORGET_AFTER;
        throttle.failed(&by_address, much_later);
        assert_eq!(throttle.wait(&by_address, much_later), None, "counted anew");
    }

    #[test]
    fn the_throttle_remembers_a_bounded_number_of_keys() {
        let throttle = Throttle::default();
        let now = Instant::now();
        for i in 0..MAX_REMEMBERED + 100 {
            throttle.failed(&[Key::Address(i.to_string())], now);
        }
        assert!(throttle.failures.lock().unwrap().len() <= MAX_REMEMBERED);
    }

    #[tokio::test]
    async fn unknown_names_cost_a_check_and_a_full_queue_is_busy() {
        let dir = tempfile::tempdir().unwrap();
        let users = Users::open(dir.path()).unwrap();
        let password = users.add("alice", false).unwrap();
        let sign_in = SignIn::new(1, 1).unwrap();
        assert_eq!(
            sign_in
                .check(&users, "alice", &password, None)
                .await
                .unwrap()
                .name,
            "alice"
        );
        assert_eq!(sign_in.checks_completed(), 1);
        assert_eq!(
            sign_in.check(&users, "nobody", "x", Some("a")).await,
            Err(SignInError::Wrong)
        );
        assert_eq!(
            sign_in.checks_completed(),
            2,
            "an unknown name is hashed too"
        );

        // One thread, one waiting place: of many at once, some are turned away unhashed.
        let attempts = (0..8).map(|i| {
            let (sign_in, users) = (&sign_in, &users);
            async move { sign_in.check(users, &format!("u{i}"), "x", None).await }
        });
        let results = futures::future::join_all(attempts).await;
        assert!(results.contains(&Err(SignInError::Busy)), "{results:?}");
        assert!(results.contains(&Err(SignInError::Wrong)), "{results:?}");
    }
}
