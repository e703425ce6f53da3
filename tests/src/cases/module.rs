//! Differential cases for this op family (see `cases/mod.rs`).

#[allow(unused_imports)]
use crate::*;
#[allow(unused_imports)]
use burn::tensor::backend::Backend;

crate::cases! {}
