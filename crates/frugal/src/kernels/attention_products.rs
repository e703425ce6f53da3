//! Attention as matrix products on cuBLASLt, for frugal-cuda's runtime ([`AttentionPath`]):
//! the products on tensor cores, the element-wise passes between them
//! (`frugal_kernels::attention::{scores_softmax, scores_backward}`) on CubeCL.
//!
//! Memory facts: the forward holds the scores and the probabilities (`batch · heads · seq_q ·
//! seq_k` elements each, in the input dtype) until its last product has been queued; the
//! backward holds four such matrices (scores, their probability gradient, the probabilities
//! and the scores' gradient). They are transients of one call, released when it returns (the
//! caching allocator reuses them for the next layer); what the call keeps for the backward
//! pass is what the flash kernels keep: q, k, v, the output and the logsumexp.
//!
//! [`AttentionPath`]: super::AttentionPath

use std::any::{Any, TypeId};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use burn_backend::DType;
use burn_cubecl::CubeRuntime;
use cubecl::server::Handle;
use frugal_cuda::gemm::{GemmDtype, GemmShape, MatrixLayout};
use frugal_cuda::{FrugalCudaDevice, FrugalCudaRuntime};
use frugal_kernels::attention::{
    AttentionArgs, AttentionForward, AttentionGrads, AttentionSaved, AttentionShape,
    attention_delta, scores_backward, scores_softmax,
};

use super::{KernelMode, attention_path, mode, products};

/// The cuBLASLt dtype and TF32 flag for attention of `dtype` on runtime `R`, if the products
/// path applies: the setting ([`super::AttentionPath`]) asks for it, `R` is frugal-cuda's runtime, the library is present
/// and [`super::Products`] puts products of `dtype` on it.
pub(crate) fn applies<R: CubeRuntime>(dtype: DType) -> Option<(GemmDtype, bool)> {
    if !attention_path().wants_products(dtype)
        || mode() == KernelMode::Never
        || TypeId::of::<R>() != TypeId::of::<FrugalCudaRuntime>()
    {
        return None;
    }
    let tf32 = super::products().blas_for(dtype, products::tf32_cores())?;
    let gemm = match dtype {
        DType::F32 => GemmDtype::F32,
        DType::F16 => GemmDtype::F16,
        DType::BF16 => GemmDtype::BF16,
        _ => return None,
    };
    products::library_present().then_some((gemm, tf32))
}

/// A row-major `[batch, rows, cols]` operand.
fn row_major(rows: usize, cols: usize) -> MatrixLayout {
    MatrixLayout {
        rows,
        cols,
        row_stride: cols,
        col_stride: 1,
        batch_stride: rows * cols,
    }
}

/// The transpose of a row-major `[batch, cols, rows]` operand, read in place.
fn transposed(rows: usize, cols: usize) -> MatrixLayout {
    MatrixLayout {
        rows,
        cols,
        row_stride: 1,
        col_stride: rows,
        batch_stride: rows * cols,
    }
}

/// The products of one call on one device.
struct Products<'a, R: CubeRuntime> {
    client: &'a cubecl::client::ComputeClient<R>,
    device: &'a FrugalCudaDevice,
    batch: usize,
    dtype: GemmDtype,
    tf32: bool,
}

impl<R: CubeRuntime> Products<'_, R> {
    /// `lhs · rhs` into a new contiguous `[batch, m, n]` buffer; `None` if the library refused.
    fn product(
        &self,
        lhs: (&Handle, MatrixLayout),
        rhs: (&Handle, MatrixLayout),
    ) -> Option<Handle> {
        let (m, k, n) = (lhs.1.rows, lhs.1.cols, rhs.1.cols);
        let shape = GemmShape {
            batch: self.batch,
            m,
            n,
            k,
            lhs: lhs.1,
            rhs: rhs.1,
            dtype: self.dtype,
            tf32: self.tf32,
        };
        let out = self.client.empty(self.batch * m * n * self.dtype.size());
        match frugal_cuda::matmul(self.device, &shape, lhs.0, rhs.0, &out) {
            Ok(()) => Some(out),
            Err(error) => {
                // Once per process: a refusal repeats for every layer and step.
                static WARNED: AtomicBool = AtomicBool::new(false);
                if !WARNED.swap(true, Relaxed) {
                    log::warn!(
                        "frugal: attention's products fall back to the flash kernels: {error}"
                    );
                }
                None
            }
        }
    }
}

fn products_on<'a, R: CubeRuntime>(
    client: &'a cubecl::client::ComputeClient<R>,
    device: &'a R::Device,
    shape: &AttentionShape,
    (dtype, tf32): (GemmDtype, bool),
) -> Option<Products<'a, R>> {
    Some(Products {
        client,
        device: (device as &dyn Any).downcast_ref::<FrugalCudaDevice>()?,
        batch: shape.batch * shape.heads,
        dtype,
        tf32,
    })
}

/// The forward as products: `scores = q kᵀ`, the probabilities and logsumexp, `out = P v`.
/// `None` (the caller runs the flash kernel) if a step was refused.
pub(crate) fn forward<R: CubeRuntime>(
    client: &cubecl::client::ComputeClient<R>,
    device: &R::Device,
    gemm: (GemmDtype, bool),
    args: AttentionArgs<'_>,
) -> Option<AttentionForward> {
    let (q, k, v, bias) = (args.q, args.k, args.v, args.bias);
    let (shape, dtype, config) = (args.shape, args.dtype, args.config);
    let p = products_on(client, device, &shape, gemm)?;
    let (sq, sk, d) = (shape.seq_q, shape.seq_k, shape.head_dim);
    let scores = p.product((q, row_major(sq, d)), (k, transposed(d, sk)))?;
    let soft = scores_softmax(client, &scores, bias, shape, dtype, config).ok()?;
    drop(scores);
    let out = p.product((&soft.probs, row_major(sq, sk)), (v, row_major(sk, d)))?;
    Some(AttentionForward { out, lse: soft.lse })
}

/// The backward as products: the scores and `dP = dO vᵀ` again, the probabilities and the
/// scores' gradient, then `dv = Pᵀ dO`, `dq = dS k`, `dk = dSᵀ q`. `None` (the caller runs
/// the flash kernels) if a step was refused.
pub(crate) fn backward<R: CubeRuntime>(
    client: &cubecl::client::ComputeClient<R>,
    device: &R::Device,
    gemm: (GemmDtype, bool),
    args: AttentionArgs<'_>,
    saved: AttentionSaved<'_>,
) -> Option<AttentionGrads> {
    let (q, k, v, bias) = (args.q, args.k, args.v, args.bias);
    let (shape, dtype, config) = (args.shape, args.dtype, args.config);
    let AttentionSaved { out, lse, grad_out } = saved;
    let p = products_on(client, device, &shape, gemm)?;
    let (sq, sk, d) = (shape.seq_q, shape.seq_k, shape.head_dim);
    let scores = p.product((q, row_major(sq, d)), (k, transposed(d, sk)))?;
    let grad_probs = p.product((grad_out, row_major(sq, d)), (v, transposed(d, sk)))?;
    let delta = attention_delta(client, out, grad_out, shape, dtype).ok()?;
    let grads = scores_backward(
        client,
        &scores,
        &grad_probs,
        bias,
        lse,
        &delta,
        shape,
        dtype,
        config,
    )
    .ok()?;
    drop((scores, grad_probs, delta));
    let grad_v = p.product(
        (&grads.probs, transposed(sk, sq)),
        (grad_out, row_major(sq, d)),
    )?;
    let grad_q = p.product(
        (&grads.grad_scores, row_major(sq, sk)),
        (k, row_major(sk, d)),
    )?;
    let grad_k = p.product(
        (&grads.grad_scores, transposed(sk, sq)),
        (q, row_major(sq, d)),
    )?;
    Some(AttentionGrads {
        grad_q,
        grad_k,
        grad_v,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transposed_operand_reads_the_row_major_matrix_in_place() {
        // kᵀ of a [sk = 5, d = 3] row-major k: element (x, j) of kᵀ is k[j, x] at j * 3 + x.
        let kt = transposed(3, 5);
        let at = |r: usize, c: usize| r * kt.row_stride + c * kt.col_stride;
        assert_eq!(at(2, 4), 4 * 3 + 2);
        assert_eq!(kt.batch_stride, 15);
        let q = row_major(4, 3);
        assert_eq!(q.row_stride + q.col_stride * 2, 5);
    }
}
