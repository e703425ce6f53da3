//! The raw device operations the caching allocator is built on, and a simulated device.
//!
//! [`DeviceMemory`] is the boundary between the allocator's logic and the driver: a CUDA
//! implementation maps each method onto one or two driver calls (listed on each method), while
//! [`SimulatedDevice`] only keeps books, which is enough to test every path of the allocator,
//! driver out-of-memory included, on a machine without a GPU.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::Serialize;

/// Why a device operation failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceError {
    /// Not enough physical memory (`CUDA_ERROR_OUT_OF_MEMORY`). The allocator answers this by
    /// releasing cached memory and retrying.
    OutOfMemory {
        /// Bytes the failed call asked for.
        requested: u64,
    },
    /// The device cannot do this (for example virtual memory management on a device without it).
    Unsupported(&'static str),
    /// Any other failure: arguments the device did not hand out, or a driver error.
    Invalid(String),
}

impl fmt::Display for DeviceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceError::OutOfMemory { requested } => {
                write!(f, "device out of memory ({requested} B requested)")
            }
            DeviceError::Unsupported(what) => write!(f, "not supported by the device: {what}"),
            DeviceError::Invalid(what) => write!(f, "invalid device operation: {what}"),
        }
    }
}

impl std::error::Error for DeviceError {}

/// The driver operations the caching allocator needs. Addresses are device virtual addresses.
///
/// Releasing physical memory (`free`, `unmap`) while kernels may still use it is the
/// implementation's concern: a CUDA implementation synchronises its stream first. The allocator
/// only calls them for memory in no live block.
pub trait DeviceMemory {
    /// Total physical memory of the device, used as the default virtual range of an expandable
    /// segment (`cuDeviceTotalMem`).
    fn total_memory(&self) -> u64;

    /// Allocates a plain segment of `size` bytes (`cuMemAlloc`), returning its address, which
    /// must be aligned to at least [`super::ALIGNMENT`].
    fn alloc(&mut self, size: u64) -> Result<u64, DeviceError>;

    /// Frees a plain segment returned by [`Self::alloc`] with the same size (`cuMemFree`).
    fn free(&mut self, address: u64, size: u64) -> Result<(), DeviceError>;

    /// Whether virtual memory management (reserve/map/unmap) is available
    /// (`CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED`).
    fn supports_vmm(&self) -> bool;

    /// Whether the device has run all the work queued on it (`cuStreamQuery`): host time spent
    /// while it is idle delays that work, host time while it is busy is hidden behind it.
    fn idle(&self) -> bool {
        true
    }

    /// Size of a physical granule (`cuMemGetAllocationGranularity`, typically 2 MiB): every
    /// reservation, mapping and unmapping is a multiple of it.
    fn granularity(&self) -> u64;

    /// Reserves `size` bytes of virtual address space with no memory behind it
    /// (`cuMemAddressReserve`), returning its base address.
    fn reserve(&mut self, size: u64) -> Result<u64, DeviceError>;

    /// Releases a reservation made by [`Self::reserve`] (`cuMemAddressFree`). Everything in it
    /// has been unmapped by then.
    fn release(&mut self, base: u64, size: u64) -> Result<(), DeviceError>;

    /// Backs `[base + offset, base + offset + size)` of a reservation with new physical memory
    /// and makes it accessible (`cuMemCreate` + `cuMemMap` + `cuMemSetAccess`). The range is
    /// granule-aligned and not mapped yet. The allocator later unmaps any granule-aligned part
    /// of what it mapped, not necessarily whole ranges of one call, so a CUDA implementation
    /// should create one physical allocation per granule (as PyTorch does).
    fn map(&mut self, base: u64, offset: u64, size: u64) -> Result<(), DeviceError>;

    /// Unmaps `[base + offset, base + offset + size)` and frees the physical memory behind it
    /// (`cuMemUnmap` + `cuMemRelease`). The range is granule-aligned and fully mapped. An
    /// implementation may do so only once the device has run the work queued before, as long
    /// as the range can be mapped again at once and the memory serves the next [`Self::map`].
    fn unmap(&mut self, base: u64, offset: u64, size: u64) -> Result<(), DeviceError>;

    /// Time spent in driver calls here: waits for the device to finish queued work (before
    /// freeing memory it may still use), mappings and unmappings. Zero where nothing is timed.
    fn times(&self) -> DeviceTimes {
        DeviceTimes::default()
    }
}

/// Calls of one kind and the time they took.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct CallTime {
    /// Number of calls.
    pub count: u64,
    /// Time in them, in nanoseconds.
    pub nanos: u64,
}

impl CallTime {
    /// Counts one call of `elapsed`.
    pub fn add(&mut self, elapsed: std::time::Duration) {
        self.count += 1;
        self.nanos += elapsed.as_nanos().min(u64::MAX as u128) as u64;
    }

    /// The calls since `start`.
    pub fn since(&self, start: &Self) -> Self {
        Self {
            count: self.count.saturating_sub(start.count),
            nanos: self.nanos.saturating_sub(start.nanos),
        }
    }
}

/// Where a [`DeviceMemory`] spent its time in the driver. A wait lets the device's queue run
/// dry, so that work queued afterwards starts late; mappings and unmappings hold up the host
/// thread that queues the work.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct DeviceTimes {
    /// Waits for the device.
    pub waits: CallTime,
    /// Mappings of a range (`cuMemCreate`, `cuMemMap` and `cuMemSetAccess` together).
    pub maps: CallTime,
    /// Unmappings of retired granules (`cuMemUnmap` and `cuMemRelease`).
    pub unmaps: CallTime,
}

/// Calls made to a [`SimulatedDevice`], for tests that check how often the allocator went to
/// the driver.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct SimulatedDeviceCounters {
    /// Successful [`DeviceMemory::alloc`] calls.
    pub allocs: u64,
    /// Successful [`DeviceMemory::free`] calls.
    pub frees: u64,
    /// Successful [`DeviceMemory::reserve`] calls.
    pub reserves: u64,
    /// Successful [`DeviceMemory::release`] calls.
    pub releases: u64,
    /// Successful [`DeviceMemory::map`] calls.
    pub maps: u64,
    /// Successful [`DeviceMemory::unmap`] calls.
    pub unmaps: u64,
    /// Calls refused for lack of physical memory.
    pub out_of_memory: u64,
}

#[derive(Debug, Clone)]
struct Reservation {
    size: u64,
    /// Offsets of the mapped granules.
    mapped: BTreeSet<u64>,
}

/// A device that only keeps books: addresses are numbers handed out from a counter, nothing is
/// read or written. It checks every call as a driver would (freeing what was not allocated,
/// mapping twice, unmapping what is not mapped, unaligned ranges are all errors), so tests also
/// check that the allocator drives the device correctly, and it refuses physical memory above
/// its optional capacity, to simulate driver out-of-memory.
#[derive(Debug, Clone)]
pub struct SimulatedDevice {
    capacity: Option<u64>,
    total_memory: u64,
    granularity: u64,
    vmm: bool,
    next_address: u64,
    /// Plain allocations: address -> size.
    allocations: BTreeMap<u64, u64>,
    /// Reservations: base -> reservation.
    reservations: BTreeMap<u64, Reservation>,
    physical: u64,
    peak_physical: u64,
    counters: SimulatedDeviceCounters,
    /// What [`DeviceMemory::idle`] answers: `false` while [`Self::set_busy`] says so.
    busy: bool,
}

impl Default for SimulatedDevice {
    fn default() -> Self {
        Self::new()
    }
}

impl SimulatedDevice {
    /// A device with virtual memory management, 2 MiB granules, no capacity limit and a nominal
    /// 80 GiB of total memory (an H100's).
    pub fn new() -> Self {
        Self {
            capacity: None,
            total_memory: 80 << 30,
            granularity: 2 << 20,
            vmm: true,
            // Start well away from zero so a null address is never handed out.
            next_address: 1 << 40,
            allocations: BTreeMap::new(),
            reservations: BTreeMap::new(),
            physical: 0,
            peak_physical: 0,
            counters: SimulatedDeviceCounters::default(),
            busy: false,
        }
    }

    /// Makes [`DeviceMemory::idle`] answer `!busy`: a device with work queued, or none.
    pub fn set_busy(&mut self, busy: bool) {
        self.busy = busy;
    }

    /// Limits physical memory to `bytes` (also the reported total memory).
    pub fn with_capacity(mut self, bytes: u64) -> Self {
        self.capacity = Some(bytes);
        self.total_memory = bytes;
        self
    }

    /// Turns virtual memory management off (the allocator then uses plain segments only).
    pub fn without_vmm(mut self) -> Self {
        self.vmm = false;
        self
    }

    /// Sets the granule size (a power of two, at least 512 B).
    pub fn with_granularity(mut self, bytes: u64) -> Self {
        self.granularity = bytes.max(super::MIN_BLOCK_SIZE).next_power_of_two();
        self
    }

    /// Changes the physical capacity at run time (as if another process took or gave back
    /// memory). Memory already handed out stays.
    pub fn set_capacity(&mut self, bytes: Option<u64>) {
        self.capacity = bytes;
    }

    /// Physical bytes in use: plain allocations plus mapped granules.
    pub fn physical_in_use(&self) -> u64 {
        self.physical
    }

    /// Highest [`Self::physical_in_use`] so far.
    pub fn peak_physical(&self) -> u64 {
        self.peak_physical
    }

    /// Calls made so far.
    pub fn counters(&self) -> SimulatedDeviceCounters {
        self.counters
    }

    /// Number of live plain allocations.
    pub fn plain_allocations(&self) -> usize {
        self.allocations.len()
    }

    /// Number of live reservations.
    pub fn reservations(&self) -> usize {
        self.reservations.len()
    }

    /// Whether every byte of `[address, address + size)` is backed by memory: inside one plain
    /// allocation, or inside mapped granules of one reservation.
    pub fn is_accessible(&self, address: u64, size: u64) -> bool {
        let Some(end) = address.checked_add(size) else {
            return false;
        };
        if let Some((&base, &len)) = self.allocations.range(..=address).next_back()
            && end <= base + len
        {
            return true;
        }
        if let Some((&base, r)) = self.reservations.range(..=address).next_back()
            && end <= base + r.size
        {
            if size == 0 {
                return true;
            }
            let g = self.granularity;
            let first = (address - base) / g * g;
            let mut off = first;
            while off < end - base {
                if !r.mapped.contains(&off) {
                    return false;
                }
                off += g;
            }
            return true;
        }
        false
    }

    fn take_physical(&mut self, size: u64) -> Result<(), DeviceError> {
        let total = self.physical.checked_add(size);
        match (total, self.capacity) {
            (Some(total), Some(cap)) if total <= cap => {}
            (Some(_), None) => {}
            _ => {
                self.counters.out_of_memory += 1;
                return Err(DeviceError::OutOfMemory { requested: size });
            }
        }
        self.physical += size;
        self.peak_physical = self.peak_physical.max(self.physical);
        Ok(())
    }

    /// Hands out a fresh address range, with a gap of one granule after it so that distinct
    /// allocations are never adjacent (an overrun would then show as an inaccessible range).
    fn next_range(&mut self, size: u64) -> Result<u64, DeviceError> {
        let g = self.granularity;
        let span = size
            .checked_next_multiple_of(g)
            .and_then(|s| s.checked_add(g))
            .ok_or(DeviceError::OutOfMemory { requested: size })?;
        let address = self.next_address;
        self.next_address = address
            .checked_add(span)
            .ok_or(DeviceError::OutOfMemory { requested: size })?;
        Ok(address)
    }

    fn check_granular(&self, what: &str, offset: u64, size: u64) -> Result<(), DeviceError> {
        let g = self.granularity;
        if size == 0 || !offset.is_multiple_of(g) || !size.is_multiple_of(g) {
            return Err(DeviceError::Invalid(format!(
                "{what}: offset {offset} and size {size} must be non-zero multiples of the \
                 granularity {g}"
            )));
        }
        Ok(())
    }
}

impl DeviceMemory for SimulatedDevice {
    fn total_memory(&self) -> u64 {
        self.total_memory
    }

    fn idle(&self) -> bool {
        !self.busy
    }

    fn alloc(&mut self, size: u64) -> Result<u64, DeviceError> {
        if size == 0 {
            return Err(DeviceError::Invalid("alloc of zero bytes".into()));
        }
        self.take_physical(size)?;
        let address = match self.next_range(size) {
            Ok(a) => a,
            Err(e) => {
                self.physical -= size;
                return Err(e);
            }
        };
        self.allocations.insert(address, size);
        self.counters.allocs += 1;
        Ok(address)
    }

    fn free(&mut self, address: u64, size: u64) -> Result<(), DeviceError> {
        match self.allocations.get(&address) {
            Some(&s) if s == size => {
                self.allocations.remove(&address);
                self.physical -= size;
                self.counters.frees += 1;
                Ok(())
            }
            Some(&s) => Err(DeviceError::Invalid(format!(
                "free of {address:#x} with size {size}, allocated with {s}"
            ))),
            None => Err(DeviceError::Invalid(format!(
                "free of {address:#x}, which is not allocated"
            ))),
        }
    }

    fn supports_vmm(&self) -> bool {
        self.vmm
    }

    fn granularity(&self) -> u64 {
        self.granularity
    }

    fn reserve(&mut self, size: u64) -> Result<u64, DeviceError> {
        if !self.vmm {
            return Err(DeviceError::Unsupported("virtual memory management"));
        }
        self.check_granular("reserve", 0, size)?;
        let base = self.next_range(size)?;
        self.reservations.insert(
            base,
            Reservation {
                size,
                mapped: BTreeSet::new(),
            },
        );
        self.counters.reserves += 1;
        Ok(base)
    }

    fn release(&mut self, base: u64, size: u64) -> Result<(), DeviceError> {
        match self.reservations.get(&base) {
            Some(r) if r.size != size => Err(DeviceError::Invalid(format!(
                "release of {base:#x} with size {size}, reserved with {}",
                r.size
            ))),
            Some(r) if !r.mapped.is_empty() => Err(DeviceError::Invalid(format!(
                "release of {base:#x} with {} granules still mapped",
                r.mapped.len()
            ))),
            Some(_) => {
                self.reservations.remove(&base);
                self.counters.releases += 1;
                Ok(())
            }
            None => Err(DeviceError::Invalid(format!(
                "release of {base:#x}, which is not reserved"
            ))),
        }
    }

    fn map(&mut self, base: u64, offset: u64, size: u64) -> Result<(), DeviceError> {
        self.check_granular("map", offset, size)?;
        let g = self.granularity;
        let Some(r) = self.reservations.get(&base) else {
            return Err(DeviceError::Invalid(format!(
                "map in {base:#x}, which is not reserved"
            )));
        };
        if offset.checked_add(size).is_none_or(|end| end > r.size) {
            return Err(DeviceError::Invalid(format!(
                "map of [{offset}, +{size}) outside the reservation of {} B",
                r.size
            )));
        }
        if r.mapped.range(offset..offset + size).next().is_some() {
            return Err(DeviceError::Invalid(format!(
                "map of [{offset}, +{size}) over mapped granules"
            )));
        }
        self.take_physical(size)?;
        let r = self.reservations.get_mut(&base).expect("checked above");
        let mut off = offset;
        while off < offset + size {
            r.mapped.insert(off);
            off += g;
        }
        self.counters.maps += 1;
        Ok(())
    }

    fn unmap(&mut self, base: u64, offset: u64, size: u64) -> Result<(), DeviceError> {
        self.check_granular("unmap", offset, size)?;
        let g = self.granularity;
        let Some(r) = self.reservations.get_mut(&base) else {
            return Err(DeviceError::Invalid(format!(
                "unmap in {base:#x}, which is not reserved"
            )));
        };
        let Some(end) = offset.checked_add(size) else {
            return Err(DeviceError::Invalid("unmap range overflows".into()));
        };
        let count = r.mapped.range(offset..end).count() as u64;
        if count * g != size {
            return Err(DeviceError::Invalid(format!(
                "unmap of [{offset}, +{size}) where only {count} granules are mapped"
            )));
        }
        let mut off = offset;
        while off < end {
            r.mapped.remove(&off);
            off += g;
        }
        self.physical -= size;
        self.counters.unmaps += 1;
        Ok(())
    }
}
