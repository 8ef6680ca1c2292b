//! The shape of one KV page, which is also its byte layout everywhere a page is copied.
//!
//! One type for every holder of a page: the executor's pool copies pages out and in in this
//! layout (`Executor::read_pages` / `write_pages`), the transfer crate sends them on the wire
//! in it, and the lower cache tiers store them in it. A page holds, for each layer, K then V,
//! each `[page_size, num_kv_heads, head_dim]` elements of [`KvDtype`]. Pages travel as opaque
//! byte strings in exactly that order, so no side reshuffles anything.

use std::fmt;

/// Element type of the stored K and V.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KvDtype {
    /// IEEE half precision.
    F16,
    /// bfloat16.
    Bf16,
    /// 32-bit float.
    F32,
}

impl KvDtype {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            KvDtype::F16 | KvDtype::Bf16 => 2,
            KvDtype::F32 => 4,
        }
    }

    /// The one-byte code used on the wire.
    pub fn code(self) -> u8 {
        match self {
            KvDtype::F16 => 1,
            KvDtype::Bf16 => 2,
            KvDtype::F32 => 3,
        }
    }

    /// The dtype for a wire code, `None` for an unknown code.
    pub fn from_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(KvDtype::F16),
            2 => Some(KvDtype::Bf16),
            3 => Some(KvDtype::F32),
            _ => None,
        }
    }
}

impl fmt::Display for KvDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KvDtype::F16 => "f16",
            KvDtype::Bf16 => "bf16",
            KvDtype::F32 => "f32",
        })
    }
}

/// Shape of one KV page: for each layer, K then V, each `[page_size, num_kv_heads, head_dim]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KvLayout {
    /// Transformer layers.
    pub num_layers: usize,
    /// Key/value heads per layer.
    pub num_kv_heads: usize,
    /// Dimension of each head.
    pub head_dim: usize,
    /// Tokens per page.
    pub page_size: usize,
    /// Element type.
    pub dtype: KvDtype,
}

impl KvLayout {
    /// The default model's layout (SmolLM2-135M: 30 layers, 3 KV heads of 64, pages of 16
    /// tokens) in bf16: 368,640 bytes per page.
    pub fn smollm2_135m() -> Self {
        Self {
            num_layers: 30,
            num_kv_heads: 3,
            head_dim: 64,
            page_size: 16,
            dtype: KvDtype::Bf16,
        }
    }

    /// Bytes of one page across all layers, K and V.
    pub fn page_bytes(&self) -> usize {
        self.num_layers * 2 * self.tensor_bytes()
    }

    /// Bytes of one K (or V) tensor of one layer within a page.
    pub fn tensor_bytes(&self) -> usize {
        self.page_size * self.num_kv_heads * self.head_dim * self.dtype.size()
    }

    /// Byte range of layer `layer`'s K tensor (`v == false`) or V tensor (`v == true`) within
    /// a page.
    pub fn tensor_range(&self, layer: usize, v: bool) -> std::ops::Range<usize> {
        let start = (layer * 2 + usize::from(v)) * self.tensor_bytes();
        start..start + self.tensor_bytes()
    }
}

impl fmt::Display for KvLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} layers x {} kv heads x {} dims x {} tokens/page, {}",
            self.num_layers, self.num_kv_heads, self.head_dim, self.page_size, self.dtype
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_model_page_is_368640_bytes() {
        let l = KvLayout::smollm2_135m();
        assert_eq!(l.page_bytes(), 368_640);
        assert_eq!(l.tensor_range(0, true), 6_144..12_288);
        assert_eq!(l.tensor_range(29, true).end, l.page_bytes());
    }
}
