//! The cost model: what re-running an op costs, in bytes of device memory traffic, with a
//! product's multiply-adds converted at [`MACS_PER_BYTE`].

use super::{Macs, OpId};

/// Multiply-adds a GPU does in the time it moves one byte of memory.
pub(crate) const MACS_PER_BYTE: f64 = 16.0;

/// What keeping one byte in host memory for a step costs, in bytes of device memory traffic:
/// its copy out and its copy back, each taking the time HBM (3–5 TB/s) needs for about 32
/// bytes over a PCIe link's 50–60 GB/s.
pub(crate) const PARK_COST_PER_BYTE: f64 = 64.0;

/// Above this estimated recomputation cost per byte held (memory traffic per byte), a
/// product is left on the device by a scope's end under a budget that keeps products: a
/// linear layer's output contracting 768 features is above it (about 13), `q·kᵀ`'s attention
/// scores contracting a head's 64 below (about 2).
pub(crate) const KEEP_COST_PER_BYTE: f64 = 8.0;

/// Estimated cost of re-running `op`, in bytes of memory traffic, from its tensor inputs' and
/// output's bytes, the output's last dimension and its element size.
pub(crate) fn op_cost(op: OpId, inputs: &[u64], output: u64, out_last: usize, elem: usize) -> f64 {
    let traffic = inputs.iter().sum::<u64>() as f64 + output as f64;
    let elem = elem.max(1) as f64;
    // The elements of the operand that holds every row times the output's columns
    // ([.., m, k] · [.., k, n] -> [.., m, n]: m·k·n per batch).
    let rows_times_cols = |operand: u64| operand as f64 / elem * out_last as f64;
    let facts = op.facts();
    let macs = match facts.macs {
        Macs::RowsOf(operand) if inputs.len() > operand.max(1) => rows_times_cols(inputs[operand]),
        _ if facts.product && inputs.len() >= 2 => {
            // For an (m×k)·(k×n) product, sqrt(lhs·rhs·out) bytes / 8 = m·n·k.
            let (lhs, rhs) = (inputs[0] as f64, inputs[1] as f64);
            (lhs * rhs * output as f64).sqrt() / 8.0
        }
        _ => 0.0,
    };
    traffic + macs / MACS_PER_BYTE
}

/// Whether a scope's end may leave `op`'s output of `bytes`, priced `cost`, on the device
/// (see [`KEEP_COST_PER_BYTE`]).
pub(crate) fn is_costly_product(op: OpId, cost: f64, bytes: u64) -> bool {
    op.facts().product && cost >= KEEP_COST_PER_BYTE * bytes as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocabulary::families::{float, module};

    fn macs_of(elements: u64, columns: u64) -> f64 {
        (elements * columns) as f64 / MACS_PER_BYTE
    }

    #[test]
    fn a_product_costs_its_multiply_adds() {
        let linear = module::op(module::Op::linear);
        let matmul = float::op(float::Op::float_matmul);
        // linear: x [4096, 768] · W [768, 3072] + b -> [4096, 3072], f32.
        let (x, w, b, out) = (4096 * 768 * 4, 768 * 3072 * 4, 3072 * 4, 4096 * 3072 * 4);
        let traffic = (x + w + b + out) as f64;
        let macs = 4096.0 * 768.0 * 3072.0;
        let cost = op_cost(linear, &[x, w, b], out, 3072, 4);
        assert_eq!(cost, traffic + macs / MACS_PER_BYTE);
        assert!(is_costly_product(linear, cost, out));
        // Batched q·kᵀ: [96, 512, 64] · [96, 64, 512] -> [96, 512, 512].
        let (q, k, scores) = (96 * 512 * 64 * 4, 96 * 64 * 512 * 4, 96 * 512 * 512 * 4);
        let cost = op_cost(matmul, &[q, k], scores, 512, 4);
        let macs = 96.0 * 512.0 * 64.0 * 512.0;
        assert_eq!(cost, (q + k + scores) as f64 + macs / MACS_PER_BYTE);
        assert!(!is_costly_product(matmul, cost, scores));
        // linear_x_backward(x, W, grad_out) -> grad_x [4096, 768]: grad_out's elements × 768.
        let cost = op_cost(
            module::op(module::Op::linear_x_backward),
            &[x, w, out],
            x,
            768,
            4,
        );
        assert_eq!(cost, (x + w + out + x) as f64 + macs_of(out / 4, 768));
        // Elementwise ops cost their traffic.
        let exp = float::op(float::Op::float_exp);
        assert_eq!(op_cost(exp, &[out], out, 3072, 4), 2.0 * out as f64);
    }
}
