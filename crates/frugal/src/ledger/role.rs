//! What live bytes are for: parameters, gradients, optimizer state, activations or other.
//!
//! A buffer gets the role of the phase it is made in ([`Phase`], set by the training loop or by
//! [`crate::train::RoleTracking`]): made during the forward pass it is an activation (what is
//! still live of the forward pass is what backward saved), during backward a gradient, during
//! the optimizer step optimizer state. Parameters cannot be told apart from optimizer state by
//! their phase (both are made by the optimizer), so they are tagged by visiting the module
//! ([`crate::memory::tag_parameters`]); a tag moves the buffer's bytes to its new role.

use std::sync::atomic::{AtomicU8, Ordering::Relaxed};

use serde::Serialize;

use super::stat::Stat;

/// What a live buffer is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// A module parameter.
    Parameter,
    /// A gradient (made during backward).
    Gradient,
    /// The optimizer's state (made during the optimizer step, and not a parameter).
    OptimizerState,
    /// Made during the forward pass: while backward has not run, what backward saved.
    Activation,
    /// Anything else: inputs, data made outside a phase, temporaries of other code.
    Other,
}

/// The number of roles.
pub(crate) const ROLE_COUNT: usize = 5;

impl Role {
    /// Every role, in report order.
    pub const ALL: [Role; ROLE_COUNT] = [
        Role::Parameter,
        Role::Gradient,
        Role::OptimizerState,
        Role::Activation,
        Role::Other,
    ];

    /// Its name in tables and plots.
    pub fn label(self) -> &'static str {
        match self {
            Role::Parameter => "parameters",
            Role::Gradient => "gradients",
            Role::OptimizerState => "optimizer state",
            Role::Activation => "activations",
            Role::Other => "other",
        }
    }

    #[inline]
    pub(crate) fn index(self) -> usize {
        self as usize
    }

    #[inline]
    pub(crate) fn from_index(index: u8) -> Role {
        Role::ALL[index as usize]
    }
}

/// Where a training step is: decides the role of the buffers made from now on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Outside a step's phases (data loading, evaluation, set-up): new buffers are "other".
    Outside,
    /// The forward pass: new buffers are activations.
    Forward,
    /// The backward pass: new buffers are gradients.
    Backward,
    /// The optimizer step: new buffers are optimizer state (parameters are tagged afterwards).
    Optimizer,
}

impl Phase {
    /// The role of the buffers made in this phase.
    pub fn role(self) -> Role {
        match self {
            Phase::Outside => Role::Other,
            Phase::Forward => Role::Activation,
            Phase::Backward => Role::Gradient,
            Phase::Optimizer => Role::OptimizerState,
        }
    }
}

/// Bytes per role.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RoleBytes {
    /// Module parameters.
    pub parameters: u64,
    /// Gradients.
    pub gradients: u64,
    /// Optimizer state.
    pub optimizer_state: u64,
    /// Activations.
    pub activations: u64,
    /// Everything else.
    pub other: u64,
}

impl RoleBytes {
    /// The bytes of `role`.
    pub fn get(&self, role: Role) -> u64 {
        match role {
            Role::Parameter => self.parameters,
            Role::Gradient => self.gradients,
            Role::OptimizerState => self.optimizer_state,
            Role::Activation => self.activations,
            Role::Other => self.other,
        }
    }

    /// The sum over all roles.
    pub fn total(&self) -> u64 {
        Role::ALL.iter().map(|&role| self.get(role)).sum()
    }

    fn from_fn(mut f: impl FnMut(Role) -> u64) -> Self {
        Self {
            parameters: f(Role::Parameter),
            gradients: f(Role::Gradient),
            optimizer_state: f(Role::OptimizerState),
            activations: f(Role::Activation),
            other: f(Role::Other),
        }
    }
}

/// Live bytes per role, with their peaks, and the role of new buffers.
#[derive(Default)]
pub(crate) struct RoleCounts {
    bytes: [Stat; ROLE_COUNT],
    /// The role new buffers get (a [`Role`] index); 0 is `Parameter`, so the default is set
    /// in `new`.
    current: AtomicU8,
}

impl RoleCounts {
    pub(crate) fn new() -> Self {
        let counts = Self::default();
        counts.current.store(Role::Other as u8, Relaxed);
        counts
    }

    /// The role a buffer made now gets.
    #[inline]
    pub(crate) fn current(&self) -> Role {
        Role::from_index(self.current.load(Relaxed))
    }

    pub(crate) fn set_phase(&self, phase: Phase) {
        self.current.store(phase.role() as u8, Relaxed);
    }

    #[inline]
    pub(crate) fn add(&self, role: Role, bytes: u64) {
        self.bytes[role.index()].add(bytes);
    }

    #[inline]
    pub(crate) fn sub(&self, role: Role, bytes: u64) {
        self.bytes[role.index()].sub(bytes);
    }

    /// Live bytes per role now.
    pub(crate) fn live(&self) -> RoleBytes {
        RoleBytes::from_fn(|role| self.bytes[role.index()].current())
    }

    /// The highest live bytes of each role since the last reset (each its own high, not
    /// taken at one moment).
    pub(crate) fn peak(&self) -> RoleBytes {
        RoleBytes::from_fn(|role| self.bytes[role.index()].peak())
    }

    pub(crate) fn reset_peak(&self) {
        self.bytes.iter().for_each(Stat::reset_peak);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_buffers_take_the_phase_role_and_moves_keep_the_total() {
        let counts = RoleCounts::new();
        assert_eq!(counts.current(), Role::Other);
        counts.set_phase(Phase::Backward);
        assert_eq!(counts.current(), Role::Gradient);
        counts.add(Role::Gradient, 100);
        counts.add(Role::OptimizerState, 50);
        counts.sub(Role::OptimizerState, 50);
        counts.add(Role::Parameter, 50);
        let live = counts.live();
        assert_eq!(
            (live.gradients, live.parameters, live.total()),
            (100, 50, 150)
        );
        assert_eq!(counts.peak().optimizer_state, 50);
        counts.reset_peak();
        assert_eq!(counts.peak().optimizer_state, 0);
    }
}
