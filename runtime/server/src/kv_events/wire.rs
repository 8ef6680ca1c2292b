//! The wire shape of a batch: vLLM's and SGLang's array-shaped msgpack `EventBatch`.

/// Encodes one batch's payload.
pub fn encode_batch(ts: f64, events: &[WireEvent]) -> Vec<u8> {
    use rmp::encode::*;
    let mut out = Vec::with_capacity(64 + events.len() * 96);
    // Writes into a Vec cannot fail.
    let _ = write_array_len(&mut out, 3);
    let _ = write_f64(&mut out, ts);
    let _ = write_array_len(&mut out, events.len() as u32);
    for e in events {
        match e {
            WireEvent::Stored {
                hashes,
                parent,
                tokens,
                block_size,
                medium,
            } => {
                let _ = write_array_len(&mut out, 7);
                let _ = write_str(&mut out, "BlockStored");
                let _ = write_array_len(&mut out, hashes.len() as u32);
                for h in hashes {
                    let _ = write_uint(&mut out, *h);
                }
                match parent {
                    Some(p) => {
                        let _ = write_uint(&mut out, *p);
                    }
                    None => {
                        let _ = write_nil(&mut out);
                    }
                }
                let _ = write_array_len(&mut out, tokens.len() as u32);
                for t in tokens {
                    let _ = write_uint(&mut out, u64::from(*t));
                }
                let _ = write_uint(&mut out, *block_size as u64);
                let _ = write_nil(&mut out); // lora_id
                let _ = write_str(&mut out, medium);
            }
            WireEvent::Removed { hashes, medium } => {
                let _ = write_array_len(&mut out, 3);
                let _ = write_str(&mut out, "BlockRemoved");
                let _ = write_array_len(&mut out, hashes.len() as u32);
                for h in hashes {
                    let _ = write_uint(&mut out, *h);
                }
                let _ = write_str(&mut out, medium);
            }
            WireEvent::AllCleared => {
                let _ = write_array_len(&mut out, 1);
                let _ = write_str(&mut out, "AllBlocksCleared");
            }
        }
    }
    let _ = write_uint(&mut out, 0); // data_parallel_rank
    out
}

/// One event as it goes on the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireEvent {
    /// `BlockStored`.
    Stored {
        /// Block hashes, in sequence order.
        hashes: Vec<u64>,
        /// The block before the first, `None` at a sequence's start.
        parent: Option<u64>,
        /// `block_size` tokens per hash.
        tokens: Vec<u32>,
        /// Tokens per block (the page size).
        block_size: usize,
        /// `GPU` (the executor's pool), `CPU` or `DISK`.
        medium: &'static str,
    },
    /// `BlockRemoved`.
    Removed {
        /// Block hashes.
        hashes: Vec<u64>,
        /// Where they were removed from.
        medium: &'static str,
    },
    /// `AllBlocksCleared`.
    AllCleared,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_is_the_array_shaped_event_batch() {
        let b = encode_batch(
            1.5,
            &[
                WireEvent::Stored {
                    hashes: vec![7, u64::MAX],
                    parent: None,
                    tokens: vec![1, 2, 3, 4],
                    block_size: 2,
                    medium: "GPU",
                },
                WireEvent::Removed {
                    hashes: vec![7],
                    medium: "GPU",
                },
                WireEvent::AllCleared,
            ],
        );
        // [1.5, [[BlockStored, [7, MAX], nil, [1,2,3,4], 2, nil, "GPU"], [...], [...]], 0]
        let mut r = &b[..];
        assert_eq!(rmp::decode::read_array_len(&mut r).unwrap(), 3);
        assert_eq!(rmp::decode::read_f64(&mut r).unwrap(), 1.5);
        assert_eq!(rmp::decode::read_array_len(&mut r).unwrap(), 3);
        assert_eq!(rmp::decode::read_array_len(&mut r).unwrap(), 7);
        let mut tag = [0u8; 32];
        assert_eq!(
            rmp::decode::read_str(&mut r, &mut tag).unwrap(),
            "BlockStored"
        );
        assert_eq!(rmp::decode::read_array_len(&mut r).unwrap(), 2);
        assert_eq!(rmp::decode::read_int::<u64, _>(&mut r).unwrap(), 7);
        assert_eq!(rmp::decode::read_int::<u64, _>(&mut r).unwrap(), u64::MAX);
        rmp::decode::read_nil(&mut r).unwrap();
        assert_eq!(rmp::decode::read_array_len(&mut r).unwrap(), 4);
    }
}
