//! Host memory and copies between it and the device: pinned staging, reads (behind a fence),
//! writes (their host buffers kept in the drop queue), and [`copy_2d`], the one driver call
//! behind both directions. Its own file because these are the server's only host-side
//! buffers, and the copy's descriptor is long.

use std::ffi::c_void;
use std::future::Future;

use cubecl_common::backtrace::BackTrace;
use cubecl_common::bytes::{AllocationProperty, Bytes};
use cubecl_common::stream_id::StreamId;
use cubecl_core::server::{Binding, CopyDescriptor, Handle, IoError, ServerError};
use cubecl_core::zspace::striding::has_pitched_row_major_strides;
use cubecl_core::zspace::{Shape, Strides};
use cubecl_runtime::memory_management::MemoryHandle;
use cudarc::driver::sys::{CUDA_MEMCPY2D_st, CUmemorytype, CUstream, cuMemcpy2DAsync_v2};

use super::FrugalCudaServer;
use super::fence::Fence;
use crate::cuda::memory::PinnedBytesController;

const MB: usize = 1 << 20;

/// A buffer's layout as rows of contiguous elements at a fixed pitch: what `copy_2d` moves in
/// one call.
struct Pitched {
    shape: Shape,
    strides: Strides,
    elem_size: usize,
}

/// `descriptor`'s buffer and layout if it is pitched rows (see [`Pitched`]); otherwise the
/// error CubeCL's servers give for other strides.
fn pitched(descriptor: CopyDescriptor) -> Result<(Binding, Pitched), IoError> {
    let CopyDescriptor {
        handle,
        shape,
        strides,
        elem_size,
    } = descriptor;
    if has_pitched_row_major_strides(&shape, &strides) {
        let layout = Pitched {
            shape,
            strides,
            elem_size,
        };
        Ok((handle, layout))
    } else {
        Err(IoError::UnsupportedStrides {
            backtrace: BackTrace::capture(),
        })
    }
}

impl FrugalCudaServer {
    fn reserve_pinned(&mut self, size: usize) -> Option<Bytes> {
        let handle = self.pinned.reserve(size as u64).ok()?;
        let binding = MemoryHandle::binding(handle);
        let resource = self.pinned.get_resource(binding.clone(), None, None).ok()?;
        let controller = Box::new(PinnedBytesController::new(binding, resource));
        // SAFETY: the slot holds at least `size` bytes and stays ours while the Bytes live.
        Some(unsafe { Bytes::from_controller(controller, size) })
    }

    /// Host memory for a transfer: pinned up to 100 MB (or when asked), else pageable.
    pub(super) fn reserve_host(&mut self, size: usize, pinned: bool) -> Bytes {
        if !pinned && size > 100 * MB {
            return Bytes::from_bytes_vec(vec![0; size]);
        }
        self.reserve_pinned(size)
            .unwrap_or_else(|| Bytes::from_bytes_vec(vec![0; size]))
    }

    fn copy_to_host(&mut self, descriptor: CopyDescriptor) -> Result<Bytes, IoError> {
        let (handle, layout) = pitched(descriptor)?;
        let num_bytes = layout.shape.iter().product::<usize>() * layout.elem_size;
        let mut bytes = self.reserve_host(num_bytes, true);
        let resource = self.resource(handle)?;
        let started = self.timer.start(self.stream);
        // SAFETY: the resource is a live device buffer covering the pitched layout, `bytes` holds
        // the packed copy, and the caller waits on a fence before reading it.
        unsafe {
            copy_2d(
                &layout,
                Direction::ToHost(&mut bytes),
                resource.ptr,
                self.stream,
            )
        }?;
        self.timer.finish("copy to host", started, self.stream);
        Ok(bytes)
    }

    pub(super) fn write_to_device(
        &mut self,
        descriptor: CopyDescriptor,
        data: Bytes,
    ) -> Result<(), IoError> {
        let (handle, layout) = pitched(descriptor)?;
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
                &layout,
                Direction::ToDevice(&data),
                resource.ptr,
                self.stream,
            )
        }?;
        self.timer.finish("copy to device", started, self.stream);
        self.drop_queue.push(data);
        Ok(())
    }

    pub(super) fn create_with_data(
        &mut self,
        data: &[u8],
        stream_id: StreamId,
    ) -> Result<Handle, ServerError> {
        let handle = self.empty(data.len() as u64, stream_id)?;
        self.write_bytes(handle.clone().binding(), data)?;
        Ok(handle)
    }

    /// Queues a copy of `data` into the device buffer `binding`, through pinned staging.
    pub(super) fn write_bytes(&mut self, binding: Binding, data: &[u8]) -> Result<(), IoError> {
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

    pub(super) fn read_async(
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
    layout: &Pitched,
    direction: Direction<'_>,
    device: u64,
    stream: CUstream,
) -> Result<(), IoError> {
    let (shape, strides, elem_size) = (&layout.shape, &layout.strides, layout.elem_size);
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
