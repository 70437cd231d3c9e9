//! Set of disjoint half-open address ranges: which mappings are already registered with
//! userfaultfd (so the miss path does not re-read /proc/self/maps for them).

#[derive(Debug, Default, Clone)]
pub struct IntervalSet {
    /// Sorted, disjoint, non-adjacent (start, end).
    v: Vec<(usize, usize)>,
}

impl IntervalSet {
    pub fn clear(&mut self) {
        self.v.clear();
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.v.len()
    }

    /// True when all of [start, end) is in the set.
    pub fn covers(&self, start: usize, end: usize) -> bool {
        if start >= end {
            return true;
        }
        let i = self.v.partition_point(|&(_, e)| e <= start);
        self.v.get(i).is_some_and(|&(s, e)| s <= start && end <= e)
    }

    pub fn insert(&mut self, start: usize, end: usize) {
        if start >= end {
            return;
        }
        // Everything touching [start, end] merges into one entry.
        let lo = self.v.partition_point(|&(_, e)| e < start);
        let hi = self.v.partition_point(|&(s, _)| s <= end);
        let (mut s, mut e) = (start, end);
        if lo < hi {
            s = s.min(self.v[lo].0);
            e = e.max(self.v[hi - 1].1);
        }
        self.v.splice(lo..hi, [(s, e)]);
    }

    pub fn remove(&mut self, start: usize, end: usize) {
        if start >= end {
            return;
        }
        let lo = self.v.partition_point(|&(_, e)| e <= start);
        let hi = self.v.partition_point(|&(s, _)| s < end);
        if lo >= hi {
            return;
        }
        let mut keep = [(0, 0); 2];
        let mut n = 0;
        if self.v[lo].0 < start {
            keep[n] = (self.v[lo].0, start);
            n += 1;
        }
        if self.v[hi - 1].1 > end {
            keep[n] = (end, self.v[hi - 1].1);
            n += 1;
        }
        self.v.splice(lo..hi, keep[..n].iter().copied());
    }
}

#[cfg(test)]
mod tests {
    use super::IntervalSet;

    #[test]
    fn insert_merges_and_remove_splits() {
        let mut s = IntervalSet::default();
        s.insert(10, 20);
        s.insert(30, 40);
        assert!(s.covers(12, 18) && !s.covers(15, 35) && !s.covers(20, 30));
        s.insert(20, 30);
        assert_eq!(s.len(), 1);
        assert!(s.covers(10, 40));
        s.remove(15, 25);
        assert!(s.covers(10, 15) && s.covers(25, 40) && !s.covers(14, 16));
        assert_eq!(s.len(), 2);
        s.remove(0, 100);
        assert_eq!(s.len(), 0);
        assert!(!s.covers(10, 11));
        assert!(s.covers(5, 5));
    }

    #[test]
    fn remove_inside_one_and_across_many() {
        let mut s = IntervalSet::default();
        for i in 0..10 {
            s.insert(i * 100, i * 100 + 50);
        }
        s.remove(125, 725);
        assert!(s.covers(100, 125) && s.covers(725, 750) && !s.covers(300, 310));
        assert_eq!(s.len(), 5); // [0,50) [100,125) [725,750) [800,850) [900,950)
    }
}
