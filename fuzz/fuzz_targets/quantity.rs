//! Kubernetes quantities as users type them into the spawner form: refused or read, never a
//! panic; the canonical form reads as the same amount and is its own canonical form.
#![no_main]

use labforge_crds::quantity::{canonical, value};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(form) = canonical(text) {
        assert_eq!(canonical(&form).as_deref(), Ok(form.as_str()), "{text:?}");
        if let (Ok(a), Ok(b)) = (value(text), value(&form)) {
            // Past f64's range both are infinite, and equal.
            let scale = a.abs().max(b.abs()).max(1e-9);
            assert!(
                a == b || (a - b).abs() / scale < 1e-9,
                "{text:?}: {a} vs {form:?}: {b}"
            );
        }
    }
});
