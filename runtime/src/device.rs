//! Device selection: which burn backend a run uses.
//!
//! The runtime is generic over `B: TrainBackend`; this module is the one place that names
//! concrete backends, so a run is monomorphized once per backend compiled in. flex (CPU) is
//! always there; `wgpu`, `vulkan` and `cuda` are cargo features. The wgpu adapter follows
//! cubecl's `CUBECL_WGPU_DEFAULT_DEVICE` (`Cpu` selects Mesa's lavapipe).

use agentry_dsl::spec::{Device, Placement};
use burn::tensor::backend::{Backend, Device as _, DeviceId};

use crate::error::RunError;
use crate::model::TrainBackend;

/// Work generic over the backend, run by [`dispatch`] on the chosen device.
pub trait OnBackend {
    /// What the work returns.
    type Output;
    /// Runs the work on backend `B` and device `device`.
    fn run<B: TrainBackend>(self, device: B::Device) -> Self::Output;
}

/// Parses a device name as the experiment language and `--device` spell it.
pub fn parse(name: &str) -> Result<Device, RunError> {
    match name {
        "auto" => Ok(Device::Auto),
        "flex" | "cpu" => Ok(Device::Flex),
        "wgpu" => Ok(Device::Wgpu),
        "vulkan" => Ok(Device::Vulkan),
        "cuda" => Ok(Device::Cuda),
        other => Err(RunError::Device {
            device: other.to_string(),
            reason: "expected one of auto, flex, wgpu, vulkan, cuda".to_string(),
        }),
    }
}

/// The device `auto` stands for in this build: CUDA when compiled in and a driver is present,
/// else wgpu when compiled in, else flex.
pub fn resolve(device: Device) -> Device {
    if device != Device::Auto {
        return device;
    }
    if cfg!(feature = "cuda") && std::path::Path::new("/proc/driver/nvidia/version").exists() {
        Device::Cuda
    } else if cfg!(feature = "wgpu") {
        Device::Wgpu
    } else if cfg!(feature = "vulkan") {
        Device::Vulkan
    } else {
        Device::Flex
    }
}

/// The name of a device, as written in files.
pub fn name(device: Device) -> &'static str {
    match device {
        Device::Auto => "auto",
        Device::Flex => "flex",
        Device::Wgpu => "wgpu",
        Device::Vulkan => "vulkan",
        Device::Cuda => "cuda",
    }
}

/// The devices `placement` puts the rollout engines on, next to a trainer on `trainer`: none
/// when colocated, else the listed indices among the devices of the trainer's kind (CUDA
/// device 1 next to CUDA device 0). An index the backend does not have is an error.
pub fn engine_devices<B: Backend>(
    trainer: &B::Device,
    placement: &Placement,
) -> Result<Vec<B::Device>, RunError> {
    let Placement::Disaggregated { devices } = placement else {
        return Ok(Vec::new());
    };
    let kind = trainer.to_id().type_id;
    let count = B::device_count(kind);
    devices
        .iter()
        .map(|&index| {
            if usize::from(index) < count {
                Ok(B::Device::from_id(DeviceId::new(kind, index)))
            } else {
                Err(RunError::Device {
                    device: format!("{} device {index}", B::name(trainer)),
                    reason: format!(
                        "`placement = disaggregated` names it, but this machine has {count} \
                         such device{} (indices from 0)",
                        if count == 1 { "" } else { "s" }
                    ),
                })
            }
        })
        .collect()
}

/// Sizes the pool of CPU threads flex's kernels run on (rayon's global pool). Without a call
/// it has `RAYON_NUM_THREADS` threads, else one per core. Results do not depend on the count:
/// every kernel reduces in an order fixed by the shapes alone.
pub fn set_cpu_threads(threads: usize) -> Result<(), RunError> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build_global()
        .map_err(|e| RunError::Device {
            device: "flex".to_string(),
            reason: format!("cannot size the CPU thread pool to {threads}: {e}"),
        })
}

/// CPU threads flex's kernels run on.
pub fn cpu_threads() -> usize {
    rayon::current_num_threads()
}

/// Runs `work` on `device` (after resolving `auto`).
pub fn dispatch<W: OnBackend>(device: Device, work: W) -> Result<W::Output, RunError> {
    use burn::backend::Autodiff;
    let device = resolve(device);
    match device {
        Device::Flex => Ok(work.run::<Autodiff<burn::backend::Flex>>(Default::default())),
        #[cfg(feature = "wgpu")]
        Device::Wgpu => Ok(work.run::<Autodiff<burn::backend::Wgpu>>(Default::default())),
        #[cfg(feature = "vulkan")]
        Device::Vulkan => Ok(work.run::<Autodiff<burn::backend::Vulkan>>(Default::default())),
        #[cfg(feature = "cuda")]
        Device::Cuda => Ok(work.run::<Autodiff<burn::backend::Cuda>>(Default::default())),
        other => Err(RunError::Device {
            device: name(other).to_string(),
            reason: format!(
                "this build was compiled without it; rebuild with `--features {}`",
                name(other)
            ),
        }),
    }
}
