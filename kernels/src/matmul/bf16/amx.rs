//! The AMX engine: `tdpbf16ps` on the packed tiles, four output tiles at a time in the tile
//! registers. Linux on x86-64 only: the kernel must grant the process the tiles' 8 KiB of state
//! (`arch_prctl(ARCH_REQ_XCOMP_PERM)`), asked once; elsewhere, or when it refuses, another
//! engine (or f32) runs.

use super::{Sums, TILE_LEN};

/// Whether this process may run AMX bf16 products: the CPU has them and the kernel granted the
/// tile state (`bf16::engine` asks once and keeps the answer).
#[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]
pub(super) fn available() -> bool {
    // CPUID leaf 7: EDX bit 22 is AMX-BF16, bit 24 AMX-TILE.
    let leaf = std::arch::x86_64::__cpuid_count(7, 0);
    let has = |bit: u32| leaf.edx & (1 << bit) != 0;
    if !(has(22) && has(24)) {
        return false;
    }
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: arch_prctl with these arguments only asks the kernel for permission to use the
    // tile state; it reads and writes no memory of ours.
    unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        ) == 0
    }
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu")))]
pub(super) fn available() -> bool {
    false
}

/// The tile configuration: palette 1, all eight tiles 16 rows of 64 bytes.
#[repr(C, align(64))]
struct Config {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    bytes_per_row: [u16; 16],
    rows: [u8; 16],
}

const CONFIG: Config = Config {
    palette: 1,
    start_row: 0,
    reserved: [0; 14],
    bytes_per_row: [64, 64, 64, 64, 64, 64, 64, 64, 0, 0, 0, 0, 0, 0, 0, 0],
    rows: [16, 16, 16, 16, 16, 16, 16, 16, 0, 0, 0, 0, 0, 0, 0, 0],
};

/// Bytes between a tile's rows, packed.
const STRIDE: usize = super::DEPTH * 2;
/// Bytes from one packed tile to the next chunk's.
const NEXT: usize = TILE_LEN * 2;

/// Runs `body` with this thread's tiles configured by [`CONFIG`], and releases them after.
///
/// # Safety
///
/// AMX must be [`available`], and `body` must run no other tile configuration.
pub(super) unsafe fn with_tiles(body: impl FnOnce()) {
    // SAFETY: the caller's contract; the configuration is this thread's, loaded before its
    // first tile operation and released after its last.
    unsafe {
        std::arch::asm!("ldtilecfg [{}]", in(reg) &CONFIG, options(nostack));
    }
    body();
    // SAFETY: releases this thread's tile state configured above.
    unsafe {
        std::arch::asm!("tilerelease", options(nostack));
    }
}

/// `out[t] = Σ_chunks a(t) · b(t)` for four output tiles `(a0, b0), (a0, b1), (a1, b0),
/// (a1, b1)`: a product of 32 rows by 32 columns.
///
/// # Safety
///
/// AMX must be [`available`] and this thread inside [`with_tiles`]; each pointer must point at
/// `chunks` consecutive packed tiles.
pub(super) unsafe fn block(a: [*const u16; 2], b: [*const u16; 2], chunks: usize, out: &mut Sums) {
    // SAFETY: the caller's contract; the loads read `chunks` tiles from each pointer and the
    // stores write four 1 KiB buffers.
    unsafe {
        std::arch::asm!(
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            "2:",
            "tileloadd tmm4, [{a0} + {s}*1]",
            "tileloadd tmm6, [{b0} + {s}*1]",
            "tdpbf16ps tmm0, tmm4, tmm6",
            "tileloadd tmm7, [{b1} + {s}*1]",
            "tdpbf16ps tmm1, tmm4, tmm7",
            "tileloadd tmm5, [{a1} + {s}*1]",
            "tdpbf16ps tmm2, tmm5, tmm6",
            "tdpbf16ps tmm3, tmm5, tmm7",
            // The next chunk's right-hand tiles, line by line, into the first-level cache while
            // the products run (+10-15% on the prefill's shapes); a prefetch never faults, so
            // the last chunk's, past the buffer, is harmless.
            "prefetcht0 [{b0} + 1024]",
            "prefetcht0 [{b0} + 1088]",
            "prefetcht0 [{b0} + 1152]",
            "prefetcht0 [{b0} + 1216]",
            "prefetcht0 [{b0} + 1280]",
            "prefetcht0 [{b0} + 1344]",
            "prefetcht0 [{b0} + 1408]",
            "prefetcht0 [{b0} + 1472]",
            "prefetcht0 [{b0} + 1536]",
            "prefetcht0 [{b0} + 1600]",
            "prefetcht0 [{b0} + 1664]",
            "prefetcht0 [{b0} + 1728]",
            "prefetcht0 [{b0} + 1792]",
            "prefetcht0 [{b0} + 1856]",
            "prefetcht0 [{b0} + 1920]",
            "prefetcht0 [{b0} + 1984]",
            "prefetcht0 [{b1} + 1024]",
            "prefetcht0 [{b1} + 1088]",
            "prefetcht0 [{b1} + 1152]",
            "prefetcht0 [{b1} + 1216]",
            "prefetcht0 [{b1} + 1280]",
            "prefetcht0 [{b1} + 1344]",
            "prefetcht0 [{b1} + 1408]",
            "prefetcht0 [{b1} + 1472]",
            "prefetcht0 [{b1} + 1536]",
            "prefetcht0 [{b1} + 1600]",
            "prefetcht0 [{b1} + 1664]",
            "prefetcht0 [{b1} + 1728]",
            "prefetcht0 [{b1} + 1792]",
            "prefetcht0 [{b1} + 1856]",
            "prefetcht0 [{b1} + 1920]",
            "prefetcht0 [{b1} + 1984]",
            "add {a0}, {next}",
            "add {a1}, {next}",
            "add {b0}, {next}",
            "add {b1}, {next}",
            "dec {n}",
            "jnz 2b",
            "tilestored [{c0} + {s}*1], tmm0",
            "tilestored [{c1} + {s}*1], tmm1",
            "tilestored [{c2} + {s}*1], tmm2",
            "tilestored [{c3} + {s}*1], tmm3",
            a0 = inout(reg) a[0] => _,
            a1 = inout(reg) a[1] => _,
            b0 = inout(reg) b[0] => _,
            b1 = inout(reg) b[1] => _,
            n = inout(reg) chunks => _,
            s = in(reg) STRIDE,
            next = const NEXT,
            c0 = in(reg) out[0].as_mut_ptr(),
            c1 = in(reg) out[1].as_mut_ptr(),
            c2 = in(reg) out[2].as_mut_ptr(),
            c3 = in(reg) out[3].as_mut_ptr(),
            options(nostack),
        );
    }
}
