//! The GGUF container: header, metadata, tensor infos and where each tensor's data lies.
//!
//! Layout (little-endian, versions 2 and 3): the magic `GGUF`, a `u32` version, `u64` tensor
//! and metadata counts, the metadata (`key: string, type: u32, value`), the tensor infos
//! (`name: string, n_dims: u32, dims: [u64; n_dims], type: u32, offset: u64`), padding to
//! `general.alignment` (32 by default), then the tensor data; each tensor's offset is relative
//! to the start of the data and aligned. A string is a `u64` length and UTF-8 bytes. Dims are
//! innermost first (`dims[0]` is the length of a contiguous row), the reverse of torch's order.
//!
//! Every count, length and offset is checked against the bytes actually present before it is
//! used, so a truncated or corrupt file is an error, never a panic or a huge allocation.

use std::collections::{BTreeMap, HashSet};

/// The four bytes every GGUF file starts with.
pub const MAGIC: &[u8; 4] = b"GGUF";
/// The alignment of tensor data when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// The most dimensions a ggml tensor has.
const MAX_DIMS: u32 = 4;

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// Type 0.
    U8(u8),
    /// Type 1.
    I8(i8),
    /// Type 2.
    U16(u16),
    /// Type 3.
    I16(i16),
    /// Type 4.
    U32(u32),
    /// Type 5.
    I32(i32),
    /// Type 6.
    F32(f32),
    /// Type 7 (stored as one byte, 0 or 1).
    Bool(bool),
    /// Type 8.
    String(String),
    /// Type 9: an element type, a count, the elements (arrays may nest).
    Array(Vec<Value>),
    /// Type 10.
    U64(u64),
    /// Type 11.
    I64(i64),
    /// Type 12.
    F64(f64),
}

impl Value {
    /// The value as an unsigned integer, whatever integer type stores it (writers differ:
    /// llama.cpp writes counts as `u32`, others as `u64` or signed); `None` when it is not a
    /// non-negative integer.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(x) => Some(x.into()),
            Value::U16(x) => Some(x.into()),
            Value::U32(x) => Some(x.into()),
            Value::U64(x) => Some(x),
            Value::I8(x) => u64::try_from(x).ok(),
            Value::I16(x) => u64::try_from(x).ok(),
            Value::I32(x) => u64::try_from(x).ok(),
            Value::I64(x) => u64::try_from(x).ok(),
            _ => None,
        }
    }

    /// The value as a float, from either float type.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(x) => Some(x.into()),
            Value::F64(x) => Some(x),
            _ => None,
        }
    }

    /// The value as a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// The value as a boolean.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// The value as an array.
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    /// The name of the value's type, for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::U8(_) => "u8",
            Value::I8(_) => "i8",
            Value::U16(_) => "u16",
            Value::I16(_) => "i16",
            Value::U32(_) => "u32",
            Value::I32(_) => "i32",
            Value::F32(_) => "f32",
            Value::Bool(_) => "bool",
            Value::String(_) => "string",
            Value::Array(_) => "array",
            Value::U64(_) => "u64",
            Value::I64(_) => "i64",
            Value::F64(_) => "f64",
        }
    }
}

/// A ggml tensor type, by its id in the file. The known ids carry their block layout, so
/// every tensor's extent can be checked even when its type cannot be dequantized.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GgmlType(pub u32);

impl GgmlType {
    /// 32-bit floats.
    pub const F32: GgmlType = GgmlType(0);
    /// IEEE half floats.
    pub const F16: GgmlType = GgmlType(1);
    /// Blocks of 32: an f16 scale and 4-bit values offset by 8.
    pub const Q4_0: GgmlType = GgmlType(2);
    /// Blocks of 32: an f16 scale and minimum, 4-bit values.
    pub const Q4_1: GgmlType = GgmlType(3);
    /// Blocks of 32: an f16 scale and 8-bit values.
    pub const Q8_0: GgmlType = GgmlType(8);
    /// Super-blocks of 256: 8 sub-blocks with 6-bit scales and minimums, 4-bit values.
    pub const Q4_K: GgmlType = GgmlType(12);
    /// Super-blocks of 256: as Q4_K with a fifth bit per value.
    pub const Q5_K: GgmlType = GgmlType(13);
    /// Super-blocks of 256: 16 sub-blocks with 8-bit scales, 6-bit values.
    pub const Q6_K: GgmlType = GgmlType(14);
    /// bfloat16.
    pub const BF16: GgmlType = GgmlType(30);

    /// The type's name, as ggml spells it (`TYPE_N` for an id this reader does not know).
    pub fn name(self) -> String {
        match self.layout() {
            Some((name, _, _)) => name.to_string(),
            None => format!("TYPE_{}", self.0),
        }
    }

    /// `(name, values per block, bytes per block)` of the types whose layout is known (from
    /// ggml's `type_traits`); `None` for any other id.
    pub fn layout(self) -> Option<(&'static str, u64, u64)> {
        Some(match self.0 {
            0 => ("F32", 1, 4),
            1 => ("F16", 1, 2),
            2 => ("Q4_0", 32, 18),
            3 => ("Q4_1", 32, 20),
            6 => ("Q5_0", 32, 22),
            7 => ("Q5_1", 32, 24),
            8 => ("Q8_0", 32, 34),
            9 => ("Q8_1", 32, 36),
            10 => ("Q2_K", 256, 84),
            11 => ("Q3_K", 256, 110),
            12 => ("Q4_K", 256, 144),
            13 => ("Q5_K", 256, 176),
            14 => ("Q6_K", 256, 210),
            15 => ("Q8_K", 256, 292),
            24 => ("I8", 1, 1),
            25 => ("I16", 1, 2),
            26 => ("I32", 1, 4),
            27 => ("I64", 1, 8),
            28 => ("F64", 1, 8),
            30 => ("BF16", 1, 2),
            _ => return None,
        })
    }
}

/// One tensor's description.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    /// The tensor's name (`blk.0.attn_q.weight`).
    pub name: String,
    /// Dims as stored: innermost (contiguous) first.
    pub dims: Vec<u64>,
    /// The element type.
    pub ty: GgmlType,
    /// Offset of the data from the start of the file (already checked to lie inside it).
    pub start: usize,
    /// Bytes of data.
    pub len: usize,
}

impl TensorInfo {
    /// The shape outermost first, as torch and burn write it (the reverse of `dims`).
    pub fn shape(&self) -> Vec<usize> {
        // Each dim was checked to fit in usize when the file was parsed.
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }

    /// Number of values.
    pub fn elements(&self) -> usize {
        self.dims.iter().map(|&d| d as usize).product()
    }
}

/// A parsed GGUF file: its metadata and tensor infos, and the bytes they point into.
#[derive(Debug)]
pub struct GgufFile {
    /// The format version (2 or 3).
    pub version: u32,
    /// The metadata, by key.
    pub metadata: BTreeMap<String, Value>,
    /// The tensor infos, in file order.
    pub tensors: Vec<TensorInfo>,
    /// The whole file.
    bytes: Vec<u8>,
}

impl GgufFile {
    /// Parses a whole file held in memory. The error is a plain reason; the caller adds the
    /// file's name.
    pub fn parse(bytes: Vec<u8>) -> Result<Self, String> {
        let mut r = Reader {
            bytes: &bytes,
            at: 0,
        };
        let magic = r.take(4, "the magic")?;
        if magic != MAGIC {
            return Err(format!(
                "not a GGUF file: it starts with {magic:02x?}, not the magic `GGUF`"
            ));
        }
        let version = r.u32("the version")?;
        match version {
            2 | 3 => {}
            1 => return Err("GGUF version 1 is not supported (versions 2 and 3 are)".into()),
            v if v.swap_bytes() == 2 || v.swap_bytes() == 3 => {
                return Err("a big-endian GGUF file, which is not supported".into());
            }
            v => return Err(format!("unknown GGUF version {v} (2 and 3 are supported)")),
        }
        let tensor_count = r.u64("the tensor count")?;
        let kv_count = r.u64("the metadata count")?;
        let mut metadata = BTreeMap::new();
        for i in 0..kv_count {
            let key = r.string(&format!("metadata key {i}"))?;
            let ty = r.u32(&format!("the type of `{key}`"))?;
            let value = r.value(ty, &key, 0)?;
            if metadata.insert(key.clone(), value).is_some() {
                return Err(format!("metadata key `{key}` appears twice"));
            }
        }
        let alignment = match metadata.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(Value::U32(a)) if a.is_power_of_two() => u64::from(*a),
            Some(other) => {
                return Err(format!(
                    "general.alignment is {other:?}; it must be a u32 power of two"
                ));
            }
        };
        let mut infos = Vec::new();
        let mut seen = HashSet::new();
        for i in 0..tensor_count {
            let name = r.string(&format!("the name of tensor {i}"))?;
            let what = |field: &str| format!("the {field} of tensor `{name}`");
            let n_dims = r.u32(&what("dimension count"))?;
            if n_dims == 0 || n_dims > MAX_DIMS {
                return Err(format!(
                    "tensor `{name}` has {n_dims} dimensions (1 to {MAX_DIMS} are possible)"
                ));
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                dims.push(r.u64(&what("dims"))?);
            }
            let ty = GgmlType(r.u32(&what("type"))?);
            let offset = r.u64(&what("offset"))?;
            if !seen.insert(name.clone()) {
                return Err(format!("tensor `{name}` appears twice"));
            }
            infos.push((name, dims, ty, offset));
        }
        let data_start =
            align(r.at as u64, alignment).ok_or_else(|| "the data start overflows".to_string())?;
        let file_len = bytes.len() as u64;
        let mut tensors = Vec::with_capacity(infos.len());
        for (name, dims, ty, offset) in infos {
            let len = extent(&dims, ty).map_err(|reason| format!("tensor `{name}` {reason}"))?;
            if !offset.is_multiple_of(alignment) {
                return Err(format!(
                    "tensor `{name}`: data offset {offset} is not a multiple of the alignment \
                     {alignment}"
                ));
            }
            let end = data_start
                .checked_add(offset)
                .and_then(|s| s.checked_add(len));
            match end {
                Some(end) if end <= file_len => {}
                _ => {
                    return Err(format!(
                        "tensor `{name}`: its {len} bytes of data at offset {offset} lie past the \
                         end of the file ({file_len} bytes, data from byte {data_start}; \
                         truncated?)"
                    ));
                }
            }
            tensors.push(TensorInfo {
                name,
                dims,
                ty,
                start: (data_start + offset) as usize,
                len: len as usize,
            });
        }
        Ok(GgufFile {
            version,
            metadata,
            tensors,
            bytes,
        })
    }

    /// A tensor's info by name.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// A tensor's raw data (in bounds: checked when the file was parsed).
    pub fn data(&self, info: &TensorInfo) -> &[u8] {
        &self.bytes[info.start..info.start + info.len]
    }
}

/// `at` rounded up to a multiple of `alignment` (a power of two).
fn align(at: u64, alignment: u64) -> Option<u64> {
    Some(at.checked_add(alignment - 1)? / alignment * alignment)
}

/// The bytes a tensor of `dims` and type `ty` occupies; an error when the type is unknown,
/// a row is not whole blocks, or the size overflows.
fn extent(dims: &[u64], ty: GgmlType) -> Result<u64, String> {
    let Some((name, block, block_bytes)) = ty.layout() else {
        return Err(format!("has unknown ggml type id {}", ty.0));
    };
    if !dims[0].is_multiple_of(block) {
        return Err(format!(
            "has rows of {} values, not a multiple of {name}'s block of {block}",
            dims[0]
        ));
    }
    let elements = dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .filter(|&n| usize::try_from(n).is_ok())
        .ok_or_else(|| format!("has dims {dims:?}, whose size overflows"))?;
    (elements / block)
        .checked_mul(block_bytes)
        .filter(|&n| usize::try_from(n).is_ok())
        .ok_or_else(|| format!("has dims {dims:?}, whose size overflows"))
}

/// A cursor over the file's bytes; every read is bounds-checked.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

/// How deep arrays may nest (a guard against a crafted file exhausting the stack).
const MAX_NESTING: usize = 8;

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], String> {
        let left = self.bytes.len() - self.at;
        if n > left {
            return Err(format!(
                "truncated: {what} needs {n} bytes at offset {}, but the file has {} bytes",
                self.at,
                self.bytes.len()
            ));
        }
        let out = &self.bytes[self.at..self.at + n];
        self.at += n;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], String> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N, what)?);
        Ok(out)
    }

    fn u32(&mut self, what: &str) -> Result<u32, String> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &str) -> Result<u64, String> {
        self.array(what).map(u64::from_le_bytes)
    }

    fn string(&mut self, what: &str) -> Result<String, String> {
        let len = self.u64(what)?;
        let len = usize::try_from(len)
            .ok()
            .filter(|&n| n <= self.bytes.len() - self.at)
            .ok_or_else(|| {
                format!(
                    "truncated: {what} is a string of {len} bytes at offset {}, past the end of \
                     the file ({} bytes)",
                    self.at,
                    self.bytes.len()
                )
            })?;
        let raw = self.take(len, what)?;
        String::from_utf8(raw.to_vec()).map_err(|e| format!("{what} is not UTF-8: {e}"))
    }

    fn value(&mut self, ty: u32, key: &str, depth: usize) -> Result<Value, String> {
        let what = || format!("the value of `{key}`");
        Ok(match ty {
            0 => Value::U8(self.array::<1>(&what())?[0]),
            1 => Value::I8(i8::from_le_bytes(self.array(&what())?)),
            2 => Value::U16(u16::from_le_bytes(self.array(&what())?)),
            3 => Value::I16(i16::from_le_bytes(self.array(&what())?)),
            4 => Value::U32(u32::from_le_bytes(self.array(&what())?)),
            5 => Value::I32(i32::from_le_bytes(self.array(&what())?)),
            6 => Value::F32(f32::from_le_bytes(self.array(&what())?)),
            7 => match self.array::<1>(&what())?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(format!("`{key}` is a bool stored as {b}, not 0 or 1")),
            },
            8 => Value::String(self.string(&what())?),
            9 => {
                if depth >= MAX_NESTING {
                    return Err(format!("`{key}` nests arrays more than {MAX_NESTING} deep"));
                }
                let element = self.u32(&format!("the element type of `{key}`"))?;
                let count = self.u64(&format!("the length of `{key}`"))?;
                // Every element takes at least one byte, so a count beyond the bytes left is
                // corrupt; checking first keeps a crafted count from reserving memory.
                let left = (self.bytes.len() - self.at) as u64;
                if count > left {
                    return Err(format!(
                        "truncated: `{key}` is an array of {count} elements at offset {}, more \
                         than the {left} bytes left",
                        self.at
                    ));
                }
                let mut items = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    items.push(self.value(element, key, depth + 1)?);
                }
                Value::Array(items)
            }
            10 => Value::U64(u64::from_le_bytes(self.array(&what())?)),
            11 => Value::I64(i64::from_le_bytes(self.array(&what())?)),
            12 => Value::F64(f64::from_le_bytes(self.array(&what())?)),
            other => return Err(format!("`{key}` has unknown value type {other}")),
        })
    }
}

/// Writes GGUF files (version 3): small models and malformed files for tests, and fixtures.
/// Tensors are given as raw data of a type, so any quantization can be written.
#[derive(Clone, Debug, Default)]
pub struct Writer {
    metadata: Vec<(String, Value)>,
    tensors: Vec<(String, Vec<u64>, GgmlType, Vec<u8>)>,
}

impl Writer {
    /// An empty file.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a metadata entry.
    pub fn meta(mut self, key: &str, value: Value) -> Self {
        self.metadata.push((key.to_string(), value));
        self
    }

    /// Adds a tensor: `dims` innermost first, as GGUF stores them, and its raw data.
    pub fn tensor(mut self, name: &str, dims: &[u64], ty: GgmlType, data: Vec<u8>) -> Self {
        self.tensors
            .push((name.to_string(), dims.to_vec(), ty, data));
        self
    }

    /// Adds an f32 tensor with torch's `shape` (outermost first).
    pub fn f32_tensor(self, name: &str, shape: &[usize], values: &[f32]) -> Self {
        let dims: Vec<u64> = shape.iter().rev().map(|&d| d as u64).collect();
        let data = values.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.tensor(name, &dims, GgmlType::F32, data)
    }

    /// The file's bytes, with data aligned to `general.alignment` when it is set as a u32.
    pub fn to_bytes(&self) -> Vec<u8> {
        let alignment = self
            .metadata
            .iter()
            .find_map(|(k, v)| match (k.as_str(), v) {
                ("general.alignment", Value::U32(a)) if a.is_power_of_two() => Some(*a as usize),
                _ => None,
            })
            .unwrap_or(DEFAULT_ALIGNMENT as usize);
        let mut out = Vec::new();
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (key, value) in &self.metadata {
            write_string(&mut out, key);
            out.extend_from_slice(&type_id(value).to_le_bytes());
            write_value(&mut out, value);
        }
        let mut offset = 0usize;
        let mut offsets = Vec::new();
        for (name, dims, ty, data) in &self.tensors {
            write_string(&mut out, name);
            out.extend_from_slice(&(dims.len() as u32).to_le_bytes());
            for d in dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&ty.0.to_le_bytes());
            out.extend_from_slice(&(offset as u64).to_le_bytes());
            offsets.push(offset);
            offset = (offset + data.len()).div_ceil(alignment) * alignment;
        }
        let data_start = out.len().div_ceil(alignment) * alignment;
        out.resize(data_start, 0);
        for ((_, _, _, data), at) in self.tensors.iter().zip(offsets) {
            out.resize(data_start + at, 0);
            out.extend_from_slice(data);
        }
        out
    }
}

fn write_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn type_id(value: &Value) -> u32 {
    match value {
        Value::U8(_) => 0,
        Value::I8(_) => 1,
        Value::U16(_) => 2,
        Value::I16(_) => 3,
        Value::U32(_) => 4,
        Value::I32(_) => 5,
        Value::F32(_) => 6,
        Value::Bool(_) => 7,
        Value::String(_) => 8,
        Value::Array(_) => 9,
        Value::U64(_) => 10,
        Value::I64(_) => 11,
        Value::F64(_) => 12,
    }
}

fn write_value(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(u8::from(*x)),
        Value::String(s) => write_string(out, s),
        Value::Array(items) => {
            // An empty array's element type is not recorded in `Value`; u8 is as good as any.
            let element = items.first().map_or(0, type_id);
            out.extend_from_slice(&element.to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for item in items {
                write_value(out, item);
            }
        }
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
    }
}
