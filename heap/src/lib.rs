//! Asks the C allocator to give the memory it holds free back to the operating system.
//!
//! labforge's binaries use the system allocator. glibc's keeps what a thread frees in that
//! thread's arena and, by itself, returns only the free space at the top of an arena. Memory
//! freed between live blocks stays resident: after a burst of connections, a long-running proxy
//! would stay near its peak size. `malloc_trim` gives back every whole free page of every arena.
//!
//! This is labforge's one direct call into C, so it is the one exception to the workspace's ban on
//! unsafe code, kept in a crate of its own.

/// Gives the allocator's free pages back to the operating system; `true` when it released any.
/// It walks every arena under that arena's lock, so call it off latency-sensitive threads.
/// Elsewhere than glibc it does nothing and returns `false`.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn release_free_memory() -> bool {
    // SAFETY: malloc_trim takes no pointer and changes only the allocator's own bookkeeping,
    // under its arena locks; glibc allows it from any thread at any time.
    #[expect(unsafe_code, reason = "glibc's malloc_trim, a foreign function")]
    let released = unsafe { libc::malloc_trim(0) };
    released == 1
}

/// Gives the allocator's free pages back to the operating system; `true` when it released any.
/// Only glibc's allocator keeps free pages this way: elsewhere this does nothing.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn release_free_memory() -> bool {
    false
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    use super::*;

    /// Anonymous resident memory of this process, in KiB.
    fn resident_anonymous_kib() -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
        status
            .lines()
            .find_map(|line| line.strip_prefix("RssAnon:"))
            .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("RssAnon in /proc/self/status")
    }

    #[test]
    fn memory_freed_between_live_blocks_goes_back_to_the_system() {
        // 2,000 blocks of 16 KiB, under glibc's mmap threshold so they share the heap, each
        // written so that it is resident; then every other one freed. The holes are whole pages
        // between live blocks: the heap's top cannot shrink, only malloc_trim returns them.
        let mut blocks: Vec<Vec<u8>> = (0..2000).map(|_| vec![1u8; 16 * 1024]).collect();
        let mut kept = Vec::with_capacity(blocks.len() / 2);
        for (i, block) in blocks.drain(..).enumerate() {
            if i % 2 == 0 {
                kept.push(block);
            }
        }
        let before = resident_anonymous_kib();
        assert!(release_free_memory(), "malloc_trim released nothing");
        let after = resident_anonymous_kib();
        // 1,000 holes of 16 KiB: at least 12 KiB of whole pages each.
        assert!(
            before.saturating_sub(after) >= 8 * 1024,
            "resident anonymous memory went from {before} to {after} KiB"
        );
        // The kept blocks are intact.
        assert!(kept.iter().all(|block| block.iter().all(|&b| b == 1)));
    }
}
