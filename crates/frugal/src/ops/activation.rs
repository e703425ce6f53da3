//! Forwarding of Burn's `ActivationOps`.

use burn_backend::Backend;
use burn_backend::Scalar;
use burn_backend::ops::ActivationOps;

use super::forward_ops;
use crate::backend::Frugal;

crate::vocabulary::catalog::activation::activation_methods!(forward_ops! {{

}});
