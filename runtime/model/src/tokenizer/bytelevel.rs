//! Token strings to bytes: GPT-2's byte-to-char table and SentencePiece's `▁` / `<0xAB>`.

use std::sync::OnceLock;

use super::TokenEncoding;

/// GPT-2's reversible byte-to-char table: printable Latin-1 bytes map to themselves, the rest
/// to U+0100 upwards, in byte order.
fn byte_to_char() -> &'static [char; 256] {
    static TABLE: OnceLock<[char; 256]> = OnceLock::new();
    TABLE.get_or_init(|| {
        let printable =
            |b: u32| (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || b >= 0xae;
        let mut table = ['\0'; 256];
        let mut next = 256u32;
        for b in 0..256u32 {
            let c = if printable(b) {
                b
            } else {
                let c = next;
                next += 1;
                c
            };
            table[b as usize] = char::from_u32(c).unwrap_or('\u{fffd}');
        }
        table
    })
}

fn char_to_byte(c: char) -> Option<u8> {
    static INV: OnceLock<std::collections::HashMap<char, u8>> = OnceLock::new();
    INV.get_or_init(|| {
        byte_to_char()
            .iter()
            .enumerate()
            .map(|(b, &c)| (c, b as u8))
            .collect()
    })
    .get(&c)
    .copied()
}

/// The GPT-2 byte-level string of `bytes` (what a byte-level vocabulary stores).
#[cfg(test)]
pub(crate) fn bytes_to_bytelevel(bytes: &[u8]) -> String {
    let t = byte_to_char();
    bytes.iter().map(|&b| t[b as usize]).collect()
}

/// The bytes a vocabulary string stands for.
pub(crate) fn token_to_bytes(token: &str, encoding: TokenEncoding) -> Vec<u8> {
    match encoding {
        TokenEncoding::ByteLevel => {
            let mut out = Vec::with_capacity(token.len());
            for c in token.chars() {
                match char_to_byte(c) {
                    Some(b) => out.push(b),
                    None => {
                        let mut buf = [0u8; 4];
                        out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                    }
                }
            }
            out
        }
        TokenEncoding::SentencePiece => {
            if let Some(b) = parse_byte_token(token) {
                return vec![b];
            }
            token.replace('\u{2581}', " ").into_bytes()
        }
        TokenEncoding::Raw => token.as_bytes().to_vec(),
    }
}

/// `<0xAB>` → `0xAB`.
pub(crate) fn parse_byte_token(token: &str) -> Option<u8> {
    let hex = token.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytelevel_round_trip() {
        let all: Vec<u8> = (0..=255).collect();
        let s = bytes_to_bytelevel(&all);
        assert_eq!(token_to_bytes(&s, TokenEncoding::ByteLevel), all);
        assert_eq!(bytes_to_bytelevel(b" the\n"), "\u{120}the\u{10a}");
    }

    #[test]
    fn sentencepiece_bytes() {
        assert_eq!(
            token_to_bytes("<0x0A>", TokenEncoding::SentencePiece),
            b"\n"
        );
        assert_eq!(
            token_to_bytes("\u{2581}hello", TokenEncoding::SentencePiece),
            b" hello"
        );
        assert_eq!(parse_byte_token("<0xZZ>"), None);
    }
}
