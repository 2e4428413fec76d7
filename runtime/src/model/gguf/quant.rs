//! Dequantization of ggml tensor data to f32, exactly as ggml's `dequantize_row_*`
//! (`ggml-quants.c`) computes it, operation for operation in f32, so a quantized model loads
//! to the very floats llama.cpp and transformers compute with.
//!
//! Block layouts (little-endian; `d`, `m`, `dmin` are f16):
//! - Q4_0, 18 bytes per 32 values: `d`, 16 bytes of nibbles; value `j < 16` is
//!   `(lo(qs[j]) - 8) * d`, value `j + 16` is `(hi(qs[j]) - 8) * d`.
//! - Q4_1, 20 bytes per 32: `d`, `m`, 16 bytes; `lo(qs[j]) * d + m`, `hi(qs[j]) * d + m`.
//! - Q8_0, 34 bytes per 32: `d`, 32 signed bytes; `q * d`.
//! - Q4_K, 144 bytes per 256: `d`, `dmin`, 12 bytes of packed 6-bit scales and minimums for
//!   8 sub-blocks of 32, 128 bytes of nibbles; each 64 values use 32 bytes, low nibbles for
//!   the first sub-block, high for the second: `d * sc * q - dmin * m`.
//! - Q5_K, 176 bytes per 256: as Q4_K, with 32 bytes of fifth bits (`qh`) before the
//!   nibbles; each pair of sub-blocks takes the next two bit planes of `qh`.
//! - Q6_K, 210 bytes per 256: 128 bytes of low nibbles, 64 of high 2-bit pairs, 16 signed
//!   8-bit scales (one per 16 values), `d` last; `d * scale * (q - 32)`.

use agentry_kernels::blocks::{BLOCK, BlockFormat, BlockMatrix};
use burn::tensor::{bf16, f16};

use super::file::GgmlType;

/// Values per K-quant super-block.
const QK_K: usize = 256;

/// Dequantizes `data`, which holds `n` values of type `ty` (its length already checked
/// against `n` by the file parser; checked again here so this is safe to call on any input).
pub fn dequantize(ty: GgmlType, data: &[u8], n: usize) -> Result<Vec<f32>, String> {
    let Some((name, block, block_bytes)) = ty.layout() else {
        return Err(format!("has unknown ggml type id {}", ty.0));
    };
    let (block, block_bytes) = (block as usize, block_bytes as usize);
    if !n.is_multiple_of(block) || data.len() != n / block * block_bytes {
        return Err(format!(
            "has {} bytes of {name} data, which is not {n} values",
            data.len()
        ));
    }
    let mut out = vec![0.0f32; n];
    let blocks = data
        .chunks_exact(block_bytes)
        .zip(out.chunks_exact_mut(block));
    match ty {
        GgmlType::F32 => blocks.for_each(|(b, y)| y[0] = f32::from_le_bytes(le4(b))),
        GgmlType::F16 => blocks.for_each(|(b, y)| y[0] = half(b)),
        GgmlType::BF16 => blocks
            .for_each(|(b, y)| y[0] = bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).into()),
        GgmlType::Q4_0 => blocks.for_each(|(b, y)| q4_0(b, y)),
        GgmlType::Q4_1 => return in_blocks(BlockFormat::Q4_1, data, n),
        GgmlType::Q8_0 => return in_blocks(BlockFormat::Q8_0, data, n),
        GgmlType::Q4_K => blocks.for_each(|(b, y)| q4_k(b, y)),
        GgmlType::Q5_K => blocks.for_each(|(b, y)| q5_k(b, y)),
        GgmlType::Q6_K => blocks.for_each(|(b, y)| q6_k(b, y)),
        _ => {
            return Err(format!(
                "is stored as {name}, which cannot be dequantized yet (F32, F16, BF16, Q8_0, \
                 Q4_0, Q4_1, Q4_K, Q5_K and Q6_K can)"
            ));
        }
    }
    Ok(out)
}

fn le4(b: &[u8]) -> [u8; 4] {
    [b[0], b[1], b[2], b[3]]
}

/// The f16 at the start of `b`, as f32 (exact).
fn half(b: &[u8]) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()
}

fn q4_0(b: &[u8], y: &mut [f32]) {
    let d = half(b);
    let qs = &b[2..18];
    for (j, &q) in qs.iter().enumerate() {
        y[j] = ((q & 0x0F) as i32 - 8) as f32 * d;
        y[j + 16] = ((q >> 4) as i32 - 8) as f32 * d;
    }
}

/// Q4_1 and Q8_0 through the kernels' [`BlockMatrix`], the one definition of their values
/// (the same floats a product by the blocks multiplies by).
fn in_blocks(format: BlockFormat, data: &[u8], n: usize) -> Result<Vec<f32>, String> {
    if n == 0 {
        return Ok(Vec::new());
    }
    BlockMatrix::from_ggml(format, n / BLOCK, BLOCK, data).map(|blocks| blocks.dequantize())
}

/// ggml's `get_scale_min_k4`: the 6-bit scale and minimum of sub-block `j` (0..8) from the
/// 12 packed bytes: sub-blocks 0..4 in the low 6 bits of bytes `j` and `j + 4`; sub-blocks
/// 4..8 in the nibbles of byte `j + 4` with their top two bits in bytes `j - 4` and `j`.
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

fn q4_k(b: &[u8], y: &mut [f32]) {
    let (d, min) = (half(b), half(&b[2..]));
    let scales = &b[4..16];
    let qs = &b[16..144];
    for (chunk, (q, y)) in qs.chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
        let (sc, m) = scale_min_k4(2 * chunk, scales);
        let (d1, m1) = (d * sc as f32, min * m as f32);
        let (sc, m) = scale_min_k4(2 * chunk + 1, scales);
        let (d2, m2) = (d * sc as f32, min * m as f32);
        for l in 0..32 {
            y[l] = d1 * (q[l] & 0x0F) as f32 - m1;
            y[l + 32] = d2 * (q[l] >> 4) as f32 - m2;
        }
    }
}

fn q5_k(b: &[u8], y: &mut [f32]) {
    let (d, min) = (half(b), half(&b[2..]));
    let scales = &b[4..16];
    let qh = &b[16..48];
    let ql = &b[48..176];
    for (chunk, (q, y)) in ql.chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
        let (u1, u2) = (1u8 << (2 * chunk), 2u8 << (2 * chunk));
        let (sc, m) = scale_min_k4(2 * chunk, scales);
        let (d1, m1) = (d * sc as f32, min * m as f32);
        let (sc, m) = scale_min_k4(2 * chunk + 1, scales);
        let (d2, m2) = (d * sc as f32, min * m as f32);
        for l in 0..32 {
            let high1 = if qh[l] & u1 != 0 { 16 } else { 0 };
            let high2 = if qh[l] & u2 != 0 { 16 } else { 0 };
            y[l] = d1 * ((q[l] & 0x0F) + high1) as f32 - m1;
            y[l + 32] = d2 * ((q[l] >> 4) + high2) as f32 - m2;
        }
    }
}

fn q6_k(b: &[u8], y: &mut [f32]) {
    let ql = &b[0..128];
    let qh = &b[128..192];
    let sc = &b[192..208];
    let d = half(&b[208..]);
    debug_assert_eq!(y.len(), QK_K);
    for half_block in 0..2 {
        let ql = &ql[64 * half_block..];
        let qh = &qh[32 * half_block..];
        let sc = &sc[8 * half_block..];
        let y = &mut y[128 * half_block..];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            let scale = |k: usize| d * sc[is + k] as i8 as f32;
            y[l] = scale(0) * q1 as f32;
            y[l + 32] = scale(2) * q2 as f32;
            y[l + 64] = scale(4) * q3 as f32;
            y[l + 96] = scale(6) * q4 as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f16_bytes(x: f32) -> [u8; 2] {
        f16::from_f32(x).to_bits().to_le_bytes()
    }

    #[test]
    fn float_types_are_exact() {
        let bytes: Vec<u8> = [1.5f32, -0.25]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        assert_eq!(
            dequantize(GgmlType::F32, &bytes, 2).unwrap(),
            vec![1.5, -0.25]
        );
        let bytes = [f16_bytes(2.0), f16_bytes(-0.5)].concat();
        assert_eq!(
            dequantize(GgmlType::F16, &bytes, 2).unwrap(),
            vec![2.0, -0.5]
        );
        // bf16 is the top half of an f32.
        let bytes = [0x80u8, 0x3F, 0x20, 0xC0];
        assert_eq!(
            dequantize(GgmlType::BF16, &bytes, 2).unwrap(),
            vec![1.0, -2.5]
        );
    }

    #[test]
    fn q8_0_scales_signed_bytes() {
        let mut block = f16_bytes(0.5).to_vec();
        block.extend((0..32).map(|i| (i as i8 - 16) as u8));
        let y = dequantize(GgmlType::Q8_0, &block, 32).unwrap();
        let want: Vec<f32> = (0..32).map(|i| (i - 16) as f32 * 0.5).collect();
        assert_eq!(y, want);
    }

    #[test]
    fn q4_0_and_q4_1_take_low_nibbles_first() {
        // Byte j holds value j in its low nibble and value j + 16 in its high one.
        let qs: Vec<u8> = (0..16u8).map(|j| j | ((15 - j) << 4)).collect();
        let block = [f16_bytes(2.0).as_slice(), &qs].concat();
        let y = dequantize(GgmlType::Q4_0, &block, 32).unwrap();
        for j in 0..16 {
            assert_eq!(y[j], (j as f32 - 8.0) * 2.0);
            assert_eq!(y[j + 16], ((15 - j) as f32 - 8.0) * 2.0);
        }
        let block = [f16_bytes(0.25).as_slice(), &f16_bytes(-1.0), &qs].concat();
        let y = dequantize(GgmlType::Q4_1, &block, 32).unwrap();
        for j in 0..16 {
            assert_eq!(y[j], j as f32 * 0.25 - 1.0);
            assert_eq!(y[j + 16], (15 - j) as f32 * 0.25 - 1.0);
        }
    }

    /// Packs 8 six-bit scales and minimums as ggml's `get_scale_min_k4` reads them.
    fn pack_scales(sc: [u8; 8], m: [u8; 8]) -> [u8; 12] {
        let mut q = [0u8; 12];
        for j in 0..4 {
            q[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
            q[j + 4] = m[j] | ((m[j + 4] >> 4) << 6);
            q[j + 8] = (sc[j + 4] & 0x0F) | ((m[j + 4] & 0x0F) << 4);
        }
        q
    }

    #[test]
    fn k_quant_scales_unpack() {
        let sc = [1, 2, 3, 63, 17, 40, 5, 62];
        let m = [0, 9, 33, 63, 48, 7, 21, 60];
        let q = pack_scales(sc, m);
        for j in 0..8 {
            assert_eq!(scale_min_k4(j, &q), (sc[j], m[j]), "sub-block {j}");
        }
    }

    #[test]
    fn q4_k_and_q5_k_follow_the_ggml_formula() {
        let sc = [1, 2, 3, 63, 17, 40, 5, 62];
        let m = [0, 9, 33, 63, 48, 7, 21, 60];
        let (d, dmin) = (0.125f32, 0.0625f32);
        let qs: Vec<u8> = (0..128).map(|i| (i * 37 % 256) as u8).collect();
        let qh: Vec<u8> = (0..32).map(|i| (i * 91 % 256) as u8).collect();
        // The reference, written from the layout: value v of sub-block s = 2c + h (c: the
        // 32-byte chunk, h: low or high nibble) is d * sc[s] * q - dmin * m[s], where the fifth
        // bit of Q5_K is bit s of qh[l].
        let reference = |five: bool| -> Vec<f32> {
            let mut out = Vec::new();
            for s in 0..8 {
                let (c, h) = (s / 2, s % 2);
                for l in 0..32 {
                    let byte = qs[32 * c + l];
                    let mut q = if h == 0 { byte & 0x0F } else { byte >> 4 } as u32;
                    if five && (qh[l] >> s) & 1 == 1 {
                        q += 16;
                    }
                    out.push(d * sc[s] as f32 * q as f32 - dmin * m[s] as f32);
                }
            }
            out
        };
        let head = [
            f16_bytes(d).as_slice(),
            &f16_bytes(dmin),
            &pack_scales(sc, m),
        ]
        .concat();
        let block = [head.as_slice(), &qs].concat();
        assert_eq!(
            dequantize(GgmlType::Q4_K, &block, 256).unwrap(),
            reference(false)
        );
        let block = [head.as_slice(), &qh, &qs].concat();
        assert_eq!(
            dequantize(GgmlType::Q5_K, &block, 256).unwrap(),
            reference(true)
        );
    }

    #[test]
    fn q6_k_follows_the_ggml_formula() {
        let ql: Vec<u8> = (0..128).map(|i| (i * 53 % 256) as u8).collect();
        let qh: Vec<u8> = (0..64).map(|i| (i * 29 % 256) as u8).collect();
        let sc: Vec<u8> = (0..16).map(|i| (i * 9 - 70) as i8 as u8).collect();
        let d = 0.03125f32;
        let block = [ql.as_slice(), &qh, &sc, &f16_bytes(d)].concat();
        // Value v (0..256) of half n = v / 128, r = v % 128, l = r % 32, k = r / 32 takes its
        // low four bits from ql[64n + l + 32 (k % 2)] (high nibble when k >= 2), its top two
        // from bits 2k of qh[32n + l], and scale sc[8n + l / 16 + 2k].
        let want: Vec<f32> = (0..256)
            .map(|v| {
                let (n, r) = (v / 128, v % 128);
                let (l, k) = (r % 32, r / 32);
                let low = ql[64 * n + l + 32 * (k % 2)];
                let low = if k >= 2 { low >> 4 } else { low & 0x0F };
                let high = (qh[32 * n + l] >> (2 * k)) & 3;
                let q = (low | (high << 4)) as i32 - 32;
                d * sc[8 * n + l / 16 + 2 * k] as i8 as f32 * q as f32
            })
            .collect();
        assert_eq!(dequantize(GgmlType::Q6_K, &block, 256).unwrap(), want);
    }

    /// Random blocks, dequantized by llama.cpp's Python package (`gguf.quants.dequantize`;
    /// `scripts/make_gguf_quant_fixture.py`).
    #[test]
    fn every_quant_type_matches_gguf_py() {
        let fixture: serde_json::Value =
            serde_json::from_str(include_str!("testdata/quants.json")).unwrap();
        let types = [
            ("Q4_0", GgmlType::Q4_0),
            ("Q4_1", GgmlType::Q4_1),
            ("Q8_0", GgmlType::Q8_0),
            ("Q4_K", GgmlType::Q4_K),
            ("Q5_K", GgmlType::Q5_K),
            ("Q6_K", GgmlType::Q6_K),
        ];
        for (name, ty) in types {
            let case = &fixture[name];
            let hex = case["hex"].as_str().unwrap();
            let bytes: Vec<u8> = (0..hex.len() / 2)
                .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
                .collect();
            let want: Vec<f32> = case["values"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap() as f32)
                .collect();
            let got = dequantize(ty, &bytes, want.len()).unwrap();
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-6 * b.abs().max(1e-3),
                    "{name}[{i}]: {a} vs gguf-py's {b}"
                );
            }
        }
    }

    #[test]
    fn wrong_lengths_and_types_are_errors() {
        assert!(dequantize(GgmlType::Q8_0, &[0; 33], 32).is_err());
        assert!(dequantize(GgmlType::Q8_0, &[0; 34], 31).is_err());
        assert!(
            dequantize(GgmlType(6), &[0; 22], 32)
                .unwrap_err()
                .contains("Q5_0")
        );
        assert!(dequantize(GgmlType(77), &[], 0).unwrap_err().contains("77"));
    }
}
