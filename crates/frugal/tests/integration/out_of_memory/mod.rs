//! The remedies for running out of memory that Frugal offers a training loop: gradient
//! accumulation and auto-fit. Each test holds `crate::serial` throughout: auto-fit reads the
//! device's peak, which another test's tensors would disturb.

mod abandoned;
mod accumulation;
mod auto_fit;
