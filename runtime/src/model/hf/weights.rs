//! Safetensors files: one `model.safetensors`, or shards listed by
//! `model.safetensors.index.json`. Tensors come out as f32, whatever their stored float type.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use burn::tensor::{bf16, f16};
use safetensors::{Dtype, SafeTensors};
use serde_json::Value;

use super::HfError;

/// The single-file checkpoint.
pub const SINGLE_FILE: &str = "model.safetensors";
/// The index of a sharded checkpoint.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// A tensor read as f32, row-major, with its shape.
#[derive(Clone, Debug, PartialEq)]
pub struct F32Tensor {
    /// The shape, outermost first.
    pub shape: Vec<usize>,
    /// The values.
    pub values: Vec<f32>,
}

/// Where each tensor of a checkpoint lives.
#[derive(Debug)]
pub struct Weights {
    /// Tensor name to the file that holds it.
    location: BTreeMap<String, PathBuf>,
    /// The file that lists the names: the index, or the single file.
    listing: PathBuf,
}

impl Weights {
    /// Finds the checkpoint in `dir`: the index when there is one, else the single file.
    pub fn open(dir: &Path) -> Result<Self, HfError> {
        let index = dir.join(INDEX_FILE);
        if index.exists() {
            return Self::sharded(dir, index);
        }
        let single = dir.join(SINGLE_FILE);
        if !single.exists() {
            return Err(HfError::Invalid {
                path: dir.to_path_buf(),
                reason: format!("no {SINGLE_FILE} or {INDEX_FILE} in the checkpoint directory"),
            });
        }
        let location = header_names(&single)?
            .into_iter()
            .map(|name| (name, single.clone()))
            .collect();
        Ok(Weights {
            location,
            listing: single,
        })
    }

    fn sharded(dir: &Path, index: PathBuf) -> Result<Self, HfError> {
        let invalid = |reason: String| HfError::Invalid {
            path: index.clone(),
            reason,
        };
        let text = std::fs::read_to_string(&index).map_err(|source| HfError::Io {
            path: index.clone(),
            source,
        })?;
        let value: Value =
            serde_json::from_str(&text).map_err(|e| invalid(format!("not valid JSON: {e}")))?;
        let Some(map) = value.get("weight_map").and_then(Value::as_object) else {
            return Err(invalid("no `weight_map` object".to_string()));
        };
        let mut location = BTreeMap::new();
        for (name, file) in map {
            let Some(file) = file.as_str() else {
                return Err(invalid(format!(
                    "the shard of `{name}` is not a string: {file}"
                )));
            };
            // A shard is a file beside the index; a path could reach outside the checkpoint.
            let plain = Path::new(file)
                .file_name()
                .is_some_and(|f| f == std::ffi::OsStr::new(file));
            if !plain || file == "." || file == ".." {
                return Err(invalid(format!(
                    "the shard of `{name}` is `{file}`, not a file name in the checkpoint directory"
                )));
            }
            location.insert(name.clone(), dir.join(file));
        }
        for file in location.values().collect::<BTreeSet<_>>() {
            if !file.is_file() {
                return Err(invalid(format!(
                    "lists shard {}, which does not exist",
                    file.display()
                )));
            }
        }
        Ok(Weights {
            location,
            listing: index,
        })
    }

    /// Every tensor name the checkpoint lists.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.location.keys().map(String::as_str)
    }

    /// The file that lists the names (the index, or the single file), for error messages.
    pub fn listing(&self) -> &Path {
        &self.listing
    }

    /// Reads the `wanted` tensors (name and expected shape), one file at a time, as f32.
    ///
    /// Every tensor must be listed, be stored in its file with exactly the expected shape, have
    /// a float type (f32, f16, bf16) and hold only finite values.
    pub fn read(
        &self,
        wanted: &[(String, Vec<usize>)],
    ) -> Result<HashMap<String, F32Tensor>, HfError> {
        let mut by_file: BTreeMap<&Path, Vec<&(String, Vec<usize>)>> = BTreeMap::new();
        for entry in wanted {
            let Some(file) = self.location.get(&entry.0) else {
                return Err(HfError::Tensor {
                    path: self.listing.clone(),
                    tensor: entry.0.clone(),
                    reason: "missing from the checkpoint".to_string(),
                });
            };
            by_file.entry(file).or_default().push(entry);
        }
        let mut out = HashMap::with_capacity(wanted.len());
        for (file, entries) in by_file {
            let bytes = read(file)?;
            let tensors = deserialize(&bytes, file)?;
            for (name, shape) in entries {
                let tensor_error = |reason: String| HfError::Tensor {
                    path: file.to_path_buf(),
                    tensor: name.clone(),
                    reason,
                };
                let view = tensors
                    .tensor(name)
                    .map_err(|_| tensor_error("missing from this file".to_string()))?;
                if view.shape() != shape.as_slice() {
                    return Err(tensor_error(format!(
                        "shape {:?}, expected {:?} from config.json",
                        view.shape(),
                        shape
                    )));
                }
                let values = to_f32(view.dtype(), view.data()).map_err(tensor_error)?;
                if let Some(i) = values.iter().position(|x| !x.is_finite()) {
                    return Err(tensor_error(format!(
                        "holds a non-finite value ({}) at flat index {i}",
                        values[i]
                    )));
                }
                out.insert(
                    name.clone(),
                    F32Tensor {
                        shape: shape.clone(),
                        values,
                    },
                );
            }
        }
        Ok(out)
    }
}

fn read(path: &Path) -> Result<Vec<u8>, HfError> {
    std::fs::read(path).map_err(|source| HfError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// The tensor names in a safetensors header, read without reading the data (the data is
/// checked when the tensors are read).
fn header_names(path: &Path) -> Result<Vec<String>, HfError> {
    use std::io::Read;
    /// The largest header the safetensors crate accepts.
    const MAX_HEADER: u64 = 100_000_000;
    let invalid = |reason: String| HfError::Invalid {
        path: path.to_path_buf(),
        reason: format!("not a valid safetensors file (truncated or corrupt?): {reason}"),
    };
    let io = |source| HfError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut file = std::fs::File::open(path).map_err(io)?;
    let mut len = [0u8; 8];
    file.read_exact(&mut len)
        .map_err(|_| invalid("shorter than the 8-byte header length".to_string()))?;
    let len = u64::from_le_bytes(len);
    if len > MAX_HEADER {
        return Err(invalid(format!("header length {len} is too large")));
    }
    let mut header = Vec::new();
    file.take(len).read_to_end(&mut header).map_err(io)?;
    if header.len() as u64 != len {
        return Err(invalid(format!(
            "header of {len} bytes announced, {} present",
            header.len()
        )));
    }
    let value: Value =
        serde_json::from_slice(&header).map_err(|e| invalid(format!("header is not JSON: {e}")))?;
    let Value::Object(map) = value else {
        return Err(invalid("header is not a JSON object".to_string()));
    };
    Ok(map
        .into_iter()
        .map(|(k, _)| k)
        .filter(|k| k != "__metadata__")
        .collect())
}

fn deserialize<'a>(bytes: &'a [u8], path: &Path) -> Result<SafeTensors<'a>, HfError> {
    SafeTensors::deserialize(bytes).map_err(|e| HfError::Invalid {
        path: path.to_path_buf(),
        reason: format!("not a valid safetensors file (truncated or corrupt?): {e}"),
    })
}

/// Little-endian stored floats to f32 (exact for every supported type).
pub fn to_f32(dtype: Dtype, data: &[u8]) -> Result<Vec<f32>, String> {
    match dtype {
        Dtype::F32 => Ok(data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()),
        Dtype::F16 => Ok(data
            .chunks_exact(2)
            .map(|b| f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32())
            .collect()),
        Dtype::BF16 => Ok(data
            .chunks_exact(2)
            .map(|b| bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32())
            .collect()),
        other => Err(format!(
            "stored as {other:?}, which is not supported (F32, F16 and BF16 are)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_types_convert_exactly() {
        // 1.0, -2.0 and the smallest subnormal in f16; 1.0 and -2.5 in bf16.
        let f16s = [0x3C00u16, 0xC000, 0x0001];
        let bytes: Vec<u8> = f16s.iter().flat_map(|b| b.to_le_bytes()).collect();
        assert_eq!(
            to_f32(Dtype::F16, &bytes).unwrap(),
            vec![1.0, -2.0, 2f32.powi(-24)]
        );
        let bf16s = [0x3F80u16, 0xC020];
        let bytes: Vec<u8> = bf16s.iter().flat_map(|b| b.to_le_bytes()).collect();
        assert_eq!(to_f32(Dtype::BF16, &bytes).unwrap(), vec![1.0, -2.5]);
        let bytes: Vec<u8> = [0.1f32, -3.0]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        assert_eq!(to_f32(Dtype::F32, &bytes).unwrap(), vec![0.1, -3.0]);
        assert!(to_f32(Dtype::I64, &[0; 8]).unwrap_err().contains("I64"));
    }
}
