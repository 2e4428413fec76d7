//! A frozen base's weights kept in ggml blocks beside their f32 values, for the decode step.
//!
//! A decode step multiplies a few rows by every weight, so on the CPU its time is the
//! weights' bytes over the memory bandwidth; a Q4_1 block holds a weight in a sixth of the
//! bytes of its f32 values. [`QuantizedBase`] holds each decoder block's linear layers (and
//! the LM head) as [`BlockMatrix`]es whose values are exactly the policy's f32 weights: the
//! GGUF loader keeps a file's Q4_1 and Q8_0 tensors so, and [`Policy::with_quantized_base`]
//! quantizes any policy's base (its f32 weights then become the blocks' values).
//!
//! The blocks stand for the base as it was loaded, so whatever changes a base weight drops
//! them: a run that fine-tunes the whole model ([`Policy::as_declared`] with `finetune =
//! full`) and [`Policy::merged`]. A frozen base keeps them: LoRA's ([`Policy::with_lora`],
//! QLoRA's setting), and any policy that only generates (serving, evaluation). On flex a
//! product of at most [`BLOCK_ROWS`] rows (a decode step's) reads the blocks
//! ([`Kernels::block_product`]); prefill (more rows, where the arithmetic and not the reading
//! bounds a product), training (under autodiff) and the other backends multiply by the f32
//! weights. The two agree up to the order of each dot product's sum.

use std::sync::Arc;

use agentry_dsl::spec::LoraTarget;
use agentry_kernels::blocks::{BlockFormat, BlockMatrix};
use burn::nn::Linear;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

use super::hf::{f32_values, transposed};
use super::kernels::Kernels;
use super::transformer::Policy;

/// Most rows a product takes through the blocks (a decode step's batch): above it `gemm`'s
/// f32 products catch up (measured with `bench_blocks`: at 16 rows the blocks are 0.7–2.4×
/// as fast as the f32 product per weight, at 4 rows 1.4–3.5×).
pub const BLOCK_ROWS: usize = 16;

/// A policy's base weights in ggml blocks, each `[d_out, d_in]` (a linear layer's rows are
/// its outputs).
#[derive(Clone, Debug)]
pub struct QuantizedBase {
    /// Per decoder block, one entry per [`LoraTarget::ALL`] (`None`: that weight is f32 only).
    pub(crate) layers: Vec<[Option<BlockMatrix>; 7]>,
    /// The LM head, or the tied embedding it reads (`[vocab, d_model]`).
    pub(crate) head: Option<BlockMatrix>,
}

impl QuantizedBase {
    /// The blocks of block `layer`'s `target`, if it has them.
    pub fn layer(&self, layer: usize, target: LoraTarget) -> Option<&BlockMatrix> {
        self.layers.get(layer)?[slot(target)].as_ref()
    }

    /// Keeps `blocks` as block `layer`'s `target` (a layer past the last is ignored).
    pub(crate) fn set_layer(&mut self, layer: usize, target: LoraTarget, blocks: BlockMatrix) {
        if let Some(slots) = self.layers.get_mut(layer) {
            slots[slot(target)] = Some(blocks);
        }
    }

    /// The LM head's blocks (the tied embedding's when the head is tied), if it has them.
    pub fn head(&self) -> Option<&BlockMatrix> {
        self.head.as_ref()
    }

    /// Bytes the blocks take in memory.
    pub fn bytes(&self) -> usize {
        let layers = self.layers.iter().flatten().flatten();
        layers.chain(&self.head).map(BlockMatrix::bytes).sum()
    }
}

/// Where `target`'s blocks sit in a layer's slots: its place in [`LoraTarget::ALL`].
fn slot(target: LoraTarget) -> usize {
    LoraTarget::ALL
        .iter()
        .position(|&t| t == target)
        .expect("ALL lists every target")
}

/// `layer` on rows `x` (`[rows, d_in]`) through its blocks `w`, with its bias; `None` where
/// the backend multiplies by the f32 weight instead ([`Kernels::block_product`]).
pub(crate) fn block_linear<B: Kernels>(
    layer: Option<&Linear<B>>,
    w: &BlockMatrix,
    x: Tensor<B, 2>,
) -> Option<Tensor<B, 2>> {
    let y: Tensor<B, 2> = Tensor::from_primitive(burn::tensor::TensorPrimitive::Float(
        B::block_product(x.into_primitive().tensor(), w)?,
    ));
    Some(match layer.and_then(|l| l.bias.as_ref()) {
        Some(bias) => y + bias.val().unsqueeze_dim(0),
        None => y,
    })
}

impl<B: Kernels> Policy<B> {
    /// This policy with its base quantized: every decoder block's linear layers to `format`,
    /// the LM head (or the tied embedding) to Q8_0 as llama.cpp's files keep it, each as
    /// ggml's reference quantizer rounds. Lossy: the f32 weights become the blocks' values,
    /// so every path computes with the same weights, and the blocks serve the decode steps.
    /// Errors on a weight whose input width is not a multiple of 32 or that holds a value that
    /// is not finite.
    pub fn with_quantized_base(mut self, format: BlockFormat) -> Result<Self, String> {
        let mut layers = Vec::with_capacity(self.blocks.len());
        for (i, block) in self.blocks.iter_mut().enumerate() {
            let mut quantized: [Option<BlockMatrix>; 7] = Default::default();
            for target in LoraTarget::ALL {
                let linear = super::lora::layer_mut(block, target);
                let (blocks, weight) = quantize_in_out(linear.weight.val(), format)
                    .map_err(|e| format!("block {i}'s {} weight: {e}", target.name()))?;
                linear.weight = linear.weight.clone().map(|_| weight);
                quantized[slot(target)] = Some(blocks);
            }
            layers.push(quantized);
        }
        let head = match &mut self.head {
            Some(head) => {
                let (blocks, weight) = quantize_in_out(head.weight.val(), BlockFormat::Q8_0)
                    .map_err(|e| format!("the LM head: {e}"))?;
                head.weight = head.weight.clone().map(|_| weight);
                blocks
            }
            None => {
                // The tied embedding is `[vocab, d_model]` already: rows are outputs.
                let embed = self.embed.weight.val();
                let [vocab, d] = embed.dims();
                let (_, values) = f32_values(embed.clone());
                let blocks = BlockMatrix::quantize(BlockFormat::Q8_0, vocab, d, &values)
                    .map_err(|e| format!("the tied embedding: {e}"))?;
                let weight = device_tensor(blocks.dequantize(), [vocab, d], &embed);
                self.embed.weight = self.embed.weight.clone().map(|_| weight);
                blocks
            }
        };
        self.quantized = Some(Arc::new(QuantizedBase {
            layers,
            head: Some(head),
        }));
        Ok(self)
    }

    /// The tied or untied LM head on `rows` through its blocks, where they serve.
    pub(crate) fn head_by_blocks(&self, rows: Tensor<B, 2>) -> Option<Tensor<B, 2>> {
        let w = self.quantized.as_ref()?.head.as_ref()?;
        block_linear(self.head.as_ref(), w, rows)
    }
}

/// A linear layer's weight (burn's `[d_in, d_out]`) quantized as `[d_out, d_in]` blocks, and
/// the blocks' values back in burn's layout, on the weight's device and with its gradient
/// setting.
fn quantize_in_out<B: Backend>(
    weight: Tensor<B, 2>,
    format: BlockFormat,
) -> Result<(BlockMatrix, Tensor<B, 2>), String> {
    let [d_in, d_out] = weight.dims();
    let (_, rows) = f32_values(weight.clone().transpose());
    let blocks = BlockMatrix::quantize(format, d_out, d_in, &rows)?;
    let in_out = transposed(&blocks.dequantize(), d_out, d_in);
    Ok((blocks, device_tensor(in_out, [d_in, d_out], &weight)))
}

/// `values` as a tensor of `shape` on `like`'s device, requiring a gradient if `like` does.
fn device_tensor<B: Backend>(
    values: Vec<f32>,
    shape: [usize; 2],
    like: &Tensor<B, 2>,
) -> Tensor<B, 2> {
    Tensor::from_data(TensorData::new(values, shape), &like.device())
        .set_require_grad(like.is_require_grad())
}
