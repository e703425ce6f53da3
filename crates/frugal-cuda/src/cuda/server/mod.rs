//! The compute server: one CUDA stream, kernels compiled by [`super::compiler`], device memory
//! from the caching allocator through [`crate::storage::HandleRegistry`].
//!
//! One stream per device (cubecl-cuda keeps one per thread). Work on one stream runs in order,
//! which is what lets a freed block be reused at once without events: a kernel queued later
//! cannot run before the kernels that last used the block. Host reads wait on an event; host
//! buffers of uploads stay alive in a drop queue until a later event has passed.
//!
//! Errors (an allocation that found no memory, a launch that failed) are recorded and returned
//! by the next `sync`, `read` or `flush`, with the allocator's statistics in the message: the
//! client's `initialize_memory` and `launch` return nothing, so that is the first place a user
//! can see them. A kernel whose buffer had no memory is not launched.
//!
//! This file holds the server's state, its construction, error recording, device reservations
//! and the `ComputeServer` impl, which delegates to the files beside it: `control.rs` (the
//! memory API's side channel), `fence.rs` (events the host and streams wait on), `transfers.rs`
//! (host memory and copies), `launch.rs` (kernel launches), `deferred.rs` (launches waiting for
//! kernels that compile on other threads) and `collective.rs` (NCCL, on a
//! stream of its own, and the `ServerCommunication` impl). The cuBLASLt products it queues are
//! in `cuda/blas/products.rs`, beside the library.

mod collective;
mod control;
mod deferred;
mod fence;
mod launch;
mod transfers;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use cubecl_common::backtrace::BackTrace;
use cubecl_common::bytes::Bytes;
use cubecl_common::device::DeviceId;
use cubecl_common::profile::ProfileDuration;
use cubecl_common::stream_id::StreamId;
use cubecl_core::future::{self, DynFut};
use cubecl_core::ir::MemoryDeviceProperties;
use cubecl_core::prelude::*;
use cubecl_core::server::{
    Binding, CopyDescriptor, Handle, IoError, KernelArguments, ProfileError, ProfilingToken,
    ServerError, ServerUtilities,
};
use cubecl_cuda::CudaCompiler;
use cubecl_runtime::allocator::PitchedMemoryLayoutPolicy;
use cubecl_runtime::compiler::CubeTask;
use cubecl_runtime::logging::ServerLogger;
use cubecl_runtime::memory_management::drop_queue::PendingDropQueue;
use cubecl_runtime::memory_management::{
    ManagedMemoryHandle, MemoryAllocationMode, MemoryConfiguration, MemoryManagement,
    MemoryManagementOptions, MemoryUsage,
};
use cubecl_runtime::server::ComputeServer;
use cubecl_runtime::storage::ManagedResource;
use cudarc::driver::sys::CUstream;

use super::blas::BlasLt;
use super::compile_waits::CompileWaitCause;
use super::compiler::KernelContext;
use super::launch_timing::LaunchTimer;
use super::memory::{CudaDeviceMemory, PinnedStorage};
use crate::gemm::GemmError;
use crate::launch_metadata::MetadataCache;
use crate::storage::{DeviceResource, HandleRegistry};

use collective::Collectives;
pub use collective::nccl_available;
pub use control::MemoryReport;
pub(super) use control::{ControlRequest, MemoryControl};
use deferred::Deferred;
use fence::Fence;

/// The CubeCL compute server of [`super::FrugalCudaRuntime`].
#[derive(Debug)]
pub struct FrugalCudaServer {
    // The `pub(super)` fields are those the cuBLASLt products (`cuda/blas/products.rs`) use:
    // a product runs on this stream, in this error state and under this timer.
    ctx: KernelContext,
    pub(super) stream: CUstream,
    memory: HandleRegistry<CudaDeviceMemory>,
    pinned: MemoryManagement<PinnedStorage>,
    pub(super) errors: Vec<ServerError>,
    /// Launches and writes refused after the first recorded error (typically every op that
    /// depends on a failed allocation): counted, not recorded one by one.
    pub(super) refused_after_error: u64,
    drop_queue: PendingDropQueue<Fence>,
    cursor: u64,
    control: Arc<MemoryControl>,
    utilities: Arc<ServerUtilities<Self>>,
    /// cuBLASLt, made at the first product (or why it could not be).
    pub(super) blas: Option<Result<BlasLt, GemmError>>,
    /// Device time of each launch, product and copy, when asked for.
    pub(super) timer: LaunchTimer,
    /// Kernel metadata already on the device.
    metadata: MetadataCache,
    /// NCCL's stream and communicators, and the buffers of collectives still queued.
    collective: Collectives,
    /// Launches waiting for kernels that compile on other threads.
    deferred: Deferred,
}

// SAFETY: the server is driven from one thread at a time (CubeCL's device handle serialises
// access), and sets its context current on entry. Its streams and NCCL communicators are used
// only through it, so never from two threads at once.
unsafe impl Send for FrugalCudaServer {}

fn unhealthy(errors: Vec<ServerError>) -> ServerError {
    ServerError::ServerUnhealthy {
        errors,
        backtrace: BackTrace::capture(),
    }
}

impl FrugalCudaServer {
    pub(crate) fn new(
        device: DeviceId,
        ctx: KernelContext,
        mut memory: HandleRegistry<CudaDeviceMemory>,
        mem_props: &MemoryDeviceProperties,
        control: Arc<MemoryControl>,
        utilities: ServerUtilities<Self>,
    ) -> Self {
        ctx.set_current();
        let stream = cudarc::driver::result::stream::create(
            cudarc::driver::result::stream::StreamKind::NonBlocking,
        )
        .expect("frugal-cuda: cannot create a CUDA stream");
        memory
            .storage()
            .allocator_mut()
            .device_mut()
            .set_stream(stream);
        let pinned = MemoryManagement::from_configuration(
            PinnedStorage::default(),
            &MemoryDeviceProperties {
                max_page_size: mem_props.max_page_size,
                alignment: super::memory::PINNED_ALIGNMENT as u64,
            },
            MemoryConfiguration::default(),
            utilities.logger.clone(),
            MemoryManagementOptions::new("frugal-cuda pinned host")
                .mode(MemoryAllocationMode::Auto),
        );
        Self {
            ctx,
            stream,
            memory,
            pinned,
            errors: Vec::new(),
            refused_after_error: 0,
            drop_queue: PendingDropQueue::default(),
            cursor: 0,
            control,
            utilities: Arc::new(utilities),
            blas: None,
            timer: LaunchTimer::default(),
            metadata: MetadataCache::default(),
            collective: Collectives::new(device),
            deferred: Deferred::new(),
        }
    }

    /// Called first by every entry point that touches the stream or hands memory out (the
    /// products' and collectives' too): as [`Self::enter_queuing`], then every deferred launch
    /// goes to the stream, so that what follows comes after it; a wait for their kernels is
    /// counted under `cause`.
    pub(super) fn enter(&mut self, cause: CompileWaitCause) {
        self.enter_queuing();
        if !self.deferred.is_empty() {
            self.launch_deferred(Some(cause));
        }
    }

    /// Called first by the entry points that may leave launches deferred (a launch, an
    /// allocation, the memory figures): the thread driving the server may change between
    /// calls, so the context is made current here, and the memory API's requests are applied
    /// here (one atomic load when there are none).
    pub(super) fn enter_queuing(&mut self) {
        self.ctx.set_current();
        if self.control.pending.load(Ordering::Acquire) {
            self.apply_requests();
        }
    }

    /// Records an error for the next sync or read; after the first, only counts them, so one
    /// failed allocation gives one error, not one per op that depended on it.
    pub(super) fn record(&mut self, error: ServerError) {
        if self.errors.is_empty() {
            self.errors.push(error);
        } else {
            self.refused_after_error += 1;
        }
    }

    /// Returns the recorded errors, if any, clearing them.
    fn take_errors(&mut self) -> Result<(), ServerError> {
        if self.errors.is_empty() {
            return Ok(());
        }
        let mut errors = std::mem::take(&mut self.errors);
        let refused = std::mem::take(&mut self.refused_after_error);
        if refused > 0 {
            errors.push(ServerError::Generic {
                reason: format!(
                    "frugal-cuda: {refused} more kernel launches or copies were refused after \
                     that (they used a buffer that was never allocated, or failed alike)"
                ),
                backtrace: BackTrace::capture(),
            });
        }
        self.ctx.timestamps.error(ProfileError::Unknown {
            reason: format!("{errors:?}"),
            backtrace: BackTrace::capture(),
        });
        Err(unhealthy(errors))
    }

    /// Reserves `size` bytes; an error is a `ServerError::Generic` whose text carries the
    /// allocator's message and statistics (CubeCL's I/O errors print no description).
    fn reserve(&mut self, size: u64) -> Result<ManagedMemoryHandle, ServerError> {
        let mut reserved = self.memory.reserve(size);
        if reserved.is_err() && !self.deferred.is_empty() {
            // Deferred launches hold the memory of tensors dropped since: launched, it can go.
            self.launch_deferred(Some(CompileWaitCause::Memory));
            self.memory.storage().allocator_mut().flush();
            reserved = self.memory.reserve(size);
        }
        reserved.map_err(|e| {
            let stats = self.memory.stats();
            ServerError::Generic {
                reason: format!(
                    "frugal-cuda: {e}\nallocator: {} allocated in {} blocks, {} reserved in {} \
                     segments (peak {}), cap {}",
                    crate::allocator::format_bytes(stats.allocated_bytes),
                    stats.active_blocks,
                    crate::allocator::format_bytes(stats.reserved_bytes),
                    stats.segments,
                    crate::allocator::format_bytes(stats.peak_reserved_bytes),
                    stats
                        .cap
                        .map_or("none".to_string(), crate::allocator::format_bytes),
                ),
                backtrace: BackTrace::capture(),
            }
        })
    }

    fn bind(&mut self, reserved: ManagedMemoryHandle, assigned: ManagedMemoryHandle) {
        self.cursor += 1;
        if let Err(e) = self.memory.bind(reserved, assigned, self.cursor) {
            self.record(e.into());
        }
    }

    pub(super) fn empty(&mut self, size: u64, stream_id: StreamId) -> Result<Handle, ServerError> {
        let handle = Handle::new(stream_id, size);
        let reserved = self.reserve(size)?;
        self.bind(reserved, handle.memory.clone());
        Ok(handle)
    }

    pub(super) fn resource(&mut self, binding: Binding) -> Result<DeviceResource, IoError> {
        self.memory
            .get_resource(binding.memory, binding.offset_start, binding.offset_end)
    }
}

impl ComputeServer for FrugalCudaServer {
    type Kernel = Box<dyn CubeTask<CudaCompiler>>;
    type Storage = crate::storage::AllocatorStorage<CudaDeviceMemory>;
    type MemoryLayoutPolicy = PitchedMemoryLayoutPolicy;
    type Info = Arc<MemoryControl>;

    fn logger(&self) -> Arc<ServerLogger> {
        self.utilities.logger.clone()
    }

    fn utilities(&self) -> Arc<ServerUtilities<Self>> {
        self.utilities.clone()
    }

    fn staging(
        &mut self,
        sizes: &[usize],
        _stream_id: StreamId,
    ) -> Result<Vec<Bytes>, ServerError> {
        self.enter_queuing();
        Ok(sizes
            .iter()
            .map(|size| self.reserve_host(*size, true))
            .collect())
    }

    fn initialize_memory(&mut self, memory: ManagedMemoryHandle, size: u64, _stream_id: StreamId) {
        self.enter_queuing();
        match self.reserve(size) {
            Ok(reserved) => self.bind(reserved, memory),
            // The handle stays unbound: it resolves to the registry's unallocated slot, so
            // every kernel or copy using it is refused (counted, not launched) and the next
            // sync or read reports this error.
            Err(e) => self.record(e),
        }
    }

    fn read(
        &mut self,
        descriptors: Vec<CopyDescriptor>,
        _stream_id: StreamId,
    ) -> DynFut<Result<Vec<Bytes>, ServerError>> {
        self.enter(CompileWaitCause::Read);
        if let Err(e) = self.take_errors() {
            return Box::pin(async move { Err(e) });
        }
        Box::pin(self.read_async(descriptors))
    }

    fn write(&mut self, descriptors: Vec<(CopyDescriptor, Bytes)>, _stream_id: StreamId) {
        self.enter(CompileWaitCause::Write);
        for (descriptor, data) in descriptors {
            if let Err(e) = self.write_to_device(descriptor, data) {
                self.record(e.into());
                return;
            }
        }
    }

    fn sync(&mut self, _stream_id: StreamId) -> DynFut<Result<(), ServerError>> {
        self.enter(CompileWaitCause::Sync);
        self.release_collectives();
        if let Err(e) = self.take_errors() {
            return Box::pin(async move { Err(e) });
        }
        let fence = Fence::new(self.stream);
        // The host waits for the stream here anyway: the timed events are complete or nearly.
        self.timer.read_pending();
        Box::pin(async move { fence.wait_sync() })
    }

    fn get_resource(
        &mut self,
        binding: Binding,
        _stream_id: StreamId,
    ) -> Result<ManagedResource<DeviceResource>, ServerError> {
        self.enter(CompileWaitCause::Resource);
        let memory = binding.memory.clone();
        let resource = self.resource(binding)?;
        Ok(ManagedResource::new(memory, resource))
    }

    unsafe fn launch(
        &mut self,
        kernel: Self::Kernel,
        count: CubeCount,
        bindings: KernelArguments,
        mode: ExecutionMode,
        stream_id: StreamId,
    ) {
        self.enter_queuing();
        if let Err(e) = self.launch_checked(kernel, count, bindings, mode, stream_id) {
            self.record(e);
        }
    }

    fn flush(&mut self, _stream_id: StreamId) -> Result<(), ServerError> {
        self.enter(CompileWaitCause::Flush);
        self.take_errors()?;
        self.release_collectives();
        let stream = self.stream;
        self.drop_queue.flush(|| Fence::new(stream));
        self.memory.storage().allocator_mut().flush();
        Ok(())
    }

    fn memory_usage(&mut self, _stream_id: StreamId) -> Result<MemoryUsage, ServerError> {
        self.enter_queuing();
        Ok(self.publish_report())
    }

    fn memory_cleanup(&mut self, _stream_id: StreamId) {
        self.enter(CompileWaitCause::Memory);
        if let Err(e) = self.memory.cleanup() {
            self.errors.push(ServerError::Generic {
                reason: format!("frugal-cuda: memory cleanup failed: {e}"),
                backtrace: BackTrace::capture(),
            });
        }
        self.publish_report();
    }

    fn start_profile(&mut self, stream_id: StreamId) -> Result<ProfilingToken, ServerError> {
        self.enter(CompileWaitCause::Profile);
        future::block_on(self.sync(stream_id))?;
        Ok(self.ctx.timestamps.start())
    }

    fn end_profile(
        &mut self,
        stream_id: StreamId,
        token: ProfilingToken,
    ) -> Result<ProfileDuration, ProfileError> {
        self.enter(CompileWaitCause::Profile);
        if let Err(e) = future::block_on(self.sync(stream_id)) {
            self.ctx.timestamps.error(ProfileError::Server(Box::new(e)));
        }
        self.ctx.timestamps.stop(token)
    }

    fn allocation_mode(&mut self, _mode: MemoryAllocationMode, _stream_id: StreamId) {
        // Every reservation already gets a block of its own size from the allocator, which is
        // what CubeCL's persistent mode asks for; there is no other mode to switch to.
    }
}
