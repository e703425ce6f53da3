//! Collectives through NCCL, ported from cubecl-cuda 0.10's `ServerCommunication`: the
//! all-reduce behind Burn's data-parallel training (`DistributedBackend::all_reduce`), and the
//! GPU-to-GPU copy (`send`/`recv`) behind moving a tensor between devices, which CubeCL's client
//! uses instead of a round trip through host memory once `SERVER_COMM_ENABLED` is set.
//!
//! They run on a stream of their own, so that a gradient's all-reduce overlaps the backward pass
//! still running on the compute stream. The two streams are ordered on the device, by events:
//! - before each operation the collective stream waits for the compute stream, which wrote the
//!   data, and which may still be using a freed block that the operation's buffer now occupies;
//! - `sync_collective` makes the compute stream wait for the collective stream. Burn calls it
//!   before a reduced tensor is used (`CollectiveTensor::resolve`), and CubeCL's client after
//!   each `recv`.
//!
//! The server hands a freed block to the next reservation at once, because work on its one
//! compute stream runs in order (see `mod.rs`). An NCCL operation still queued on the other
//! stream breaks that premise, so the buffers of each operation stay held (their blocks
//! allocated) until the compute stream is ordered after it (`sync_collective`) or it is seen
//! complete. cubecl-cuda holds nothing: there, a tensor moved to another device and dropped at
//! once can have its block reused while NCCL still sends it.
//!
//! One communicator per set of devices, made at the first operation on the set (`comm_init`):
//! every device of the set calls `ncclCommInitRank` with the same unique id, taken from a
//! process-wide map, so the ranks are device threads of one process (as in Burn's data-parallel
//! training), not processes.
//!
//! Errors are returned, and also recorded for the next sync or read: the client unwraps them on
//! the device thread, where a panic is only logged, and training must not go on with gradients
//! that were never reduced.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::ffi::OsString;
use std::ffi::{CStr, c_void};
use std::mem::MaybeUninit;
use std::sync::{Mutex, Once, OnceLock};

use cubecl_common::backtrace::BackTrace;
use cubecl_common::device::DeviceId;
use cubecl_common::stream_id::StreamId;
use cubecl_core::ir::{ElemType, FloatKind, IntKind, UIntKind};
use cubecl_core::server::{
    Binding, CommunicationId, CopyDescriptor, Handle, ReduceOperation, ServerCommunication,
    ServerError,
};
use cudarc::driver::sys::CUstream;
use cudarc::nccl::result::{self as nccl, NcclError};
use cudarc::nccl::sys::{ncclComm_t, ncclDataType_t, ncclRedOp_t, ncclUniqueId};

use super::FrugalCudaServer;
use super::fence::Fence;
use crate::cuda::compile_waits::CompileWaitCause;

/// A server's side of the collectives: its device, the collective stream, the communicators and
/// the buffers of operations that may still be running.
#[derive(Debug)]
pub(super) struct Collectives {
    /// This server's device: its rank in a communicator is its place among the sorted devices.
    device: DeviceId,
    /// NCCL's stream, apart from the compute stream so that collectives overlap computation.
    stream: CUstream,
    /// One communicator per set of devices. Never destroyed, as in cubecl-cuda: a server lives
    /// as long as its process.
    communicators: HashMap<CommunicationId, ncclComm_t>,
    /// The operations queued on `stream` whose buffers are still held, oldest first.
    in_flight: VecDeque<InFlight>,
}

/// The buffers of operations queued on the collective stream, and an event after them.
#[derive(Debug)]
struct InFlight {
    after: Fence,
    /// Held only to keep the blocks allocated.
    _buffers: Vec<Binding>,
}

impl Collectives {
    /// The collective state of `device`'s server. Its context must be current.
    pub(super) fn new(device: DeviceId) -> Self {
        // Made whether or not collectives are used: an idle stream costs nothing, and the
        // server then needs no "not yet" state.
        let stream = cudarc::driver::result::stream::create(
            cudarc::driver::result::stream::StreamKind::NonBlocking,
        )
        .expect("frugal-cuda: cannot create the collectives' CUDA stream");
        Self {
            device,
            stream,
            communicators: HashMap::new(),
            in_flight: VecDeque::new(),
        }
    }
}

/// NCCL unique ids by set of devices, shared by the servers of one process: all ranks of a
/// communicator must give `ncclCommInitRank` the same id, so the first to come makes it and the
/// others take it.
struct SharedIds<T> {
    ids: Mutex<HashMap<CommunicationId, T>>,
}

impl<T: Copy> SharedIds<T> {
    fn new() -> Self {
        Self {
            ids: Mutex::new(HashMap::new()),
        }
    }

    /// The id of the set `devices` (in any order), made by `make` the first time. A failed
    /// `make` stores nothing, so a later call tries again.
    fn get_or_make<E>(
        &self,
        devices: &[DeviceId],
        make: impl FnOnce() -> Result<T, E>,
    ) -> Result<T, E> {
        let mut ids = self.ids.lock().unwrap_or_else(|e| e.into_inner());
        match ids.entry(CommunicationId::from(devices.to_vec())) {
            Entry::Occupied(entry) => Ok(*entry.get()),
            Entry::Vacant(entry) => Ok(*entry.insert(make()?)),
        }
    }
}

fn unique_ids() -> &'static SharedIds<ncclUniqueId> {
    static IDS: OnceLock<SharedIds<ncclUniqueId>> = OnceLock::new();
    IDS.get_or_init(SharedIds::new)
}

/// `devices` sorted, as NCCL's ranks: a device's rank is its place here, the same in every
/// thread whatever order each was given. Repeated devices are an error (NCCL would wait for
/// ranks that never come).
fn ranked(devices: &[DeviceId]) -> Result<Vec<DeviceId>, String> {
    let mut sorted = devices.to_vec();
    sorted.sort();
    if sorted.windows(2).any(|pair| pair[0] == pair[1]) {
        return Err(format!(
            "a collective over {devices:?} names a device twice"
        ));
    }
    Ok(sorted)
}

/// The rank of `device` among `devices`.
fn rank_of(devices: &[DeviceId], device: DeviceId) -> Result<usize, String> {
    let sorted = ranked(devices)?;
    sorted
        .iter()
        .position(|d| *d == device)
        .ok_or_else(|| format!("device {device:?} is not among {devices:?}"))
}

/// NCCL's reduction for CubeCL's.
fn nccl_op(op: ReduceOperation) -> ncclRedOp_t {
    match op {
        ReduceOperation::Sum => ncclRedOp_t::ncclSum,
        // NCCL divides by the number of ranks itself (NCCL 2.10 and later).
        ReduceOperation::Mean => ncclRedOp_t::ncclAvg,
    }
}

/// NCCL's type for elements of `dtype`, and their width in bytes; an error for the types NCCL
/// has no counterpart of.
fn nccl_type(dtype: ElemType) -> Result<(ncclDataType_t, u64), String> {
    use ncclDataType_t::*;
    Ok(match dtype {
        ElemType::Float(FloatKind::F64) => (ncclFloat64, 8),
        // Flex32 is stored as f32 (only its arithmetic is relaxed), so NCCL's f32 sums it
        // exactly as it is stored; cubecl-cuda refuses it.
        ElemType::Float(FloatKind::F32 | FloatKind::Flex32) => (ncclFloat32, 4),
        ElemType::Float(FloatKind::F16) => (ncclFloat16, 2),
        ElemType::Float(FloatKind::BF16) => (ncclBfloat16, 2),
        ElemType::Float(FloatKind::E4M3) => (ncclFloat8e4m3, 1),
        ElemType::Float(FloatKind::E5M2) => (ncclFloat8e5m2, 1),
        ElemType::Int(IntKind::I64) => (ncclInt64, 8),
        ElemType::Int(IntKind::I32) => (ncclInt32, 4),
        ElemType::Int(IntKind::I8) => (ncclInt8, 1),
        ElemType::UInt(UIntKind::U64) => (ncclUint64, 8),
        ElemType::UInt(UIntKind::U32) => (ncclUint32, 4),
        ElemType::UInt(UIntKind::U8) => (ncclUint8, 1),
        ElemType::Float(
            FloatKind::TF32
            | FloatKind::E2M1
            | FloatKind::E2M3
            | FloatKind::E3M2
            | FloatKind::UE8M0,
        )
        | ElemType::Int(IntKind::I16)
        | ElemType::UInt(UIntKind::U16)
        | ElemType::Bool => {
            return Err(format!("NCCL cannot reduce elements of type {dtype:?}"));
        }
    })
}

/// NCCL's type and element count for a buffer of `bytes` bytes of `dtype`; an error where the
/// bytes are not whole elements (a count rounded down would leave the tail unreduced).
fn nccl_elements(dtype: ElemType, bytes: u64) -> Result<(ncclDataType_t, usize), String> {
    let (nccl_dtype, width) = nccl_type(dtype)?;
    if !bytes.is_multiple_of(width) {
        return Err(format!(
            "a buffer of {bytes} B is not a whole number of {dtype:?} elements"
        ));
    }
    Ok((nccl_dtype, (bytes / width) as usize))
}

/// What a failed NCCL call says, with NCCL's own description of the code.
/// NCCL's switch between connecting peers when a communicator is made (`0`) and at the first
/// operation of each kind (`1`, the default since NCCL 2.22).
const RUNTIME_CONNECT: &str = "NCCL_RUNTIME_CONNECT";

/// The value to give `NCCL_RUNTIME_CONNECT`: `0`, unless the user has set it.
fn runtime_connect_override(current: Option<OsString>) -> Option<&'static str> {
    match current {
        None => Some("0"),
        Some(_) => None,
    }
}

/// Makes NCCL connect the peers in `ncclCommInitRank`, which every rank calls at once.
///
/// Connected at the first operation of each kind instead, NCCL blocks the calling thread until
/// the peer makes the same call. CubeCL's client queues an all-reduce on each device's thread
/// without flushing the queue (`ComputeClient::all_reduce`), so the peer's call may sit in a
/// queue that only its training thread flushes, while that thread waits for the gradient sync:
/// a device thread blocked in NCCL there would wait for ever.
fn connect_peers_at_init() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if let Some(value) = runtime_connect_override(std::env::var_os(RUNTIME_CONNECT)) {
            // SAFETY: `set_var` races with reads of the environment on other threads. It runs
            // once, before this process's first NCCL call; other device threads making a
            // communicator wait on the `Once`, and neither Burn nor CubeCL reads the environment
            // while training. A program that reads it from threads of its own at this time can
            // set `NCCL_RUNTIME_CONNECT` before it starts, and this does nothing.
            unsafe { std::env::set_var(RUNTIME_CONNECT, value) };
        }
    });
}

/// The bytes a send moves: the source handle's whole used region, which is what CubeCL's client
/// sizes the receiving handle for (`ComputeClient::to_client_tensor`), so that the two sides
/// agree: an NCCL receive waits until all the bytes it was given have come. The tensor keeps
/// its strides on the other device (burn-cubecl's `to_client`), so a region with padded rows
/// (CubeCL's pitched layout: 1000 `i32` in 4096 B) moves whole, padding and all.
fn sent_bytes(desc: &CopyDescriptor) -> Result<u64, String> {
    let bytes = desc.handle.size_in_used();
    // The bytes the tensor's shape and strides reach, which the region must hold.
    let reached = match desc.shape.iter().any(|&extent| extent == 0) {
        true => 0,
        false => {
            let last = desc
                .shape
                .iter()
                .zip(desc.strides.iter())
                .map(|(&extent, &stride)| (extent - 1) * stride)
                .sum::<usize>();
            (last as u64 + 1) * desc.elem_size as u64
        }
    };
    if reached > bytes {
        return Err(format!(
            "a send of shape {:?} with strides {:?} ({reached} B) from a handle of {bytes} B",
            desc.shape, desc.strides
        ));
    }
    Ok(bytes)
}

fn nccl_failed(call: &str, e: NcclError) -> String {
    // SAFETY: NCCL is loaded (the failed call came from it); it returns a static string.
    let text = unsafe {
        let text = cudarc::nccl::sys::ncclGetErrorString(e.0);
        if text.is_null() {
            String::new()
        } else {
            CStr::from_ptr(text).to_string_lossy().into_owned()
        }
    };
    format!("NCCL {call} failed: {:?} ({text})", e.0)
}

/// Where NCCL was not found: cudarc would panic inside its loader at the first NCCL call, so the
/// library is looked for first and this says what to do.
fn nccl_missing() -> String {
    format!(
        "collectives need the NCCL library, loaded at run time, and it was not found: cudarc \
         looks for {:?} on the loader's path, but not for `libnccl.so.2`, the only name a \
         runtime-only install has (PyTorch's wheel in `site-packages/nvidia/nccl/lib`, or the \
         `libnccl2` package without `libnccl-dev`). Install the development package, or link \
         `libnccl.so` to that `libnccl.so.2` in a folder of your own (`ln -s \
         .../nvidia/nccl/lib/libnccl.so.2 DIR/libnccl.so`) and start the process with DIR in \
         LD_LIBRARY_PATH.",
        cudarc::get_lib_name_candidates("nccl")
    )
}

/// Whether the NCCL library, which collectives need (feature `distributed`), can be loaded on
/// this machine. Where it cannot, the first collective fails with an error that says how to
/// make it loadable.
pub fn nccl_available() -> bool {
    // SAFETY: only tries to open the library.
    unsafe { cudarc::nccl::sys::is_culib_present() }
}

impl FrugalCudaServer {
    /// Records `error` for the next sync or read, and returns it.
    fn collective_failed(&mut self, error: impl Into<ServerError>) -> ServerError {
        let error = error.into();
        self.record(error.clone());
        error
    }

    fn collective_error(&mut self, reason: String) -> ServerError {
        self.collective_failed(ServerError::Generic {
            reason: format!("frugal-cuda: {reason}"),
            backtrace: BackTrace::capture(),
        })
    }

    /// The communicator of the set `devices`, made by `comm_init` before.
    fn communicator(&mut self, devices: &[DeviceId]) -> Result<ncclComm_t, ServerError> {
        match self
            .collective
            .communicators
            .get(&CommunicationId::from(devices.to_vec()))
        {
            Some(comm) => Ok(*comm),
            None => Err(self.collective_error(format!(
                "no NCCL communicator for devices {devices:?} (`comm_init` failed or was not \
                 called)"
            ))),
        }
    }

    /// The communicator of this device and `peer`, and `peer`'s rank in it.
    fn pair(&mut self, peer: DeviceId) -> Result<(ncclComm_t, i32), ServerError> {
        let devices = [self.collective.device, peer];
        let rank = rank_of(&devices, peer).map_err(|e| self.collective_error(e))?;
        Ok((self.communicator(&devices)?, rank as i32))
    }

    /// Makes the collective stream wait for what the compute stream has queued so far.
    fn collective_after_compute(&mut self) {
        Fence::new(self.stream).wait_async(self.collective.stream);
    }

    /// Holds `buffers` until the operation just queued on the collective stream is done or the
    /// compute stream is ordered after it.
    fn hold_for_collective(&mut self, buffers: Vec<Binding>) {
        let after = Fence::new(self.collective.stream);
        self.collective.in_flight.push_back(InFlight {
            after,
            _buffers: buffers,
        });
    }

    /// Lets go of the buffers of the collective operations the device has finished (without
    /// waiting: an event query each). Called at flushes, syncs and each collective operation, so
    /// a server that only sends, and is never asked to `sync_collective`, still frees them.
    pub(super) fn release_collectives(&mut self) {
        // Events on one stream pass in order: stop at the first that has not.
        while self
            .collective
            .in_flight
            .front()
            .is_some_and(|op| op.after.passed())
        {
            if let Some(op) = self.collective.in_flight.pop_front() {
                op.after.discard();
            }
        }
    }
}

impl ServerCommunication for FrugalCudaServer {
    /// With `distributed` only: CubeCL's client then moves tensors between devices through
    /// `send`/`recv` (NCCL) instead of through host memory, and that needs `libnccl` and opens
    /// a communicator for each pair of devices, which a build not meant for several GPUs should
    /// not depend on. The operations below work either way.
    const SERVER_COMM_ENABLED: bool = cfg!(feature = "distributed");

    fn comm_init(&mut self, device_ids: Vec<DeviceId>) -> Result<(), ServerError> {
        self.enter(CompileWaitCause::Collective);
        let id = CommunicationId::from(device_ids.clone());
        if self.collective.communicators.contains_key(&id) {
            return Ok(());
        }
        if !nccl_available() {
            return Err(self.collective_error(nccl_missing()));
        }
        let devices = ranked(&device_ids).map_err(|e| self.collective_error(e))?;
        let rank =
            rank_of(&devices, self.collective.device).map_err(|e| self.collective_error(e))?;
        connect_peers_at_init();
        let unique_id = unique_ids()
            .get_or_make(&devices, nccl::get_uniqueid)
            .map_err(|e| self.collective_error(nccl_failed("ncclGetUniqueId", e)))?;
        let mut comm = MaybeUninit::uninit();
        // SAFETY: every rank of the set passes the same unique id (the shared map) and its own
        // rank (its place among the sorted devices); this device's context is current (`enter`),
        // which is how NCCL picks the GPU. The call returns once all ranks have joined; on
        // success it has written the communicator, so `assume_init` reads an initialised value.
        let comm = unsafe {
            nccl::comm_init_rank(
                comm.as_mut_ptr(),
                devices.len() as i32,
                unique_id,
                rank as i32,
            )
            .map_err(|e| self.collective_error(nccl_failed("ncclCommInitRank", e)))?;
            comm.assume_init()
        };
        self.collective.communicators.insert(id.clone(), comm);
        // The client marks the set too (before the task runs); marked here as well, as
        // cubecl-cuda does, for callers that reach the server without the client.
        if let Ok(mut initialized) = self.utilities.initialized_comms.write() {
            initialized.insert(id);
        }
        Ok(())
    }

    fn all_reduce(
        &mut self,
        src: Binding,
        dst: Binding,
        dtype: ElemType,
        // One compute stream per device: every stream id is it.
        _stream_id: StreamId,
        op: ReduceOperation,
        device_ids: Vec<DeviceId>,
    ) -> Result<(), ServerError> {
        self.enter(CompileWaitCause::Collective);
        self.release_collectives();
        let comm = self.communicator(&device_ids)?;
        let source = self
            .resource(src.clone())
            .map_err(|e| self.collective_failed(e))?;
        let target = self
            .resource(dst.clone())
            .map_err(|e| self.collective_failed(e))?;
        if target.size < source.size {
            return Err(self.collective_error(format!(
                "all-reduce of {} B into a buffer of {} B",
                source.size, target.size
            )));
        }
        let (nccl_dtype, count) =
            nccl_elements(dtype, source.size).map_err(|e| self.collective_error(e))?;
        self.collective_after_compute();
        // SAFETY: both addresses are live device buffers of at least `count` elements, held
        // below until the operation is done; `comm` came from `ncclCommInitRank` on this device;
        // the collective stream belongs to this device's context.
        unsafe {
            nccl::all_reduce(
                source.ptr as *const c_void,
                target.ptr as *mut c_void,
                count,
                nccl_dtype,
                nccl_op(op),
                comm,
                self.collective.stream as _,
            )
        }
        .map_err(|e| self.collective_error(nccl_failed("ncclAllReduce", e)))?;
        self.hold_for_collective(vec![src, dst]);
        Ok(())
    }

    fn sync_collective(&mut self, _stream_id: StreamId) -> Result<(), ServerError> {
        self.enter(CompileWaitCause::Collective);
        Fence::new(self.collective.stream).wait_async(self.stream);
        // Whatever is queued from now on, on either stream, runs after the queued collectives,
        // so their blocks may be reused at once.
        for op in std::mem::take(&mut self.collective.in_flight) {
            op.after.discard();
        }
        Ok(())
    }

    fn send(
        &mut self,
        desc: CopyDescriptor,
        // Sent as bytes: a copy does not depend on the element type, so any tensor moves
        // (cubecl-cuda refuses booleans and 16-bit integers here). `recv` does the same.
        _dtype: ElemType,
        _stream_id: StreamId,
        device_id_dst: DeviceId,
    ) -> Result<(), ServerError> {
        self.enter(CompileWaitCause::Collective);
        self.release_collectives();
        let bytes = sent_bytes(&desc).map_err(|e| self.collective_error(e))?;
        let (comm, peer) = self.pair(device_id_dst)?;
        let source = self
            .resource(desc.handle.clone())
            .map_err(|e| self.collective_failed(e))?;
        if source.size < bytes {
            return Err(self.collective_error(format!(
                "a send of {bytes} B from a buffer of {} B",
                source.size
            )));
        }
        self.collective_after_compute();
        // SAFETY: a live device buffer of at least `bytes` bytes, held below until the send is
        // done; `comm` came from `ncclCommInitRank` on this device; the stream is this context's.
        unsafe {
            nccl::send(
                source.ptr as *const c_void,
                bytes as usize,
                ncclDataType_t::ncclUint8,
                peer,
                comm,
                self.collective.stream as _,
            )
        }
        .map_err(|e| self.collective_error(nccl_failed("ncclSend", e)))?;
        self.hold_for_collective(vec![desc.handle]);
        Ok(())
    }

    fn recv(
        &mut self,
        handle: Handle,
        _dtype: ElemType,
        _stream_id: StreamId,
        device_id_src: DeviceId,
    ) -> Result<(), ServerError> {
        self.enter(CompileWaitCause::Collective);
        self.release_collectives();
        let (comm, peer) = self.pair(device_id_src)?;
        // The client made the handle; its memory is allocated here, as `initialize_memory`
        // would.
        let reserved = self
            .reserve(handle.size())
            .map_err(|e| self.collective_failed(e))?;
        self.bind(reserved, handle.memory.clone());
        // What the sender sends (`sent_bytes`): CubeCL's client sized this handle so.
        let bytes = handle.size_in_used();
        let binding = handle.binding();
        let target = self
            .resource(binding.clone())
            .map_err(|e| self.collective_failed(e))?;
        // The block may have been freed by tensors whose kernels are still queued on the compute
        // stream: the receive must not overwrite it before they have run.
        self.collective_after_compute();
        // SAFETY: a live device buffer of `bytes` bytes, held below until the receive is done;
        // `comm` came from `ncclCommInitRank` on this device; the stream is this context's.
        unsafe {
            nccl::recv(
                target.ptr as *mut c_void,
                bytes as usize,
                ncclDataType_t::ncclUint8,
                peer,
                comm,
                self.collective.stream as _,
            )
        }
        .map_err(|e| self.collective_error(nccl_failed("ncclRecv", e)))?;
        self.hold_for_collective(vec![binding]);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    fn device(index: u16) -> DeviceId {
        DeviceId {
            type_id: 0,
            index_id: index,
        }
    }

    const FLOATS: [FloatKind; 12] = [
        FloatKind::E2M1,
        FloatKind::E2M3,
        FloatKind::E3M2,
        FloatKind::E4M3,
        FloatKind::E5M2,
        FloatKind::UE8M0,
        FloatKind::F16,
        FloatKind::BF16,
        FloatKind::Flex32,
        FloatKind::F32,
        FloatKind::TF32,
        FloatKind::F64,
    ];

    fn every_dtype() -> Vec<ElemType> {
        let mut all: Vec<ElemType> = FLOATS.into_iter().map(ElemType::Float).collect();
        all.extend([IntKind::I8, IntKind::I16, IntKind::I32, IntKind::I64].map(ElemType::Int));
        all.extend([UIntKind::U8, UIntKind::U16, UIntKind::U32, UIntKind::U64].map(ElemType::UInt));
        all.push(ElemType::Bool);
        all
    }

    #[test]
    fn each_dtype_maps_to_the_nccl_type_of_its_format() {
        use ncclDataType_t::*;
        let expected = [
            (ElemType::Float(FloatKind::F64), ncclFloat64),
            (ElemType::Float(FloatKind::F32), ncclFloat32),
            (ElemType::Float(FloatKind::Flex32), ncclFloat32),
            (ElemType::Float(FloatKind::F16), ncclFloat16),
            (ElemType::Float(FloatKind::BF16), ncclBfloat16),
            (ElemType::Float(FloatKind::E4M3), ncclFloat8e4m3),
            (ElemType::Float(FloatKind::E5M2), ncclFloat8e5m2),
            (ElemType::Int(IntKind::I64), ncclInt64),
            (ElemType::Int(IntKind::I32), ncclInt32),
            (ElemType::Int(IntKind::I8), ncclInt8),
            (ElemType::UInt(UIntKind::U64), ncclUint64),
            (ElemType::UInt(UIntKind::U32), ncclUint32),
            (ElemType::UInt(UIntKind::U8), ncclUint8),
        ];
        for (dtype, nccl_dtype) in expected {
            assert_eq!(nccl_type(dtype).map(|t| t.0), Ok(nccl_dtype), "{dtype:?}");
        }
        // Everything else is refused, not reduced as some other format.
        let refused: Vec<ElemType> = every_dtype()
            .into_iter()
            .filter(|dtype| !expected.iter().any(|(mapped, _)| mapped == dtype))
            .collect();
        assert_eq!(refused.len(), 8);
        for dtype in refused {
            let error = nccl_type(dtype).unwrap_err();
            assert!(error.contains(&format!("{dtype:?}")), "{error}");
        }
    }

    #[test]
    fn element_widths_are_cubecls_storage_sizes() {
        // A width that disagreed with how CubeCL stores the type would reduce the wrong count.
        for dtype in every_dtype() {
            if let Ok((_, width)) = nccl_type(dtype) {
                assert_eq!(width as usize, dtype.size(), "{dtype:?}");
            }
        }
    }

    #[test]
    fn element_counts_divide_the_bytes_by_the_width() {
        let f32 = ElemType::Float(FloatKind::F32);
        let bf16 = ElemType::Float(FloatKind::BF16);
        let i64 = ElemType::Int(IntKind::I64);
        assert_eq!(
            nccl_elements(f32, 4096),
            Ok((ncclDataType_t::ncclFloat32, 1024))
        );
        assert_eq!(
            nccl_elements(bf16, 4096),
            Ok((ncclDataType_t::ncclBfloat16, 2048))
        );
        assert_eq!(
            nccl_elements(i64, 4096),
            Ok((ncclDataType_t::ncclInt64, 512))
        );
        assert_eq!(
            nccl_elements(ElemType::UInt(UIntKind::U8), 3),
            Ok((ncclDataType_t::ncclUint8, 3))
        );
        assert_eq!(nccl_elements(f32, 0), Ok((ncclDataType_t::ncclFloat32, 0)));
        // A partial element is an error, not a count rounded down.
        assert!(nccl_elements(f32, 4098).unwrap_err().contains("4098 B"));
        assert!(nccl_elements(ElemType::Bool, 4).is_err());
    }

    #[test]
    fn mean_is_nccls_average_and_sum_its_sum() {
        assert_eq!(nccl_op(ReduceOperation::Sum), ncclRedOp_t::ncclSum);
        assert_eq!(nccl_op(ReduceOperation::Mean), ncclRedOp_t::ncclAvg);
    }

    #[test]
    fn ranks_are_places_among_the_sorted_devices_whatever_the_order_given() {
        let devices = [device(3), device(0), device(1)];
        assert_eq!(rank_of(&devices, device(0)), Ok(0));
        assert_eq!(rank_of(&devices, device(1)), Ok(1));
        assert_eq!(rank_of(&devices, device(3)), Ok(2));
        // Another thread given the same set in another order agrees.
        let reordered = [device(1), device(3), device(0)];
        for d in devices {
            assert_eq!(rank_of(&devices, d), rank_of(&reordered, d));
        }
        // A pair: sender and receiver each find the other's rank, and they differ.
        let pair = [device(2), device(5)];
        assert_eq!(rank_of(&pair, device(5)), Ok(1));
        assert_eq!(rank_of(&[device(5), device(2)], device(2)), Ok(0));
    }

    #[test]
    fn a_device_outside_the_set_or_named_twice_is_an_error() {
        assert!(rank_of(&[device(0), device(1)], device(2)).is_err());
        // Would make NCCL wait for a third rank that never comes.
        assert!(rank_of(&[device(0), device(1), device(0)], device(1)).is_err());
        // A send to oneself.
        assert!(rank_of(&[device(4), device(4)], device(4)).is_err());
    }

    #[test]
    fn every_rank_of_a_set_gets_the_one_id_made_for_it() {
        let ids = SharedIds::new();
        let made = Cell::new(0u32);
        let make = || -> Result<u32, ()> {
            made.set(made.get() + 1);
            Ok(100 + made.get())
        };
        let first = ids.get_or_make(&[device(0), device(1)], make);
        let second = ids.get_or_make(&[device(1), device(0)], make);
        assert_eq!(first, Ok(101));
        assert_eq!(second, Ok(101));
        assert_eq!(made.get(), 1);
        // Another set gets an id of its own.
        assert_eq!(ids.get_or_make(&[device(0), device(2)], make), Ok(102));
    }

    fn descriptor(
        handle: Handle,
        shape: &[usize],
        strides: &[usize],
        elem_size: usize,
    ) -> CopyDescriptor {
        handle.copy_descriptor(shape.to_vec().into(), strides.to_vec().into(), elem_size)
    }

    #[test]
    fn a_send_moves_what_the_receiving_handle_was_sized_for() {
        let stream = StreamId { value: 0 };
        // 1000 i32 in a pitched row of 4096 B: the client sizes the receiving handle by the
        // source's used size, and the receive waits for all of it.
        let padded = Handle::new(stream, 4096);
        assert_eq!(
            sent_bytes(&descriptor(padded.clone(), &[1000], &[1], 4)),
            Ok(padded.size_in_used())
        );
        // Rows padded to 1024 elements: the region moves whole, padding included.
        let pitched = Handle::new(stream, 3 * 4096);
        assert_eq!(
            sent_bytes(&descriptor(pitched, &[3, 1000], &[1024, 1], 4)),
            Ok(3 * 4096)
        );
        // A slice of a larger buffer: its used size, not the buffer's.
        let slice = Handle::new(stream, 8192)
            .offset_start(1024)
            .offset_end(3072);
        assert_eq!(sent_bytes(&descriptor(slice, &[1024], &[1], 4)), Ok(4096));
        // More than the region holds is refused, naming both sizes.
        let small = Handle::new(stream, 1024);
        let refused = sent_bytes(&descriptor(small, &[1000], &[1], 4)).unwrap_err();
        assert!(
            refused.contains("4000 B") && refused.contains("1024 B"),
            "{refused}"
        );
    }

    #[test]
    fn peers_connect_at_init_unless_the_user_chose() {
        assert_eq!(runtime_connect_override(None), Some("0"));
        assert_eq!(runtime_connect_override(Some("1".into())), None);
        assert_eq!(runtime_connect_override(Some("0".into())), None);
    }

    #[test]
    fn a_failed_id_is_not_kept() {
        let ids = SharedIds::<u32>::new();
        let set = [device(0), device(1)];
        assert_eq!(ids.get_or_make(&set, || Err("no NCCL")), Err("no NCCL"));
        assert_eq!(ids.get_or_make(&set, || Ok::<_, &str>(7)), Ok(7));
        assert_eq!(ids.get_or_make(&set, || Ok::<_, &str>(8)), Ok(7));
    }

    #[test]
    fn the_missing_library_message_names_the_file_to_link() {
        // The advice to link `libnccl.so` holds only while cudarc does not look for the
        // versioned name itself; this fails when it starts to, so the message gets updated.
        let candidates = cudarc::get_lib_name_candidates("nccl");
        assert!(candidates.iter().any(|name| name == "libnccl.so"));
        assert!(!candidates.iter().any(|name| name == "libnccl.so.2"));
        let message = nccl_missing();
        assert!(message.contains("libnccl.so.2"));
        assert!(message.contains("LD_LIBRARY_PATH"));
    }
}
