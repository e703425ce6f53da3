//! Device memory from the CUDA driver: the [`DeviceMemory`] the caching allocator runs on, and
//! page-locked host memory for transfers.

use std::collections::{HashMap, VecDeque};
use std::ffi::c_void;
use std::time::Instant;

use cubecl_common::backtrace::BackTrace;
use cubecl_common::bytes::{AllocationController, AllocationProperty};
use cubecl_runtime::memory_management::ManagedMemoryBinding;
use cubecl_runtime::server::IoError;
use cubecl_runtime::storage::{ComputeStorage, StorageHandle, StorageId, StorageUtilization};
use cudarc::driver::sys::{
    self, CUdevice, CUdeviceptr, CUevent, CUmemAccessDesc, CUmemAllocationProp,
    CUmemGenericAllocationHandle, CUmemLocation, CUresult, CUstream,
};

use crate::allocator::{DeviceError, DeviceMemory, DeviceTimes};
use crate::host_pages::{FaultedPages, touch_threads};

fn check(result: CUresult, call: &'static str, requested: u64) -> Result<(), DeviceError> {
    match result {
        CUresult::CUDA_SUCCESS => Ok(()),
        CUresult::CUDA_ERROR_OUT_OF_MEMORY => Err(DeviceError::OutOfMemory { requested }),
        CUresult::CUDA_ERROR_NOT_SUPPORTED => Err(DeviceError::Unsupported(call)),
        other => Err(DeviceError::Invalid(format!("{call} failed: {other:?}"))),
    }
}

fn device_location(ordinal: i32) -> CUmemLocation {
    // SAFETY: `CUmemLocation` is plain old data, valid when zeroed.
    let mut location: CUmemLocation = unsafe { std::mem::zeroed() };
    location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    // The device ordinal is a plain field before CUDA 13.2 and the first member of a union
    // after it; both sit right after the 4-byte type, so write it there whatever the bindings.
    // SAFETY: offset 4 is inside the 8-byte struct and holds a C int in every version.
    unsafe {
        let id = (&mut location as *mut CUmemLocation as *mut u8).add(4) as *mut i32;
        id.write_unaligned(ordinal);
    }
    location
}

/// [`DeviceMemory`] of one CUDA device, through the driver API: `cuMemAlloc`/`cuMemFree` for
/// plain segments and the virtual-memory calls for expandable ones (one physical allocation per
/// granule, as PyTorch does, so any granule-aligned part of a mapping can be unmapped). Its
/// granule, the one [`DeviceMemory::granularity`] reports, is the map unit: 4 MiB unless
/// `FRUGAL_CUDA_MAP_UNIT_MIB` sets another number of MiB (0: the driver's granularity), rounded
/// up to a power of two no smaller than the driver's own granularity.
///
/// Memory is only returned to the driver for blocks no tensor holds, but kernels queued before
/// the last free may still read it. `free` synchronises the context first (it is rare). An
/// unmapped granule, once the stream is known ([`Self::set_stream`]), is *retired* instead: it
/// stays mapped at its old address until an event recorded on the stream at the unmap has
/// passed, and meanwhile its physical memory backs the next granule mapped elsewhere. Work on
/// the one stream runs in order, so the new mapping is only written after every kernel that
/// used the old one, as when a freed block is reused; and no `unmap` waits for the device.
/// Giving back memory to map it elsewhere, which a growth limit does every step, then costs
/// no synchronisation and no new physical allocation.
#[derive(Debug)]
pub struct CudaDeviceMemory {
    ordinal: i32,
    total: u64,
    vmm: bool,
    granularity: u64,
    /// Physical allocation handle of each mapped granule, by device address.
    granules: HashMap<CUdeviceptr, CUmemGenericAllocationHandle>,
    /// The stream kernels run on, on which retirements are fenced (`None`: unmaps
    /// synchronise).
    stream: Option<CUstream>,
    /// Granules unmapped by the allocator but still mapped in the driver, oldest first.
    retired: VecDeque<Retirement>,
    /// Time spent in the driver here.
    times: DeviceTimes,
}

/// Granules one `unmap` retired, and the event after which nothing reads them.
#[derive(Debug)]
struct Retirement {
    event: CUevent,
    granules: Vec<RetiredGranule>,
}

/// A granule still mapped at `address`, whose physical memory may already back another.
#[derive(Debug)]
struct RetiredGranule {
    address: CUdeviceptr,
    handle: CUmemGenericAllocationHandle,
    /// Its physical memory now backs another granule (it must not be released).
    reused: bool,
}

// SAFETY: handles and addresses are plain integers owned by this value; the server that owns it
// is used from one thread at a time.
unsafe impl Send for CudaDeviceMemory {}

impl CudaDeviceMemory {
    /// The memory of `device` (the current context must be that device's primary context).
    pub fn new(device: CUdevice, ordinal: i32) -> Result<Self, DeviceError> {
        // SAFETY: read-only queries of a valid device handle.
        let (total, vmm) = unsafe {
            let mut total = 0usize;
            check(
                sys::cuDeviceTotalMem_v2(&mut total, device),
                "cuDeviceTotalMem",
                0,
            )?;
            let vmm = cudarc::driver::result::device::get_attribute(
                device,
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
            )
            .map(|v| v != 0)
            .unwrap_or(false);
            (total as u64, vmm)
        };
        let mut memory = Self {
            ordinal,
            total,
            vmm,
            granularity: 2 << 20,
            granules: HashMap::new(),
            stream: None,
            retired: VecDeque::new(),
            times: DeviceTimes::default(),
        };
        if vmm {
            let prop = memory.allocation_prop();
            let mut granularity = 0usize;
            // SAFETY: `prop` describes pinned device memory of this device.
            let result = unsafe {
                sys::cuMemGetAllocationGranularity(
                    &mut granularity,
                    &prop,
                    sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
                )
            };
            match check(result, "cuMemGetAllocationGranularity", 0) {
                Ok(()) if granularity > 0 => {
                    let setting = std::env::var("FRUGAL_CUDA_MAP_UNIT_MIB").ok();
                    memory.granularity = map_unit(setting.as_deref(), granularity as u64);
                }
                _ => memory.vmm = false,
            }
        }
        Ok(memory)
    }

    fn allocation_prop(&self) -> CUmemAllocationProp {
        // SAFETY: plain old data, valid when zeroed (no handle types, no flags).
        let mut prop: CUmemAllocationProp = unsafe { std::mem::zeroed() };
        prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location = device_location(self.ordinal);
        prop
    }

    fn synchronize(&mut self) -> Result<(), DeviceError> {
        let start = Instant::now();
        // SAFETY: the device's context is current on the server's thread.
        let result = check(unsafe { sys::cuCtxSynchronize() }, "cuCtxSynchronize", 0);
        self.times.waits.add(start.elapsed());
        result
    }

    /// The stream all of this device's kernels and copies run on: from then on unmapped
    /// granules are retired behind an event on it instead of synchronising the device.
    pub fn set_stream(&mut self, stream: CUstream) {
        self.stream = Some(stream);
    }

    /// An event recorded on the stream now, after which nothing queued so far runs (`None`
    /// before the stream is known).
    fn fence(&mut self) -> Result<Option<CUevent>, DeviceError> {
        let Some(stream) = self.stream else {
            return Ok(None);
        };
        let mut event: CUevent = std::ptr::null_mut();
        // SAFETY: creates and records one event on the server's live stream.
        unsafe {
            check(
                sys::cuEventCreate(
                    &mut event,
                    sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32,
                ),
                "cuEventCreate",
                0,
            )?;
            check(sys::cuEventRecord(event, stream), "cuEventRecord", 0)?;
        }
        Ok(Some(event))
    }

    /// Unmaps the retired granules whose event has passed (all of them, waiting, with
    /// `wait`), releasing the physical memory of those not reused.
    fn collect_retired(&mut self, wait: bool) -> Result<(), DeviceError> {
        let through = if wait { self.retired.len() } else { 0 };
        self.collect_retired_through(through)
    }

    /// Unmaps the retired granules whose event has passed, waiting for the device until the
    /// first `wait_for` retirements have passed (events on one stream pass in order, so
    /// waiting for the last of them is enough), and releases the physical memory of those
    /// not reused.
    fn collect_retired_through(&mut self, wait_for: usize) -> Result<(), DeviceError> {
        if wait_for > 0
            && let Some(last) = self.retired.get(wait_for - 1)
        {
            let start = Instant::now();
            // SAFETY: the event was created and recorded by `unmap` and not destroyed yet.
            let result = unsafe { sys::cuEventSynchronize(last.event) };
            self.times.waits.add(start.elapsed());
            check(result, "cuEventSynchronize", 0)?;
        }
        while let Some(front) = self.retired.front() {
            // SAFETY: as above.
            match unsafe { sys::cuEventQuery(front.event) } {
                CUresult::CUDA_SUCCESS => {}
                CUresult::CUDA_ERROR_NOT_READY => return Ok(()),
                other => check(other, "cuEventQuery", 0)?,
            }
            let Some(retirement) = self.retired.pop_front() else {
                break;
            };
            let start = Instant::now();
            // SAFETY: the event passed: nothing queued before the unmap reads these granules.
            unsafe {
                let _ = sys::cuEventDestroy_v2(retirement.event);
                for granule in retirement.granules {
                    check(
                        sys::cuMemUnmap(granule.address, self.granularity as usize),
                        "cuMemUnmap",
                        0,
                    )?;
                    if !granule.reused {
                        check(sys::cuMemRelease(granule.handle), "cuMemRelease", 0)?;
                    }
                }
            }
            self.times.unmaps.add(start.elapsed());
        }
        Ok(())
    }

    /// A physical granule for `address`: the one still retired there if its memory is free
    /// (`true`: it is mapped already), else a retired granule's memory not reused yet, else a
    /// new one (`cuMemCreate`, after waiting for the retired granules if the device is full).
    fn granule_for(
        &mut self,
        address: CUdeviceptr,
        requested: u64,
    ) -> Result<(CUmemGenericAllocationHandle, bool), DeviceError> {
        let here = self
            .retired
            .iter()
            .position(|r| r.granules.iter().any(|g| g.address == address && !g.reused));
        if let Some(at) = here {
            let granules = &mut self.retired[at].granules;
            let index = granules
                .iter()
                .position(|g| g.address == address && !g.reused)
                .unwrap_or(0);
            return Ok((granules.swap_remove(index).handle, true));
        }
        // The address is still mapped to memory that now backs another granule: unmap it once
        // the work queued before it was retired has run (not all the work queued since).
        if let Some(at) = self
            .retired
            .iter()
            .position(|r| r.granules.iter().any(|g| g.address == address))
        {
            self.collect_retired_through(at + 1)?;
        }
        for retirement in self.retired.iter_mut() {
            if let Some(granule) = retirement.granules.iter_mut().find(|g| !g.reused) {
                granule.reused = true;
                return Ok((granule.handle, false));
            }
        }
        let prop = self.allocation_prop();
        let mut handle: CUmemGenericAllocationHandle = 0;
        // SAFETY: `prop` is valid; writes one handle on success.
        let mut result =
            unsafe { sys::cuMemCreate(&mut handle, self.granularity as usize, &prop, 0) };
        if result == CUresult::CUDA_ERROR_OUT_OF_MEMORY && !self.retired.is_empty() {
            self.collect_retired(true)?;
            // SAFETY: as above.
            result = unsafe { sys::cuMemCreate(&mut handle, self.granularity as usize, &prop, 0) };
        }
        check(result, "cuMemCreate", requested)?;
        Ok((handle, false))
    }
}

impl DeviceMemory for CudaDeviceMemory {
    fn total_memory(&self) -> u64 {
        self.total
    }

    fn times(&self) -> DeviceTimes {
        self.times
    }

    fn alloc(&mut self, size: u64) -> Result<u64, DeviceError> {
        let mut ptr: CUdeviceptr = 0;
        // SAFETY: writes one device pointer on success.
        check(
            unsafe { sys::cuMemAlloc_v2(&mut ptr, size as usize) },
            "cuMemAlloc",
            size,
        )?;
        Ok(ptr)
    }

    fn free(&mut self, address: u64, _size: u64) -> Result<(), DeviceError> {
        // `cuMemFree` synchronises anyway; waiting first makes the wait explicit and counted.
        self.synchronize()?;
        // SAFETY: `address` came from `alloc` and no block in it is live.
        check(unsafe { sys::cuMemFree_v2(address) }, "cuMemFree", 0)
    }

    fn supports_vmm(&self) -> bool {
        self.vmm
    }

    fn idle(&self) -> bool {
        let Some(stream) = self.stream else {
            return true;
        };
        // SAFETY: the server's stream lives as long as the server that owns this memory.
        let queried = unsafe { cudarc::driver::sys::cuStreamQuery(stream) };
        queried != CUresult::CUDA_ERROR_NOT_READY
    }

    fn granularity(&self) -> u64 {
        self.granularity
    }

    fn reserve(&mut self, size: u64) -> Result<u64, DeviceError> {
        let mut base: CUdeviceptr = 0;
        // SAFETY: reserves address space only; writes the base on success.
        check(
            unsafe {
                sys::cuMemAddressReserve(&mut base, size as usize, self.granularity as usize, 0, 0)
            },
            "cuMemAddressReserve",
            size,
        )?;
        Ok(base)
    }

    fn release(&mut self, base: u64, size: u64) -> Result<(), DeviceError> {
        if self.retired.iter().any(|r| {
            r.granules
                .iter()
                .any(|g| (base..base + size).contains(&g.address))
        }) {
            self.collect_retired(true)?;
        }
        // SAFETY: the whole reservation was unmapped by the allocator before.
        check(
            unsafe { sys::cuMemAddressFree(base, size as usize) },
            "cuMemAddressFree",
            0,
        )
    }

    fn map(&mut self, base: u64, offset: u64, size: u64) -> Result<(), DeviceError> {
        self.collect_retired(false)?;
        let started = Instant::now();
        let result = self.map_granules(base, offset, size);
        self.times.maps.add(started.elapsed());
        result
    }

    fn unmap(&mut self, base: u64, offset: u64, size: u64) -> Result<(), DeviceError> {
        self.collect_retired(false)?;
        let start = base + offset;
        let addresses = (start..start + size).step_by(self.granularity as usize);
        if let Some(event) = self.fence()? {
            let granules = addresses
                .filter_map(|address| {
                    let handle = self.granules.remove(&address)?;
                    Some(RetiredGranule {
                        address,
                        handle,
                        reused: false,
                    })
                })
                .collect();
            self.retired.push_back(Retirement { event, granules });
            return Ok(());
        }
        self.synchronize()?;
        let started = Instant::now();
        // One granule at a time: `cuMemUnmap` takes whole ranges of one `cuMemMap`, and each
        // granule was mapped on its own.
        for address in addresses {
            // SAFETY: the granule is mapped by `map` and holds no live block.
            check(
                unsafe { sys::cuMemUnmap(address, self.granularity as usize) },
                "cuMemUnmap",
                0,
            )?;
            if let Some(handle) = self.granules.remove(&address) {
                // SAFETY: the granule's mapping is gone; releasing frees its memory.
                check(unsafe { sys::cuMemRelease(handle) }, "cuMemRelease", 0)?;
            }
        }
        self.times.unmaps.add(started.elapsed());
        Ok(())
    }
}

impl CudaDeviceMemory {
    /// [`DeviceMemory::map`] without the bookkeeping: a physical granule for each granule of
    /// the range, mapped, then access granted to the whole range at once.
    fn map_granules(&mut self, base: u64, offset: u64, size: u64) -> Result<(), DeviceError> {
        let start = base + offset;
        let mut mapped = 0u64;
        let mut failure = None;
        while mapped < size {
            let address = start + mapped;
            let (handle, in_place) = match self.granule_for(address, size) {
                Ok(granule) => granule,
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            };
            if !in_place {
                // SAFETY: the granule range lies inside a reservation of ours and is not
                // mapped (the allocator's contract, and `granule_for` unmapped a retired one).
                let result =
                    unsafe { sys::cuMemMap(address, self.granularity as usize, 0, handle, 0) };
                if let Err(e) = check(result, "cuMemMap", size) {
                    // A handle that backs nothing else goes back to the driver.
                    let shared = self
                        .retired
                        .iter()
                        .any(|r| r.granules.iter().any(|g| g.handle == handle));
                    if !shared {
                        // SAFETY: the handle is ours and mapped nowhere.
                        unsafe { sys::cuMemRelease(handle) };
                    }
                    failure = Some(e);
                    break;
                }
            }
            self.granules.insert(address, handle);
            mapped += self.granularity;
        }
        if failure.is_none() {
            let access = CUmemAccessDesc {
                location: device_location(self.ordinal),
                flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            };
            // SAFETY: the whole range was just mapped.
            let result = unsafe { sys::cuMemSetAccess(start, size as usize, &access, 1) };
            if let Err(e) = check(result, "cuMemSetAccess", size) {
                failure = Some(e);
            }
        }
        match failure {
            None => Ok(()),
            Some(e) => {
                // Leave nothing half-mapped: the allocator treats a failed map as not done.
                if mapped > 0 {
                    let _ = self.unmap(base, offset, mapped);
                }
                Err(e)
            }
        }
    }
}

/// The map unit, in MiB, of expandable segments unless `FRUGAL_CUDA_MAP_UNIT_MIB` says
/// otherwise (see [`map_unit`]).
pub const DEFAULT_MAP_UNIT_MIB: u64 = 4;

/// The unit in which expandable segments map and unmap physical memory: `setting` MiB
/// (`FRUGAL_CUDA_MAP_UNIT_MIB`; [`DEFAULT_MAP_UNIT_MIB`] when unset, the driver's granularity
/// when 0), rounded up to a power of two no smaller than `driver_granularity` (the driver
/// reserves address ranges at power-of-two alignments). An unparsable setting is reported and
/// the default used.
///
/// Under a growth limit the allocator moves physical memory between addresses every step, and
/// each unit moved costs a `cuMemMap`, later a `cuMemUnmap` and `cuMemRelease`, on the thread
/// that launches the kernels (see `docs/results.md` for what that costs a step). A larger unit
/// makes fewer calls, but holes between live blocks are given back only in whole units, so
/// reserved bytes end a little higher.
pub fn map_unit(setting: Option<&str>, driver_granularity: u64) -> u64 {
    let mib = match setting.map(|s| (s, s.trim().parse::<u64>())) {
        None => DEFAULT_MAP_UNIT_MIB,
        Some((_, Ok(mib))) => mib,
        Some((value, Err(_))) => {
            log::warn!(
                "FRUGAL_CUDA_MAP_UNIT_MIB={value:?} ignored: expected a whole number of MiB (0: \
                 the driver's granularity); using {DEFAULT_MAP_UNIT_MIB} MiB"
            );
            DEFAULT_MAP_UNIT_MIB
        }
    };
    mib.saturating_mul(1 << 20)
        .max(driver_granularity)
        .checked_next_power_of_two()
        .unwrap_or(driver_granularity)
}

/// Alignment of pinned host buffers.
pub const PINNED_ALIGNMENT: usize = 16;

/// Page-locked host memory for the staging buffers of transfers and the host copies of
/// offloaded tensors; kept in CubeCL's own pools, since host memory is not what this crate
/// economises. A new buffer is faulted in on several threads and then registered with the
/// driver (`host_pages`: several times faster than `cuMemAllocHost`, which faults the pages in
/// one after another); where registration fails, `cuMemAllocHost` makes it.
#[derive(Default)]
pub struct PinnedStorage {
    memory: HashMap<StorageId, PinnedAllocation>,
}

/// How one pinned buffer was made, which says how it is given back.
enum PinnedAllocation {
    /// Faulted-in host pages registered with `cuMemHostRegister`.
    Registered(FaultedPages),
    /// A `cuMemAllocHost` buffer.
    Driver(*mut c_void),
}

impl PinnedAllocation {
    fn ptr(&self) -> *mut u8 {
        match self {
            Self::Registered(pages) => pages.as_ptr(),
            Self::Driver(ptr) => ptr.cast(),
        }
    }

    /// Registered host pages of `size` bytes, if the host has them and the driver pins them.
    fn register(size: usize) -> Option<Self> {
        let pages = FaultedPages::new(size, touch_threads())?;
        // SAFETY: the range is a live host allocation of `pages.len()` bytes, unregistered
        // before it is freed (`Drop`).
        let result = unsafe {
            sys::cuMemHostRegister_v2(
                pages.as_ptr().cast(),
                pages.len(),
                sys::CU_MEMHOSTREGISTER_PORTABLE,
            )
        };
        (result == CUresult::CUDA_SUCCESS).then_some(Self::Registered(pages))
    }
}

impl Drop for PinnedAllocation {
    fn drop(&mut self) {
        // SAFETY: each pointer came from the call its variant names and is given back once,
        // when CubeCL no longer references the buffer.
        unsafe {
            match self {
                Self::Registered(pages) => {
                    sys::cuMemHostUnregister(pages.as_ptr().cast());
                }
                Self::Driver(ptr) => {
                    sys::cuMemFreeHost(*ptr);
                }
            }
        }
    }
}

// SAFETY: the buffers are page-locked host allocations owned by this storage; the server that
// owns it is used from one thread at a time.
unsafe impl Send for PinnedStorage {}

impl std::fmt::Debug for PinnedStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedStorage")
            .field("buffers", &self.memory.len())
            .finish()
    }
}

/// A pinned host buffer.
#[derive(Debug)]
pub struct PinnedResource {
    /// First byte.
    pub ptr: *mut u8,
    /// Length in bytes.
    pub size: usize,
}

// SAFETY: page-locked host memory is valid from any thread while its storage lives.
unsafe impl Send for PinnedResource {}

impl ComputeStorage for PinnedStorage {
    type Resource = PinnedResource;

    fn alignment(&self) -> usize {
        PINNED_ALIGNMENT
    }

    fn get(&mut self, handle: &StorageHandle) -> PinnedResource {
        let base = self
            .memory
            .get(&handle.id)
            .expect("frugal-cuda: pinned storage handle without memory")
            .ptr();
        PinnedResource {
            // SAFETY: CubeCL's handle lies inside the allocation it was carved from.
            ptr: unsafe { base.add(handle.offset() as usize) },
            size: handle.size() as usize,
        }
    }

    fn alloc(&mut self, size: u64) -> Result<StorageHandle, IoError> {
        let allocation = match PinnedAllocation::register(size as usize) {
            Some(registered) => registered,
            None => {
                let mut ptr: *mut c_void = std::ptr::null_mut();
                // SAFETY: writes one host pointer on success.
                let result = unsafe { sys::cuMemAllocHost_v2(&mut ptr, size as usize) };
                if result != CUresult::CUDA_SUCCESS {
                    return Err(IoError::Unknown {
                        description: format!("cuMemAllocHost of {size} B failed: {result:?}"),
                        backtrace: BackTrace::capture(),
                    });
                }
                PinnedAllocation::Driver(ptr)
            }
        };
        let id = StorageId::new();
        self.memory.insert(id, allocation);
        Ok(StorageHandle::new(
            id,
            StorageUtilization { offset: 0, size },
        ))
    }

    fn dealloc(&mut self, id: StorageId) {
        self.memory.remove(&id);
    }

    fn flush(&mut self) {}
}

/// Keeps a pinned staging buffer's slot alive for as long as the `Bytes` built on it live.
pub struct PinnedBytesController {
    resource: PinnedResource,
    _binding: ManagedMemoryBinding,
}

impl PinnedBytesController {
    /// A controller for `resource`, holding `binding` so CubeCL does not reuse the slot.
    pub fn new(binding: ManagedMemoryBinding, resource: PinnedResource) -> Self {
        Self {
            resource,
            _binding: binding,
        }
    }
}

impl AllocationController for PinnedBytesController {
    fn alloc_align(&self) -> usize {
        PINNED_ALIGNMENT
    }

    unsafe fn memory_mut(&mut self) -> &mut [std::mem::MaybeUninit<u8>] {
        // SAFETY: the slot is held by `_binding`, so `size` bytes at `ptr` stay ours.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.resource.ptr as *mut std::mem::MaybeUninit<u8>,
                self.resource.size,
            )
        }
    }

    fn memory(&self) -> &[std::mem::MaybeUninit<u8>] {
        // SAFETY: as above.
        unsafe {
            std::slice::from_raw_parts(
                self.resource.ptr as *const std::mem::MaybeUninit<u8>,
                self.resource.size,
            )
        }
    }

    fn property(&self) -> AllocationProperty {
        AllocationProperty::Pinned
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DRIVER: u64 = 2 << 20;

    #[test]
    fn the_map_unit_is_a_power_of_two_no_smaller_than_the_driver_granularity() {
        assert_eq!(map_unit(None, DRIVER), DEFAULT_MAP_UNIT_MIB << 20);
        assert_eq!(map_unit(Some("0"), DRIVER), DRIVER);
        assert_eq!(map_unit(Some("1"), DRIVER), DRIVER);
        assert_eq!(map_unit(Some(" 8 "), DRIVER), 8 << 20);
        assert_eq!(
            map_unit(Some("20"), DRIVER),
            32 << 20,
            "20 MiB is no alignment"
        );
        assert_eq!(map_unit(Some("four"), DRIVER), DEFAULT_MAP_UNIT_MIB << 20);
        assert_eq!(map_unit(Some("4"), 64 << 20), 64 << 20);
        assert_eq!(map_unit(Some(&u64::MAX.to_string()), DRIVER), DRIVER);
    }
}
