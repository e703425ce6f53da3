//! The side channel of the public memory API ([`crate::cuda::set_memory_cap`],
//! [`crate::cuda::memory_report`], ...): requests queued in [`MemoryControl`] from any thread,
//! applied by the server when it next enters, and what it publishes back. Its own file because
//! it is the one part of the server that other threads touch.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use cubecl_runtime::memory_management::MemoryUsage;

use super::FrugalCudaServer;
use crate::allocator::{AllocError, History, OomInfo, Stats};
use crate::cuda::launch_timing::LaunchTimings;
use crate::storage::{RegistryCounters, TraceEvent};

/// A change asked for from outside the server, applied at its next allocation or usage query.
pub(crate) enum ControlRequest {
    Cap(Option<u64>),
    GrowthLimit(Option<u64>),
    MissTimeShare(Option<f64>),
    /// A training step begins, settled or not (see `HandleRegistry::mark_step`).
    MarkStep(bool),
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

/// Shared between the server and the public API ([`crate::cuda::memory_report`],
/// [`crate::cuda::set_memory_cap`], ...): requests go in, reports come out. The flag keeps the
/// server's per-allocation check to one relaxed load.
#[derive(Default)]
pub struct MemoryControl {
    pub(super) pending: AtomicBool,
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

impl FrugalCudaServer {
    pub(super) fn apply_requests(&mut self) {
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
                ControlRequest::MissTimeShare(share) => {
                    self.memory.set_miss_time_share(share);
                    Ok(())
                }
                ControlRequest::MarkStep(settled) => {
                    self.memory.mark_step(settled);
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

    pub(super) fn publish_report(&mut self) -> MemoryUsage {
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
}
