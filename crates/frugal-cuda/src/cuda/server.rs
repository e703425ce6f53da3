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

use std::ffi::c_void;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use cubecl_common::backtrace::BackTrace;
use cubecl_common::bytes::{AllocationProperty, Bytes};
use cubecl_common::profile::ProfileDuration;
use cubecl_common::stream_id::StreamId;
use cubecl_core::future::{self, DynFut};
use cubecl_core::ir::MemoryDeviceProperties;
use cubecl_core::prelude::*;
use cubecl_core::server::{
    Binding, CopyDescriptor, Handle, IoError, KernelArguments, ProfileError, ProfilingToken,
    ServerCommunication, ServerError, ServerUtilities,
};
use cubecl_core::zspace::striding::has_pitched_row_major_strides;
use cubecl_core::zspace::{Shape, Strides};
use cubecl_cuda::CudaCompiler;
use cubecl_runtime::allocator::PitchedMemoryLayoutPolicy;
use cubecl_runtime::compiler::CubeTask;
use cubecl_runtime::logging::ServerLogger;
use cubecl_runtime::memory_management::drop_queue::{self, PendingDropQueue};
use cubecl_runtime::memory_management::{
    ManagedMemoryHandle, MemoryAllocationMode, MemoryConfiguration, MemoryHandle, MemoryManagement,
    MemoryManagementOptions, MemoryUsage,
};
use cubecl_runtime::server::ComputeServer;
use cubecl_runtime::storage::ManagedResource;
use cudarc::driver::sys::{
    CUDA_MEMCPY2D_st, CUevent_flags, CUevent_st, CUevent_wait_flags, CUmemorytype, CUstream,
    CUtensorMap, cuMemcpy2DAsync_v2,
};

use super::blas::{BlasLt, GemmBuffers};
use super::compiler::KernelContext;
use super::launch_timing::{LaunchTimer, LaunchTimings};
use super::memory::{CudaDeviceMemory, PinnedBytesController, PinnedStorage};
use super::tma;
use crate::allocator::{AllocError, History, OomInfo, Stats};
use crate::gemm::{GemmError, GemmShape};
use crate::launch_metadata::{self, MetadataCache, Placement};
use crate::storage::{DeviceResource, HandleRegistry, RegistryCounters, TraceEvent};

const MB: usize = 1 << 20;

/// An event recorded on a stream, to wait for everything queued before it.
#[derive(Debug)]
pub(crate) struct Fence {
    event: *mut CUevent_st,
}

// SAFETY: the event is destroyed exactly once, by the consuming wait; streams are never closed.
unsafe impl Send for Fence {}

impl Fence {
    pub fn new(stream: CUstream) -> Self {
        // SAFETY: the stream is the server's, alive for the process.
        unsafe {
            let event =
                cudarc::driver::result::event::create(CUevent_flags::CU_EVENT_DEFAULT).unwrap();
            cudarc::driver::result::event::record(event, stream).unwrap();
            Self { event }
        }
    }

    pub fn wait_sync(self) -> Result<(), ServerError> {
        let generic = |e: cudarc::driver::DriverError| ServerError::Generic {
            reason: format!("{e:?}"),
            backtrace: BackTrace::capture(),
        };
        // SAFETY: the event was created and recorded by `new`; consumed here.
        unsafe {
            cudarc::driver::result::event::synchronize(self.event).map_err(generic)?;
            cudarc::driver::result::event::destroy(self.event).map_err(generic)?;
        }
        Ok(())
    }

    #[allow(dead_code)]
    pub fn wait_async(self, stream: CUstream) {
        // SAFETY: as above; the wait is queued on a live stream.
        unsafe {
            let _ = cudarc::driver::result::stream::wait_event(
                stream,
                self.event,
                CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            );
            let _ = cudarc::driver::result::event::destroy(self.event);
        }
    }
}

impl drop_queue::Fence for Fence {
    fn sync(self) {
        let _ = self.wait_sync();
    }
}

/// A change asked for from outside the server, applied at its next allocation or usage query.
pub(crate) enum ControlRequest {
    Cap(Option<u64>),
    GrowthLimit(Option<u64>),
    OomHandler(Box<dyn FnMut(&OomInfo) -> bool + Send>),
    ClearOomHandler,
    ResetPeaks,
    /// Start (clearing) or stop recording the allocator's input.
    RecordTrace(bool),
    /// Move the recorded events into [`MemoryControl`] for the caller.
    TakeTrace,
    /// Publish the allocator's segments and blocks into [`MemoryControl`], with a copy of the
    /// trace recorded so far when `true`.
    History(bool),
    /// Start (clearing what was measured) or stop timing launches on the device.
    LaunchTiming(bool),
    /// Move the launch times measured so far into [`MemoryControl`] for the caller.
    TakeLaunchTimings,
}

/// What the allocator reports, as published by the server.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct MemoryReport {
    /// The allocator's statistics.
    pub stats: Stats,
    /// What the handle registry did (reservations, misses, failures).
    pub registry: RegistryCounters,
    /// Bytes of live tensors as CubeCL counts them (unpadded).
    pub bytes_in_use: u64,
    /// Live tensor buffers.
    pub buffers_in_use: u64,
}

/// Shared between the server and the public API ([`super::memory_report`],
/// [`super::set_memory_cap`], ...): requests go in, reports come out. The flag keeps the
/// server's per-allocation check to one relaxed load.
#[derive(Default)]
pub struct MemoryControl {
    pending: AtomicBool,
    requests: Mutex<Vec<ControlRequest>>,
    report: Mutex<MemoryReport>,
    last_error: Mutex<Option<AllocError>>,
    trace: Mutex<Vec<TraceEvent>>,
    history: Mutex<Option<History>>,
    launch_timings: Mutex<Option<LaunchTimings>>,
}

impl std::fmt::Debug for MemoryControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryControl").finish_non_exhaustive()
    }
}

impl MemoryControl {
    pub(crate) fn request(&self, request: ControlRequest) {
        self.requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(request);
        self.pending.store(true, Ordering::Release);
    }

    pub(crate) fn report(&self) -> MemoryReport {
        *self.report.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn take_trace(&self) -> Vec<TraceEvent> {
        std::mem::take(&mut *self.trace.lock().unwrap_or_else(|e| e.into_inner()))
    }

    pub(crate) fn take_history(&self) -> Option<History> {
        self.history
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    pub(crate) fn take_launch_timings(&self) -> Option<LaunchTimings> {
        self.launch_timings
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    pub(crate) fn take_error(&self) -> Option<AllocError> {
        self.last_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }
}

/// The CubeCL compute server of [`super::FrugalCudaRuntime`].
#[derive(Debug)]
pub struct FrugalCudaServer {
    ctx: KernelContext,
    stream: CUstream,
    memory: HandleRegistry<CudaDeviceMemory>,
    pinned: MemoryManagement<PinnedStorage>,
    errors: Vec<ServerError>,
    /// Launches and writes refused after the first recorded error (typically every op that
    /// depends on a failed allocation): counted, not recorded one by one.
    refused_after_error: u64,
    drop_queue: PendingDropQueue<Fence>,
    cursor: u64,
    control: Arc<MemoryControl>,
    utilities: Arc<ServerUtilities<Self>>,
    /// cuBLASLt, made at the first product (or why it could not be).
    blas: Option<Result<BlasLt, GemmError>>,
    /// Device time of each launch, product and copy, when asked for.
    timer: LaunchTimer,
    /// Kernel metadata already on the device.
    metadata: MetadataCache,
}

// SAFETY: the server is driven from one thread at a time (CubeCL's device handle serialises
// access), and sets its context current on entry.
unsafe impl Send for FrugalCudaServer {}

fn unhealthy(errors: Vec<ServerError>) -> ServerError {
    ServerError::ServerUnhealthy {
        errors,
        backtrace: BackTrace::capture(),
    }
}

impl FrugalCudaServer {
    pub(crate) fn new(
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
        }
    }

    fn enter(&mut self) {
        self.ctx.set_current();
        if self.control.pending.load(Ordering::Acquire) {
            self.apply_requests();
        }
    }

    fn apply_requests(&mut self) {
        self.control.pending.store(false, Ordering::Release);
        let requests = std::mem::take(
            &mut *self
                .control
                .requests
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        );
        for request in requests {
            let result = match request {
                ControlRequest::Cap(cap) => self.memory.set_cap(cap),
                ControlRequest::GrowthLimit(limit) => {
                    self.memory.set_growth_limit(limit);
                    Ok(())
                }
                ControlRequest::OomHandler(handler) => {
                    self.memory.set_oom_handler(handler);
                    Ok(())
                }
                ControlRequest::ClearOomHandler => {
                    self.memory.storage().allocator_mut().clear_oom_handler();
                    Ok(())
                }
                ControlRequest::ResetPeaks => {
                    self.memory.reset_peaks();
                    Ok(())
                }
                ControlRequest::RecordTrace(on) => {
                    self.memory.storage().record_trace(on);
                    Ok(())
                }
                ControlRequest::TakeTrace => {
                    let events = self.memory.storage().take_trace();
                    *self.control.trace.lock().unwrap_or_else(|e| e.into_inner()) = events;
                    Ok(())
                }
                ControlRequest::History(with_trace) => {
                    let allocator = self.memory.storage().allocator();
                    let history = if with_trace {
                        allocator.history()
                    } else {
                        History {
                            snapshot: allocator.snapshot(),
                            trace: None,
                        }
                    };
                    *self
                        .control
                        .history
                        .lock()
                        .unwrap_or_else(|e| e.into_inner()) = Some(history);
                    Ok(())
                }
                ControlRequest::LaunchTiming(on) => {
                    self.timer.set(on);
                    Ok(())
                }
                ControlRequest::TakeLaunchTimings => {
                    let timings = self.timer.take();
                    *self
                        .control
                        .launch_timings
                        .lock()
                        .unwrap_or_else(|e| e.into_inner()) = Some(timings);
                    Ok(())
                }
            };
            if let Err(e) = result {
                *self
                    .control
                    .last_error
                    .lock()
                    .unwrap_or_else(|e| e.into_inner()) = Some(e);
            }
        }
    }

    fn publish_report(&mut self) -> MemoryUsage {
        let usage = self.memory.memory_usage();
        let report = MemoryReport {
            stats: self.memory.stats(),
            registry: self.memory.counters(),
            bytes_in_use: usage.bytes_in_use,
            buffers_in_use: usage.number_allocs,
        };
        *self
            .control
            .report
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = report;
        usage
    }

    /// Records an error for the next sync or read; after the first, only counts them, so one
    /// failed allocation gives one error, not one per op that depended on it.
    fn record(&mut self, error: ServerError) {
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
        self.memory.reserve(size).map_err(|e| {
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

    fn empty(&mut self, size: u64, stream_id: StreamId) -> Result<Handle, ServerError> {
        let handle = Handle::new(stream_id, size);
        let reserved = self.reserve(size)?;
        self.bind(reserved, handle.memory.clone());
        Ok(handle)
    }

    fn resource(&mut self, binding: Binding) -> Result<DeviceResource, IoError> {
        self.memory
            .get_resource(binding.memory, binding.offset_start, binding.offset_end)
    }

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
        self.enter();
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

    fn reserve_pinned(&mut self, size: usize) -> Option<Bytes> {
        let handle = self.pinned.reserve(size as u64).ok()?;
        let binding = MemoryHandle::binding(handle);
        let resource = self.pinned.get_resource(binding.clone(), None, None).ok()?;
        let controller = Box::new(PinnedBytesController::new(binding, resource));
        // SAFETY: the slot holds at least `size` bytes and stays ours while the Bytes live.
        Some(unsafe { Bytes::from_controller(controller, size) })
    }

    /// Host memory for a transfer: pinned up to 100 MB (or when asked), else pageable.
    fn reserve_host(&mut self, size: usize, pinned: bool) -> Bytes {
        if !pinned && size > 100 * MB {
            return Bytes::from_bytes_vec(vec![0; size]);
        }
        self.reserve_pinned(size)
            .unwrap_or_else(|| Bytes::from_bytes_vec(vec![0; size]))
    }

    fn copy_to_host(&mut self, descriptor: CopyDescriptor) -> Result<Bytes, IoError> {
        let CopyDescriptor {
            handle,
            shape,
            strides,
            elem_size,
        } = descriptor;
        if !has_pitched_row_major_strides(&shape, &strides) {
            return Err(IoError::UnsupportedStrides {
                backtrace: BackTrace::capture(),
            });
        }
        let num_bytes = shape.iter().product::<usize>() * elem_size;
        let mut bytes = self.reserve_host(num_bytes, true);
        let resource = self.resource(handle)?;
        let started = self.timer.start(self.stream);
        // SAFETY: the resource is a live device buffer covering the pitched layout, `bytes` holds
        // the packed copy, and the caller waits on a fence before reading it.
        unsafe {
            copy_2d(
                &shape,
                &strides,
                elem_size,
                Direction::ToHost(&mut bytes),
                resource.ptr,
                self.stream,
            )
        }?;
        self.timer.finish("copy to host", started, self.stream);
        Ok(bytes)
    }

    fn write_to_device(&mut self, descriptor: CopyDescriptor, data: Bytes) -> Result<(), IoError> {
        let CopyDescriptor {
            handle,
            shape,
            strides,
            elem_size,
        } = descriptor;
        if !has_pitched_row_major_strides(&shape, &strides) {
            return Err(IoError::UnsupportedStrides {
                backtrace: BackTrace::capture(),
            });
        }
        let resource = self.resource(handle)?;
        let data = match data.property() {
            AllocationProperty::File => {
                let mut buffer = self.reserve_host(data.len(), true);
                data.copy_into(&mut buffer);
                buffer
            }
            _ => data,
        };
        let started = self.timer.start(self.stream);
        // SAFETY: as in `copy_to_host`; `data` is kept alive by the drop queue until a later
        // fence has passed.
        unsafe {
            copy_2d(
                &shape,
                &strides,
                elem_size,
                Direction::ToDevice(&data),
                resource.ptr,
                self.stream,
            )
        }?;
        self.timer.finish("copy to device", started, self.stream);
        self.drop_queue.push(data);
        Ok(())
    }

    fn create_with_data(
        &mut self,
        data: &[u8],
        stream_id: StreamId,
    ) -> Result<Handle, ServerError> {
        let handle = self.empty(data.len() as u64, stream_id)?;
        self.write_bytes(handle.clone().binding(), data)?;
        Ok(handle)
    }

    /// Queues a copy of `data` into the device buffer `binding`, through pinned staging.
    fn write_bytes(&mut self, binding: Binding, data: &[u8]) -> Result<(), IoError> {
        let mut staging = self.reserve_host(data.len(), true);
        staging.copy_from_slice(data);
        self.write_to_device(
            CopyDescriptor {
                handle: binding,
                shape: [data.len()].into(),
                strides: [1].into(),
                elem_size: 1,
            },
            staging,
        )
    }

    fn read_async(
        &mut self,
        descriptors: Vec<CopyDescriptor>,
    ) -> impl Future<Output = Result<Vec<Bytes>, ServerError>> + Send + use<> {
        let held: Vec<Binding> = descriptors.iter().map(|d| d.handle.clone()).collect();
        let result: Result<Vec<Bytes>, IoError> = descriptors
            .into_iter()
            .map(|d| self.copy_to_host(d))
            .collect();
        let fence = Fence::new(self.stream);
        async move {
            let synced = fence.wait_sync();
            drop(held);
            synced?;
            Ok(result?)
        }
    }

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

    fn launch_checked(
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
        if let Some(binding) = info_binding {
            resources.push(self.resource(binding)?);
        }

        if !self.ctx.is_loaded(&kernel_id) {
            self.ctx.compile(&kernel_id, kernel, mode, logger)?;
        }
        let started = self.timer.start(self.stream);
        let launched = self.ctx.launch(
            self.stream,
            &kernel_id,
            dispatch,
            &tensor_maps,
            &resources,
            const_info,
        );
        self.timer.finish(name, started, self.stream);
        if self.drop_queue.should_flush() {
            let stream = self.stream;
            self.drop_queue.flush(|| Fence::new(stream));
        }
        if let Err(e) = launched {
            if self.ctx.timestamps.is_empty() {
                return Err(e.into());
            }
            self.ctx.timestamps.error(ProfileError::Launch(e));
        }
        Ok(())
    }
}

enum Direction<'a> {
    ToHost(&'a mut Bytes),
    ToDevice(&'a [u8]),
}

/// Copies a pitched row-major tensor between the device and packed host memory: one linear
/// copy for rank ≤ 1, else one 2D copy whose rows are the innermost dimension.
///
/// # Safety
/// `device` must cover the layout, the host side must hold the packed bytes, and it must stay
/// alive until the stream has passed the copy.
unsafe fn copy_2d(
    shape: &Shape,
    strides: &Strides,
    elem_size: usize,
    direction: Direction<'_>,
    device: u64,
    stream: CUstream,
) -> Result<(), IoError> {
    let failed = |what: &str, e: String| IoError::Unknown {
        description: format!("CUDA {what} failed: {e}"),
        backtrace: BackTrace::capture(),
    };
    let rank = shape.len();
    if rank <= 1 {
        // SAFETY: the caller's contract.
        return unsafe {
            match direction {
                Direction::ToHost(bytes) => {
                    cudarc::driver::result::memcpy_dtoh_async(&mut bytes[..], device, stream)
                        .map_err(|e| failed("memcpy_dtoh", e.to_string()))
                }
                Direction::ToDevice(data) => {
                    cudarc::driver::result::memcpy_htod_async(device, data, stream)
                        .map_err(|e| failed("memcpy_htod", e.to_string()))
                }
            }
        };
    }
    let width = shape[rank - 1] * elem_size;
    let height: usize = shape[..rank - 1].iter().product();
    let pitch = strides[rank - 2] * elem_size;
    // The memory-type enums have no zero value, so the descriptor is built whole.
    let (src_type, dst_type, src_pitch, dst_pitch, src_host, dst_host, src_device, dst_device) =
        match direction {
            Direction::ToHost(bytes) => (
                CUmemorytype::CU_MEMORYTYPE_DEVICE,
                CUmemorytype::CU_MEMORYTYPE_HOST,
                pitch,
                width,
                std::ptr::null(),
                bytes.as_mut_ptr() as *mut c_void,
                device,
                0,
            ),
            Direction::ToDevice(data) => (
                CUmemorytype::CU_MEMORYTYPE_HOST,
                CUmemorytype::CU_MEMORYTYPE_DEVICE,
                width,
                pitch,
                data.as_ptr() as *const c_void,
                std::ptr::null_mut(),
                0,
                device,
            ),
        };
    let copy = CUDA_MEMCPY2D_st {
        srcXInBytes: 0,
        srcY: 0,
        srcMemoryType: src_type,
        srcHost: src_host,
        srcDevice: src_device,
        srcArray: std::ptr::null_mut(),
        srcPitch: src_pitch,
        dstXInBytes: 0,
        dstY: 0,
        dstMemoryType: dst_type,
        dstHost: dst_host,
        dstDevice: dst_device,
        dstArray: std::ptr::null_mut(),
        dstPitch: dst_pitch,
        WidthInBytes: width,
        Height: height,
    };
    // SAFETY: the descriptor is complete and the caller's contract covers both sides.
    unsafe { cuMemcpy2DAsync_v2(&copy, stream) }
        .result()
        .map_err(|e| failed("2D memcpy", e.to_string()))
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
        self.enter();
        Ok(sizes
            .iter()
            .map(|size| self.reserve_host(*size, true))
            .collect())
    }

    fn initialize_memory(&mut self, memory: ManagedMemoryHandle, size: u64, _stream_id: StreamId) {
        self.enter();
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
        self.enter();
        if let Err(e) = self.take_errors() {
            return Box::pin(async move { Err(e) });
        }
        Box::pin(self.read_async(descriptors))
    }

    fn write(&mut self, descriptors: Vec<(CopyDescriptor, Bytes)>, _stream_id: StreamId) {
        self.enter();
        for (descriptor, data) in descriptors {
            if let Err(e) = self.write_to_device(descriptor, data) {
                self.record(e.into());
                return;
            }
        }
    }

    fn sync(&mut self, _stream_id: StreamId) -> DynFut<Result<(), ServerError>> {
        self.enter();
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
        self.enter();
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
        self.enter();
        if let Err(e) = self.launch_checked(kernel, count, bindings, mode, stream_id) {
            self.record(e);
        }
    }

    fn flush(&mut self, _stream_id: StreamId) -> Result<(), ServerError> {
        self.enter();
        self.take_errors()?;
        let stream = self.stream;
        self.drop_queue.flush(|| Fence::new(stream));
        self.memory.storage().allocator_mut().flush();
        Ok(())
    }

    fn memory_usage(&mut self, _stream_id: StreamId) -> Result<MemoryUsage, ServerError> {
        self.enter();
        Ok(self.publish_report())
    }

    fn memory_cleanup(&mut self, _stream_id: StreamId) {
        self.enter();
        if let Err(e) = self.memory.cleanup() {
            self.errors.push(ServerError::Generic {
                reason: format!("frugal-cuda: memory cleanup failed: {e}"),
                backtrace: BackTrace::capture(),
            });
        }
        self.publish_report();
    }

    fn start_profile(&mut self, stream_id: StreamId) -> Result<ProfilingToken, ServerError> {
        future::block_on(self.sync(stream_id))?;
        Ok(self.ctx.timestamps.start())
    }

    fn end_profile(
        &mut self,
        stream_id: StreamId,
        token: ProfilingToken,
    ) -> Result<ProfileDuration, ProfileError> {
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

impl ServerCommunication for FrugalCudaServer {
    const SERVER_COMM_ENABLED: bool = false;
}
