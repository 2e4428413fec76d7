//! The process's allocator, told to keep the memory a training step frees for the next step.
//!
//! A training step allocates and frees the same large buffers every time: activations,
//! gradients, tiles of logits, products' outputs. glibc's `malloc` hands a freed block above its
//! mmap threshold (128 KiB at first, adjusted up to 32 MiB) back to the system, and trims the
//! top of a heap when more than 128 KiB is free there; the next step maps the same memory
//! again and pays a page fault for every 4 KiB it first touches. With rayon's threads, each
//! allocating in its own arena, the dynamic threshold never settles. Raising both thresholds
//! keeps those pages mapped and reused, without raising the peak: on bench_policy's small model
//! at 2 threads the faults per step fall from about 44,000 to 1,500 and the step is about 1.3×
//! faster, at the same peak resident memory (the book's performance page has the table).
#![allow(unsafe_code)]

use std::sync::OnceLock;

/// Blocks up to this size come from the heaps, and this much free memory may stay at a heap's
/// top: larger than any buffer a step of the models Agentry trains on a CPU allocates at once.
pub const KEPT_BYTES: usize = 1 << 30;

/// How the allocator treats freed memory, as [`keep_freed_memory`] left it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FreedMemory {
    /// Kept for reuse: glibc's mmap and trim thresholds are [`KEPT_BYTES`].
    Kept,
    /// The user's own `glibc.malloc.mmap_threshold` or `glibc.malloc.trim_threshold` in
    /// `GLIBC_TUNABLES` is in effect; Agentry left that one as it was.
    UsersTunables,
    /// Not glibc (another platform or libc), or glibc refused the setting: the allocator's own
    /// policy.
    AllocatorDefault,
}

impl std::fmt::Display for FreedMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Kept => "kept for reuse (glibc's mmap and trim thresholds at 1 GiB)",
            Self::UsersTunables => "as GLIBC_TUNABLES sets it",
            Self::AllocatorDefault => "the allocator's default",
        })
    }
}

/// Makes the allocator keep freed memory for the process's next allocations (see the module
/// docs), once per process; later calls return the first call's outcome. The runtime calls it
/// when a run starts on the CPU. A threshold the user set through `GLIBC_TUNABLES` is left as
/// it is (the other one is still raised); to turn this off, set both, e.g.
/// `GLIBC_TUNABLES=glibc.malloc.mmap_threshold=131072:glibc.malloc.trim_threshold=131072`
/// (glibc's starting values, held fixed).
pub fn keep_freed_memory() -> FreedMemory {
    static OUTCOME: OnceLock<FreedMemory> = OnceLock::new();
    *OUTCOME.get_or_init(|| {
        let users = std::env::var("GLIBC_TUNABLES").unwrap_or_default();
        set_thresholds(&users)
    })
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn set_thresholds(users_tunables: &str) -> FreedMemory {
    let bytes = libc::c_int::try_from(KEPT_BYTES).expect("1 GiB fits a C int");
    let mut outcome = FreedMemory::Kept;
    for (parameter, tunable) in [
        (libc::M_MMAP_THRESHOLD, "glibc.malloc.mmap_threshold"),
        (libc::M_TRIM_THRESHOLD, "glibc.malloc.trim_threshold"),
    ] {
        if users_tunables.contains(tunable) {
            outcome = FreedMemory::UsersTunables;
            continue;
        }
        // SAFETY: `mallopt` only sets a parameter of the allocator, under the allocator's own
        // lock; it reads and writes no memory of ours.
        if unsafe { libc::mallopt(parameter, bytes) } != 1 {
            return FreedMemory::AllocatorDefault;
        }
    }
    outcome
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set_thresholds(_users_tunables: &str) -> FreedMemory {
    FreedMemory::AllocatorDefault
}

/// Floats each of rayon's tasks zero-fills (256 KiB); a buffer of fewer is filled on the
/// calling thread.
const FILL_CHUNK: usize = 1 << 16;

/// A buffer of `len` zeros, filled on rayon's threads. The kernels allocate their outputs with
/// it: with freed memory kept for reuse, `vec![0.0; len]` cannot hand out fresh zero pages
/// and `memset`s the block on the calling thread, a serial part of every training step (about
/// 12 ms of a 290 ms step of bench_policy's small model on two threads, measured).
pub fn zeroed(len: usize) -> Vec<f32> {
    use rayon::prelude::*;
    use std::mem::MaybeUninit;
    if len < FILL_CHUNK || rayon::current_num_threads() < 2 {
        return vec![0.0; len];
    }
    let mut out = Vec::with_capacity(len);
    out.spare_capacity_mut()[..len]
        .par_chunks_mut(FILL_CHUNK)
        .for_each(|chunk| chunk.fill(MaybeUninit::new(0.0)));
    // SAFETY: the first `len` elements of the capacity were all written just above.
    unsafe { out.set_len(len) };
    out
}

#[cfg(test)]
mod zeroed_tests {
    use super::*;

    #[test]
    fn zeroed_buffers_are_zeros_on_any_thread_count() {
        for threads in [1, 2, 3] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            for len in [0, 7, FILL_CHUNK - 1, FILL_CHUNK, 3 * FILL_CHUNK + 5] {
                // Dirty the allocator's free memory first, so a buffer that skipped a fill shows.
                drop(vec![f32::NAN; len]);
                let buffer = pool.install(|| zeroed(len));
                assert_eq!(buffer.len(), len);
                assert!(
                    buffer.iter().all(|&x| x.to_bits() == 0),
                    "{len} on {threads} threads"
                );
            }
        }
    }
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    use super::*;

    /// Minor page faults of the calling thread so far.
    fn thread_page_faults() -> i64 {
        let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
        // SAFETY: `getrusage` fills the struct it is given; RUSAGE_THREAD is Linux's.
        let status = unsafe { libc::getrusage(libc::RUSAGE_THREAD, usage.as_mut_ptr()) };
        assert_eq!(status, 0, "getrusage failed");
        // SAFETY: filled by the successful call above.
        unsafe { usage.assume_init() }.ru_minflt
    }

    /// Page faults taken to allocate, write and free a 24 MiB buffer, twice in a row.
    fn faults_of_two_rounds() -> [i64; 2] {
        const BYTES: usize = 24 << 20;
        std::array::from_fn(|round| {
            let before = thread_page_faults();
            let buffer: Vec<u8> = (0..BYTES).map(|i| (i + round) as u8).collect();
            std::hint::black_box(&buffer);
            drop(buffer);
            thread_page_faults() - before
        })
    }

    #[test]
    fn a_freed_buffer_is_reused_without_page_faults() {
        assert_eq!(keep_freed_memory(), FreedMemory::Kept);
        // A thread of its own, as rayon's workers are, with an arena of its own.
        // (The first round may reuse an arena an earlier test's thread left; it is not checked.
        // With glibc's defaults the second round takes a fault for each of its 6,144 pages.)
        let [_, second] = std::thread::spawn(faults_of_two_rounds).join().unwrap();
        let pages = (24 << 20) / 4096;
        assert!(
            second < pages / 20,
            "the second round should reuse the first's pages: {second} faults for {pages} pages"
        );
    }

    #[test]
    fn the_users_tunables_win() {
        assert_eq!(
            set_thresholds("glibc.malloc.trim_threshold=131072"),
            FreedMemory::UsersTunables
        );
    }
}
