//! Forwarding of Burn's `ModuleOps`.

use burn_backend::Backend;
use burn_backend::ops::AttentionModuleOptions;
use burn_backend::ops::ConvOptions;
use burn_backend::ops::ConvTransposeOptions;
use burn_backend::ops::DeformConvOptions;
use burn_backend::ops::InterpolateOptions;
use burn_backend::ops::ModuleOps;
use burn_backend::ops::UnfoldOptions;

use super::forward_ops;
use crate::backend::Frugal;

crate::vocabulary::catalog::module::module_methods!(forward_ops! {{

}});
