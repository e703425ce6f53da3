//! Matrix products on cuBLASLt, on the server's stream, with workspace from the caching
//! allocator.
//!
//! The mapping of a row-major product onto the column-major library is [`crate::gemm`]'s.
//!
//! The library is loaded at run time (`libcublasLt.so`); where it is missing,
//! [`FrugalCudaServer::gemm`](crate::FrugalCudaServer::gemm) says so and the caller keeps
//! CubeCL's kernels. Descriptors and the chosen algorithm are cached per
//! shape, layout and alignment, so a training step's repeated products pay the heuristic once.
//!
//! This file is the library's wrapper and needs nothing of the server; the server's side of a
//! product (the bindings, the workspace, its error state) is `products.rs`.

mod products;

use std::collections::HashMap;
use std::ffi::c_void;
use std::mem::size_of;

use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys;

use crate::gemm::{GemmDtype, GemmError, GemmShape, alignment, stored};

fn data_type(dtype: GemmDtype) -> sys::cudaDataType {
    match dtype {
        GemmDtype::F32 => sys::cudaDataType::CUDA_R_32F,
        GemmDtype::F16 => sys::cudaDataType::CUDA_R_16F,
        GemmDtype::BF16 => sys::cudaDataType::CUDA_R_16BF,
    }
}

/// Whether `libcublasLt` can be loaded on this machine.
pub fn blas_available() -> bool {
    // SAFETY: only tries to open the library.
    unsafe { sys::is_culib_present() }
}

/// The workspace the algorithm search may assume (PyTorch's default on Hopper); the chosen
/// algorithm's own need, usually much less, is what is allocated.
const MAX_WORKSPACE: usize = 32 << 20;

/// What identifies a plan: the product and the operands' alignment (algorithms differ by it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct PlanKey {
    shape: GemmShape,
    align: [u32; 3],
}

/// The descriptors and algorithm of one product, made once.
struct Plan {
    desc: sys::cublasLtMatmulDesc_t,
    layouts: [sys::cublasLtMatrixLayout_t; 3],
    algo: sys::cublasLtMatmulAlgo_t,
    workspace: usize,
}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: created by `Plan::new`, destroyed once here.
        unsafe {
            for layout in self.layouts {
                let _ = lt::destroy_matrix_layout(layout);
            }
            let _ = lt::destroy_matmul_desc(self.desc);
        }
    }
}

fn library(e: lt::CublasError) -> GemmError {
    GemmError::Library(format!("{:?}", e.0))
}

impl Plan {
    /// # Safety
    /// `handle` is a live cuBLASLt handle of the current context.
    unsafe fn new(handle: sys::cublasLtHandle_t, key: &PlanKey) -> Result<Plan, GemmError> {
        let shape = &key.shape;
        let [a, b, d] = stored(shape)?;
        let compute = match (shape.dtype, shape.tf32) {
            (GemmDtype::F32, true) => sys::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32,
            _ => sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        };
        let desc =
            lt::create_matmul_desc(compute, sys::cudaDataType::CUDA_R_32F).map_err(library)?;
        let mut plan = Plan {
            desc,
            layouts: [std::ptr::null_mut(); 3],
            algo: sys::cublasLtMatmulAlgo_t { data: [0; 8] },
            workspace: 0,
        };
        // cublasOperation_t: CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 (the header's values; cudarc's
        // cuBLASLt bindings do not export the enum).
        let op = |t: bool| t as i32;
        for (attr, value) in [
            (
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
                op(a.transpose),
            ),
            (
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSB,
                op(b.transpose),
            ),
        ] {
            // SAFETY: the descriptor is live; the value is the attribute's type.
            unsafe {
                lt::set_matmul_desc_attribute(
                    desc,
                    attr,
                    (&value) as *const _ as *const c_void,
                    size_of::<i32>(),
                )
            }
            .map_err(library)?;
        }
        let strides = [
            shape.rhs.batch_stride,
            shape.lhs.batch_stride,
            shape.m * shape.n,
        ];
        for (i, (s, stride)) in [a, b, d].iter().zip(strides).enumerate() {
            let layout = lt::create_matrix_layout(data_type(shape.dtype), s.rows, s.cols, s.ld)
                .map_err(library)?;
            plan.layouts[i] = layout;
            if shape.batch > 1 {
                let count = i32::try_from(shape.batch)
                    .map_err(|_| GemmError::Layout(format!("batch {} too large", shape.batch)))?;
                let stride = stride as i64;
                // SAFETY: live layout; values of the attributes' types.
                unsafe {
                    lt::set_matrix_layout_attribute(
                        layout,
                        sys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                        (&count) as *const _ as *const c_void,
                        size_of::<i32>(),
                    )
                    .map_err(library)?;
                    lt::set_matrix_layout_attribute(
                        layout,
                        sys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                        (&stride) as *const _ as *const c_void,
                        size_of::<i64>(),
                    )
                    .map_err(library)?;
                }
            }
        }
        let pref = lt::create_matmul_pref().map_err(library)?;
        let chosen = (|| {
            use sys::cublasLtMatmulPreferenceAttributes_t as P;
            let max = MAX_WORKSPACE;
            // SAFETY: live preference; values of the attributes' types.
            unsafe {
                lt::set_matmul_pref_attribute(
                    pref,
                    P::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                    (&max) as *const _ as *const c_void,
                    size_of::<usize>(),
                )?;
                for (attr, align) in [
                    (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align[0]),
                    (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align[1]),
                    (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align[2]),
                    (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align[2]),
                ] {
                    lt::set_matmul_pref_attribute(
                        pref,
                        attr,
                        (&align) as *const _ as *const c_void,
                        size_of::<u32>(),
                    )?;
                }
                let [la, lb, ld] = plan.layouts;
                lt::get_matmul_algo_heuristic(handle, desc, la, lb, ld, ld, pref)
            }
        })();
        // SAFETY: created above, destroyed once.
        let _ = unsafe { lt::destroy_matmul_pref(pref) };
        let chosen = chosen.map_err(library)?;
        plan.algo = chosen.algo;
        plan.workspace = chosen.workspaceSize;
        Ok(plan)
    }
}

/// A server's cuBLASLt handle and its plans.
pub(super) struct BlasLt {
    handle: sys::cublasLtHandle_t,
    plans: HashMap<PlanKey, Plan>,
}

impl std::fmt::Debug for BlasLt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlasLt")
            .field("plans", &self.plans.len())
            .finish_non_exhaustive()
    }
}

impl Drop for BlasLt {
    fn drop(&mut self) {
        self.plans.clear();
        // SAFETY: created by `BlasLt::new`, destroyed once.
        let _ = unsafe { lt::destroy_handle(self.handle) };
    }
}

/// Device addresses of one product's buffers.
struct GemmBuffers {
    lhs: u64,
    rhs: u64,
    out: u64,
}

impl BlasLt {
    /// Loads the library and makes a handle in the current context.
    fn new() -> Result<BlasLt, GemmError> {
        if !blas_available() {
            return Err(GemmError::Unavailable(
                "libcublasLt.so was not found on the library path".into(),
            ));
        }
        let handle = lt::create_handle().map_err(library)?;
        Ok(BlasLt {
            handle,
            plans: HashMap::new(),
        })
    }

    /// The workspace bytes `shape`'s algorithm needs for these buffers (making its plan).
    fn workspace(&mut self, shape: &GemmShape, buffers: &GemmBuffers) -> Result<usize, GemmError> {
        let key = Self::key(shape, buffers);
        if let Some(plan) = self.plans.get(&key) {
            return Ok(plan.workspace);
        }
        // SAFETY: the handle is live and its context current (the server entered it).
        let plan = unsafe { Plan::new(self.handle, &key)? };
        let workspace = plan.workspace;
        self.plans.insert(key, plan);
        Ok(workspace)
    }

    fn key(shape: &GemmShape, buffers: &GemmBuffers) -> PlanKey {
        PlanKey {
            shape: *shape,
            align: [
                alignment(buffers.rhs),
                alignment(buffers.lhs),
                alignment(buffers.out),
            ],
        }
    }

    /// Queues the product on `stream`, after [`Self::workspace`] made its plan.
    ///
    /// # Safety
    /// The addresses hold the operands and output `shape` describes, the workspace holds the
    /// bytes [`Self::workspace`] returned, and they stay allocated until the stream passes
    /// the product.
    unsafe fn run(
        &mut self,
        shape: &GemmShape,
        buffers: &GemmBuffers,
        workspace: u64,
        stream: cudarc::driver::sys::CUstream,
    ) -> Result<(), GemmError> {
        let key = Self::key(shape, buffers);
        let plan = self
            .plans
            .get(&key)
            .ok_or_else(|| GemmError::Library("no plan was made for this product".into()))?;
        let (alpha, beta) = (1.0f32, 0.0f32);
        let [la, lb, ld] = plan.layouts;
        // SAFETY: the caller's contract; the plan's descriptors are live.
        unsafe {
            lt::matmul(
                self.handle,
                plan.desc,
                (&alpha) as *const f32 as *const c_void,
                (&beta) as *const f32 as *const c_void,
                buffers.rhs as *const c_void,
                la,
                buffers.lhs as *const c_void,
                lb,
                buffers.out as *const c_void,
                ld,
                buffers.out as *mut c_void,
                ld,
                &plan.algo,
                workspace as *mut c_void,
                plan.workspace,
                stream as sys::cudaStream_t,
            )
        }
        .map_err(library)
    }
}
