//! Compute kernels of the CPU executor.
//!
//! - [`quant`]: activation quantization (8-bit blocks of 32, llama.cpp's Q8_0/Q8_1 rounding)
//!   and dequantization of every stored weight type;
//! - [`packed`]: weights repacked once at load into a SIMD-friendly layout, and the matmul
//!   that dispatches to the best instruction set found at run time (AVX-512 VNNI, AVX2,
//!   scalar);
//! - [`attention`]: causal attention reading the paged f16/bf16/f32 KV in place;
//! - [`pool`]: a small persistent thread pool whose idle workers park instead of spinning.
//!
//! Every SIMD kernel has a scalar twin; unit tests check each against a naive
//! dequantize-then-dot reference.

pub mod attention;
mod dot_avx2;
mod dot_avx512;
mod dot_scalar;
pub mod elementwise;
pub mod packed;
pub mod pool;
pub mod quant;

use std::sync::OnceLock;

/// Which opt-in AMX tiles the kernels use here (asked for and available).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AmxUse {
    /// Prefill matmuls on AMX-INT8 tiles (`SGLRS_AMX=1`; the same bits).
    pub matmul: bool,
    /// Prefill attention on AMX-BF16 tiles (`SGLRS_AMX_ATTENTION=1`; not the same bits).
    pub attention: bool,
}

impl AmxUse {
    /// What this process uses with `isa`.
    pub fn detect(isa: Isa) -> Self {
        #[cfg(target_arch = "x86_64")]
        if isa == Isa::Avx512Vnni {
            return AmxUse {
                matmul: dot_avx512::amx_in_use(),
                attention: attention::amx::wanted() && attention::amx::available(),
            };
        }
        let _ = isa;
        AmxUse::default()
    }
}

/// Instruction set the quantized kernels use, detected once at run time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    /// Portable Rust.
    Scalar,
    /// AVX2 + FMA + F16C.
    Avx2,
    /// AVX-512 F/BW/VL with VNNI int8 dot products.
    Avx512Vnni,
}

impl Isa {
    /// The best instruction set this CPU supports (cached). `SGLRS_ISA=scalar|avx2` caps it.
    pub fn detect() -> Isa {
        static ISA: OnceLock<Isa> = OnceLock::new();
        *ISA.get_or_init(|| {
            let best = Self::best_supported();
            match std::env::var("SGLRS_ISA").as_deref() {
                Ok("scalar") => Isa::Scalar,
                Ok("avx2") => best.min(Isa::Avx2),
                _ => best,
            }
        })
    }

    /// Every instruction set this CPU can run, from the slowest up (for tests).
    pub fn all_supported() -> Vec<Isa> {
        let best = Self::best_supported();
        [Isa::Scalar, Isa::Avx2, Isa::Avx512Vnni]
            .into_iter()
            .filter(|i| *i <= best)
            .collect()
    }

    fn best_supported() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512vnni")
            {
                return Isa::Avx512Vnni;
            }
            if is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c")
            {
                return Isa::Avx2;
            }
        }
        Isa::Scalar
    }
}
