//! The table of a tagged endpoint's operations, from their start until their result is
//! taken: a slab (a vector with a free list), so that finding an operation by its id is
//! an index, not a hash, on every message's path.
//!
//! What it guarantees: an id names one operation only. The id is the slot's index in
//! its low 32 bits and the operation's serial number in its high 32 bits; a slot reused
//! by a later operation has another serial, so the id of an operation whose result was
//! taken (a stale request) finds nothing rather than the slot's new occupant.

use slab::Slab;

/// Operations by id.
pub(super) struct Ops<T> {
    slots: Slab<(u64, T)>,
    next_serial: u64,
}

impl<T> Ops<T> {
    pub(super) fn new() -> Ops<T> {
        Ops {
            slots: Slab::new(),
            next_serial: 0,
        }
    }

    /// Adds an operation; returns its id.
    pub(super) fn insert(&mut self, op: T) -> u64 {
        let entry = self.slots.vacant_entry();
        let index = entry.key() as u64;
        let id = (self.next_serial << 32) | (index & 0xffff_ffff);
        self.next_serial = (self.next_serial + 1) & 0xffff_ffff;
        entry.insert((id, op));
        id
    }

    fn index(id: u64) -> usize {
        (id & 0xffff_ffff) as usize
    }

    pub(super) fn get(&self, id: &u64) -> Option<&T> {
        match self.slots.get(Self::index(*id)) {
            Some((i, op)) if i == id => Some(op),
            _ => None,
        }
    }

    pub(super) fn get_mut(&mut self, id: &u64) -> Option<&mut T> {
        match self.slots.get_mut(Self::index(*id)) {
            Some((i, op)) if i == id => Some(op),
            _ => None,
        }
    }

    pub(super) fn contains_key(&self, id: &u64) -> bool {
        self.get(id).is_some()
    }

    /// Looks operation `id` up once: `None` if there is none, else what `take` makes of
    /// it, the operation forgotten when that is `Some`.
    #[inline]
    pub(super) fn take_if<R>(
        &mut self,
        id: u64,
        take: impl FnOnce(&mut T) -> Option<R>,
    ) -> Option<Option<R>> {
        let index = Self::index(id);
        let taken = match self.slots.get_mut(index) {
            Some((i, op)) if *i == id => take(op),
            _ => return None,
        };
        if taken.is_some() {
            self.slots.remove(index);
        }
        Some(taken)
    }

    pub(super) fn remove(&mut self, id: &u64) -> Option<T> {
        self.get(id)?;
        Some(self.slots.remove(Self::index(*id)).1)
    }

    #[cfg(test)]
    pub(super) fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The ids of every operation, in no particular order.
    pub(super) fn keys(&self) -> impl Iterator<Item = u64> + '_ {
        self.slots.iter().map(|(_, (id, _))| *id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reused_slot_does_not_answer_to_its_old_id() {
        let mut ops = Ops::new();
        let a = ops.insert("a");
        assert_eq!(ops.get(&a), Some(&"a"));
        assert_eq!(ops.remove(&a), Some("a"));
        let b = ops.insert("b");
        assert_ne!(a, b, "the slot is reused under another id");
        assert_eq!(ops.get(&a), None);
        assert_eq!(ops.remove(&a), None);
        assert_eq!(ops.get(&b), Some(&"b"), "a stale id removed nothing");
        assert!(!ops.contains_key(&(b + 1)));
        assert_eq!(ops.keys().collect::<Vec<_>>(), vec![b]);
    }

    #[test]
    fn many_operations_keep_their_own_ids() {
        let mut ops = Ops::new();
        let ids: Vec<u64> = (0..100).map(|i| ops.insert(i)).collect();
        for (i, id) in ids.iter().enumerate().step_by(2) {
            assert_eq!(ops.remove(id), Some(i));
        }
        for (i, id) in ids.iter().enumerate() {
            assert_eq!(ops.get(id).copied(), (i % 2 == 1).then_some(i));
        }
        assert!(!ops.is_empty());
    }
}
