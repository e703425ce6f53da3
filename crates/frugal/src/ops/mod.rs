//! Every Backend op trait of Burn 0.21, forwarded to the inner backend.
//!
//! Each op family (one file per Burn op trait, as in burn-autodiff) lists its methods once in
//! a small signature language read by the private macro `forward_ops!`:
//!
//! | kind | Frugal-side type | handed to the inner backend as |
//! |---|---|---|
//! | `F` `I` `Bo` `Q` | float / int / bool / quantized tensor | its inner primitive |
//! | `RF` `RI` `RBo` `RQ` | reference to one | a reference to its inner primitive |
//! | `VF` `VI` `VBo` `VQ` | `Vec` of them | `Vec` of inner primitives |
//! | `OF` `OBo` | `Option` of one | `Option` of the inner primitive |
//! | `D` | `&Device` | as is |
//! | `TP`, `QP` | `TensorPrimitive`, quantization parameters | the inner versions |
//! | `[T]` | any other type `T` | as is |
//!
//! Outputs are charged to the ledger of the op's first tensor argument (or its device
//! argument). Ops listed under `views:` return a tensor that shares its input's storage record
//! instead of being charged again, so a buffer is never counted twice.

mod activation;
pub(crate) mod attention;
mod backend;
mod bool;
pub(crate) mod convert;
#[cfg(feature = "distributed")]
mod distributed;
mod float;
mod forward;
mod int;
pub(crate) mod layer_norm;
pub(crate) mod linear_cross_entropy;
mod module;
mod qtensor;
pub(crate) mod registry;
mod transaction;

use crate::device::DeviceState;
use crate::vocabulary::OP_COUNT;
pub use crate::vocabulary::forwarded_methods;
pub(crate) use forward::*;

/// How many times each forwarded method has been called in this process, on any device.
pub fn call_counts() -> Vec<(&'static str, &'static str, u64)> {
    let states = DeviceState::all();
    (0..OP_COUNT)
        .map(|i| {
            let op = crate::vocabulary::OpId::from_index(i);
            let calls = states.iter().map(|s| s.ledger.calls(op)).sum::<u64>()
                + DeviceState::unattributed().ledger.calls(op);
            (op.family(), op.name(), calls)
        })
        .collect()
}

/// What a recipe keeps for an argument that makes the op impossible to replay.
pub(crate) struct NoReplay;
