//! Bytes from one trainer replica to every other, through the collective's all-reduce.
//!
//! A multi-node run ([`super::nodes`]) has one transport between its nodes: burn's
//! collective, whose only global operation in burn 0.21 is the all-reduce (its global
//! broadcast is not implemented). A broadcast is an all-reduce where one replica brings the
//! message and every other brings zeros: the message's bytes ride as floats, three bytes to a
//! float (an integer below 2^24, which a float holds exactly and to which adding zeros changes
//! nothing), so every replica gets the sender's bytes exactly. Two sums per message: its
//! length, then its bytes.

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData, TensorPrimitive};
use burn_collective::{PeerId, ReduceOperation};

/// Bytes per float: the largest run of bytes whose value (below 2^24) a float holds exactly.
const BYTES_PER_FLOAT: usize = 3;

/// Sends `message` (the sender, exactly one replica) or receives it (`None`, every other):
/// every replica of the collective must call this at the same point. `width` is the
/// collective's node count: its ring all-reduce cuts a tensor into one slice per node, so no
/// tensor may be shorter.
pub(super) fn exchange<B: Backend>(
    peer: PeerId,
    device: &B::Device,
    width: usize,
    message: Option<&[u8]>,
) -> Result<Vec<u8>, String> {
    let len = message.map_or(0, <[u8]>::len);
    // The length as two 24-bit halves.
    let head = [(len & 0xff_ffff) as f32, (len >> 24) as f32];
    let head = sum::<B>(peer, device, &head, width)?;
    let len = head[0] as usize | (head[1] as usize) << 24;
    let floats = len.div_ceil(BYTES_PER_FLOAT);
    let body = match message {
        Some(bytes) => encode(bytes),
        None => vec![0.0; floats],
    };
    let body = sum::<B>(peer, device, &body, width)?;
    let mut bytes = decode(&body[..floats]);
    bytes.truncate(len);
    Ok(bytes)
}

/// The sum over every replica of `values`, padded with zeros to `width`.
fn sum<B: Backend>(
    peer: PeerId,
    device: &B::Device,
    values: &[f32],
    width: usize,
) -> Result<Vec<f32>, String> {
    let mut padded = values.to_vec();
    padded.resize(values.len().max(width), 0.0);
    let len = padded.len();
    let tensor = Tensor::<B, 1>::from_data(TensorData::new(padded, [len]), device);
    let summed = burn_collective::all_reduce::<B>(
        peer,
        tensor.into_primitive().tensor(),
        ReduceOperation::Sum,
    )
    .map_err(|e| format!("{e:?}"))?;
    Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(summed))
        .into_data()
        .into_vec()
        .map_err(|e| format!("{e:?}"))
}

fn encode(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks(BYTES_PER_FLOAT)
        .map(|chunk| {
            let word = chunk
                .iter()
                .enumerate()
                .fold(0u32, |word, (i, &b)| word | u32::from(b) << (8 * i));
            word as f32
        })
        .collect()
}

fn decode(floats: &[f32]) -> Vec<u8> {
    floats
        .iter()
        .flat_map(|&f| {
            let word = f as u32;
            [word as u8, (word >> 8) as u8, (word >> 16) as u8]
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_survive_the_trip_through_floats() {
        let bytes: Vec<u8> = (0..=255u8).chain([255, 255, 255, 0, 7]).collect();
        for len in [0, 1, 2, 3, 4, bytes.len()] {
            let mut back = decode(&encode(&bytes[..len]));
            back.truncate(len);
            assert_eq!(back, &bytes[..len]);
        }
        assert_eq!(encode(&[255, 255, 255]), [16_777_215.0], "2^24 - 1, exact");
    }
}
