//! Software prefetch hints for the tree's passes over memory that is likely cold.

/// Asks the CPU to start loading the cache line at `p` (a hint; nothing elsewhere).
#[inline(always)]
pub(crate) fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is only a hint: it never faults and reads nothing architecturally,
    // whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Asks the CPU to start loading the cache line at `p` for writing (a hint; nothing else).
#[inline(always)]
pub(crate) fn prefetch_write<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: as in `prefetch`: a prefetch is only a hint that never faults and changes
    // nothing architecturally, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_ET0 }>(p.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// How far ahead (bytes) linear passes over memory that is likely cold prefetch.
const AHEAD_BYTES: usize = 2048;

/// Prefetches the line `AHEAD_BYTES` past element `i` of `s`, if that is inside `s`. Called
/// once per 64 bytes by passes over a request's tokens or pages: the hardware prefetcher
/// stops at every 4 KiB page and restarts slowly.
#[inline(always)]
pub(crate) fn prefetch_ahead<T>(s: &[T], i: usize) {
    let j = i + AHEAD_BYTES / std::mem::size_of::<T>().max(1);
    if j < s.len() {
        prefetch(s[j..].as_ptr());
    }
}

/// Prefetches the first `AHEAD_BYTES` of `s` (the start of such a pass).
#[inline]
pub(crate) fn prefetch_head<T>(s: &[T]) {
    let size = std::mem::size_of::<T>().max(1);
    for j in (0..s.len().min(AHEAD_BYTES / size)).step_by((64 / size).max(1)) {
        prefetch(s[j..].as_ptr());
    }
}
