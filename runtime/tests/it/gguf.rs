//! GGUF files: SmolLM2-135M-Instruct (Q4_1, fetched once by [`pretrained::smollm2`]) against
//! Python `transformers` loading the same file (`scripts/make_gguf_reference.py` wrote
//! `tests/fixtures/gguf/smollm2.json`): tokenization, logits, greedy generation; and the
//! loader's errors on malformed files, built with [`Writer`].

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Instant;

use crate::common::{self, ids};
use crate::pretrained;
use agentry_runtime::model::gguf::{GgmlType, GgufError, Value, Writer};
use agentry_runtime::model::{Generation, Policy, Pretrained, Sampling, generate};
use burn::backend::Flex;
use burn::tensor::{Int, Tensor, TensorData};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde_json::Value as Json;

type B = Flex;

/// The model, loaded once for every test of this binary that needs it.
fn smollm2() -> &'static Pretrained<B> {
    static MODEL: OnceLock<Pretrained<B>> = OnceLock::new();
    MODEL.get_or_init(|| {
        let path = pretrained::smollm2();
        let start = Instant::now();
        let model = Pretrained::<B>::from_gguf(&path, &Default::default()).unwrap();
        eprintln!("loaded {} in {:.2?}", path.display(), start.elapsed());
        model
    })
}

fn reference() -> Json {
    common::json(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf/smollm2.json"))
}

#[test]
fn smollm2_tokenizer_matches_transformers() {
    let model = smollm2();
    let (hf, _) = model
        .tokenizer
        .hf()
        .expect("a GGUF tokenizer is a Hugging Face one");
    for case in reference()["strings"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let ours = hf.encode_with_specials(text).unwrap();
        assert_eq!(ours, ids(&case["ids"]), "encoding {text:?}");
        assert_eq!(
            hf.decode(&ours).unwrap(),
            case["decoded"].as_str().unwrap(),
            "decoding {text:?}"
        );
        // Plain text never yields a special token; without markers it encodes the same.
        let plain = model.tokenizer.encode(text);
        assert!(plain.iter().all(|&t| !model.tokenizer.is_special(t)));
        if !text.contains("<|") && !text.contains("<repo_name>") {
            assert_eq!(plain, ours, "{text:?}");
        }
    }
    for marker in ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<file_sep>"] {
        let one = hf.encode_with_specials(marker).unwrap();
        assert_eq!(one.len(), 1, "{marker} is one token");
        assert!(model.tokenizer.is_special(one[0]), "{marker} is special");
    }
}

#[test]
fn smollm2_logits_match_transformers() {
    let model = smollm2();
    let mut worst = 0.0f32;
    for case in reference()["prompts"].as_array().unwrap() {
        let prompt = ids(&case["ids"]);
        let (hf, _) = model.tokenizer.hf().unwrap();
        assert_eq!(
            hf.encode_with_specials(case["text"].as_str().unwrap())
                .unwrap(),
            prompt
        );
        let data: Vec<i64> = prompt.iter().map(|&t| i64::from(t)).collect();
        let tokens = Tensor::<B, 2, Int>::from_data(
            TensorData::new(data, [1, prompt.len()]),
            &Default::default(),
        );
        let logits: Vec<f32> = model.policy.forward(tokens).into_data().into_vec().unwrap();
        let last = &logits[(prompt.len() - 1) * model.policy.vocab..];
        for (ids_key, logits_key) in [("top_ids", "top_logits"), ("fixed_ids", "fixed_logits")] {
            for (id, theirs) in ids(&case[ids_key])
                .iter()
                .zip(case[logits_key].as_array().unwrap())
            {
                let error = (last[*id as usize] - theirs.as_f64().unwrap() as f32).abs();
                worst = worst.max(error);
            }
        }
        // The top-1 agrees, so greedy decoding starts the same.
        let argmax = (0..last.len())
            .max_by(|&a, &b| last[a].total_cmp(&last[b]))
            .unwrap();
        assert_eq!(argmax as u32, ids(&case["top_ids"])[0]);
    }
    eprintln!("SmolLM2: max |logit - transformers| = {worst:e}");
    assert!(worst < 1e-3, "logits differ by {worst}");
}

/// Greedy decoding of the reference's three prompts in one batch (the shorter ones are
/// left-padded, which must not change them), checked against transformers' 24 tokens.
fn greedy_matches_transformers(policy: &Policy<B>, model: &Pretrained<B>) -> Vec<Generation> {
    let reference = reference();
    let cases = reference["prompts"].as_array().unwrap();
    let prompts: Vec<Vec<u32>> = cases.iter().map(|c| ids(&c["ids"])).collect();
    let sampling = Sampling {
        max_new_tokens: 24,
        greedy: true,
        ..Sampling::default()
    };
    let start = Instant::now();
    let out = generate(
        policy,
        &prompts,
        &sampling,
        &mut ChaCha8Rng::seed_from_u64(0),
    );
    eprintln!("3 x 24 greedy tokens in {:.2?}", start.elapsed());
    for (case, generation) in cases.iter().zip(&out) {
        assert_eq!(
            generation.tokens,
            ids(&case["greedy"]),
            "{}: ours {:?}",
            case["question"],
            model.tokenizer.decode(&generation.tokens)
        );
    }
    out
}

#[test]
fn smollm2_greedy_generation_matches_transformers() {
    let model = smollm2();
    let out = greedy_matches_transformers(&model.policy, model);
    let france = model.tokenizer.decode(&out[0].tokens);
    assert!(
        france.starts_with("The capital of France is Paris"),
        "{france:?}"
    );
}

/// The file's Q4_1 layers and Q8_0 head are kept as blocks, which decode steps multiply by
/// (`smollm2_greedy_generation_matches_transformers` decodes through them too); with LoRA
/// adapters over the frozen base, greedy decoding still gives transformers' tokens.
#[test]
fn smollm2_keeps_its_blocks_and_decodes_through_them_with_adapters() {
    use agentry_dsl::spec::{Lora, LoraTarget};
    use agentry_kernels::blocks::BlockFormat;
    let model = smollm2();
    let blocks = model.policy.quantized.as_ref().expect("the file's blocks");
    for layer in 0..30 {
        for target in LoraTarget::ALL {
            let w = blocks.layer(layer, target).expect("every layer is Q4_1");
            assert_eq!(w.format(), BlockFormat::Q4_1);
        }
    }
    let head = blocks.head().expect("the tied head");
    assert_eq!(
        (head.format(), head.rows(), head.cols()),
        (BlockFormat::Q8_0, 49152, 576)
    );
    // The query projection's rows are unpermuted with the f32 weight's.
    let q: Vec<f32> = model.policy.blocks[0]
        .q
        .weight
        .val()
        .into_data()
        .into_vec()
        .unwrap();
    let rows = blocks.layer(0, LoraTarget::Q).unwrap().dequantize();
    for (o, row) in rows.chunks(576).enumerate().step_by(37) {
        for (i, &v) in row.iter().enumerate() {
            assert_eq!(q[i * 576 + o], v, "row {o}, column {i}");
        }
    }
    let adapted = model.policy.clone().with_lora(&Lora {
        rank: 4,
        alpha: 8.0,
        dropout: 0.0,
        targets: LoraTarget::ALL.to_vec(),
    });
    greedy_matches_transformers(&adapted, model);
}

#[test]
fn smollm2_speaks_chatml() {
    let model = smollm2();
    let (hf, markers) = model.tokenizer.hf().unwrap();
    assert_eq!(
        markers,
        agentry_runtime::text::hf::TurnMarkers::ChatMl {
            start: hf.token_id("<|im_start|>").unwrap(),
            end: hf.token_id("<|im_end|>").unwrap(),
        }
    );
    assert_eq!(model.policy.vocab, 49152);
    assert_eq!(model.policy.blocks.len(), 30);
}

// ---------------------------------------------------------------------------------------
// Malformed and unsupported files.

/// A scratch file holding `bytes`, removed when dropped.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn scratch(name: &str, bytes: &[u8]) -> Scratch {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("gguf");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{name}.gguf"));
    std::fs::write(&path, bytes).unwrap();
    Scratch(path)
}

/// A tiny Llama model with a ChatML byte-level vocabulary, as GGUF: 2 layers, d_model 8,
/// 2 heads, 1 key/value head, ffn 16, tied embeddings.
fn tiny() -> Writer {
    let mut tokens: Vec<String> = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        .map(String::from)
        .to_vec();
    // The 256 byte tokens of GPT-2's byte-level alphabet, then one merge.
    tokens.extend(byte_alphabet());
    tokens.push("ab".to_string());
    let mut types = vec![Value::I32(3); 3];
    types.extend(std::iter::repeat_n(Value::I32(1), tokens.len() - 3));
    let vocab = tokens.len();
    let (d, ffn, kv) = (8usize, 16usize, 4usize);
    let values = |n: usize, seed: f32| -> Vec<f32> {
        (0..n)
            .map(|i| (i as f32 * 0.37 + seed).sin() * 0.1)
            .collect()
    };
    let mut w = Writer::new()
        .meta("general.architecture", Value::String("llama".into()))
        .meta("llama.block_count", Value::U32(2))
        .meta("llama.context_length", Value::U32(64))
        .meta("llama.embedding_length", Value::U32(d as u32))
        .meta("llama.feed_forward_length", Value::U32(ffn as u32))
        .meta("llama.attention.head_count", Value::U32(2))
        .meta("llama.attention.head_count_kv", Value::U32(1))
        .meta("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5))
        .meta("llama.rope.freq_base", Value::F32(10000.0))
        .meta("tokenizer.ggml.model", Value::String("gpt2".into()))
        .meta("tokenizer.ggml.pre", Value::String("smollm".into()))
        .meta(
            "tokenizer.ggml.tokens",
            Value::Array(tokens.into_iter().map(Value::String).collect()),
        )
        .meta("tokenizer.ggml.token_type", Value::Array(types))
        .meta(
            "tokenizer.ggml.merges",
            Value::Array(vec![Value::String("a b".into())]),
        )
        .meta(
            "tokenizer.chat_template",
            Value::String(
                "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + \
                 message['content'] + '<|im_end|>\\n'}}{% endfor %}{% if add_generation_prompt %}\
                 {{ '<|im_start|>assistant\\n' }}{% endif %}"
                    .into(),
            ),
        )
        .f32_tensor("token_embd.weight", &[vocab, d], &values(vocab * d, 0.0))
        .f32_tensor("output_norm.weight", &[d], &[1.0; 8]);
    for i in 0..2 {
        let p = format!("blk.{i}");
        let s = i as f32;
        w = w
            .f32_tensor(&format!("{p}.attn_norm.weight"), &[d], &[1.0; 8])
            .f32_tensor(&format!("{p}.ffn_norm.weight"), &[d], &[1.0; 8])
            .f32_tensor(
                &format!("{p}.attn_q.weight"),
                &[d, d],
                &values(d * d, s + 1.0),
            )
            .f32_tensor(
                &format!("{p}.attn_k.weight"),
                &[kv, d],
                &values(kv * d, s + 2.0),
            )
            .f32_tensor(
                &format!("{p}.attn_v.weight"),
                &[kv, d],
                &values(kv * d, s + 3.0),
            )
            .f32_tensor(
                &format!("{p}.attn_output.weight"),
                &[d, d],
                &values(d * d, s + 4.0),
            )
            .f32_tensor(
                &format!("{p}.ffn_gate.weight"),
                &[ffn, d],
                &values(ffn * d, s + 5.0),
            )
            .f32_tensor(
                &format!("{p}.ffn_up.weight"),
                &[ffn, d],
                &values(ffn * d, s + 6.0),
            )
            .f32_tensor(
                &format!("{p}.ffn_down.weight"),
                &[d, ffn],
                &values(ffn * d, s + 7.0),
            );
    }
    w
}

/// GPT-2's printable spelling of the 256 bytes.
fn byte_alphabet() -> Vec<String> {
    let mut printable: Vec<u32> = (b'!' as u32..=b'~' as u32).collect();
    printable.extend(0xA1..=0xAC);
    printable.extend(0xAE..=0xFF);
    let mut extra = 0;
    (0..256u32)
        .map(|b| {
            let c = if printable.contains(&b) {
                b
            } else {
                extra += 1;
                255 + extra
            };
            char::from_u32(c).unwrap().to_string()
        })
        .collect()
}

fn load(bytes: &[u8], name: &str) -> Result<Pretrained<B>, GgufError> {
    let file = scratch(name, bytes);
    Pretrained::<B>::from_gguf(&file.0, &Default::default())
}

/// Loading fails with an error whose message has every one of `parts` and the file's name.
fn expect_error(bytes: &[u8], name: &str, parts: &[&str]) -> String {
    let message = match load(bytes, name) {
        Ok(_) => panic!("{name}: the file loaded"),
        Err(e) => e.to_string(),
    };
    assert!(message.contains(&format!("{name}.gguf")), "{message}");
    for part in parts {
        assert!(message.contains(part), "{name}: {message:?} lacks {part:?}");
    }
    message
}

#[test]
fn a_tiny_gguf_model_loads_and_runs() {
    let model = load(&tiny().to_bytes(), "tiny").unwrap();
    assert_eq!(model.policy.blocks.len(), 2);
    assert!(model.policy.head.is_none(), "no `output.weight`: tied");
    let (hf, _) = model.tokenizer.hf().unwrap();
    assert_eq!(
        hf.encode_with_specials("<|im_start|>ab").unwrap(),
        vec![1, 259]
    );
    let out = generate(
        &model.policy,
        &[vec![1, 70, 71]],
        &Sampling {
            max_new_tokens: 3,
            greedy: true,
            ..Sampling::default()
        },
        &mut ChaCha8Rng::seed_from_u64(0),
    );
    assert_eq!(out[0].tokens.len(), 3);
}

#[test]
fn malformed_headers_are_errors() {
    let good = tiny().to_bytes();
    let mut bad = good.clone();
    bad[0] = b'X';
    expect_error(&bad, "magic", &["not a GGUF file"]);
    let mut bad = good.clone();
    bad[4..8].copy_from_slice(&7u32.to_le_bytes());
    expect_error(&bad, "version", &["unknown GGUF version 7"]);
    let mut bad = good.clone();
    bad[4..8].copy_from_slice(&3u32.to_be_bytes());
    expect_error(&bad, "big_endian", &["big-endian"]);
    let mut bad = good.clone();
    bad[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
    expect_error(&bad, "kv_count", &["truncated"]);
    // Every truncation is an error, never a panic.
    for cut in [0, 3, 10, 24, 100, 2000, good.len() / 2, good.len() - 1] {
        expect_error(&good[..cut], &format!("cut_{cut}"), &[]);
    }
    expect_error(
        &good[..good.len() - 1],
        "cut_data",
        &["past the end of the file"],
    );
}

#[test]
fn metadata_errors_name_the_key() {
    let w = tiny().meta("general.alignment", Value::U32(3));
    expect_error(&w.to_bytes(), "alignment", &["general.alignment"]);
    let w = tiny().meta("llama.block_count", Value::U32(9));
    expect_error(
        &w.to_bytes(),
        "twice",
        &["`llama.block_count` appears twice"],
    );
    let w = Writer::new().meta("general.architecture", Value::String("mamba".into()));
    expect_error(&w.to_bytes(), "arch", &["mamba", "llama and qwen2"]);
}

#[test]
fn tensor_errors_name_the_tensor() {
    let bytes = tiny()
        .f32_tensor("blk.5.attn_q.weight", &[8, 8], &[0.0; 64])
        .to_bytes();
    expect_error(
        &bytes,
        "extra",
        &["blk.5.attn_q.weight", "not part of a llama model"],
    );
    let bytes = tiny()
        .tensor("rope_freqs.weight", &[1], GgmlType::F32, vec![0; 4])
        .to_bytes();
    expect_error(
        &bytes,
        "rope_freqs",
        &["rope_freqs.weight", "not supported yet"],
    );
    let bytes = tiny()
        .tensor("weird", &[4], GgmlType(99), vec![0; 4])
        .to_bytes();
    expect_error(
        &bytes,
        "unknown_type",
        &["weird", "unknown ggml type id 99"],
    );
    let bytes = tiny()
        .tensor("odd_rows", &[33], GgmlType::Q8_0, vec![0; 34])
        .to_bytes();
    expect_error(
        &bytes,
        "odd_rows",
        &["odd_rows", "not a multiple of Q8_0's block of 32"],
    );
}

/// A tiny file whose tensor `name` is replaced by `dims` and `data` of type `ty`.
fn replace(name: &str, dims: &[u64], ty: GgmlType, data: Vec<u8>) -> Vec<u8> {
    let mut w = Writer::new();
    let original = tiny();
    // Rebuild through the public API: parse the original, then write it back with the change.
    let file = agentry_runtime::model::gguf::GgufFile::parse(original.to_bytes()).unwrap();
    for (key, value) in &file.metadata {
        w = w.meta(key, value.clone());
    }
    for info in &file.tensors {
        if info.name == name {
            w = w.tensor(name, dims, ty, data.clone());
        } else {
            w = w.tensor(&info.name, &info.dims, info.ty, file.data(info).to_vec());
        }
    }
    w.to_bytes()
}

#[test]
fn misshapen_unsupported_and_non_finite_tensors_are_errors() {
    let bytes = replace(
        "blk.1.ffn_up.weight",
        &[8, 15],
        GgmlType::F32,
        vec![0; 8 * 15 * 4],
    );
    expect_error(
        &bytes,
        "shape",
        &["blk.1.ffn_up.weight", "[15, 8]", "[16, 8]"],
    );
    let bytes = replace("blk.0.attn_norm.weight", &[8], GgmlType::F32, vec![0; 32]);
    load(&bytes, "zeros_norm").unwrap();
    let mut nan = vec![0u8; 32];
    nan[4..8].copy_from_slice(&f32::NAN.to_le_bytes());
    let bytes = replace("blk.0.attn_norm.weight", &[8], GgmlType::F32, nan);
    expect_error(&bytes, "nan", &["blk.0.attn_norm.weight", "non-finite"]);
    let bytes = replace("blk.0.attn_norm.weight", &[8], GgmlType::F16, vec![0; 16]);
    load(&bytes, "f16_norm").unwrap();
    // Q5_0 has a known layout, so the file parses; the tiny model's rows are too short for
    // its block of 32, so this is refused for its shape (the quant unit tests cover the
    // refusal to dequantize Q5_0).
    let bytes = replace(
        "blk.0.attn_v.weight",
        &[32, 4],
        GgmlType(6),
        vec![0; 22 * 4],
    );
    expect_error(
        &bytes,
        "q5_0",
        &["blk.0.attn_v.weight", "[4, 32]", "[4, 8]"],
    );
}

#[test]
fn missing_tokenizer_or_template_is_an_error() {
    let strip = |key: &str| {
        let file = agentry_runtime::model::gguf::GgufFile::parse(tiny().to_bytes()).unwrap();
        let mut w = Writer::new();
        for (k, v) in &file.metadata {
            if k != key {
                w = w.meta(k, v.clone());
            }
        }
        for info in &file.tensors {
            w = w.tensor(&info.name, &info.dims, info.ty, file.data(info).to_vec());
        }
        w.to_bytes()
    };
    expect_error(
        &strip("tokenizer.chat_template"),
        "no_template",
        &["chat_template"],
    );
    expect_error(
        &strip("tokenizer.ggml.merges"),
        "no_merges",
        &["tokenizer.ggml.merges"],
    );
    expect_error(
        &strip("llama.block_count"),
        "no_layers",
        &["llama.block_count"],
    );
    let with_template = |template: &str| {
        let file = agentry_runtime::model::gguf::GgufFile::parse(tiny().to_bytes()).unwrap();
        let mut w = Writer::new();
        for (k, v) in &file.metadata {
            let v = if k == "tokenizer.chat_template" {
                Value::String(template.into())
            } else {
                v.clone()
            };
            w = w.meta(k, v);
        }
        for info in &file.tensors {
            w = w.tensor(&info.name, &info.dims, info.ty, file.data(info).to_vec());
        }
        w.to_bytes()
    };
    expect_error(
        &with_template("{{ messages }}"),
        "other_template",
        &["not supported yet"],
    );
    expect_error(
        &with_template("<|im_start|>{% for %}"),
        "broken_template",
        &["chat template does not compile"],
    );
    expect_error(
        &with_template("<|im_start|>{{ messages[0].content }}"),
        "partial_template",
        &["drops the assistant's message"],
    );
}

/// Random byte flips in a valid file: an error or a model, never a panic.
#[test]
fn mangled_files_never_panic() {
    let good = tiny().to_bytes();
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    for round in 0..200 {
        let mut bad = good.clone();
        for _ in 0..4 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            // Mostly the header and metadata, where the structure is.
            let at = (state as usize) % 4096.min(bad.len());
            bad[at] = (state >> 32) as u8;
        }
        let _ = load(&bad, &format!("mangled_{round}"));
    }
}
