//! The catalog's images still being prepared on this machine: not yet pulled into the container
//! engine, or not yet in the registry at all while `make up` builds them. The spawner form says
//! so, since a notebook of such an image starts only once its image is there.

use std::collections::BTreeSet;
use std::sync::Mutex;

/// Images being prepared; empty where nothing is prepared ahead (a cluster pulls per node).
#[derive(Debug, Default)]
pub struct ImagesBeingPrepared {
    images: Mutex<BTreeSet<String>>,
}

impl ImagesBeingPrepared {
    pub fn new(images: impl IntoIterator<Item = String>) -> Self {
        Self {
            images: Mutex::new(images.into_iter().collect()),
        }
    }

    /// `image` is ready to run.
    pub fn done(&self, image: &str) {
        self.lock().remove(image);
    }

    /// Whether `image` is still being prepared.
    pub fn contains(&self, image: &str) -> bool {
        self.lock().contains(image)
    }

    /// The images still being prepared.
    pub fn images(&self) -> BTreeSet<String> {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeSet<String>> {
        self.images.lock().unwrap_or_else(|e| e.into_inner())
    }
}
