//! The method lists of Burn 0.21's Backend op traits, one file per trait. Each file defines a
//! macro that hands its list to a callback: `crate::vocabulary::declare_family!` makes the ids from
//! it, and `crate::ops`' forwarding macro the implementations, so the two never disagree.

pub(crate) mod activation;
pub(crate) mod backend;
pub(crate) mod bool;
pub(crate) mod float;
pub(crate) mod int;
pub(crate) mod module;
pub(crate) mod qtensor;
pub(crate) mod transaction;
