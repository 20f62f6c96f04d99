//! The frame of an actor's mailbox: a message of one actor carried inside another's
//! mailbox enum, for a derived reference (`From` wraps it, `TryFrom` takes it back out).
//! Written once here instead of a pair of impls per message kind.

/// `carried!(Inner => Outer::Variant)`, or with a type parameter shared by both,
/// `carried!(<D> Inner<D> => Outer<D>, Outer::Variant)`.
macro_rules! carried {
    (<$g:ident> $inner:ty => $outer:ty, $($variant:ident)::+) => {
        impl<$g> From<$inner> for $outer {
            fn from(message: $inner) -> Self {
                $($variant)::+(message)
            }
        }

        impl<$g> TryFrom<$outer> for $inner {
            type Error = ();

            fn try_from(message: $outer) -> Result<Self, ()> {
                match message {
                    $($variant)::+(message) => Ok(message),
                    _ => Err(()),
                }
            }
        }
    };
    ($inner:ty => $outer:ident :: $variant:ident) => {
        impl From<$inner> for $outer {
            fn from(message: $inner) -> Self {
                $outer::$variant(message)
            }
        }

        impl TryFrom<$outer> for $inner {
            type Error = ();

            fn try_from(message: $outer) -> Result<Self, ()> {
                match message {
                    $outer::$variant(message) => Ok(message),
                    _ => Err(()),
                }
            }
        }
    }
}

pub(crate) use carried;
