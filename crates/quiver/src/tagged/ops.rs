//! The table of a tagged endpoint's operations, from their start until their result is
//! taken: a vector with a list of vacant slots, so that finding an operation by its id
//! is an index, not a hash, on every message's path.
//!
//! What it guarantees: an id names one operation only. The id is the slot's index in
//! its low 32 bits and the operation's serial number in its high 32 bits; a slot reused
//! by a later operation has another serial, so the id of an operation whose result was
//! taken (a stale request) finds nothing rather than the slot's new occupant.

/// Operations by id.
pub(super) struct Ops<T> {
    slots: Vec<Slot<T>>,
    /// Indexes of the vacant slots, the last vacated last.
    vacant: Vec<u32>,
    next_serial: u64,
}

/// A slot of the table: an operation and its id, or nothing (`op` is `None`, `id` the
/// last occupant's). Not the `slab` crate's: its removal moves the value out, and a
/// result taken on every message's path then pays for moving the whole operation; here
/// the operation is dropped in place.
struct Slot<T> {
    id: u64,
    op: Option<T>,
}

impl<T> Ops<T> {
    pub(super) fn new() -> Ops<T> {
        Ops {
            slots: Vec::new(),
            vacant: Vec::new(),
            next_serial: 0,
        }
    }

    /// Adds an operation; returns its id.
    #[inline(always)]
    pub(super) fn insert(&mut self, op: T) -> u64 {
        let serial = self.next_serial << 32;
        self.next_serial = (self.next_serial + 1) & 0xffff_ffff;
        match self.vacant.pop() {
            Some(index) => {
                let id = serial | u64::from(index);
                let slot = &mut self.slots[index as usize];
                slot.id = id;
                slot.op = Some(op);
                id
            }
            None => {
                // More than 2^32 operations at once would not fit in memory.
                let id = serial | (self.slots.len() as u64 & 0xffff_ffff);
                self.slots.push(Slot { id, op: Some(op) });
                id
            }
        }
    }

    fn index(id: u64) -> usize {
        (id & 0xffff_ffff) as usize
    }

    /// The slot of operation `id`, if it holds it.
    #[inline]
    fn slot_mut(&mut self, id: u64) -> Option<&mut Slot<T>> {
        self.slots
            .get_mut(Self::index(id))
            .filter(|s| s.id == id && s.op.is_some())
    }

    pub(super) fn get(&self, id: &u64) -> Option<&T> {
        match self.slots.get(Self::index(*id)) {
            Some(s) if s.id == *id => s.op.as_ref(),
            _ => None,
        }
    }

    #[inline]
    pub(super) fn get_mut(&mut self, id: &u64) -> Option<&mut T> {
        self.slot_mut(*id).and_then(|s| s.op.as_mut())
    }

    pub(super) fn contains_key(&self, id: &u64) -> bool {
        self.get(id).is_some()
    }

    /// Looks operation `id` up once: `None` if there is none, else what `take` makes of
    /// it, the operation forgotten when that is `Some`.
    #[inline(always)]
    pub(super) fn take_if<R>(
        &mut self,
        id: u64,
        take: impl FnOnce(&mut T) -> Option<R>,
    ) -> Option<Option<R>> {
        let index = Self::index(id);
        let slot = match self.slots.get_mut(index) {
            Some(s) if s.id == id => s,
            _ => return None,
        };
        let taken = take(slot.op.as_mut()?);
        if taken.is_some() {
            // Dropped in place, not moved out.
            slot.op = None;
            self.vacant.push(index as u32);
        }
        Some(taken)
    }

    pub(super) fn remove(&mut self, id: &u64) -> Option<T> {
        let index = Self::index(*id);
        let op = self.slot_mut(*id)?.op.take();
        self.vacant.push(index as u32);
        op
    }

    pub(super) fn is_empty(&self) -> bool {
        self.vacant.len() == self.slots.len()
    }

    /// The ids of every operation, in no particular order.
    pub(super) fn keys(&self) -> impl Iterator<Item = u64> + '_ {
        self.slots.iter().filter(|s| s.op.is_some()).map(|s| s.id)
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
        assert_eq!(
            ops.get(&a),
            None,
            "a vacant slot keeps its last id but no operation"
        );
        assert_eq!(ops.take_if(a, |op| Some(*op)), None);
        assert!(ops.is_empty());
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
        assert_eq!(
            ops.take_if(ids[1], |_| None::<()>),
            Some(None),
            "still there"
        );
        assert_eq!(ops.take_if(ids[1], |op| Some(*op)), Some(Some(1)));
        assert_eq!(ops.take_if(ids[1], |op| Some(*op)), None, "taken once");
        let mut left: Vec<u64> = ops.keys().collect();
        left.sort();
        let mut want: Vec<u64> = ids.iter().copied().skip(3).step_by(2).collect();
        want.sort();
        assert_eq!(left, want);
    }
}
