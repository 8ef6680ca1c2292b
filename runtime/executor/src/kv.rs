//! The paged KV pool: one buffer of `num_pages` pages.
//!
//! A page holds, per layer, K then V of `page_size` positions. On the wire ([`KvLayout`]:
//! `read_pages`/`write_pages`) both are `[page_size, num_kv_heads, head_dim]`. In memory the
//! pool is one region per (layer, K or V, KV head), each holding that share of every page in
//! page-id order (`page_size * head_dim` elements per page): K transposed, `[head_dim,
//! page_size]`, so attention reads 16 consecutive positions of one dimension with one load
//! and converts them in registers ([`PagedKv`]), and V `[page_size, head_dim]`. A sequence's
//! pages in a run of ids are then one run of memory per head, which the hardware prefetcher
//! streams (decode at batch 4 over 3,400 positions 150 → 188 tokens/s against pages holding
//! every layer and head together; docs/executor.md). The page copies gather, scatter and
//! transpose on the way.

use super::{ExecError, KvDtype, KvLayout};
use crate::kernels::attention::PagedKv;
use half::{bf16, f16};
use std::sync::Arc;

/// The pool's memory, shared by the pool and its [`PageIo`] handles: an anonymous mapping
/// (page-aligned, so every element type is aligned, and zeroed by the kernel). Pages are read
/// and written through raw pointers under the page-ownership rule (see [`PageIo`]).
///
/// On Linux the mapping asks for transparent huge pages: an attention task reads a 2 KiB
/// share per KV page, wherever the page ids lie, and with 4 KiB pages such reads often miss
/// the TLB (a few percent of decode over a 3,400-token context; `sglrs bench executor
/// --decode-prompt 3400`).
#[derive(Debug)]
struct PoolBuf {
    /// Owns the mapping `ptr` points into (unmapped on drop).
    _map: memmap2::MmapMut,
    ptr: *mut u64,
}

// SAFETY: the buffer is plain memory; who may touch which page is the callers' contract
// (`KvPool` methods through `&`/`&mut`, `PageIo`'s unsafe methods).
unsafe impl Send for PoolBuf {}
// SAFETY: as above.
unsafe impl Sync for PoolBuf {}

impl PoolBuf {
    fn zeroed(bytes: usize) -> PoolBuf {
        // A zero-length mapping is an error; keep one word so the pointer stays valid.
        let mut map = memmap2::MmapMut::map_anon(bytes.max(8))
            .unwrap_or_else(|e| panic!("cannot map a KV pool of {bytes} bytes: {e}"));
        #[cfg(target_os = "linux")]
        {
            // Only advice: without THP (disabled, or `never`) the pool works the same.
            let _ = map.advise(memmap2::Advice::HugePage);
        }
        let ptr = map.as_mut_ptr() as *mut u64;
        PoolBuf { _map: map, ptr }
    }
}

/// KV pages of every layer.
#[derive(Debug)]
pub struct KvPool {
    layout: KvLayout,
    num_pages: usize,
    buf: Arc<PoolBuf>,
    bytes: usize,
}

impl KvPool {
    /// A zeroed pool of `num_pages` pages.
    pub fn new(layout: KvLayout, num_pages: usize) -> KvPool {
        let bytes = layout.page_bytes() * num_pages;
        KvPool {
            layout,
            num_pages,
            buf: Arc::new(PoolBuf::zeroed(bytes)),
            bytes,
        }
    }

    fn raw(&self) -> &[u8] {
        // SAFETY: the buffer holds at least `bytes` initialized bytes and lives as long as
        // `self`. Pages a `PageIo` writes at the same time belong to no batch, so nothing
        // reads them through this slice meanwhile.
        unsafe { std::slice::from_raw_parts(self.buf.ptr as *const u8, self.bytes) }
    }

    /// A handle that copies pages in and out of this pool from another thread (the cache
    /// I/O thread of the hierarchical cache).
    pub fn page_io(&self) -> PageIo {
        PageIo {
            geom: Geometry::of(self),
            buf: self.buf.clone(),
        }
    }

    /// Shape of a page.
    pub fn layout(&self) -> KvLayout {
        self.layout
    }

    /// Pages in the pool.
    pub fn num_pages(&self) -> usize {
        self.num_pages
    }

    /// Stores one token's K and V (`num_kv_heads * head_dim` each) at `slot` of `page`.
    pub fn write_token(&mut self, layer: usize, page: usize, slot: usize, k: &[f32], v: &[f32]) {
        // SAFETY: `&mut self` excludes every other access to the pool.
        unsafe { self.writer().write_token(layer, page, slot, k, v) }
    }

    /// A handle that writes tokens from several threads at once (see [`KvWriter`]).
    pub fn writer(&mut self) -> KvWriter<'_> {
        KvWriter {
            geom: Geometry::of(self),
            ptr: self.buf.ptr as *mut u8,
            _pool: std::marker::PhantomData,
        }
    }

    /// Layer `layer`'s K and V of `kv_head` for the sequence with page table `pages`, read in
    /// place by the attention kernels.
    pub fn head<'a>(&'a self, layer: usize, pages: &'a [u32], kv_head: usize) -> PagedKv<'a> {
        let l = &self.layout;
        let g = Geometry::of(self);
        PagedKv {
            raw: self.raw(),
            dtype: l.dtype,
            pages,
            page_size: l.page_size,
            // Within a region, page ids are `chunk_bytes` apart.
            page_bytes: g.chunk_bytes(),
            k_off: g.chunk_offset(layer, false, kv_head, 0),
            v_off: g.chunk_offset(layer, true, kv_head, 0),
            v_stride: l.head_dim * l.dtype.size(),
            head_dim: l.head_dim,
        }
    }

    /// Copies pages out, `page_bytes` each, in order.
    pub fn read_pages(&self, pages: &[u32], out: &mut [u8]) -> Result<(), ExecError> {
        // SAFETY: `&self`: the executor is not running a forward pass, so nothing writes.
        unsafe { self.page_io().read_pages(pages, out) }
    }

    /// Copies pages in, `page_bytes` each, in order.
    pub fn write_pages(&mut self, pages: &[u32], data: &[u8]) -> Result<(), ExecError> {
        // SAFETY: `&mut self`: nothing else reads or writes the pool's pages meanwhile
        // (a `PageIo` only touches pages its caller owns, which are in no batch).
        unsafe { self.page_io().write_pages(pages, data) }
    }
}

/// What a page copy needs to know about the pool.
#[derive(Clone, Copy, Debug)]
struct Geometry {
    layout: KvLayout,
    num_pages: usize,
    bytes: usize,
}

impl Geometry {
    /// Bytes of one (layer, K or V, KV head) share of a page: `page_size * head_dim`
    /// elements.
    fn chunk_bytes(&self) -> usize {
        self.layout.page_size * self.layout.head_dim * self.layout.dtype.size()
    }

    /// Byte offset in the pool of page `page`'s share of (`layer`, K or V, `head`): the pool
    /// is one region per (layer, K or V, KV head), pages in id order inside it.
    fn chunk_offset(&self, layer: usize, v: bool, head: usize, page: usize) -> usize {
        let l = &self.layout;
        (((layer * 2 + v as usize) * l.num_kv_heads + head) * self.num_pages + page)
            * self.chunk_bytes()
    }

    /// Page `page`'s shares in the raw order (per layer, K of each KV head, then V of each):
    /// (offset in the raw page, offset in the pool, bytes).
    fn shares(&self, page: usize) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
        let (nkv, cb) = (self.layout.num_kv_heads, self.chunk_bytes());
        (0..self.layout.num_layers * 2 * nkv).map(move |i| {
            let (part, head) = (i / nkv, i % nkv);
            let off = self.chunk_offset(part / 2, part % 2 == 1, head, page);
            (i * cb, off, cb)
        })
    }

    fn of(pool: &KvPool) -> Geometry {
        Geometry {
            layout: pool.layout,
            num_pages: pool.num_pages,
            bytes: pool.bytes,
        }
    }

    fn row_elems(&self) -> usize {
        self.layout.num_kv_heads * self.layout.head_dim
    }

    /// Bytes of one layer's K (or V) within a page.
    fn part_bytes(&self) -> usize {
        self.layout.page_size * self.row_elems() * self.layout.dtype.size()
    }

    /// Byte offset, within a page, of layer `layer`'s K (`v = false`) or V part.
    fn part_offset(&self, layer: usize, v: bool) -> usize {
        (layer * 2 + v as usize) * self.part_bytes()
    }

    /// Converts one page between the wire order (K and V `[slot][head][d]`) and the pool's
    /// raw order ([`POOL_PAGE_FORMAT`]: K `[head][d][slot]`, V `[head][slot][d]`).
    fn convert_page(&self, src: &[u8], dst: &mut [u8], to_wire: bool) {
        let l = &self.layout;
        let (es, ps, re) = (l.dtype.size(), l.page_size, self.row_elems());
        let part = self.part_bytes();
        for layer in 0..l.num_layers {
            let k = self.part_offset(layer, false);
            let (ks, kd) = (&src[k..k + part], &mut dst[k..k + part]);
            // Element sizes are 2 (f16, bf16) or 4 (f32).
            match es {
                2 => transpose_u16(ks, kd, ps, re, to_wire),
                _ => transpose::<4>(ks, kd, ps, re, to_wire),
            }
            let v = self.part_offset(layer, true);
            let hb = l.head_dim * es;
            for h in 0..l.num_kv_heads {
                for slot in 0..ps {
                    let wire = v + (slot * l.num_kv_heads + h) * hb;
                    let pool = v + (h * ps + slot) * hb;
                    let (from, to) = if to_wire { (pool, wire) } else { (wire, pool) };
                    dst[to..to + hb].copy_from_slice(&src[from..from + hb]);
                }
            }
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
        debug_assert!(self.num_pages * pb <= self.bytes);
        Ok(pb)
    }
}

/// Transposes one layer's K part of a page: wire `[slot][e]` ↔ pool `[e][slot]`, elements of
/// `ES` bytes, `ps` slots, `re` elements per slot. Works in tiles of [`TILE`]×[`TILE`]
/// elements (read a tile's rows, write its columns), so both sides move whole cache lines.
#[inline]
fn transpose<const ES: usize>(src: &[u8], dst: &mut [u8], ps: usize, re: usize, to_wire: bool) {
    // `src` is `rows × cols` elements; `dst[c][r] = src[r][c]`.
    let (rows, cols) = if to_wire { (re, ps) } else { (ps, re) };
    let mut tile = [[[0u8; ES]; TILE]; TILE];
    for r0 in (0..rows).step_by(TILE) {
        let rn = TILE.min(rows - r0);
        for c0 in (0..cols).step_by(TILE) {
            let cn = TILE.min(cols - c0);
            for (r, row) in src[(r0 * cols + c0) * ES..]
                .chunks(cols * ES)
                .take(rn)
                .enumerate()
            {
                for (c, e) in row[..cn * ES].chunks_exact(ES).enumerate() {
                    tile[c][r].copy_from_slice(e);
                }
            }
            for (c, col) in dst[(c0 * rows + r0) * ES..]
                .chunks_mut(rows * ES)
                .take(cn)
                .enumerate()
            {
                for (r, e) in col[..rn * ES].chunks_exact_mut(ES).enumerate() {
                    e.copy_from_slice(&tile[c][r]);
                }
            }
        }
    }
}

/// [`transpose`] for 2-byte elements, as `u16` loads and stores over [`TILE`]-square tiles.
#[inline]
fn transpose_u16(src: &[u8], dst: &mut [u8], ps: usize, re: usize, to_wire: bool) {
    let (rows, cols) = if to_wire { (re, ps) } else { (ps, re) };
    assert!(src.len() >= rows * cols * 2 && dst.len() >= rows * cols * 2);
    let (s, d) = (src.as_ptr() as *const u16, dst.as_mut_ptr() as *mut u16);
    let mut tile = [[0u16; TILE]; TILE];
    for r0 in (0..rows).step_by(TILE) {
        let rn = TILE.min(rows - r0);
        for c0 in (0..cols).step_by(TILE) {
            let cn = TILE.min(cols - c0);
            // SAFETY: every index is below `rows * cols`, which both buffers hold (asserted
            // above); unaligned reads and writes, as the buffers are byte slices.
            unsafe {
                for r in 0..rn {
                    let row = s.add((r0 + r) * cols + c0);
                    for (c, t) in tile.iter_mut().enumerate().take(cn) {
                        t[r] = row.add(c).read_unaligned();
                    }
                }
                for (c, t) in tile.iter().enumerate().take(cn) {
                    let col = d.add((c0 + c) * rows + r0);
                    for (r, v) in t.iter().enumerate().take(rn) {
                        col.add(r).write_unaligned(*v);
                    }
                }
            }
        }
    }
}

/// Edge of a transpose tile, in elements.
const TILE: usize = 16;

/// Version of the raw page arrangement [`PageIo::read_pages_raw`] and
/// [`PageIo::write_pages_raw`] move: per layer, K of each KV head transposed (`[kv_head][dim]
/// [slot]`), then V of each KV head (`[kv_head][slot][dim]`) — the pool's per-head shares of
/// the page, gathered. Two hosts exchange raw pages only when theirs agree. (1: V
/// `[slot][kv_head][dim]`, pages stored whole.)
pub const POOL_PAGE_FORMAT: u32 = 2;

/// Copies whole pages in and out of a [`KvPool`] from any thread, in the [`KvLayout`] byte
/// order (the layout of the wire and of the cache tiers), while the executor runs forward
/// passes over other pages.
///
/// The page-ownership rule makes this sound: a page is written only by its owner (a running
/// sequence, through the forward pass, or a sequence loading it from a lower tier, through
/// this handle while it is in no batch), and a page in the radix tree is full and never
/// written again. Callers of the unsafe methods uphold that rule.
#[derive(Clone, Debug)]
pub struct PageIo {
    geom: Geometry,
    buf: Arc<PoolBuf>,
}

impl PageIo {
    /// Shape of a page.
    pub fn layout(&self) -> KvLayout {
        self.geom.layout
    }

    /// Copies page `p`'s shares out of the pool into `raw` (`page_bytes`, the raw order).
    ///
    /// # Safety
    /// `p < num_pages`; nothing writes the page meanwhile.
    unsafe fn gather(&self, p: u32, raw: &mut [u8]) {
        let base = self.buf.ptr as *const u8;
        for (at, off, n) in self.geom.shares(p as usize) {
            std::ptr::copy_nonoverlapping(base.add(off), raw[at..at + n].as_mut_ptr(), n);
        }
    }

    /// Copies `raw` (the raw order) into page `p`'s shares.
    ///
    /// # Safety
    /// `p < num_pages`; nothing else reads or writes the page meanwhile.
    unsafe fn scatter(&self, p: u32, raw: &[u8]) {
        let base = self.buf.ptr as *mut u8;
        for (at, off, n) in self.geom.shares(p as usize) {
            std::ptr::copy_nonoverlapping(raw[at..at + n].as_ptr(), base.add(off), n);
        }
    }

    /// Copies pages out, `page_bytes` each, in order.
    ///
    /// # Safety
    /// Nothing writes `pages` during the call (e.g. they are locked in the radix tree).
    pub unsafe fn read_pages(&self, pages: &[u32], out: &mut [u8]) -> Result<(), ExecError> {
        let pb = self.geom.check_pages(pages, out.len())?;
        let mut raw = vec![0u8; pb];
        for (i, &p) in pages.iter().enumerate() {
            self.gather(p, &mut raw);
            self.geom
                .convert_page(&raw, &mut out[i * pb..(i + 1) * pb], true);
        }
        Ok(())
    }

    /// Copies pages out in the raw order ([`POOL_PAGE_FORMAT`], no transpose), for a peer
    /// with the same arrangement (prefill to decode).
    ///
    /// # Safety
    /// Nothing writes `pages` during the call.
    pub unsafe fn read_pages_raw(&self, pages: &[u32], out: &mut [u8]) -> Result<(), ExecError> {
        let pb = self.geom.check_pages(pages, out.len())?;
        for (i, &p) in pages.iter().enumerate() {
            self.gather(p, &mut out[i * pb..(i + 1) * pb]);
        }
        Ok(())
    }

    /// Copies pages in from the raw order ([`POOL_PAGE_FORMAT`]: what
    /// [`PageIo::read_pages_raw`] of a peer wrote), `page_bytes` each, in order.
    ///
    /// # Safety
    /// As [`PageIo::write_pages`].
    pub unsafe fn write_pages_raw(&self, pages: &[u32], data: &[u8]) -> Result<(), ExecError> {
        let pb = self.geom.check_pages(pages, data.len())?;
        for (i, &p) in pages.iter().enumerate() {
            self.scatter(p, &data[i * pb..(i + 1) * pb]);
        }
        Ok(())
    }

    /// Copies pages in, `page_bytes` each, in order. A page listed twice ends with the last
    /// copy.
    ///
    /// # Safety
    /// Nothing else reads or writes `pages` during the call: the caller owns them (allocated
    /// for this copy and in no forward pass).
    pub unsafe fn write_pages(&self, pages: &[u32], data: &[u8]) -> Result<(), ExecError> {
        let pb = self.geom.check_pages(pages, data.len())?;
        let mut raw = vec![0u8; pb];
        for (i, &p) in pages.iter().enumerate() {
            self.geom
                .convert_page(&data[i * pb..(i + 1) * pb], &mut raw, false);
            self.scatter(p, &raw);
        }
        Ok(())
    }
}

/// Writes tokens into a uniquely borrowed pool from several threads (the executor writes
/// each token's K/V on the thread that computed it).
pub struct KvWriter<'a> {
    geom: Geometry,
    ptr: *mut u8,
    _pool: std::marker::PhantomData<&'a mut KvPool>,
}

// SAFETY: writes go through `write_token`, whose contract keeps concurrent calls disjoint.
unsafe impl Sync for KvWriter<'_> {}

impl KvWriter<'_> {
    /// Stores one token's K and V (`num_kv_heads * head_dim` each) at `slot` of `page`.
    ///
    /// # Safety
    /// Concurrent calls must write different `(page, slot)` pairs. Out-of-range pages or
    /// slots panic.
    pub unsafe fn write_token(&self, layer: usize, page: usize, slot: usize, k: &[f32], v: &[f32]) {
        let g = &self.geom;
        let l = &g.layout;
        let es = l.dtype.size();
        let row = l.num_kv_heads * l.head_dim;
        assert!(slot < l.page_size && layer < l.num_layers && k.len() == row && v.len() == row);
        assert!(page < g.num_pages);
        let mut buf = vec![0u8; 2 * row * es];
        let (kb, vb) = buf.split_at_mut(row * es);
        store(l.dtype, k, kb);
        store(l.dtype, v, vb);
        let hb = l.head_dim * es;
        for h in 0..l.num_kv_heads {
            // V: the head's row at the slot.
            let vo = g.chunk_offset(layer, true, h, page) + slot * hb;
            std::ptr::copy_nonoverlapping(vb.as_ptr().add(h * hb), self.ptr.add(vo), hb);
            // K transposed: dimension d of this slot at `d * page_size + slot`.
            let ko = g.chunk_offset(layer, false, h, page);
            for d in 0..l.head_dim {
                let o = ko + (d * l.page_size + slot) * es;
                std::ptr::copy_nonoverlapping(
                    kb.as_ptr().add(h * hb + d * es),
                    self.ptr.add(o),
                    es,
                );
            }
        }
    }
}

fn store(dtype: KvDtype, src: &[f32], dst: &mut [u8]) {
    use half::slice::HalfFloatSliceExt;
    match dtype {
        KvDtype::F16 => {
            let mut h = vec![f16::ZERO; src.len()];
            h.convert_from_f32_slice(src);
            for (s, d) in h.iter().zip(dst.chunks_exact_mut(2)) {
                d.copy_from_slice(&s.to_le_bytes());
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_through_pages_in_place_and_on_the_wire() {
        for ps in [1usize, 3, 16] {
            let layout = KvLayout {
                num_layers: 2,
                num_kv_heads: 2,
                head_dim: 4,
                page_size: ps,
                dtype: KvDtype::F16,
            };
            let npages = 7usize.div_ceil(ps);
            let mut pool = KvPool::new(layout, npages + 2);
            let pages: Vec<u32> = (0..npages as u32).rev().map(|p| p + 2).collect();
            for pos in 0..7 {
                let k: Vec<f32> = (0..8).map(|i| (pos * 10 + i) as f32).collect();
                let v: Vec<f32> = k.iter().map(|x| -x).collect();
                pool.write_token(1, pages[pos / ps] as usize, pos % ps, &k, &v);
            }
            let h = pool.head(1, &pages, 1);
            for pos in 0..7 {
                for d in 0..4 {
                    assert_eq!(h.k(pos, d), (pos * 10 + 4 + d) as f32);
                    assert_eq!(h.v(pos, d), -((pos * 10 + 4 + d) as f32));
                }
            }
            // The wire order is [slot][head][d] for K as for V.
            let pb = layout.page_bytes();
            let mut buf = vec![0u8; npages * pb];
            pool.read_pages(&pages, &mut buf).unwrap();
            let part = ps * 8 * 2;
            for pos in 0..7 {
                let (page, slot) = (pos / ps, pos % ps);
                for e in 0..8 {
                    let at = |v: usize| {
                        let o = page * pb + (2 + v) * part + (slot * 8 + e) * 2;
                        f16::from_le_bytes([buf[o], buf[o + 1]]).to_f32()
                    };
                    assert_eq!(at(0), (pos * 10 + e) as f32);
                    assert_eq!(at(1), -((pos * 10 + e) as f32));
                }
            }
            let mut other = KvPool::new(layout, npages);
            let back: Vec<u32> = (0..npages as u32).collect();
            other.write_pages(&back, &buf).unwrap();
            let h2 = other.head(1, &back, 1);
            for pos in 0..7 {
                for d in 0..4 {
                    assert_eq!(h2.k(pos, d), h.k(pos, d));
                    assert_eq!(h2.v(pos, d), h.v(pos, d));
                }
            }
            let mut again = vec![0u8; npages * pb];
            other.read_pages(&back, &mut again).unwrap();
            assert_eq!(again, buf);
            assert!(matches!(
                pool.read_pages(&[99], &mut buf[..pb]),
                Err(ExecError::BadPage(99))
            ));
            assert!(matches!(
                pool.read_pages(&[2], &mut vec![0u8; pb + 1]),
                Err(ExecError::BadBuffer { .. })
            ));
        }
    }

    #[test]
    fn raw_pages_move_between_pools_unchanged() {
        let layout = KvLayout {
            num_layers: 2,
            num_kv_heads: 3,
            head_dim: 4,
            page_size: 16,
            dtype: KvDtype::F16,
        };
        let pb = layout.page_bytes();
        let wire: Vec<u8> = (0..2 * pb).map(|i| (i * 7 + 3) as u8).collect();
        let mut a = KvPool::new(layout, 4);
        a.write_pages(&[3, 1], &wire).unwrap();
        let (ai, b) = (a.page_io(), KvPool::new(layout, 4));
        let bi = b.page_io();
        let mut raw = vec![0u8; 2 * pb];
        // SAFETY: single-threaded test; nothing else touches the pools.
        unsafe {
            ai.read_pages_raw(&[3, 1], &mut raw).unwrap();
            // The raw arrangement differs from the wire's (K transposed, V by head).
            assert_ne!(raw, wire);
            bi.write_pages_raw(&[0, 2], &raw).unwrap();
            assert!(bi.write_pages_raw(&[4], &raw[..pb]).is_err());
        }
        let mut back = vec![0u8; 2 * pb];
        b.read_pages(&[0, 2], &mut back).unwrap();
        assert_eq!(back, wire);
    }

    #[test]
    fn the_tiled_transpose_matches_the_element_by_element_one() {
        for (ps, re) in [(16usize, 192usize), (1, 5), (3, 17), (16, 16), (64, 8)] {
            let src: Vec<u8> = (0..ps * re * 2).map(|i| (i * 13 + 1) as u8).collect();
            let mut pool = vec![0u8; src.len()];
            transpose_u16(&src, &mut pool, ps, re, false);
            let mut generic = vec![0u8; src.len()];
            transpose::<2>(&src, &mut generic, ps, re, false);
            assert_eq!(generic, pool);
            for slot in 0..ps {
                for e in 0..re {
                    let w = (slot * re + e) * 2;
                    let p = (e * ps + slot) * 2;
                    assert_eq!(pool[p..p + 2], src[w..w + 2], "ps {ps} re {re}");
                }
            }
            let mut back = vec![0u8; src.len()];
            transpose_u16(&pool, &mut back, ps, re, true);
            assert_eq!(back, src);
        }
    }

    /// `cargo test --release -p sglrs-executor --lib page_copy_rate -- --ignored --nocapture`
    #[test]
    #[ignore = "a measurement"]
    fn page_copy_rate() {
        let layout = KvLayout::smollm2_135m();
        let n = 256;
        let pool = KvPool::new(layout, n);
        let io = pool.page_io();
        let pb = layout.page_bytes();
        let data: Vec<u8> = (0..n * pb).map(|i| i as u8).collect();
        let pages: Vec<u32> = (0..n as u32).collect();
        let mut best = f64::MAX;
        for _ in 0..5 {
            let t = std::time::Instant::now();
            unsafe { io.write_pages(&pages, &data) }.unwrap();
            best = best.min(t.elapsed().as_secs_f64());
        }
        let mut dst = vec![1u8; data.len()];
        let mut mem = f64::MAX;
        for _ in 0..5 {
            let t = std::time::Instant::now();
            dst.copy_from_slice(&data);
            mem = mem.min(t.elapsed().as_secs_f64());
        }
        std::hint::black_box(&dst);
        let gb = data.len() as f64 / 1e9;
        println!(
            "write_pages {:.2} GB/s, memcpy {:.2} GB/s ({:.0}%)",
            gb / best,
            gb / mem,
            100.0 * mem / best
        );
    }

    #[test]
    fn page_io_copies_pages_from_another_thread_as_the_pool_does() {
        for dtype in [KvDtype::F16, KvDtype::F32] {
            let layout = KvLayout {
                num_layers: 2,
                num_kv_heads: 2,
                head_dim: 4,
                page_size: 16,
                dtype,
            };
            let mut pool = KvPool::new(layout, 6);
            let pb = layout.page_bytes();
            let wire: Vec<u8> = (0..2 * pb).map(|i| (i * 7 + 3) as u8).collect();
            pool.write_pages(&[1, 4], &wire).unwrap();
            let io = pool.page_io();
            let io2 = io.clone();
            let copy = wire.clone();
            // Another thread loads pages 2 and 3 (owned by it) while this one reads 1 and 4.
            let t = std::thread::spawn(move || unsafe { io2.write_pages(&[3, 2], &copy) });
            let mut out = vec![0u8; 2 * pb];
            pool.read_pages(&[1, 4], &mut out).unwrap();
            t.join().unwrap().unwrap();
            assert_eq!(out, wire);
            let mut back = vec![0u8; 2 * pb];
            unsafe { io.read_pages(&[3, 2], &mut back) }.unwrap();
            assert_eq!(back, wire);
            assert!(matches!(
                unsafe { io.read_pages(&[6], &mut vec![0u8; pb]) },
                Err(ExecError::BadPage(6))
            ));
        }
    }
}
