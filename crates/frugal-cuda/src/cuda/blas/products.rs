//! The server's side of a cuBLASLt product: [`FrugalCudaServer::gemm`] makes the library at
//! the first product, resolves the bindings to addresses, takes the workspace from the caching
//! allocator and queues the product on the server's stream. Its own file beside the library
//! (`mod.rs`, which knows nothing of the server) because it is server code: it shares the
//! server's error state, allocator and launch timer.

use cubecl_common::backtrace::BackTrace;
use cubecl_common::stream_id::StreamId;
use cubecl_core::server::{Binding, ServerError};

use super::{BlasLt, GemmBuffers};
use crate::cuda::FrugalCudaServer;
use crate::cuda::compile_waits::CompileWaitCause;
use crate::gemm::{GemmError, GemmShape};

impl FrugalCudaServer {
    /// Queues `out = lhs · rhs` on cuBLASLt, on this server's stream (so in order with its
    /// kernels), with the algorithm's workspace taken from the caching allocator for the
    /// duration of the product. A buffer left without memory by an earlier failed allocation
    /// refuses the product as it refuses a launch: the recorded error is reported at the next
    /// sync, and `Ok` is returned so that no fallback runs on the same missing buffer.
    pub(crate) fn gemm(
        &mut self,
        shape: &GemmShape,
        lhs: Binding,
        rhs: Binding,
        out: Binding,
    ) -> Result<(), GemmError> {
        self.enter(CompileWaitCause::Product);
        let mut blas = match self.blas.take() {
            Some(Ok(blas)) => blas,
            Some(Err(e)) => {
                self.blas = Some(Err(e.clone()));
                return Err(e);
            }
            None => match BlasLt::new() {
                Ok(blas) => blas,
                Err(e) => {
                    log::warn!("frugal-cuda: {e}; products stay on CubeCL's kernels");
                    self.blas = Some(Err(e.clone()));
                    return Err(e);
                }
            },
        };
        let result = self.gemm_with(&mut blas, shape, lhs, rhs, out);
        self.blas = Some(Ok(blas));
        result
    }

    /// [`Self::gemm`] queued without a caller waiting: a refusal is recorded as a server
    /// error, reported by the next sync, read or flush.
    pub(crate) fn gemm_queued(
        &mut self,
        shape: &GemmShape,
        lhs: Binding,
        rhs: Binding,
        out: Binding,
    ) {
        if let Err(e) = self.gemm(shape, lhs, rhs, out) {
            self.record(ServerError::Generic {
                reason: format!("frugal-cuda: a queued product failed: {e}"),
                backtrace: BackTrace::capture(),
            });
        }
    }

    fn gemm_with(
        &mut self,
        blas: &mut BlasLt,
        shape: &GemmShape,
        lhs: Binding,
        rhs: Binding,
        out: Binding,
    ) -> Result<(), GemmError> {
        if !self.errors.is_empty() {
            self.refused_after_error += 1;
            return Ok(());
        }
        let mut addresses = [0u64; 3];
        for (slot, binding) in addresses.iter_mut().zip([lhs, rhs, out]) {
            match self.resource(binding) {
                Ok(resource) => *slot = resource.ptr,
                Err(e) => {
                    self.record(e.into());
                    return Ok(());
                }
            }
        }
        let buffers = GemmBuffers {
            lhs: addresses[0],
            rhs: addresses[1],
            out: addresses[2],
        };
        let bytes = blas.workspace(shape, &buffers)?;
        let mut workspace = (None, 0u64);
        if bytes > 0 {
            let handle = self
                .empty(bytes as u64, StreamId::current())
                .map_err(|e| GemmError::Library(format!("no memory for its workspace: {e}")))?;
            let address = self
                .resource(handle.clone().binding())
                .map_err(|e| GemmError::Library(format!("workspace: {e:?}")))?
                .ptr;
            workspace = (Some(handle), address);
        }
        let started = self.timer.start(self.stream);
        // SAFETY: the addresses are the bindings' live buffers, sized by the caller for
        // `shape`; the workspace handle lives until after the product is queued, and a freed
        // block is only reused by work queued later on this same stream.
        let result = unsafe { blas.run(shape, &buffers, workspace.1, self.stream) };
        self.timer.finish("cuBLASLt product", started, self.stream);
        drop(workspace);
        result
    }
}
