//! Small helpers for the hit path: a vector with inline room for two items (an op usually
//! touches one or two regions; no allocation then) and a fast hasher for integer keys.

/// Up to 2 items inline, more spill to the heap.
#[derive(Debug, Clone, Default)]
pub struct Inline2<T: Copy + Default> {
    n: u32,
    inline: [T; 2],
    spill: Vec<T>,
}

impl<T: Copy + Default> Inline2<T> {
    /// One item.
    #[inline]
    pub fn one(x: T) -> Self {
        Inline2 {
            n: 1,
            inline: [x, T::default()],
            spill: Vec::new(),
        }
    }
    pub fn push(&mut self, x: T) {
        if self.n < 2 {
            self.inline[self.n as usize] = x;
        } else {
            if self.n == 2 {
                self.spill.extend_from_slice(&self.inline);
            }
            self.spill.push(x);
        }
        self.n += 1;
    }
    pub fn as_slice(&self) -> &[T] {
        if self.n <= 2 {
            &self.inline[..self.n as usize]
        } else {
            &self.spill
        }
    }
    pub fn last_mut(&mut self) -> Option<&mut T> {
        match self.n {
            0 => None,
            1 | 2 => Some(&mut self.inline[self.n as usize - 1]),
            _ => self.spill.last_mut(),
        }
    }
    pub fn clear(&mut self) {
        self.n = 0;
        self.spill.clear();
    }
    pub fn len(&self) -> usize {
        self.n as usize
    }
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }
}

impl<T: Copy + Default + PartialEq> PartialEq for Inline2<T> {
    fn eq(&self, o: &Self) -> bool {
        self.as_slice() == o.as_slice()
    }
}

impl<T: Copy + Default + Eq> Eq for Inline2<T> {}

impl<T: Copy + Default> std::ops::Deref for Inline2<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        self.as_slice()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inline_then_spill() {
        let mut v = Inline2::<u32>::default();
        assert!(v.is_empty());
        v.push(1);
        v.push(2);
        assert_eq!(v.as_slice(), &[1, 2]);
        v.push(3);
        *v.last_mut().unwrap() = 4;
        assert_eq!(&*v, &[1, 2, 4]);
        v.clear();
        v.push(5);
        assert_eq!(v.as_slice(), &[5]);
        assert_eq!(v.len(), 1);
        let mut w = Inline2::one(6u32);
        assert_eq!(w.as_slice(), &[6]);
        w.push(7);
        w.push(8);
        assert_eq!(&*w, &[6, 7, 8]);
    }
}
