//! Launches queued behind the compilation of their kernels, so that the kernels a step first
//! launches compile side by side on [`CompilePool`]'s threads.
//!
//! Order is what keeps the stream correct: a launch of a kernel still compiling is deferred,
//! and so is every launch after it, until the kernels before them are loaded; they then go to
//! the stream in the order they came. Anything else that touches the stream or hands memory
//! out (a copy, a read, a sync, a product, a collective, a resource) first launches every
//! deferred launch, waiting for their kernels (`FrugalCudaServer::enter`). A deferred launch
//! holds its arguments, so the memory of a tensor dropped meanwhile is not reused before the
//! launch that reads it; at most [`MAX_DEFERRED`] wait at once, which bounds that memory.

use std::collections::{HashMap, VecDeque};
use std::ffi::c_void;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::time::Instant;

use cubecl_common::backtrace::BackTrace;
use cubecl_core::prelude::*;
use cubecl_core::server::{Binding, KernelArguments, ProfileError, ServerError};
use cubecl_cuda::CudaCompiler;
use cubecl_runtime::compiler::CubeTask;
use cubecl_runtime::id::KernelId;
use cubecl_runtime::logging::ServerLogger;
use cudarc::driver::sys::CUtensorMap;
use std::sync::Arc;

use super::FrugalCudaServer;
use super::fence::Fence;
use crate::cuda::compile_pool::{CompilePool, CompileResult};
use crate::cuda::compile_waits::{CompileWaitCause, count_compile_wait};
use crate::cuda::compiler::Prepared;

/// Deferred launches at most; one more waits for the kernels before it.
pub(super) const MAX_DEFERRED: usize = 256;

/// One launch waiting for its kernel, or for the kernels of launches before it.
pub(super) struct DeferredLaunch {
    pub(super) kernel_id: KernelId,
    pub(super) name: &'static str,
    pub(super) dispatch: (u32, u32, u32),
    pub(super) tensor_maps: Vec<CUtensorMap>,
    /// The buffers' device addresses, in parameter order (a launch passes pointers to them).
    pub(super) addresses: Vec<u64>,
    /// Points into `arguments`' info block (a grid constant).
    pub(super) const_info: Option<*mut c_void>,
    /// Held until the launch: its buffers' memory stays allocated, and its info block backs
    /// `const_info`.
    pub(super) arguments: KernelArguments,
    /// The metadata buffer, held likewise.
    pub(super) info: Option<Binding>,
}

/// The deferred launches, the kernels compiling for them and the compile threads.
pub(super) struct Deferred {
    launches: VecDeque<DeferredLaunch>,
    compiling: HashMap<KernelId, Receiver<CompileResult>>,
    pool: CompilePool,
}

impl std::fmt::Debug for Deferred {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deferred")
            .field("launches", &self.launches.len())
            .field("compiling", &self.compiling.len())
            .field("pool", &self.pool)
            .finish()
    }
}

impl Deferred {
    pub(super) fn new() -> Self {
        Self {
            launches: VecDeque::new(),
            compiling: HashMap::new(),
            pool: CompilePool::from_env(),
        }
    }

    /// Whether no launch waits (the common case once a run's kernels are loaded).
    pub(super) fn is_empty(&self) -> bool {
        self.launches.is_empty()
    }
}

fn lost_compile(kernel_id: &KernelId) -> ServerError {
    ServerError::Generic {
        reason: format!(
            "frugal-cuda: the thread compiling kernel {kernel_id:?} stopped without a result \
             (it panicked); set FRUGAL_CUDA_COMPILE_THREADS=1 to compile on the server's thread"
        ),
        backtrace: BackTrace::capture(),
    }
}

impl FrugalCudaServer {
    /// Makes `kernel` ready: loaded (from the disk cache, or compiled here when compiling on
    /// one thread), or compiling on the pool. `Ok(true)` when it is loaded now.
    pub(super) fn prepare_kernel(
        &mut self,
        kernel_id: &KernelId,
        kernel: Box<dyn CubeTask<CudaCompiler>>,
        mode: ExecutionMode,
        logger: Arc<ServerLogger>,
    ) -> Result<bool, ServerError> {
        if self.ctx.is_loaded(kernel_id) {
            return Ok(true);
        }
        if self.deferred.compiling.contains_key(kernel_id) {
            return Ok(false);
        }
        if !self.deferred.pool.is_parallel() {
            self.ctx.compile(kernel_id, kernel, mode, logger)?;
            return Ok(true);
        }
        match self.ctx.prepare(kernel_id, kernel, mode, logger)? {
            Prepared::Loaded => Ok(true),
            Prepared::Job(job) => {
                let id = job.kernel_id().clone();
                let result = self.deferred.pool.submit(job);
                self.deferred.compiling.insert(id, result);
                Ok(false)
            }
        }
    }

    /// Queues `launch` behind the launches already deferred, then launches what is ready.
    pub(super) fn defer(&mut self, launch: DeferredLaunch) {
        self.deferred.launches.push_back(launch);
        let full = self.deferred.launches.len() > MAX_DEFERRED;
        self.launch_deferred(full.then_some(CompileWaitCause::QueueFull));
    }

    /// Launches the deferred launches in order while their kernels are loaded; with `wait`
    /// (what needs them launched), waits for each kernel still compiling, so that none is left.
    pub(super) fn launch_deferred(&mut self, wait: Option<CompileWaitCause>) {
        while let Some(front) = self.deferred.launches.front() {
            if !self.ctx.is_loaded(&front.kernel_id) {
                let id = front.kernel_id.clone();
                let Some(result) = self.deferred.compiling.get(&id) else {
                    // Its compilation failed (recorded) at an earlier launch of it.
                    self.deferred.launches.pop_front();
                    continue;
                };
                let compiled = if let Some(cause) = wait {
                    let started = Instant::now();
                    let compiled = result.recv().map_err(|_| lost_compile(&id));
                    count_compile_wait(cause, started.elapsed());
                    compiled
                } else {
                    match result.try_recv() {
                        Ok(compiled) => Ok(compiled),
                        Err(TryRecvError::Empty) => return,
                        Err(TryRecvError::Disconnected) => Err(lost_compile(&id)),
                    }
                };
                self.deferred.compiling.remove(&id);
                let loaded = compiled.and_then(|compiled| {
                    compiled
                        .map_err(ServerError::from)
                        .and_then(|image| self.ctx.finish(image).map_err(ServerError::from))
                });
                if let Err(e) = loaded {
                    self.record(e);
                    self.deferred.launches.pop_front();
                    continue;
                }
            }
            let DeferredLaunch {
                kernel_id,
                name,
                dispatch,
                tensor_maps,
                addresses,
                const_info,
                arguments,
                info,
            } = self
                .deferred
                .launches
                .pop_front()
                .expect("the front launch is there");
            let buffers = addresses
                .iter()
                .map(|address| address as *const u64 as *mut c_void);
            self.launch_loaded(
                &kernel_id,
                name,
                dispatch,
                &tensor_maps,
                buffers,
                const_info,
            );
            // Queued now: later work on the stream comes after it, so the memory may go.
            drop((arguments, info));
        }
    }

    /// Launches a loaded kernel on the stream, timed; a failed launch is recorded.
    pub(super) fn launch_loaded(
        &mut self,
        kernel_id: &KernelId,
        name: &'static str,
        dispatch: (u32, u32, u32),
        tensor_maps: &[CUtensorMap],
        buffers: impl IntoIterator<Item = *mut c_void>,
        const_info: Option<*mut c_void>,
    ) {
        let started = self.timer.start(self.stream);
        let launched = self.ctx.launch(
            self.stream,
            kernel_id,
            dispatch,
            tensor_maps,
            buffers,
            const_info,
        );
        self.timer.finish(name, started, self.stream);
        if self.drop_queue.should_flush() {
            let stream = self.stream;
            self.drop_queue.flush(|| Fence::new(stream));
        }
        if let Err(e) = launched {
            if self.ctx.timestamps.is_empty() {
                self.record(e.into());
            } else {
                self.ctx.timestamps.error(ProfileError::Launch(e));
            }
        }
    }
}
