//! Tensor-memory-accelerator descriptors (`CUtensorMap`) for the kernels that use them (Hopper
//! matmuls): CubeCL describes each map, the server encodes it with the driver at launch.
//!
//! Tiled and im2col maps are supported, which is what CubeCL selects on sm_90. The wide im2col
//! format and the swizzle-atomicity modes are Blackwell features (registered by the runtime only
//! for sm_100 and later) and are refused with an error naming them.

use std::ffi::c_void;
use std::mem::MaybeUninit;

use cubecl_common::backtrace::BackTrace;
use cubecl_core::ir::{ElemType, FloatKind, IntKind, StorageType, UIntKind};
use cubecl_core::prelude::*;
use cubecl_runtime::server::TensorMapMeta;
use cudarc::driver::sys::{
    CUtensorMap, CUtensorMapDataType, CUtensorMapFloatOOBfill, CUtensorMapInterleave,
    CUtensorMapL2promotion, CUtensorMapSwizzle, cuTensorMapEncodeIm2col, cuTensorMapEncodeTiled,
};

fn unsupported(what: &str) -> LaunchError {
    LaunchError::Unknown {
        reason: format!("frugal-cuda: tensor maps with {what} are not supported (sm_100 features)"),
        backtrace: BackTrace::capture(),
    }
}

fn data_type(ty: StorageType) -> Result<CUtensorMapDataType, LaunchError> {
    use CUtensorMapDataType::*;
    Ok(match ty {
        StorageType::Scalar(ElemType::Float(kind)) => match kind {
            // 8-bit and smaller floats load as bytes: zero bits are 0.0 either way.
            FloatKind::E2M1
            | FloatKind::E4M3
            | FloatKind::E5M2
            | FloatKind::UE8M0
            | FloatKind::E2M3
            | FloatKind::E3M2 => CU_TENSOR_MAP_DATA_TYPE_UINT8,
            FloatKind::F16 => CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
            FloatKind::BF16 => CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
            FloatKind::Flex32 | FloatKind::F32 => CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
            FloatKind::TF32 => CU_TENSOR_MAP_DATA_TYPE_TFLOAT32,
            FloatKind::F64 => CU_TENSOR_MAP_DATA_TYPE_FLOAT64,
        },
        StorageType::Scalar(ElemType::Int(kind)) => match kind {
            IntKind::I8 => CU_TENSOR_MAP_DATA_TYPE_UINT8,
            IntKind::I16 => CU_TENSOR_MAP_DATA_TYPE_UINT16,
            IntKind::I32 => CU_TENSOR_MAP_DATA_TYPE_INT32,
            IntKind::I64 => CU_TENSOR_MAP_DATA_TYPE_INT64,
        },
        StorageType::Scalar(ElemType::UInt(kind)) => match kind {
            UIntKind::U8 => CU_TENSOR_MAP_DATA_TYPE_UINT8,
            UIntKind::U16 => CU_TENSOR_MAP_DATA_TYPE_UINT16,
            UIntKind::U32 => CU_TENSOR_MAP_DATA_TYPE_UINT32,
            UIntKind::U64 => CU_TENSOR_MAP_DATA_TYPE_UINT64,
        },
        other => return Err(unsupported(&format!("element type {other:?}"))),
    })
}

fn interleave(i: TensorMapInterleave) -> CUtensorMapInterleave {
    use CUtensorMapInterleave::*;
    match i {
        TensorMapInterleave::None => CU_TENSOR_MAP_INTERLEAVE_NONE,
        TensorMapInterleave::B16 => CU_TENSOR_MAP_INTERLEAVE_16B,
        TensorMapInterleave::B32 => CU_TENSOR_MAP_INTERLEAVE_32B,
    }
}

fn swizzle(s: TensorMapSwizzle) -> Result<CUtensorMapSwizzle, LaunchError> {
    use CUtensorMapSwizzle::*;
    Ok(match s {
        TensorMapSwizzle::None => CU_TENSOR_MAP_SWIZZLE_NONE,
        TensorMapSwizzle::B32 => CU_TENSOR_MAP_SWIZZLE_32B,
        TensorMapSwizzle::B64 => CU_TENSOR_MAP_SWIZZLE_64B,
        TensorMapSwizzle::B128 => CU_TENSOR_MAP_SWIZZLE_128B,
        other => return Err(unsupported(&format!("swizzle {other:?}"))),
    })
}

fn prefetch(p: TensorMapPrefetch) -> CUtensorMapL2promotion {
    use CUtensorMapL2promotion::*;
    match p {
        TensorMapPrefetch::None => CU_TENSOR_MAP_L2_PROMOTION_NONE,
        TensorMapPrefetch::B64 => CU_TENSOR_MAP_L2_PROMOTION_L2_64B,
        TensorMapPrefetch::B128 => CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
        TensorMapPrefetch::B256 => CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
    }
}

fn oob_fill(fill: OobFill) -> CUtensorMapFloatOOBfill {
    use CUtensorMapFloatOOBfill::*;
    match fill {
        OobFill::Zero => CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        OobFill::NaN => CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA,
    }
}

/// Encodes `map` over the buffer at `address`. Shapes and strides go innermost first, as the
/// driver wants them (CubeCL lists them outermost first).
pub(crate) fn encode(map: &TensorMapMeta, address: u64) -> Result<CUtensorMap, LaunchError> {
    let device_ptr = address as *mut c_void;
    let rank = map.metadata.rank();
    let shape: Vec<u64> = map
        .metadata
        .shape()
        .iter()
        .rev()
        .map(|s| *s as u64)
        .collect();
    let strides: Vec<u64> = map
        .metadata
        .strides()
        .iter()
        .rev()
        .skip(1)
        .map(|s| *s as u64 * map.storage_ty.size() as u64)
        .collect();
    let elem_stride: Vec<u32> = map.elem_stride.iter().rev().map(|s| *s as u32).collect();
    let mut out = MaybeUninit::<CUtensorMap>::zeroed();
    let ty = data_type(map.storage_ty)?;
    let swizzle = swizzle(map.swizzle)?;
    // SAFETY: every array outlives the call and has the lengths the rank implies; the driver
    // validates the values and reports bad ones as an error, which is returned.
    let result = unsafe {
        match &map.format {
            TensorMapFormat::Tiled(TiledArgs { tile_size }) => {
                let tile: Vec<u32> = tile_size.iter().rev().map(|s| *s as u32).collect();
                cuTensorMapEncodeTiled(
                    out.as_mut_ptr(),
                    ty,
                    rank as u32,
                    device_ptr,
                    shape.as_ptr(),
                    strides.as_ptr(),
                    tile.as_ptr(),
                    elem_stride.as_ptr(),
                    interleave(map.interleave),
                    swizzle,
                    prefetch(map.prefetch),
                    oob_fill(map.oob_fill),
                )
            }
            TensorMapFormat::Im2col(args) => {
                let lower: Vec<i32> = args.pixel_box_lower_corner.iter().rev().copied().collect();
                let upper: Vec<i32> = args.pixel_box_upper_corner.iter().rev().copied().collect();
                cuTensorMapEncodeIm2col(
                    out.as_mut_ptr(),
                    ty,
                    rank as u32,
                    device_ptr,
                    shape.as_ptr(),
                    strides.as_ptr(),
                    lower.as_ptr(),
                    upper.as_ptr(),
                    args.channels_per_pixel,
                    args.pixels_per_column,
                    elem_stride.as_ptr(),
                    interleave(map.interleave),
                    swizzle,
                    prefetch(map.prefetch),
                    oob_fill(map.oob_fill),
                )
            }
            TensorMapFormat::Im2colWide(_) => return Err(unsupported("the wide im2col format")),
        }
    };
    result.result().map_err(|e| LaunchError::Unknown {
        reason: format!(
            "cuTensorMapEncode failed ({e}) for a rank-{rank} {:?} map at {address:#x}, \
             shape {shape:?}, strides {strides:?} B, element strides {elem_stride:?}",
            map.storage_ty
        ),
        backtrace: BackTrace::capture(),
    })?;
    // SAFETY: the encode call succeeded, so it wrote the whole map.
    Ok(unsafe { out.assume_init() })
}
