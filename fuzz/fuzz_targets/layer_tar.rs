//! A layer tar of a registry image (a user may name any image) applied to a baseline index: it
//! may be refused, never panic, and no entry may escape the image's root.
#![no_main]

use labforge_snapshot::index::BaselineIndex;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut index = BaselineIndex::default();
    if index.apply_layer(0, data).is_ok() {
        for (path, _) in index.iter() {
            assert!(path.is_relative(), "{path:?}");
            assert!(
                !path
                    .components()
                    .any(|c| matches!(c, std::path::Component::ParentDir)),
                "{path:?}"
            );
        }
    }
});
