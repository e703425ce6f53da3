//! [`FrugalCudaServer::launch_checked`]: a kernel launch from CubeCL's arguments to the driver
//! call (the dispatch counts, the metadata buffer, the bindings' addresses and tensor maps,
//! compilation at first use, deferred behind compiling kernels by `deferred.rs`). Its own file
//! because it is the server's longest path and the only user of the metadata cache.

use std::ffi::c_void;

use cubecl_common::backtrace::BackTrace;
use cubecl_common::stream_id::StreamId;
use cubecl_core::future;
use cubecl_core::prelude::*;
use cubecl_core::server::{Binding, CopyDescriptor, KernelArguments, ServerError};
use cubecl_cuda::CudaCompiler;
use cubecl_runtime::compiler::CubeTask;
use cudarc::driver::sys::CUtensorMap;

use super::FrugalCudaServer;
use super::deferred::DeferredLaunch;
use crate::cuda::compile_waits::CompileWaitCause;
use crate::cuda::tma;
use crate::launch_metadata::{self, Placement};

impl FrugalCudaServer {
    /// A device buffer holding `blob`, a kernel's metadata: the arena's copy where it has one
    /// (uploaded at its first use), else a fresh upload as cubecl-cuda makes.
    fn metadata_binding(
        &mut self,
        blob: &[u8],
        stream_id: StreamId,
    ) -> Result<Binding, ServerError> {
        let mut placement = self.metadata.place(blob);
        if let Placement::NeedsChunk = placement {
            placement = match self.empty(launch_metadata::CHUNK_BYTES, stream_id) {
                Ok(chunk) => {
                    self.metadata.add_chunk(chunk);
                    self.metadata.place(blob)
                }
                Err(_) => Placement::Uncached,
            };
        }
        match placement {
            Placement::Cached(binding) => Ok(binding),
            Placement::Fresh(binding) => {
                self.write_bytes(binding.clone(), blob)?;
                Ok(binding)
            }
            Placement::NeedsChunk | Placement::Uncached => {
                Ok(self.create_with_data(blob, stream_id)?.binding())
            }
        }
    }

    pub(super) fn launch_checked(
        &mut self,
        kernel: Box<dyn CubeTask<CudaCompiler>>,
        count: CubeCount,
        bindings: KernelArguments,
        mode: ExecutionMode,
        stream_id: StreamId,
    ) -> Result<(), ServerError> {
        let name = kernel.name();
        let mut kernel_id = kernel.id();
        kernel_id.mode(mode);
        let logger = self.utilities.logger.clone();

        let dispatch = match count {
            CubeCount::Static(x, y, z) => (x, y, z),
            // CUDA has no indirect dispatch: read the three counts back (as cubecl-cuda does).
            CubeCount::Dynamic(binding) => {
                // The counts may come from a launch still deferred.
                self.launch_deferred(Some(CompileWaitCause::DynamicCount));
                let data = future::block_on(self.read_async(vec![CopyDescriptor::new(
                    binding,
                    [3].into(),
                    [1].into(),
                    4,
                )]))?;
                let counts: &[u32] = bytemuck::cast_slice(&data[0]);
                if counts.len() != 3 {
                    return Err(ServerError::Generic {
                        reason: format!(
                            "a dynamic cube count holds {} values, not 3",
                            counts.len()
                        ),
                        backtrace: BackTrace::capture(),
                    });
                }
                (counts[0], counts[1], counts[2])
            }
        };

        let grid_constants = self.ctx.options.supports_features.grid_constants;
        let info = &bindings.info;
        let (const_info, info_binding) = if grid_constants {
            let mut binding = None;
            if info.dynamic_metadata_offset < info.data.len() {
                let dynamic: &[u8] =
                    bytemuck::cast_slice(&info.data[info.dynamic_metadata_offset..]);
                binding = Some(self.metadata_binding(dynamic, stream_id)?);
            }
            (Some(info.data.as_ptr() as *mut c_void), binding)
        } else {
            let mut binding = None;
            if !info.data.is_empty() {
                binding = Some(self.metadata_binding(bytemuck::cast_slice(&info.data), stream_id)?);
            }
            (None, binding)
        };

        let mut resources =
            Vec::with_capacity(bindings.tensor_maps.len() + bindings.buffers.len() + 1);
        for binding in bindings
            .tensor_maps
            .iter()
            .map(|map| map.binding.clone())
            .chain(bindings.buffers.iter().cloned())
        {
            resources.push(self.resource(binding)?);
        }
        let mut tensor_maps: Vec<CUtensorMap> = Vec::with_capacity(bindings.tensor_maps.len());
        for map in &bindings.tensor_maps {
            let address = self.resource(map.binding.clone())?.ptr;
            tensor_maps.push(tma::encode(&map.map, address)?);
        }

        let ready = self.prepare_kernel(&kernel_id, kernel, mode, logger)?;
        if ready && self.deferred.is_empty() {
            if let Some(binding) = info_binding {
                resources.push(self.resource(binding)?);
            }
            let buffers = resources.iter().map(|r| r.binding);
            self.launch_loaded(
                &kernel_id,
                name,
                dispatch,
                &tensor_maps,
                buffers,
                const_info,
            );
        } else {
            // Held until the launch, like the arguments.
            if let Some(binding) = &info_binding {
                resources.push(self.resource(binding.clone())?);
            }
            // The binding slots cycle, so the deferred launch keeps the addresses themselves.
            self.defer(DeferredLaunch {
                kernel_id,
                name,
                dispatch,
                tensor_maps,
                addresses: resources.iter().map(|r| r.ptr).collect(),
                const_info,
                arguments: bindings,
                info: info_binding,
            });
        }
        Ok(())
    }
}
