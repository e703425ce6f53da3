//! [`Fence`]: an event recorded on a stream, for the host to wait on or another stream to wait
//! for. Syncs, reads, flushes and the drop queue of upload buffers (flushed by launches too) all
//! wait on one, and the collectives order their stream against the compute stream with them, so
//! it sits apart from any of them.

use cubecl_common::backtrace::BackTrace;
use cubecl_core::server::ServerError;
use cubecl_runtime::memory_management::drop_queue;
use cudarc::driver::sys::{CUevent_flags, CUevent_st, CUevent_wait_flags, CUstream};

/// An event recorded on a stream, to wait for everything queued before it.
#[derive(Debug)]
pub(super) struct Fence {
    event: *mut CUevent_st,
}

// SAFETY: the event is destroyed exactly once, by the consuming wait or `discard`; streams are
// never closed.
unsafe impl Send for Fence {}

impl Fence {
    pub(super) fn new(stream: CUstream) -> Self {
        // SAFETY: the stream is the server's, alive for the process.
        unsafe {
            let event =
                cudarc::driver::result::event::create(CUevent_flags::CU_EVENT_DEFAULT).unwrap();
            cudarc::driver::result::event::record(event, stream).unwrap();
            Self { event }
        }
    }

    pub(super) fn wait_sync(self) -> Result<(), ServerError> {
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

    /// Whether the stream has passed the event, without waiting. A failed query (a broken
    /// context) counts as passed: the error itself comes back from the next sync.
    pub(super) fn passed(&self) -> bool {
        // SAFETY: the event was created and recorded by `new` and is not destroyed yet.
        let queried = unsafe { cudarc::driver::result::event::query(self.event) };
        !matches!(
            queried,
            Err(cudarc::driver::DriverError(
                cudarc::driver::sys::CUresult::CUDA_ERROR_NOT_READY
            ))
        )
    }

    /// Destroys the event without waiting for it, where something else already orders what
    /// follows after it (the driver releases it once the stream passes it).
    pub(super) fn discard(self) {
        // SAFETY: created by `new`, consumed here.
        unsafe {
            let _ = cudarc::driver::result::event::destroy(self.event);
        }
    }

    /// Makes `stream` wait, on the device, for everything queued before the event.
    pub(super) fn wait_async(self, stream: CUstream) {
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
