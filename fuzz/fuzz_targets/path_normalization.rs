//! Request paths as the proxy normalizes them before routing (Istio's normalization): refused or
//! normalized, never a panic; a normalized path is absolute, has no `..` or `.` segment, and
//! normalizing it again changes nothing.
#![no_main]

use labforge_proxy::normalize::normalize_path;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(path) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(normalized) = normalize_path(path) {
        assert!(normalized.starts_with('/'), "{path:?} → {normalized:?}");
        assert!(
            !normalized.split('/').any(|s| s == ".." || s == "."),
            "{path:?} → {normalized:?}"
        );
        let again = normalize_path(&normalized).expect("a normalized path normalizes");
        assert_eq!(again, normalized, "{path:?}");
    }
});
