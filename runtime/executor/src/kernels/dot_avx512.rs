//! AVX-512 VNNI quantized matmul over the [`QuantLayout::Vnni16`] weight layout.
//!
//! A register tile is `R` groups of 16 weight rows × `T` tokens. Per 32-block, each 64-byte
//! weight vector (16 rows × 4 consecutive values, nibbles unpacked once) meets a broadcast of
//! the same 4 activation bytes of each token (`vpbroadcastd`) in a `vpdpbusd` into int32
//! accumulators, one per (row group, token); after the block, each is converted and FMA'd
//! with the 16 row scales × the token's scale, plus the offsets × the token's block sum, into
//! f32 accumulators. The result lanes are 16 consecutive output rows of one token, so the
//! tile is stored directly: no horizontal reductions.

// Register tiles are indexed by (row group, token) on purpose: the loops mirror the tile.
#![allow(clippy::needless_range_loop)]

use super::packed::{QuantLayout, QuantMatrix};
use super::quant::{QuantActs, QK};
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Activation rows per cache block: their quantized values stay in L1/L2 while a task's
/// weight rows stream past.
const TOKEN_BLOCK: usize = 64;

/// A test-only switch (a static `$flag`, on unless a test turns it off, which the
/// `matmul_speed` timing and the bit-identity tests do) and `$on()`, constant `true` outside
/// tests.
macro_rules! test_switch {
    ($(#[$doc:meta])* $flag:ident, $on:ident) => {
        $(#[$doc])*
        #[cfg(test)]
        pub(super) static $flag: std::sync::atomic::AtomicBool =
            std::sync::atomic::AtomicBool::new(true);

        fn $on() -> bool {
            #[cfg(test)]
            return $flag.load(std::sync::atomic::Ordering::Relaxed);
            #[cfg(not(test))]
            true
        }
    };
}

test_switch!(
    /// The next-tile prefetch.
    PREFETCH,
    prefetch_on
);

/// Token blocks of `TILE8_TOKENS` (batched decode) use 1 x 8 tiles: one row group's
/// nibbles unpacked once for 8 tokens, and each weight vector used by one tile only, straight
/// from the prefetch. Measured (`matmul_speed`, one thread) 1.08-1.2x faster than 2 x 4 tiles
/// at 8 and 16 tokens, even at 32, 0.92x at 64 (prefill blocks keep 2 x 4).
const TILE8_TOKENS: std::ops::Range<usize> = 8..48;

test_switch!(
    /// The 1 x 8 tile.
    TILE8,
    tile8_on
);
test_switch!(
    /// The f16 scales (`QuantMatrix::dm16`).
    HALF,
    half_on
);
/// A test-only switch for the AMX tiles: on in tests wherever the CPU has them (the
/// bit-identity and timing tests turn it off). Outside tests they are opt-in, `SGLRS_AMX=1`.
#[cfg(test)]
pub(super) static AMX: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

fn amx_on() -> bool {
    #[cfg(test)]
    return AMX.load(std::sync::atomic::Ordering::Relaxed);
    #[cfg(not(test))]
    amx::wanted()
}

/// Computes rows `r0..r1` of `out[t * rows + r]` for every activation row.
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL/VNNI; `w` must be in the VNNI layout with `r0` a
/// multiple of 16; `out` must point to `a.n * w.rows` writable floats and no other thread
/// writes these rows.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn matmul_rows(
    w: &QuantMatrix,
    r0: usize,
    r1: usize,
    a: &QuantActs,
    out: *mut f32,
) {
    debug_assert!(w.layout == QuantLayout::Vnni16 && r0.is_multiple_of(16));
    // With `SGLRS_AMX=1`, whole 16-token tiles on AMX where it is exposed (prefill), the
    // rest on VNNI; the same bits either way. Opt-in: the GEMM alone is 1.24-1.51x faster
    // (`amx_prefill_speed`), but whole prefills gain only at short prompts (2026-12-06,
    // 2-vCPU Xeon, `sglrs bench executor --prefill-tokens N` with and without: +12-16% at
    // 256 tokens, +5-10% at 1,024, within the noise at 2,048 and 3,400; docs/agents.md).
    let tiled = if a.n >= AMX_TOKENS && amx_on() && amx::available() {
        a.n / 16 * 16
    } else {
        0
    };
    let half = !w.dm16.is_empty() && half_on();
    if tiled > 0 {
        match (w.nibble, half) {
            (true, true) => amx::rows::<true, true>(w, r0, r1, a, tiled, out),
            (true, false) => amx::rows::<true, false>(w, r0, r1, a, tiled, out),
            (false, true) => amx::rows::<false, true>(w, r0, r1, a, tiled, out),
            (false, false) => amx::rows::<false, false>(w, r0, r1, a, tiled, out),
        }
    }
    let toks = tiled..a.n;
    match (w.nibble, half) {
        (true, true) => rows_impl::<true, true>(w, r0, r1, a, toks, out),
        (true, false) => rows_impl::<true, false>(w, r0, r1, a, toks, out),
        (false, true) => rows_impl::<false, true>(w, r0, r1, a, toks, out),
        (false, false) => rows_impl::<false, false>(w, r0, r1, a, toks, out),
    }
}

/// Fewest tokens for which the AMX tiles are used.
const AMX_TOKENS: usize = 16;

/// True when [`matmul_rows`] can use AMX tiles here (the CPU has them and Linux granted them).
pub(super) fn amx_available() -> bool {
    amx::available()
}

/// True when prefill matmuls run on AMX tiles: asked for (`SGLRS_AMX=1`) and available.
pub(super) fn amx_in_use() -> bool {
    amx_on() && amx_available()
}

#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn rows_impl<const NIB: bool, const H: bool>(
    w: &QuantMatrix,
    r0: usize,
    r1: usize,
    a: &QuantActs,
    toks: std::ops::Range<usize>,
    out: *mut f32,
) {
    let n = toks.end;
    let (g0, g1) = (r0 / 16, r1.div_ceil(16));
    let mut t0 = toks.start;
    while t0 < n {
        let t1 = (t0 + TOKEN_BLOCK).min(n);
        let mut g = g0;
        while g < g1 {
            // Few tokens (decode): more row groups per tile to keep the vpdpbusd chain busy.
            let t8 = TILE8_TOKENS.contains(&(t1 - t0)) && tile8_on();
            let ng = if t1 - t0 == 1 && g1 - g >= 4 {
                4
            } else if g1 - g >= 2 && !t8 {
                2
            } else {
                1
            };
            // The first token tile of a row-group tile also prefetches (into L2) the weights
            // of the next row groups, whose first tile would otherwise wait on memory; the
            // other tiles of this one find theirs in L1. Decode only (1-47 tokens): in
            // 64-token prefill blocks it cost ~3% CPU (same-time A/B runs); at 2-4 tokens (one
            // tile per row-group tile, so nothing overlapped the loads before) it saved
            // 11-19% of the GEMM time, at one token (with the f16 scales) 6-10%
            // (`matmul_speed`, measured 2026-11-30).
            let pf_groups = if t1 - t0 < 48 && prefetch_on() {
                ng.min(g1 - g - ng)
            } else {
                0
            };
            let mut t = t0;
            while t < t1 {
                let nt = (t1 - t).min(if t8 { 8 } else { 4 });
                let pf = if t == t0 { pf_groups } else { 0 };
                match (ng, nt) {
                    (1, 8) => tile::<1, 8, NIB, H>(w, g, a, t, out, pf),
                    (1, 5..=7) => {
                        tile::<1, 4, NIB, H>(w, g, a, t, out, pf);
                        match nt - 4 {
                            3 => tile::<1, 3, NIB, H>(w, g, a, t + 4, out, 0),
                            2 => tile::<1, 2, NIB, H>(w, g, a, t + 4, out, 0),
                            _ => tile::<1, 1, NIB, H>(w, g, a, t + 4, out, 0),
                        }
                    }
                    (4, _) => tile::<4, 1, NIB, H>(w, g, a, t, out, pf),
                    (2, 4) => tile::<2, 4, NIB, H>(w, g, a, t, out, pf),
                    (2, 3) => tile::<2, 3, NIB, H>(w, g, a, t, out, pf),
                    (2, 2) => tile::<2, 2, NIB, H>(w, g, a, t, out, pf),
                    (2, _) => tile::<2, 1, NIB, H>(w, g, a, t, out, pf),
                    (_, 4) => tile::<1, 4, NIB, H>(w, g, a, t, out, pf),
                    (_, 3) => tile::<1, 3, NIB, H>(w, g, a, t, out, pf),
                    (_, 2) => tile::<1, 2, NIB, H>(w, g, a, t, out, pf),
                    _ => tile::<1, 1, NIB, H>(w, g, a, t, out, pf),
                }
                t += nt;
            }
            g += ng;
        }
        t0 = t1;
    }
}

/// One register tile: row groups `g..g + R`, tokens `t..t + T`; also prefetches the weights
/// of the `pf` row groups after them (which must exist) into L2. `H`: the scales and offsets
/// are read from `w.dm16` (f16, converted exactly) instead of `w.d` / `w.m`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tile<const R: usize, const T: usize, const NIB: bool, const H: bool>(
    w: &QuantMatrix,
    g: usize,
    a: &QuantActs,
    t: usize,
    out: *mut f32,
    pf: usize,
) {
    let mut acc = [[_mm512_setzero_ps(); T]; R];
    // Bytes of one row group's values, and of one block pair of them.
    let pair_bytes = if NIB { 8 * 64 } else { 2 * 8 * 64 };
    let group_bytes = w.nbp / 2 * pair_bytes;
    // Blocks come in pairs (`nbp` is even); four-bit pairs share their bytes.
    for b in (0..w.nbp).step_by(2) {
        for p in 0..pf {
            let grp = g + R + p;
            let at = w.qs.as_ptr().add(grp * group_bytes + b / 2 * pair_bytes) as *const i8;
            for line in 0..pair_bytes / 64 {
                _mm_prefetch::<_MM_HINT_T1>(at.add(line * 64));
            }
            let sc = (grp * w.nbp + b) * 16;
            if H {
                // Two blocks' lines of f16 scales and offsets.
                let x = w.dm16.as_ptr().add(2 * sc) as *const i8;
                _mm_prefetch::<_MM_HINT_T1>(x);
                _mm_prefetch::<_MM_HINT_T1>(x.add(64));
            } else {
                for x in [w.d.as_ptr().add(sc), w.m.as_ptr().add(sc)] {
                    _mm_prefetch::<_MM_HINT_T1>(x as *const i8);
                    _mm_prefetch::<_MM_HINT_T1>(x.add(16) as *const i8);
                }
            }
        }
        block::<R, T, NIB, H, false>(w, g, a, t, b, &mut acc);
        block::<R, T, NIB, H, true>(w, g, a, t, b + 1, &mut acc);
    }
    for i in 0..R {
        let r = (g + i) * 16;
        let mk = row_mask(w, r);
        for j in 0..T {
            _mm512_mask_storeu_ps(out.add((t + j) * w.rows + r), mk, acc[i][j]);
        }
    }
}

/// The lanes of the row group starting at row `r` that are real rows (the last group is
/// zero-padded to 16).
#[cfg(target_arch = "x86_64")]
fn row_mask(w: &QuantMatrix, r: usize) -> __mmask16 {
    let valid = w.rows.saturating_sub(r).min(16);
    if valid == 16 {
        0xFFFF
    } else {
        ((1u32 << valid) - 1) as u16
    }
}

/// Adds block `b` (odd: `ODD`) of row groups `g..g + R` × tokens `t..t + T` to `acc`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn block<const R: usize, const T: usize, const NIB: bool, const H: bool, const ODD: bool>(
    w: &QuantMatrix,
    g: usize,
    a: &QuantActs,
    t: usize,
    b: usize,
    acc: &mut [[__m512; T]; R],
) {
    let nbp = w.nbp;
    let mask = _mm512_set1_epi8(0x0F);
    let wq = w.qs.as_ptr();
    let (aq, ad) = (a.qs.as_ptr() as *const u8, a.d.as_ptr());
    let asum = a.sums(w.exact_sums).as_ptr();
    let mut iacc = [[_mm512_setzero_si512(); T]; R];
    for k in 0..QK / 4 {
        let mut wv = [_mm512_setzero_si512(); R];
        for i in 0..R {
            wv[i] = if NIB {
                // Even blocks in the low nibbles, odd blocks in the high ones.
                let at = (((g + i) * (nbp / 2) + b / 2) * 8 + k) * 64;
                let p = _mm512_loadu_si512(wq.add(at) as *const __m512i);
                if ODD {
                    _mm512_and_si512(_mm512_srli_epi16::<4>(p), mask)
                } else {
                    _mm512_and_si512(p, mask)
                }
            } else {
                let at = (((g + i) * nbp + b) * 8 + k) * 64;
                _mm512_loadu_si512(wq.add(at) as *const __m512i)
            };
        }
        for j in 0..T {
            let p = aq.add(((t + j) * nbp + b) * QK + 4 * k) as *const i32;
            let av = _mm512_set1_epi32(p.read_unaligned());
            for i in 0..R {
                iacc[i][j] = _mm512_dpbusd_epi32(iacc[i][j], wv[i], av);
            }
        }
    }
    for i in 0..R {
        let (dw, mv) = scales::<H>(w, g + i, b);
        for j in 0..T {
            let ai = (t + j) * nbp + b;
            acc[i][j] = add_block(acc[i][j], iacc[i][j], dw, mv, *ad.add(ai), *asum.add(ai));
        }
    }
}

/// Block `b`'s scales and offsets of row group `g`, as f32 (`H`: from the f16 copy).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn scales<const H: bool>(w: &QuantMatrix, g: usize, b: usize) -> (__m512, __m512) {
    let sc = (g * w.nbp + b) * 16;
    if H {
        // f16 → f32 is exact: the same f32 scales as `w.d` / `w.m`.
        let x = w.dm16.as_ptr().add(2 * sc);
        (
            _mm512_cvtph_ps(_mm256_loadu_si256(x as *const __m256i)),
            _mm512_cvtph_ps(_mm256_loadu_si256(x.add(16) as *const __m256i)),
        )
    } else {
        (
            _mm512_loadu_ps(w.d.as_ptr().add(sc)),
            _mm512_loadu_ps(w.m.as_ptr().add(sc)),
        )
    }
}

/// One block's integer sums (16 rows of one token) added to that token's accumulator:
/// `acc + isum * (d_w * d_a) + m_w * s_a`, in this order (every kernel, for the same bits).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn add_block(
    acc: __m512,
    isum: __m512i,
    dw: __m512,
    mv: __m512,
    da: f32,
    sa: f32,
) -> __m512 {
    let sc = _mm512_mul_ps(dw, _mm512_set1_ps(da));
    let acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), sc, acc);
    _mm512_fmadd_ps(mv, _mm512_set1_ps(sa), acc)
}

/// AMX-INT8 tiles (Sapphire Rapids and later, where Linux grants the tile state): a block's
/// integer sums for 16 tokens × 16 weight rows in one `tdpbsud` — activations (signed) as
/// the A tile, 16 tokens × the block's 32 bytes; weights (unsigned) as the B tile, whose
/// VNNI form is exactly the [`QuantLayout::Vnni16`] vectors of the block (four-bit values
/// unpacked first). The sums are stored and added per token with [`add_block`], as the VNNI
/// kernel adds its own: the same integers and the same float steps, so the same bits.
#[cfg(target_arch = "x86_64")]
pub(super) mod amx {
    use super::{add_block, scales, QuantActs, QuantMatrix, QK};
    use std::arch::asm;
    use std::arch::x86_64::*;
    use std::sync::OnceLock;

    /// The CPU has AMX-TILE and AMX-INT8 and the kernel let this process use the tile data.
    /// Cached.
    pub(super) fn available() -> bool {
        static ON: OnceLock<bool> = OnceLock::new();
        // SAFETY: `cpuid` exists on every x86-64; the syscall only asks for a permission.
        *ON.get_or_init(|| unsafe { detect() })
    }

    /// `SGLRS_AMX=1`: the tiles are opt-in (see [`super::matmul_rows`]). Cached.
    #[cfg(not(test))]
    pub(super) fn wanted() -> bool {
        static ON: OnceLock<bool> = OnceLock::new();
        *ON.get_or_init(|| std::env::var("SGLRS_AMX").is_ok_and(|v| v == "1"))
    }

    unsafe fn detect() -> bool {
        // AMX-TILE (bit 24) and AMX-INT8 (bit 25).
        cpu_has(1 << 24 | 1 << 25) && request_tile_data()
    }

    /// Whether CPUID leaf 7 reports every feature bit of `edx_bits` in EDX (where the AMX
    /// bits are).
    pub(crate) fn cpu_has(edx_bits: u32) -> bool {
        // Leaf 7 is read only where leaf 0 lists it.
        __cpuid(0).eax >= 7 && __cpuid_count(7, 0).edx & edx_bits == edx_bits
    }

    /// Linux hands out the 8 KiB tile register state on request: `arch_prctl(
    /// ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`, once per process.
    #[cfg(target_os = "linux")]
    pub(crate) unsafe fn request_tile_data() -> bool {
        const SYS_ARCH_PRCTL: i64 = 158;
        const ARCH_REQ_XCOMP_PERM: i64 = 0x1023;
        const XFEATURE_XTILEDATA: i64 = 18;
        let ret: i64;
        asm!(
            "syscall",
            inlateout("rax") SYS_ARCH_PRCTL => ret,
            in("rdi") ARCH_REQ_XCOMP_PERM,
            in("rsi") XFEATURE_XTILEDATA,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
        ret == 0
    }

    #[cfg(not(target_os = "linux"))]
    pub(crate) unsafe fn request_tile_data() -> bool {
        false
    }

    /// A tile configuration (palette 1), as `ldtilecfg` reads it.
    #[repr(C, align(64))]
    pub(crate) struct TileConfig {
        palette: u8,
        start_row: u8,
        reserved: [u8; 14],
        colsb: [u16; 16],
        rows: [u8; 16],
    }

    impl TileConfig {
        /// Tiles `tmm0..` shaped `(rows, bytes per row)` in turn; the rest unused.
        pub(crate) fn new(tiles: &[(u8, u16)]) -> Self {
            let mut c = TileConfig {
                palette: 1,
                start_row: 0,
                reserved: [0; 14],
                colsb: [0; 16],
                rows: [0; 16],
            };
            for (t, &(rows, colsb)) in tiles.iter().enumerate() {
                c.rows[t] = rows;
                c.colsb[t] = colsb;
            }
            c
        }
    }

    #[repr(C, align(64))]
    struct Lines<const N: usize>([u8; N]);

    /// Tokens whose activations one pass over the row groups uses (8 tiles).
    const TOKENS_PER_PASS: usize = 128;

    /// Rows `r0..r1` (whole row groups) of `out` for tokens `0..tiled` (a multiple of 16).
    ///
    /// # Safety
    /// [`available`] must be true and the CPU must have AVX-512 F/BW/VL/VNNI; the rest as
    /// [`super::matmul_rows`].
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(super) unsafe fn rows<const NIB: bool, const H: bool>(
        w: &QuantMatrix,
        r0: usize,
        r1: usize,
        a: &QuantActs,
        tiled: usize,
        out: *mut f32,
    ) {
        // tmm0/tmm3 the A tiles of an even and an odd block (16 rows × 32 bytes), tmm1/tmm4
        // their B tiles (8 rows × 64 bytes), tmm2/tmm5 their sums (16 rows × 16 int32).
        let cfg = TileConfig::new(&[(16, 32), (8, 64), (16, 64), (16, 32), (8, 64), (16, 64)]);
        asm!("ldtilecfg [{}]", in(reg) &cfg, options(nostack, readonly));
        let nbp = w.nbp;
        let (g0, g1) = (r0 / 16, r1.div_ceil(16));
        let pair_bytes = if NIB { 8 * 64 } else { 2 * 8 * 64 };
        let group_bytes = nbp / 2 * pair_bytes;
        // One row group's blocks as bytes (four-bit values unpacked), 512 bytes a block.
        let mut unpacked: Vec<Lines<512>> = Vec::new();
        if NIB {
            unpacked.resize_with(nbp, || Lines([0; 512]));
        }
        let mut sums = Lines::<2048>([0; 2048]);
        let aq = a.qs.as_ptr() as *const u8;
        let asum = a.sums(w.exact_sums).as_ptr();
        let stride = nbp * QK;
        let mask = _mm512_set1_epi8(0x0F);
        // Token blocks outer (their activations stay in cache while the row groups pass),
        // row groups inner, each group's blocks unpacked once per token block.
        let mut t0 = 0;
        while t0 < tiled {
            let t1 = (t0 + TOKENS_PER_PASS).min(tiled);
            for g in g0..g1 {
                let gq = w.qs.as_ptr().add(g * group_bytes);
                if NIB {
                    for j in 0..nbp / 2 {
                        for k in 0..8 {
                            let p = _mm512_loadu_si512(gq.add((j * 8 + k) * 64) as *const __m512i);
                            let lo = _mm512_and_si512(p, mask);
                            let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(p), mask);
                            let even = unpacked[2 * j].0.as_mut_ptr().add(k * 64);
                            let odd = unpacked[2 * j + 1].0.as_mut_ptr().add(k * 64);
                            _mm512_store_si512(even as *mut __m512i, lo);
                            _mm512_store_si512(odd as *mut __m512i, hi);
                        }
                    }
                }
                let block_b = |b: usize| -> *const u8 {
                    if NIB {
                        unpacked[b].0.as_ptr()
                    } else {
                        gq.add(b * 8 * 64)
                    }
                };
                let r = g * 16;
                let mk = super::row_mask(w, r);
                let mut t = t0;
                while t < t1 {
                    let mut acc = [_mm512_setzero_ps(); 16];
                    for b in (0..nbp).step_by(2) {
                        asm!(
                            "tilezero tmm2",
                            "tilezero tmm5",
                            "tileloadd tmm0, [{a0} + {sa}*1]",
                            "tileloadd tmm3, [{a1} + {sa}*1]",
                            "tileloadd tmm1, [{b0} + {sb}*1]",
                            "tileloadd tmm4, [{b1} + {sb}*1]",
                            "tdpbsud tmm2, tmm0, tmm1",
                            "tdpbsud tmm5, tmm3, tmm4",
                            "tilestored [{c} + {sb}*1], tmm2",
                            "tilestored [{c1} + {sb}*1], tmm5",
                            a0 = in(reg) aq.add((t * nbp + b) * QK),
                            a1 = in(reg) aq.add((t * nbp + b + 1) * QK),
                            sa = in(reg) stride,
                            b0 = in(reg) block_b(b),
                            b1 = in(reg) block_b(b + 1),
                            sb = in(reg) 64usize,
                            c = in(reg) sums.0.as_mut_ptr(),
                            c1 = in(reg) sums.0.as_mut_ptr().add(1024),
                            options(nostack),
                        );
                        for (blk, half) in [(b, 0usize), (b + 1, 1024)] {
                            let (dw, mv) = scales::<H>(w, g, blk);
                            for j in 0..16 {
                                let ai = (t + j) * nbp + blk;
                                let isum = _mm512_load_si512(
                                    sums.0.as_ptr().add(half + j * 64) as *const __m512i
                                );
                                let (da, sa) = (*a.d.as_ptr().add(ai), *asum.add(ai));
                                acc[j] = add_block(acc[j], isum, dw, mv, da, sa);
                            }
                        }
                    }
                    for j in 0..16 {
                        _mm512_mask_storeu_ps(out.add((t + j) * w.rows + r), mk, acc[j]);
                    }
                    t += 16;
                }
            }
            t0 = t1;
        }
        asm!("tilerelease", options(nostack, nomem));
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod amx {
    pub(super) fn available() -> bool {
        false
    }

    pub(super) fn wanted() -> bool {
        false
    }
}

/// Stand-in on other architectures: never selected, since detection yields `Scalar` there.
///
/// # Safety
/// Same contract as the x86 version.
#[cfg(not(target_arch = "x86_64"))]
pub(super) unsafe fn matmul_rows(
    w: &QuantMatrix,
    r0: usize,
    r1: usize,
    a: &QuantActs,
    out: *mut f32,
) {
    super::dot_scalar::matmul_rows(w, r0, r1, a, out)
}
