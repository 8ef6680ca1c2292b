//! The paged KV pool: one contiguous buffer of `num_pages` pages laid out as [`KvLayout`]
//! documents, so page reads and writes are plain copies.

use super::{ExecError, KvDtype, KvLayout};
use crate::kernels::attention::KvGather;
use half::{bf16, f16};

/// KV pages of every layer.
#[derive(Debug)]
pub struct KvPool {
    layout: KvLayout,
    num_pages: usize,
    /// Backing store, `u64` so every element type is aligned.
    data: Vec<u64>,
    bytes: usize,
}

impl KvPool {
    /// A zeroed pool of `num_pages` pages.
    pub fn new(layout: KvLayout, num_pages: usize) -> KvPool {
        let bytes = layout.page_bytes() * num_pages;
        KvPool {
            layout,
            num_pages,
            data: vec![0u64; bytes.div_ceil(8)],
            bytes,
        }
    }

    fn raw(&self) -> &[u8] {
        // SAFETY: `data` holds at least `bytes` initialized bytes.
        unsafe { std::slice::from_raw_parts(self.data.as_ptr() as *const u8, self.bytes) }
    }

    fn raw_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `raw`, uniquely borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.data.as_mut_ptr() as *mut u8, self.bytes) }
    }

    /// Shape of a page.
    pub fn layout(&self) -> KvLayout {
        self.layout
    }

    /// Pages in the pool.
    pub fn num_pages(&self) -> usize {
        self.num_pages
    }

    fn row_elems(&self) -> usize {
        self.layout.num_kv_heads * self.layout.head_dim
    }

    /// Byte offset of (page, layer, K or V, slot).
    fn offset(&self, page: usize, layer: usize, v: bool, slot: usize) -> usize {
        let l = &self.layout;
        let es = l.dtype.size();
        let part = l.page_size * self.row_elems() * es;
        page * l.page_bytes() + (layer * 2 + v as usize) * part + slot * self.row_elems() * es
    }

    /// Stores one token's K and V (`num_kv_heads * head_dim` each) at `slot` of `page`.
    pub fn write_token(&mut self, layer: usize, page: usize, slot: usize, k: &[f32], v: &[f32]) {
        let dtype = self.layout.dtype;
        for (is_v, src) in [(false, k), (true, v)] {
            let off = self.offset(page, layer, is_v, slot);
            let dst = &mut self.raw_mut()[off..off + src.len() * dtype.size()];
            store(dtype, src, dst);
        }
    }

    /// Gathers K and V of `kv_head` for positions `0..len` of a sequence with page table
    /// `pages` into `g` (f32).
    pub fn gather(
        &self,
        layer: usize,
        pages: &[u32],
        kv_head: usize,
        len: usize,
        g: &mut KvGather,
    ) {
        let l = &self.layout;
        let hd = l.head_dim;
        let es = l.dtype.size();
        g.reset(len, hd);
        let raw = self.raw();
        let mut tmp = vec![0.0f32; hd];
        let panel = hd * 32;
        for pos in 0..len {
            let page = pages[pos / l.page_size] as usize;
            let slot = pos % l.page_size;
            let koff = self.offset(page, layer, false, slot) + kv_head * hd * es;
            let voff = self.offset(page, layer, true, slot) + kv_head * hd * es;
            load(l.dtype, &raw[koff..koff + hd * es], &mut tmp);
            let base = (pos / 32) * panel + pos % 32;
            for (d, &kv) in tmp.iter().enumerate() {
                g.kt[base + d * 32] = kv;
            }
            load(
                l.dtype,
                &raw[voff..voff + hd * es],
                &mut g.v[pos * hd..(pos + 1) * hd],
            );
        }
    }

    fn check_pages(&self, pages: &[u32], buf: usize) -> Result<usize, ExecError> {
        let pb = self.layout.page_bytes();
        if buf != pages.len() * pb {
            return Err(ExecError::BadBuffer {
                got: buf,
                want: pages.len() * pb,
            });
        }
        if let Some(&bad) = pages.iter().find(|&&p| p as usize >= self.num_pages) {
            return Err(ExecError::BadPage(bad));
        }
        Ok(pb)
    }

    /// Copies pages out, `page_bytes` each, in order.
    pub fn read_pages(&self, pages: &[u32], out: &mut [u8]) -> Result<(), ExecError> {
        let pb = self.check_pages(pages, out.len())?;
        for (i, &p) in pages.iter().enumerate() {
            let p = p as usize;
            out[i * pb..(i + 1) * pb].copy_from_slice(&self.raw()[p * pb..(p + 1) * pb]);
        }
        Ok(())
    }

    /// Copies pages in, `page_bytes` each, in order.
    pub fn write_pages(&mut self, pages: &[u32], data: &[u8]) -> Result<(), ExecError> {
        let pb = self.check_pages(pages, data.len())?;
        for (i, &p) in pages.iter().enumerate() {
            let p = p as usize;
            self.raw_mut()[p * pb..(p + 1) * pb].copy_from_slice(&data[i * pb..(i + 1) * pb]);
        }
        Ok(())
    }
}

fn store(dtype: KvDtype, src: &[f32], dst: &mut [u8]) {
    match dtype {
        KvDtype::F16 => {
            for (s, d) in src.iter().zip(dst.chunks_exact_mut(2)) {
                d.copy_from_slice(&f16::from_f32(*s).to_le_bytes());
            }
        }
        KvDtype::Bf16 => {
            for (s, d) in src.iter().zip(dst.chunks_exact_mut(2)) {
                d.copy_from_slice(&bf16::from_f32(*s).to_le_bytes());
            }
        }
        KvDtype::F32 => {
            for (s, d) in src.iter().zip(dst.chunks_exact_mut(4)) {
                d.copy_from_slice(&s.to_le_bytes());
            }
        }
    }
}

fn load(dtype: KvDtype, src: &[u8], dst: &mut [f32]) {
    use half::slice::HalfFloatSliceExt;
    if dtype != KvDtype::F32 && (src.as_ptr() as usize).is_multiple_of(2) {
        // SAFETY: 2-aligned, `src.len() / 2` elements of a plain 16-bit type.
        let n = src.len() / 2;
        match dtype {
            KvDtype::F16 => unsafe {
                std::slice::from_raw_parts(src.as_ptr() as *const f16, n)
                    .convert_to_f32_slice(&mut dst[..n])
            },
            _ => unsafe {
                std::slice::from_raw_parts(src.as_ptr() as *const bf16, n)
                    .convert_to_f32_slice(&mut dst[..n])
            },
        }
        return;
    }
    match dtype {
        KvDtype::F16 => {
            for (s, d) in src.chunks_exact(2).zip(dst.iter_mut()) {
                *d = f16::from_le_bytes([s[0], s[1]]).to_f32();
            }
        }
        KvDtype::Bf16 => {
            for (s, d) in src.chunks_exact(2).zip(dst.iter_mut()) {
                *d = bf16::from_le_bytes([s[0], s[1]]).to_f32();
            }
        }
        KvDtype::F32 => {
            for (s, d) in src.chunks_exact(4).zip(dst.iter_mut()) {
                *d = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_through_pages_and_gathers() {
        let layout = KvLayout {
            num_layers: 2,
            num_kv_heads: 2,
            head_dim: 4,
            page_size: 3,
            dtype: KvDtype::F16,
        };
        let mut pool = KvPool::new(layout, 5);
        let pages = [4u32, 0, 2];
        for pos in 0..7 {
            let k: Vec<f32> = (0..8).map(|i| (pos * 10 + i) as f32).collect();
            let v: Vec<f32> = k.iter().map(|x| -x).collect();
            pool.write_token(1, pages[pos / 3] as usize, pos % 3, &k, &v);
        }
        let mut g = KvGather::default();
        pool.gather(1, &pages, 1, 7, &mut g);
        for pos in 0..7 {
            for d in 0..4 {
                assert_eq!(g.kt[g.kt_index(d, pos)], (pos * 10 + 4 + d) as f32);
                assert_eq!(g.v[pos * 4 + d], -((pos * 10 + 4 + d) as f32));
            }
        }
        let mut buf = vec![0u8; 2 * layout.page_bytes()];
        pool.read_pages(&[4, 0], &mut buf).unwrap();
        let mut other = KvPool::new(layout, 2);
        other.write_pages(&[1, 0], &buf).unwrap();
        let mut g2 = KvGather::default();
        other.gather(1, &[1, 0], 1, 6, &mut g2);
        assert_eq!(g2.v[..], g.v[..6 * 4]);
        assert!(matches!(
            pool.read_pages(&[9], &mut buf[..layout.page_bytes()]),
            Err(ExecError::BadPage(9))
        ));
        assert!(matches!(
            pool.read_pages(&[1], &mut buf),
            Err(ExecError::BadBuffer { .. })
        ));
    }
}
