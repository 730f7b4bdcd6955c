//! Start admission: how many notebooks start at once, and the order the others wait in.
//!
//! A notebook's start is mostly CPU (its server importing itself). When a class of 30 starts at
//! once on two cores, all 30 share them and each is ready only when nearly all are: everyone
//! waits for everyone. Admitting a few at a time, in the order they asked, makes readiness
//! arrive one after another, and lets a waiting notebook say where it stands in line.
//!
//! A start holds its place from admission until it is over: ready, failed, stopped or deleted.
//! A start that takes longer than [`StartQueue::hold`] lets its place go (a server that never
//! answers must not hold the class back) and goes on starting outside the count.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A notebook: its namespace and name.
pub type NotebookKey = (String, String);

/// What [`StartQueue::admit`] answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Start now.
    Start,
    /// Wait: this many starts go before it, counting itself (1 is next).
    InLine(usize),
}

/// The notebooks starting now and those waiting to, in order.
pub struct StartQueue {
    limit: usize,
    hold: Duration,
    state: Mutex<Starts>,
}

#[derive(Default)]
struct Starts {
    /// Each start under way, since when.
    starting: HashMap<NotebookKey, Instant>,
    waiting: VecDeque<NotebookKey>,
}

impl StartQueue {
    /// At most `limit` starts at once (at least one), each holding its place for at most `hold`.
    pub fn new(limit: usize, hold: Duration) -> Self {
        Self {
            limit: limit.max(1),
            hold,
            state: Mutex::default(),
        }
    }

    /// How many notebooks may start at once.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Whether `key` may start now; if not, it joins the line (once) and learns its place.
    /// Asking again while admitted answers [`Admission::Start`] again.
    pub fn admit(&self, key: &NotebookKey) -> Admission {
        let mut starts = self.lock();
        let free = starts.free(self.limit, self.hold);
        if starts.starting.contains_key(key) {
            return Admission::Start;
        }
        if !starts.waiting.contains(key) {
            starts.waiting.push_back(key.clone());
        }
        let place = starts.waiting.iter().position(|k| k == key).unwrap_or(0);
        if place < free {
            starts.waiting.retain(|k| k != key);
            starts.starting.insert(key.clone(), Instant::now());
            Admission::Start
        } else {
            Admission::InLine(place - free + 1)
        }
    }

    /// `key`'s place when it waits in line and its turn has not come; `None` when it is not in
    /// line, is starting, or may start now. Asks nothing of it: it does not join the line.
    pub fn waiting_place(&self, key: &NotebookKey) -> Option<usize> {
        let mut starts = self.lock();
        let free = starts.free(self.limit, self.hold);
        let index = starts.waiting.iter().position(|k| k == key)?;
        (index >= free).then(|| index - free + 1)
    }

    /// `key`'s start is over, or it no longer wants one (stopped, deleted, failed). Returns
    /// whether anything changed: the notebooks in line may then move up.
    pub fn finish(&self, key: &NotebookKey) -> bool {
        let mut starts = self.lock();
        let was_starting = starts.starting.remove(key).is_some();
        let before = starts.waiting.len();
        starts.waiting.retain(|k| k != key);
        was_starting || starts.waiting.len() != before
    }

    /// The notebooks in line, each with its place as [`Self::admit`] would tell it, and the
    /// ones at the front that may start now (they are not admitted until they ask).
    pub fn line(&self) -> Line {
        let mut starts = self.lock();
        let free = starts.free(self.limit, self.hold);
        let mut line = Line::default();
        for (index, key) in starts.waiting.iter().enumerate() {
            if index < free {
                line.next.push(key.clone());
            } else {
                line.waiting.push((key.clone(), index - free + 1));
            }
        }
        line
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Starts> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The line as [`StartQueue::line`] sees it.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Line {
    /// May start now.
    pub next: Vec<NotebookKey>,
    /// Still waiting, with their places.
    pub waiting: Vec<(NotebookKey, usize)>,
}

impl Starts {
    /// Places free for starts under a `limit`, once starts held longer than `hold` let theirs go.
    fn free(&mut self, limit: usize, hold: Duration) -> usize {
        self.let_overdue_go(hold);
        limit.saturating_sub(self.starting.len())
    }

    fn let_overdue_go(&mut self, hold: Duration) {
        self.starting.retain(|key, since| {
            let keep = since.elapsed() < hold;
            if !keep {
                tracing::info!(namespace = %key.0, notebook = %key.1, "a start took longer than {hold:?}: its place goes to the next in line");
            }
            keep
        });
    }
}

/// "1st", "2nd", "3rd", "4th", "11th", "21st" …
pub fn ordinal(n: usize) -> String {
    let suffix = match (n % 10, n % 100) {
        (_, 11..=13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(user: &str) -> NotebookKey {
        (user.into(), "lab".into())
    }

    #[test]
    fn starts_beyond_the_limit_wait_in_the_order_they_asked() {
        let queue = StartQueue::new(2, Duration::from_secs(60));
        assert_eq!(queue.admit(&key("a")), Admission::Start);
        assert_eq!(queue.admit(&key("b")), Admission::Start);
        assert_eq!(queue.admit(&key("c")), Admission::InLine(1));
        assert_eq!(queue.admit(&key("d")), Admission::InLine(2));
        // Asking again keeps the place; an admitted one stays admitted.
        assert_eq!(queue.admit(&key("d")), Admission::InLine(2));
        assert_eq!(queue.admit(&key("a")), Admission::Start);
        // d cannot jump the line when a place frees up: c is first.
        assert!(queue.finish(&key("a")));
        assert_eq!(
            queue.line(),
            Line {
                next: vec![key("c")],
                waiting: vec![(key("d"), 1)]
            }
        );
        assert_eq!(queue.waiting_place(&key("d")), Some(1));
        assert_eq!(queue.waiting_place(&key("c")), None, "its turn came");
        assert_eq!(queue.admit(&key("d")), Admission::InLine(1));
        assert_eq!(queue.admit(&key("c")), Admission::Start);
        assert_eq!(queue.admit(&key("d")), Admission::InLine(1));
        assert_eq!(queue.waiting_place(&key("e")), None, "not in line");
        assert_eq!(queue.waiting_place(&key("c")), None, "starting");
    }

    #[test]
    fn leaving_the_line_moves_those_behind_up() {
        let queue = StartQueue::new(1, Duration::from_secs(60));
        assert_eq!(queue.admit(&key("a")), Admission::Start);
        assert_eq!(queue.admit(&key("b")), Admission::InLine(1));
        assert_eq!(queue.admit(&key("c")), Admission::InLine(2));
        assert!(queue.finish(&key("b")), "b stopped while waiting");
        assert_eq!(queue.admit(&key("c")), Admission::InLine(1));
        assert!(!queue.finish(&key("b")), "nothing left to change");
    }

    #[test]
    fn a_start_that_takes_too_long_lets_its_place_go() {
        let queue = StartQueue::new(1, Duration::from_millis(50));
        assert_eq!(queue.admit(&key("a")), Admission::Start);
        assert_eq!(queue.admit(&key("b")), Admission::InLine(1));
        std::thread::sleep(Duration::from_millis(80));
        assert_eq!(queue.admit(&key("b")), Admission::Start);
    }

    #[test]
    fn ordinals_read_as_english() {
        let said: Vec<String> = [1, 2, 3, 4, 11, 12, 13, 21, 22, 23, 101, 111]
            .into_iter()
            .map(ordinal)
            .collect();
        assert_eq!(
            said,
            [
                "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "23rd",
                "101st", "111th"
            ]
        );
    }
}
