//! Last activity per route, for culling (the controller's `ProxyActivity`) and the web app.
//!
//! Like configurable-http-proxy, a route is active when it answered a request successfully or
//! moved websocket data. The hot path only stores a timestamp into the route's own atomic cell
//! (found through the route table, no map lookup, no lock); the map of cells is locked only when
//! the table is rebuilt or the activity endpoint is read.

use jiff::Timestamp;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// One route's last activity, as Unix milliseconds (0: never).
#[derive(Debug, Default)]
pub struct ActivityCell(AtomicI64);

impl ActivityCell {
    /// Records activity now.
    pub fn touch(&self) {
        let now = Timestamp::now().as_millisecond();
        // Serving threads touch the same route thousands of times a millisecond: a read leaves
        // the cell's cache line shared, a write would move it between cores every time.
        if self.0.load(Ordering::Relaxed) < now {
            self.0.fetch_max(now, Ordering::Relaxed);
        }
    }

    pub fn last(&self) -> Option<Timestamp> {
        match self.0.load(Ordering::Relaxed) {
            0 => None,
            ms => Timestamp::from_millisecond(ms).ok(),
        }
    }
}

/// Every route's cell, by key `<namespace>/<notebook>` (or VirtualService name).
#[derive(Debug, Default)]
pub struct Activity {
    /// The keys are shared with the routes' owners, which would otherwise hold a copy each.
    cells: Mutex<HashMap<Arc<str>, Arc<ActivityCell>>>,
}

impl Activity {
    /// The key and cell for `key`, made when new; the same key keeps its cell across table
    /// rebuilds.
    pub fn cell(&self, key: &str) -> (Arc<str>, Arc<ActivityCell>) {
        let mut cells = self.cells.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((known, cell)) = cells.get_key_value(key) {
            return (known.clone(), cell.clone());
        }
        let key: Arc<str> = key.into();
        let cell = Arc::<ActivityCell>::default();
        cells.insert(key.clone(), cell.clone());
        (key, cell)
    }

    /// Forgets routes that no longer exist.
    pub fn retain(&self, keys: &BTreeSet<&str>) {
        self.cells
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|k, _| keys.contains(&**k));
    }

    /// Whether a route with this key exists (cells live exactly as long as their routes).
    pub fn contains(&self, key: &str) -> bool {
        self.cells
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(key)
    }

    pub fn get(&self, key: &str) -> Option<Timestamp> {
        self.cells
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
            .and_then(|c| c.last())
    }

    /// Routes that saw activity, with its time.
    pub fn snapshot(&self) -> BTreeMap<String, Timestamp> {
        self.cells
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter_map(|(k, c)| Some((k.to_string(), c.last()?)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_survive_rebuilds_and_are_forgotten_with_their_route() {
        let activity = Activity::default();
        let (key, cell) = activity.cell("alice/lab");
        assert_eq!(&*key, "alice/lab");
        assert_eq!(activity.get("alice/lab"), None);
        let before = Timestamp::now();
        cell.touch();
        let seen = activity.get("alice/lab").unwrap();
        assert!(
            seen >= before.round(jiff::Unit::Millisecond).unwrap()
                - jiff::SignedDuration::from_millis(1)
        );
        // A rebuilt table asks again for the same key and gets the same history.
        let (again, cell) = activity.cell("alice/lab");
        assert!(Arc::ptr_eq(&key, &again), "the key is shared, not copied");
        assert_eq!(cell.last(), Some(seen));
        assert_eq!(activity.snapshot().len(), 1);
        activity.retain(&BTreeSet::from(["bob/lab"]));
        assert_eq!(activity.get("alice/lab"), None);
        assert!(activity.snapshot().is_empty());
    }
}
