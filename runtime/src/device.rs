//! Device selection: which burn backend a run uses.
//!
//! The runtime is generic over `B: TrainBackend`; this module is the one place that names
//! concrete backends, so a run is monomorphized once per backend compiled in. flex (CPU) is
//! always there; `wgpu`, `vulkan` and `cuda` are cargo features. The wgpu adapter follows
//! cubecl's `CUBECL_WGPU_DEFAULT_DEVICE` (`Cpu` selects Mesa's lavapipe).

use agentry_dsl::spec::{Device, MatmulPrecision, Placement};
use burn::tensor::backend::{Backend, Device as _, DeviceId};

use crate::model::TrainBackend;

pub use agentry_kernels::memory::{FreedMemory, keep_freed_memory};

/// A device the run cannot use: an unknown name, a backend this build lacks, an index the
/// machine does not have, or a CPU pool that cannot be sized. [`crate::RunError`] wraps it.
#[derive(Debug, thiserror::Error)]
#[error("device `{device}` is not available: {reason}")]
pub struct DeviceError {
    /// The device asked for.
    pub device: String,
    /// Why, and which cargo feature to enable.
    pub reason: String,
}

/// Work generic over the backend, run by [`dispatch`] on the chosen device.
pub trait OnBackend {
    /// What the work returns.
    type Output;
    /// Runs the work on backend `B` and device `device`.
    fn run<B: TrainBackend>(self, device: B::Device) -> Self::Output;
}

/// Parses a device name as the experiment language and `--device` spell it.
pub fn parse(name: &str) -> Result<Device, DeviceError> {
    match name {
        "auto" => Ok(Device::Auto),
        "flex" | "cpu" => Ok(Device::Flex),
        "wgpu" => Ok(Device::Wgpu),
        "vulkan" => Ok(Device::Vulkan),
        "cuda" => Ok(Device::Cuda),
        other => Err(DeviceError {
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
) -> Result<Vec<B::Device>, DeviceError> {
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
                Err(DeviceError {
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

/// Sets the precision of flex's matrix products for the whole process, as a run's
/// `matmul_precision` asks (every run of a process, its warm-up, rollouts and updates, computes
/// with it), and says what it does here ([`describe_matmul_precision`]). Other backends than
/// flex do not read it.
pub fn set_matmul_precision(precision: MatmulPrecision) -> &'static str {
    agentry_kernels::matmul::set_precision(kernel_precision(precision));
    describe_matmul_precision(precision)
}

/// What `precision` does on this machine ([`agentry_kernels::matmul::Precision::describe`]).
pub fn describe_matmul_precision(precision: MatmulPrecision) -> &'static str {
    kernel_precision(precision).describe()
}

fn kernel_precision(precision: MatmulPrecision) -> agentry_kernels::matmul::Precision {
    use agentry_kernels::matmul::Precision;
    match precision {
        MatmulPrecision::Highest => Precision::Highest,
        MatmulPrecision::Medium => Precision::Medium,
    }
}

/// Sizes the pool of CPU threads flex's kernels run on (rayon's global pool). Without a call
/// it has `RAYON_NUM_THREADS` threads, else one per core. Results do not depend on the count:
/// every kernel reduces in an order fixed by the shapes alone.
pub fn set_cpu_threads(threads: usize) -> Result<(), DeviceError> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build_global()
        .map_err(|e| DeviceError {
            device: "flex".to_string(),
            reason: format!("cannot size the CPU thread pool to {threads}: {e}"),
        })
}

/// CPU threads flex's kernels run on.
pub fn cpu_threads() -> usize {
    rayon::current_num_threads()
}

/// Runs `work` on `device` (after resolving `auto`). On flex the allocator first learns to keep
/// freed memory for reuse ([`keep_freed_memory`]).
pub fn dispatch<W: OnBackend>(device: Device, work: W) -> Result<W::Output, DeviceError> {
    use burn::backend::Autodiff;
    let device = resolve(device);
    match device {
        Device::Flex => {
            keep_freed_memory();
            Ok(work.run::<Autodiff<burn::backend::Flex>>(Default::default()))
        }
        #[cfg(feature = "wgpu")]
        Device::Wgpu => Ok(work.run::<Autodiff<burn::backend::Wgpu>>(Default::default())),
        #[cfg(feature = "vulkan")]
        Device::Vulkan => Ok(work.run::<Autodiff<burn::backend::Vulkan>>(Default::default())),
        #[cfg(feature = "cuda")]
        Device::Cuda => Ok(work.run::<Autodiff<burn::backend::Cuda>>(Default::default())),
        other => Err(DeviceError {
            device: name(other).to_string(),
            reason: format!(
                "this build was compiled without it; rebuild with `--features {}`",
                name(other)
            ),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_device_name_says_which_names_there_are() {
        let e = parse("tpu").unwrap_err();
        let message =
            "device `tpu` is not available: expected one of auto, flex, wgpu, vulkan, cuda";
        assert_eq!(e.to_string(), message);
        assert_eq!(
            crate::RunError::from(e).to_string(),
            message,
            "RunError adds nothing"
        );
    }

    #[test]
    fn an_engine_index_the_machine_lacks_is_refused_with_the_count() {
        let placement = Placement::Disaggregated { devices: vec![1] };
        let trainer = Default::default();
        let e = engine_devices::<burn::backend::Flex>(&trainer, &placement).unwrap_err();
        let count = <burn::backend::Flex as Backend>::device_count(trainer.to_id().type_id);
        assert_eq!(count, 1, "flex has one device");
        assert_eq!(
            e.to_string(),
            format!(
                "device `{} device 1` is not available: `placement = disaggregated` names it, but \
                 this machine has 1 such device (indices from 0)",
                <burn::backend::Flex as Backend>::name(&trainer)
            )
        );
    }
}
