//! # frugal-cuda
//!
//! The device-memory side of Frugal's planned CUDA runtime (issue 6).
//!
//! What exists today is the **caching allocator** ([`allocator`]), written so that its whole
//! logic runs and is tested without a GPU:
//!
//! - [`allocator::CachingAllocator`]: size rounding, best fit over cached free blocks, block
//!   splitting and coalescing, separate small and large pools, expandable segments (one virtual
//!   range per segment, physical granules mapped as it grows), a hard byte cap changeable at run
//!   time, an out-of-memory callback tried before failing, and statistics;
//! - [`allocator::DeviceMemory`]: the handful of raw driver operations the allocator needs
//!   (plain segment allocation and the virtual-memory calls), so that a CUDA implementation can
//!   be slotted in later;
//! - [`allocator::SimulatedDevice`]: a bookkeeping-only device (addresses are plain numbers, no
//!   memory is touched) with an optional physical capacity, used by the tests to exercise growth,
//!   release and driver out-of-memory.
//!
//! What does **not** exist yet: the CubeCL `Runtime` for NVIDIA GPUs, the CUDA implementation
//! of [`allocator::DeviceMemory`] (through cudarc's driver API), and the `ComputeStorage`
//! wrapper that hands the allocator's blocks to CubeCL's memory management. The allocator's API
//! is shaped for that wrapper: [`allocator::CachingAllocator::alloc`] returns a block handle
//! carrying `(segment, offset, size)` and its device address,
//! [`allocator::CachingAllocator::dealloc`] gives it back, [`allocator::CachingAllocator::flush`]
//! processes frees queued from elsewhere, and [`allocator::ALIGNMENT`] is the alignment every
//! block honours.

#![warn(missing_docs)]

pub mod allocator;
