//! A bounds-checked walk over a GGUF header's metadata, run before candle's parser to refuse
//! what that parser cannot take: an alignment of 0 (`general.alignment`), which it divides
//! by when it places the tensor data.

/// Why the header is refused.
pub(crate) const ZERO_ALIGNMENT: &str = "general.alignment is 0";

struct Walk<'a> {
    b: &'a [u8],
    pos: usize,
    wide: bool,
}

impl Walk<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.b.len())?;
        let s = &self.b[self.pos..end];
        self.pos = end;
        Some(s)
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn len(&mut self) -> Option<usize> {
        if self.wide {
            usize::try_from(u64::from_le_bytes(self.take(8)?.try_into().ok()?)).ok()
        } else {
            self.u32().map(|n| n as usize)
        }
    }
    fn str(&mut self) -> Option<&[u8]> {
        let n = self.len()?;
        self.take(n)
    }
    /// Skips one value of type `ty`; returns it when it is an integer candle reads as an
    /// alignment (8-, 16- or 32-bit).
    fn value(&mut self, ty: u32, depth: u32) -> Option<Option<i64>> {
        let int = |s: &[u8]| -> i64 {
            match s.len() {
                1 => i64::from(s[0]),
                2 => i64::from(u16::from_le_bytes([s[0], s[1]])),
                _ => i64::from(u32::from_le_bytes([s[0], s[1], s[2], s[3]])),
            }
        };
        Some(match ty {
            0 | 1 => Some(int(self.take(1)?)),
            2 | 3 => Some(int(self.take(2)?)),
            4 | 5 => Some(int(self.take(4)?)),
            7 => self.take(1).map(|_| None)?,
            6 => self.take(4).map(|_| None)?,
            10..=12 => self.take(8).map(|_| None)?,
            8 => self.str().map(|_| None)?,
            9 if depth < 4 => {
                let elem = self.u32()?;
                let n = self.len()?;
                for _ in 0..n {
                    self.value(elem, depth + 1)?;
                }
                None
            }
            _ => return None,
        })
    }
}

/// `Err` when the header's metadata sets `general.alignment` to 0. Anything the walk cannot
/// read (a truncated or malformed header) is left for the parser to report.
pub(crate) fn check(bytes: &[u8]) -> Result<(), &'static str> {
    let mut w = Walk {
        b: bytes,
        pos: 0,
        wide: true,
    };
    if w.take(4) != Some(&b"GGUF"[..]) {
        return Ok(());
    }
    let Some(version) = w.u32() else {
        return Ok(());
    };
    w.wide = version >= 2;
    let (Some(_tensors), Some(kvs)) = (w.len(), w.len()) else {
        return Ok(());
    };
    for _ in 0..kvs {
        let Some(key) = w.str().map(<[u8]>::to_vec) else {
            return Ok(());
        };
        let Some(ty) = w.u32() else { return Ok(()) };
        match w.value(ty, 0) {
            None => return Ok(()),
            Some(Some(0)) if key == b"general.alignment" => return Err(ZERO_ALIGNMENT),
            Some(_) => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::GgufFile;
    use crate::LoadError;

    /// A GGUF v3 header with no tensors and one metadata entry of type `ty`.
    fn header(key: &str, ty: u32, value: &[u8]) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend(0u64.to_le_bytes());
        b.extend(1u64.to_le_bytes());
        b.extend((key.len() as u64).to_le_bytes());
        b.extend(key.as_bytes());
        b.extend(ty.to_le_bytes());
        b.extend(value);
        b
    }

    #[test]
    fn a_zero_alignment_is_a_load_error_not_a_division_by_zero() {
        for (ty, v) in [
            (4u32, &0u32.to_le_bytes()[..]),
            (0, &[0u8][..]),
            (5, &[0u8; 4][..]),
        ] {
            let h = header("general.alignment", ty, v);
            assert_eq!(check(&h), Err(ZERO_ALIGNMENT));
            let f = tempfile::NamedTempFile::new().unwrap();
            std::fs::write(f.path(), &h).unwrap();
            match GgufFile::open(f.path()) {
                Err(LoadError::Gguf { message, .. }) => assert_eq!(message, ZERO_ALIGNMENT),
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn other_headers_pass_the_walk() {
        assert_eq!(
            check(&header("general.alignment", 4, &64u32.to_le_bytes())),
            Ok(())
        );
        assert_eq!(
            check(&header("general.name", 8, b"\x01\0\0\0\0\0\0\0x")),
            Ok(())
        );
        // a zero elsewhere, a truncated header, and not a GGUF at all
        assert_eq!(
            check(&header("x.alignment", 4, &0u32.to_le_bytes())),
            Ok(())
        );
        assert_eq!(check(&header("general.alignment", 4, &[0, 0])), Ok(()));
        assert_eq!(check(b"GGML"), Ok(()));
        // an array of strings before the alignment is skipped
        let mut arr = 8u32.to_le_bytes().to_vec();
        arr.extend(2u64.to_le_bytes());
        for s in ["a", "bc"] {
            arr.extend((s.len() as u64).to_le_bytes());
            arr.extend(s.as_bytes());
        }
        let mut h = header("tokens", 9, &arr);
        h[16..24].copy_from_slice(&2u64.to_le_bytes());
        h.extend(17u64.to_le_bytes());
        h.extend(b"general.alignment");
        h.extend(4u32.to_le_bytes());
        h.extend(0u32.to_le_bytes());
        assert_eq!(check(&h), Err(ZERO_ALIGNMENT));
    }
}
