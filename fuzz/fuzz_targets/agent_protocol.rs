//! What a notebook's agent sends the builder (a notebook is its owner's, so this is untrusted):
//! the change set's header line, then the change set under the builder's guard. Neither may
//! panic, and the guard must never pass on more content than the header announced.
#![no_main]

use labforge_snapshot::guard::GuardedChangeSet;
use labforge_snapshot::protocol::ChangeSetHeader;
use libfuzzer_sys::fuzz_target;
use std::io::Read;

fuzz_target!(|data: &[u8]| {
    let _ = ChangeSetHeader::read_line(data);
    let announced = data.first().map_or(0, |b| u64::from(*b) * 512);
    let mut guarded = GuardedChangeSet::new(data, announced);
    let mut passed = Vec::new();
    let _ = guarded.read_to_end(&mut passed);
    assert!(passed.len() <= data.len());
});
