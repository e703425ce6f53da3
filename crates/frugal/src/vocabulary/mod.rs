//! Layer 0, the op vocabulary: every forwarded Backend method gets an [`OpId`], and one table
//! ([`facts`]) says what Frugal needs to know about each (product or not, replayable or not,
//! its autocast class, how to price its recomputation).
//!
//! Owns: the method lists ([`catalog`], one file per Burn op trait), ids and names, the op
//! facts table and the cost model. Imports nothing from the crate.

pub(crate) mod catalog;
pub(crate) mod cost;
pub(crate) mod facts;

pub use facts::OpPrecision;
pub(crate) use facts::{Macs, OpFacts};

/// Index of a forwarded Backend method, global across op families.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct OpId(u16);

impl OpId {
    pub(crate) const fn new(index: u16) -> Self {
        Self(index)
    }

    pub(crate) const fn from_index(index: usize) -> Self {
        Self(index as u16)
    }

    #[inline]
    pub(crate) const fn index(self) -> usize {
        self.0 as usize
    }

    /// The Backend method's name, e.g. `float_matmul`.
    pub(crate) fn name(self) -> &'static str {
        self.locate().map_or("unknown", |(_, names, i)| names[i])
    }

    /// The Burn trait the method belongs to.
    pub(crate) fn family(self) -> &'static str {
        self.locate().map_or("unknown", |(family, _, _)| family)
    }

    /// What Frugal knows about the op.
    #[inline]
    pub(crate) fn facts(self) -> &'static OpFacts {
        &facts::FACTS[self.index()]
    }

    fn locate(self) -> Option<(&'static str, &'static [&'static str], usize)> {
        let mut index = self.index();
        for (family, names) in FAMILIES {
            if index < names.len() {
                return Some((family, names, index));
            }
            index -= names.len();
        }
        None
    }

    /// The id of the forwarded method called `name` (a search: for set-up code, not per op).
    pub(crate) fn by_name(name: &str) -> Option<Self> {
        (0..OP_COUNT)
            .map(Self::from_index)
            .find(|op| op.name() == name)
    }
}

/// Declares an op family's ids from its method list (see [`catalog`]): an enum `Op` with one
/// variant per method, their `NAMES`, the Burn trait's name, and `op()` mapping a variant to
/// its global [`OpId`].
macro_rules! declare_family {
    (
        family $trait:ident, module $module:ident, base $base:ident;
        manual [$($manual:ident),* $(,)?];
        $(fn $name:ident $args:tt -> $ret:tt $(via $via:ident)?;)*
        views:
        $(fn $vname:ident $vargs:tt -> $vret:tt;)*
    ) => {
        /// The family's methods, in id order.
        #[allow(non_camel_case_types, dead_code, clippy::enum_variant_names)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[repr(u16)]
        pub(crate) enum Op { $($manual,)* $($name,)* $($vname,)* }

        /// The Burn trait's name.
        pub(crate) const TRAIT: &str = stringify!($trait);

        /// The method names, in id order.
        pub(crate) const NAMES: &[&str] = &[$(stringify!($manual),)* $(stringify!($name),)* $(stringify!($vname),)*];

        /// The global id of a method of this family.
        #[inline]
        pub(crate) const fn op(op: Op) -> $crate::vocabulary::OpId {
            $crate::vocabulary::OpId::new($crate::vocabulary::$base + op as u16)
        }
    };
}

/// The op families' ids, one module per Burn op trait.
pub(crate) mod families {
    macro_rules! family {
        ($module:ident, $methods:ident) => {
            #[doc = concat!("Ids of the `", stringify!($module), "` family.")]
            pub(crate) mod $module {
                crate::vocabulary::catalog::$module::$methods!(declare_family! {});
            }
        };
    }
    family!(backend, backend_methods);
    family!(float, float_methods);
    family!(int, int_methods);
    family!(bool, bool_methods);
    family!(qtensor, qtensor_methods);
    family!(module, module_methods);
    family!(activation, activation_methods);
    family!(transaction, transaction_methods);
}

use families::{activation, backend, bool, float, int, module, qtensor, transaction};

/// The op families in id order, each with its Burn trait name and method names.
pub(crate) const FAMILIES: [(&str, &[&str]); 8] = [
    (backend::TRAIT, backend::NAMES),
    (float::TRAIT, float::NAMES),
    (int::TRAIT, int::NAMES),
    (bool::TRAIT, bool::NAMES),
    (qtensor::TRAIT, qtensor::NAMES),
    (module::TRAIT, module::NAMES),
    (activation::TRAIT, activation::NAMES),
    (transaction::TRAIT, transaction::NAMES),
];

pub(crate) const BACKEND_BASE: u16 = 0;
pub(crate) const FLOAT_BASE: u16 = BACKEND_BASE + backend::NAMES.len() as u16;
pub(crate) const INT_BASE: u16 = FLOAT_BASE + float::NAMES.len() as u16;
pub(crate) const BOOL_BASE: u16 = INT_BASE + int::NAMES.len() as u16;
pub(crate) const Q_BASE: u16 = BOOL_BASE + bool::NAMES.len() as u16;
pub(crate) const MODULE_BASE: u16 = Q_BASE + qtensor::NAMES.len() as u16;
pub(crate) const ACTIVATION_BASE: u16 = MODULE_BASE + module::NAMES.len() as u16;
pub(crate) const TRANSACTION_BASE: u16 = ACTIVATION_BASE + activation::NAMES.len() as u16;

/// Number of forwarded methods in all families.
pub(crate) const OP_COUNT: usize = TRANSACTION_BASE as usize + transaction::NAMES.len();

/// Every forwarded Backend method as `(trait, method)`, in id order.
pub fn forwarded_methods() -> Vec<(&'static str, &'static str)> {
    FAMILIES
        .iter()
        .flat_map(|(family, names)| names.iter().map(move |name| (*family, *name)))
        .collect()
}
