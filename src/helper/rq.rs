//! The registration queue (Li et al., "Scalable Memory Registration for High Performance Networks
//! Using Helper Threads" (CF 2011), section 3.2): regions the helper unpinned and will pin again,
//! ordered by deadline (the time the pin must be finished by), each with its planned cost.
//!
//! "Adjusting registration deadlines": when several deadlines crowd together, one helper cannot
//! meet them all by starting each at `deadline - cost`. The queue keeps, for every item, the
//! *latest start* that still lets every later item finish in time, computed backwards from the
//! last deadline (the classic schedule of one worker with deadlines): `finish_i = min(deadline_i,
//! start_{i+1})`, `start_i = finish_i - cost_i`. Starts are then non-decreasing in queue order,
//! so the front item is always the next one due.
//!
//! Owned by the helper thread alone: no locking. Sizes are small (regions waiting to be pinned
//! again), so a sorted `Vec` with a linear pass beats anything cleverer.

/// One region to pin again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RqItem<K> {
    pub key: K,
    /// The pin must be done by then (ns).
    pub deadline: u64,
    /// Planned cost of processing it (ns).
    pub cost: u64,
}

pub(crate) struct RegQueue<K> {
    /// Sorted by deadline.
    items: Vec<RqItem<K>>,
    /// Latest start of each item, same order.
    starts: Vec<u64>,
}

impl<K: Copy + PartialEq> Default for RegQueue<K> {
    fn default() -> Self {
        RegQueue {
            items: Vec::new(),
            starts: Vec::new(),
        }
    }
}

impl<K: Copy + PartialEq> RegQueue<K> {
    /// Queue `key` (replacing an earlier entry of it).
    pub(crate) fn insert(&mut self, key: K, deadline: u64, cost: u64) {
        self.items.retain(|i| i.key != key);
        let at = self.items.partition_point(|i| i.deadline <= deadline);
        self.items.insert(
            at,
            RqItem {
                key,
                deadline,
                cost,
            },
        );
        self.reschedule();
    }

    /// Drop `key` (its use came first, or its memory went away). Whether it was queued.
    pub(crate) fn remove(&mut self, key: K) -> bool {
        let n = self.items.len();
        self.items.retain(|i| i.key != key);
        let removed = self.items.len() != n;
        if removed {
            self.reschedule();
        }
        removed
    }

    #[cfg(test)]
    pub(crate) fn contains(&self, key: K) -> bool {
        self.items.iter().any(|i| i.key == key)
    }

    pub(crate) fn len(&self) -> usize {
        self.items.len()
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Whether one more pin of `cost` due by `deadline` could join the queue with every pin,
    /// the new one included, still starting no earlier than `free_at` (when the helper is free
    /// again): false means some pin would finish after its deadline, and its caller would pay.
    pub(crate) fn can_add(&self, deadline: u64, cost: u64, free_at: u64) -> bool {
        let at = self.items.partition_point(|i| i.deadline <= deadline);
        // The backward pass of `reschedule` over the items before `at`, the new one, the rest.
        let mut next_start = self.starts.get(at).copied().unwrap_or(u64::MAX);
        next_start = deadline.min(next_start).saturating_sub(cost);
        for it in self.items[..at].iter().rev() {
            next_start = it.deadline.min(next_start).saturating_sub(it.cost);
        }
        deadline >= cost && next_start >= free_at
    }

    /// When the front item must start.
    pub(crate) fn next_start(&self) -> Option<u64> {
        self.starts.first().copied()
    }

    /// The front item, if its latest start is at or before `now`.
    pub(crate) fn pop_due(&mut self, now: u64) -> Option<RqItem<K>> {
        if self.next_start()? > now {
            return None;
        }
        self.starts.remove(0);
        Some(self.items.remove(0))
    }

    fn reschedule(&mut self) {
        self.starts.clear();
        self.starts.resize(self.items.len(), 0);
        let mut next_start = u64::MAX;
        for (i, it) in self.items.iter().enumerate().rev() {
            let finish = it.deadline.min(next_start);
            next_start = finish.saturating_sub(it.cost);
            self.starts[i] = next_start;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordered_by_deadline_and_replaced_by_key() {
        let mut q = RegQueue::default();
        q.insert(1, 300, 10);
        q.insert(2, 100, 10);
        q.insert(3, 200, 10);
        q.insert(1, 50, 10); // re-queued earlier
        assert_eq!(q.len(), 3);
        assert_eq!(q.next_start(), Some(40));
        assert_eq!(q.pop_due(39), None);
        let order: Vec<u32> = std::iter::from_fn(|| q.pop_due(u64::MAX).map(|i| i.key)).collect();
        assert_eq!(order, [1, 2, 3]);
        assert!(q.is_empty() && q.next_start().is_none());
    }

    #[test]
    fn can_add_is_false_exactly_when_a_start_would_come_before_free_at() {
        let mut q = RegQueue::default();
        q.insert(1, 100, 10);
        q.insert(2, 120, 10);
        // Room between them at 110: starts 90 (1), 100 (new), 110 (2).
        assert!(q.can_add(110, 10, 90));
        assert!(!q.can_add(110, 10, 91));
        // A long pin due with the first pushes the first earlier: 60 (new), then 50 (1).
        assert!(q.can_add(100, 40, 50));
        assert!(!q.can_add(100, 40, 51));
        // Last and far: the queue's own front (90) is what the helper must be free by.
        assert!(q.can_add(500, 10, 90));
        assert!(!q.can_add(500, 10, 91));
        // The same answers as inserting and looking at the front.
        let mut rng = fastrand::Rng::with_seed(99);
        for _ in 0..2000 {
            let x = rng.u64(..);
            let (d, c, f) = (x % 400, 1 + (x >> 20) % 50, (x >> 40) % 400);
            let mut with = RegQueue {
                items: q.items.clone(),
                starts: q.starts.clone(),
            };
            with.insert(9, d, c);
            let ok = with.next_start().unwrap() >= f && d >= c;
            assert_eq!(q.can_add(d, c, f), ok, "deadline {d} cost {c} free_at {f}");
            if x % 7 == 0 && q.len() < 8 {
                q.insert((x % 1000) as u32 + 10, d + 200, c);
            }
        }
    }

    #[test]
    fn crowded_deadlines_start_earlier() {
        let mut q = RegQueue::default();
        // Three pins of 10 all due at 100: one worker must start the first at 70.
        for k in 0..3 {
            q.insert(k, 100, 10);
        }
        assert_eq!(q.next_start(), Some(70));
        let a = q.pop_due(70).unwrap();
        assert_eq!(a.deadline, 100);
        assert_eq!(q.next_start(), Some(80));
        // Spread-out deadlines are not moved.
        let mut q = RegQueue::default();
        q.insert(0, 100, 10);
        q.insert(1, 200, 10);
        assert_eq!(q.next_start(), Some(90));
        q.pop_due(90);
        assert_eq!(q.next_start(), Some(190));
        // A removal relaxes the schedule again.
        let mut q = RegQueue::default();
        q.insert(0, 100, 50);
        q.insert(1, 100, 50);
        assert_eq!(q.next_start(), Some(0));
        assert!(q.remove(1) && !q.remove(1));
        assert_eq!(q.next_start(), Some(50));
        assert!(!q.contains(1) && q.contains(0));
    }

    #[test]
    fn deadlines_near_zero_do_not_underflow() {
        let mut q = RegQueue::default();
        q.insert(0, 5, 100);
        q.insert(1, 5, 100);
        assert_eq!(q.next_start(), Some(0));
    }
}
