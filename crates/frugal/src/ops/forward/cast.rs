//! Autocast inside a forwarded op: the dtypes it sees, the casts of its arguments and of its
//! output.

/// Adds a float argument's dtype to autocast's set (other arguments add nothing).
macro_rules! note_dtype {
    (F, $a:ident, $s:ident) => {
        $s.add(burn_backend::TensorMetadata::dtype(&$a))
    };
    (OF, $a:ident, $s:ident) => {
        if let Some(t) = &$a {
            $s.add(burn_backend::TensorMetadata::dtype(t))
        }
    };
    (VF, $a:ident, $s:ident) => {
        $a.iter()
            .for_each(|t| $s.add(burn_backend::TensorMetadata::dtype(t)))
    };
    ($other:tt, $a:ident, $s:ident) => {
        ()
    };
}
pub(crate) use note_dtype;

/// A float argument cast to autocast's input type (other arguments unchanged).
macro_rules! cast_arg {
    (F, $a:ident, $d:expr) => {
        $crate::ops::convert::cast_to::<B>($a, $d)
    };
    (OF, $a:ident, $d:expr) => {
        $a.map(|t| $crate::ops::convert::cast_to::<B>(t, $d))
    };
    (VF, $a:ident, $d:expr) => {
        $a.into_iter()
            .map(|t| $crate::ops::convert::cast_to::<B>(t, $d))
            .collect::<Vec<_>>()
    };
    ($other:tt, $a:ident, $d:expr) => {
        $a
    };
}
pub(crate) use cast_arg;

/// A float output cast to autocast's output type, if the plan has one.
macro_rules! cast_out {
    (F, $o:ident, $d:expr) => {
        match $d {
            Some(dtype) => $crate::ops::convert::cast_to::<B>($o, dtype),
            None => $o,
        }
    };
    ($other:tt, $o:ident, $d:expr) => {
        $o
    };
}
pub(crate) use cast_out;
