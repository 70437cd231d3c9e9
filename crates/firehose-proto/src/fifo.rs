//! FIFO lists threaded through slab slots (`u32` ids): O(1) push at the tail, pop at the head and
//! removal from the middle, no allocation after the slab has grown. Several lists share one
//! `Links` (each slot is in at most one list): the per-peer firehose FIFOs of the initiator and
//! the victim FIFO of the target use it.

const NIL: u32 = u32::MAX;

#[derive(Debug, Clone, Copy)]
struct Link {
    prev: u32,
    next: u32,
    linked: bool,
}

/// Link storage for every slot of one slab.
#[derive(Debug, Default)]
pub struct Links {
    v: Vec<Link>,
}

/// One list: head (oldest) and tail (newest).
#[derive(Debug, Clone, Copy)]
pub struct List {
    head: u32,
    tail: u32,
    len: u32,
}

impl Default for List {
    fn default() -> Self {
        List {
            head: NIL,
            tail: NIL,
            len: 0,
        }
    }
}

impl Links {
    fn slot(&mut self, id: u32) -> &mut Link {
        let i = id as usize;
        if i >= self.v.len() {
            self.v.resize(
                i + 1,
                Link {
                    prev: NIL,
                    next: NIL,
                    linked: false,
                },
            );
        }
        &mut self.v[i]
    }

    pub fn is_linked(&self, id: u32) -> bool {
        self.v.get(id as usize).is_some_and(|l| l.linked)
    }

    /// Appends `id` (not linked anywhere) at the tail of `list`.
    pub fn push_back(&mut self, list: &mut List, id: u32) {
        debug_assert!(!self.is_linked(id));
        let tail = list.tail;
        *self.slot(id) = Link {
            prev: tail,
            next: NIL,
            linked: true,
        };
        if tail == NIL {
            list.head = id;
        } else {
            self.v[tail as usize].next = id;
        }
        list.tail = id;
        list.len += 1;
    }

    /// Unlinks `id` from `list` (which must be the list holding it); false if it was not linked.
    pub fn remove(&mut self, list: &mut List, id: u32) -> bool {
        if !self.is_linked(id) {
            return false;
        }
        let Link { prev, next, .. } = self.v[id as usize];
        if prev == NIL {
            list.head = next;
        } else {
            self.v[prev as usize].next = next;
        }
        if next == NIL {
            list.tail = prev;
        } else {
            self.v[next as usize].prev = prev;
        }
        self.v[id as usize] = Link {
            prev: NIL,
            next: NIL,
            linked: false,
        };
        list.len -= 1;
        true
    }

    /// Removes and returns the oldest id of `list`.
    pub fn pop_front(&mut self, list: &mut List) -> Option<u32> {
        let h = list.head;
        if h == NIL {
            return None;
        }
        self.remove(list, h);
        Some(h)
    }
}

#[cfg(test)]
impl List {
    fn len(&self) -> usize {
        self.len as usize
    }
    fn is_empty(&self) -> bool {
        self.len == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifo_order_and_middle_removal() {
        let mut l = Links::default();
        let (mut a, mut b) = (List::default(), List::default());
        for i in 0..5 {
            l.push_back(&mut a, i);
        }
        l.push_back(&mut b, 9);
        assert!(l.remove(&mut a, 2));
        assert!(!l.remove(&mut a, 2));
        assert_eq!(a.len(), 4);
        let order: Vec<u32> = std::iter::from_fn(|| l.pop_front(&mut a)).collect();
        assert_eq!(order, vec![0, 1, 3, 4]);
        assert!(a.is_empty() && l.is_linked(9) && b.len() == 1);
        l.push_back(&mut a, 2);
        assert_eq!(l.pop_front(&mut a), Some(2));
        assert_eq!(l.pop_front(&mut a), None);
    }
}
