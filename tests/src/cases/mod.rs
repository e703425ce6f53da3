//! Differential cases, one file per Burn op trait. Each case is named after the Backend method
//! it is written for, and may call others to build inputs and read outputs.

pub mod activation;
pub mod backend;
pub mod bool;
pub mod float;
pub mod int;
pub mod module;
pub mod qtensor;

/// Every case, family by family.
pub fn all() -> Vec<crate::Case> {
    let mut all = Vec::new();
    all.extend(backend::cases());
    all.extend(float::cases());
    all.extend(int::cases());
    all.extend(bool::cases());
    all.extend(qtensor::cases());
    all.extend(module::cases());
    all.extend(activation::cases());
    all
}
