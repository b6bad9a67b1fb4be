//! What each map held after the last apply that wrote it without an error,
//! so that the next apply can diff against it instead of reading every
//! entry back from the kernel (two system calls per entry: on a gateway
//! candidate of a large cluster the steering table alone has thousands).
//!
//! Only the agent writes these maps, so the copy stays true; it is
//! forgotten, and the kernel's contents read again, after any failed write
//! to a map and whenever the owner calls [`MapShadow::forget`] (the agent
//! does on its periodic resync, so an entry changed behind its back, by
//! hand with bpftool for instance, is put right within that period).

use std::{any::Any, collections::BTreeMap};

/// The last contents written per map, by map name.
#[derive(Default)]
pub struct MapShadow {
    maps: BTreeMap<&'static str, Box<dyn Any + Send>>,
}

impl MapShadow {
    /// Takes the copy of `name` out (the caller puts the new contents back
    /// once its writes succeeded); `None` if there is none or it has
    /// another type.
    pub(super) fn take<T: Any + Send>(&mut self, name: &'static str) -> Option<T> {
        let b = self.maps.remove(name)?;
        b.downcast::<T>().ok().map(|b| *b)
    }

    pub(super) fn put<T: Any + Send>(&mut self, name: &'static str, contents: T) {
        self.maps.insert(name, Box::new(contents));
    }

    /// Forgets every copy: the next apply reads each map from the kernel.
    pub fn forget(&mut self) {
        self.maps.clear();
    }

    /// Whether no map has a copy.
    pub fn is_empty(&self) -> bool {
        self.maps.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_is_taken_once_and_only_as_its_own_type() {
        let mut s = MapShadow::default();
        s.put("A", vec![1u32, 2]);
        assert_eq!(s.take::<Vec<u64>>("A"), None, "another type is no copy");
        assert!(s.is_empty(), "and the mistyped copy is gone");
        s.put("A", vec![1u32, 2]);
        assert_eq!(s.take::<Vec<u32>>("A"), Some(vec![1, 2]));
        assert_eq!(s.take::<Vec<u32>>("A"), None);
        s.put("B", 7u8);
        s.forget();
        assert_eq!(s.take::<u8>("B"), None);
    }
}
