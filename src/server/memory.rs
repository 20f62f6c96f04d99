//! How the allocator hands memory back to the kernel.
//!
//! Every flight builds batch-sized buffers (the request body, its rows' places, the
//! messages to settle: a few MiB for 10,000 rows) and frees them a moment later.
//! glibc's defaults give such memory back at once (a freed block over 128 KiB is
//! unmapped, the top of a thread's heap trimmed with `madvise`), so the next flight
//! takes every page again from the kernel, zeroed, one fault each: measured, a sixth of
//! Sluice's CPU per row (docs/benchmark.md). Keeping up to `KEEP` of freed memory for
//! reuse costs at most that much resident memory, and the buffers are bounded by the
//! batch size and the flights in the air.

/// The freed memory glibc keeps for reuse instead of returning it (32 MiB is the
/// largest mmap threshold glibc takes on 64-bit machines).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const KEEP: libc::c_int = 32 << 20;

/// Keep freed batch buffers for the next flight (glibc only; other allocators keep
/// their own defaults).
pub fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets the allocator's tuning parameters; these two take any
    // non-negative value, and it may be called at any time from any thread.
    unsafe {
        // Blocks up to this size come from the heap (reused), not from their own mmap.
        libc::mallopt(libc::M_MMAP_THRESHOLD, KEEP);
        // A heap's free top is returned only past this size.
        libc::mallopt(libc::M_TRIM_THRESHOLD, KEEP);
    }
}
