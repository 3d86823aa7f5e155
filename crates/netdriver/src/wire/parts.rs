//! Bytes held in a few separate slices, read in order as if they were one: a frame a link
//! received as a chain of buffers (AF_XDP multi-buffer), or the TCP payload of such a
//! frame, lent where it lies rather than gathered into one slice first.
//!
//! [`Parts`] is a view: a first slice, the slices after it, and how many bytes of them
//! count (the rest, Ethernet padding say, is ignored). It is `Copy` and cuts in O(parts)
//! without touching the bytes, so the TCP receive path can trim a payload to its window
//! as it trims a slice. Checksums over parts ([`Parts::sum`]) keep each slice's byte
//! lanes in place (RFC 1071 §2 (B), [`checksum::at_offset`]).

use super::checksum;

/// A byte string made of up to a few slices (see the [module documentation](self)).
#[derive(Debug, Clone, Copy)]
pub struct Parts<'a> {
    /// The first slice, already cut at the front.
    head: &'a [u8],
    /// The slices after it, uncut (only `len` bytes count in all).
    tail: &'a [&'a [u8]],
    /// Bytes in the view.
    len: usize,
}

impl<'a> Parts<'a> {
    /// One contiguous slice.
    #[inline]
    pub fn whole(bytes: &'a [u8]) -> Parts<'a> {
        Parts {
            head: bytes,
            tail: &[],
            len: bytes.len(),
        }
    }

    /// `head`, then each slice of `tail` in turn, all of them.
    pub fn new(head: &'a [u8], tail: &'a [&'a [u8]]) -> Parts<'a> {
        let len = tail
            .iter()
            .fold(head.len(), |n, p| n.saturating_add(p.len()));
        Parts { head, tail, len }
    }

    /// The slices of a chain, in order (none: an empty view).
    pub fn of(parts: &'a [&'a [u8]]) -> Parts<'a> {
        match parts.split_first() {
            Some((head, tail)) => Parts::new(head, tail),
            None => Parts::whole(&[]),
        }
    }

    /// Bytes in the view.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the view holds no bytes.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes of the first slice (all of them for a contiguous view).
    #[inline]
    pub fn first(&self) -> &'a [u8] {
        &self.head[..self.head.len().min(self.len)]
    }

    /// The view as one slice, when its bytes lie in one.
    #[inline]
    pub fn as_slice(&self) -> Option<&'a [u8]> {
        (self.head.len() >= self.len).then(|| &self.head[..self.len])
    }

    /// The first `n` bytes (all of them when there are fewer).
    #[inline]
    pub fn take(self, n: usize) -> Parts<'a> {
        Parts {
            len: self.len.min(n),
            ..self
        }
    }

    /// The bytes after the first `n` (none when there are fewer).
    #[inline]
    pub fn skip(self, n: usize) -> Parts<'a> {
        if n == 0 {
            return self;
        }
        if n >= self.len {
            return Parts::whole(&[]);
        }
        if n < self.head.len() {
            return Parts {
                head: &self.head[n..],
                tail: self.tail,
                len: self.len - n,
            };
        }
        self.skip_into_tail(n)
    }

    /// [`skip`](Self::skip) past the first slice (`n` less than the length).
    fn skip_into_tail(self, n: usize) -> Parts<'a> {
        let len = self.len - n;
        let mut n = n - self.head.len();
        let mut tail = self.tail;
        while let Some((first, rest)) = tail.split_first() {
            if n < first.len() {
                return Parts {
                    head: &first[n..],
                    tail: rest,
                    len,
                };
            }
            n -= first.len();
            tail = rest;
        }
        // `len` counted more bytes than the slices hold: never from the constructors.
        Parts::whole(&[])
    }

    /// The non-empty slices in order, cut to the view.
    pub fn slices(&self) -> impl Iterator<Item = &'a [u8]> + 'a {
        let mut left = self.len;
        core::iter::once(self.head)
            .chain(self.tail.iter().copied())
            .map(move |s| {
                let s = &s[..s.len().min(left)];
                left -= s.len();
                s
            })
            .filter(|s| !s.is_empty())
    }

    /// Copies the first `out.len()` bytes (at most all of them) into `out`; returns how
    /// many.
    pub fn copy_to(&self, out: &mut [u8]) -> usize {
        let mut at = 0;
        for s in self.slices() {
            let n = s.len().min(out.len() - at);
            out[at..at + n].copy_from_slice(&s[..n]);
            at += n;
            if at == out.len() {
                break;
            }
        }
        at
    }

    /// Appends the bytes to `out`.
    pub fn extend_into(&self, out: &mut Vec<u8>) {
        for s in self.slices() {
            out.extend_from_slice(s);
        }
    }

    /// The folded one's-complement sum of the bytes, as [`checksum::data`] of them laid
    /// end to end.
    #[inline]
    pub fn sum(&self) -> u16 {
        if let Some(bytes) = self.as_slice() {
            return checksum::data(bytes);
        }
        let mut at = 0;
        let mut sum = 0;
        for s in self.slices() {
            sum = checksum::add(sum, checksum::at_offset(checksum::data(s), at));
            at += s.len();
        }
        sum
    }
}

impl<'a> From<&'a [u8]> for Parts<'a> {
    fn from(bytes: &'a [u8]) -> Parts<'a> {
        Parts::whole(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 + 3) as u8).collect()
    }

    fn collect(p: Parts<'_>) -> Vec<u8> {
        let mut v = Vec::new();
        p.extend_into(&mut v);
        v
    }

    #[test]
    fn every_cut_reads_the_same_bytes_and_sum_as_the_slice() {
        let data = bytes(23);
        for a in 0..=data.len() {
            for b in a..=data.len() {
                let slices = [&data[..a], &data[a..b], &data[b..]];
                let p = Parts::of(&slices);
                assert_eq!(p.len(), data.len());
                assert_eq!(collect(p), data, "cut {a} {b}");
                assert_eq!(p.sum(), checksum::data(&data), "cut {a} {b}");
                for skip in 0..=data.len() + 1 {
                    for take in [0, 1, 2, 5, 30] {
                        let q = p.skip(skip).take(take);
                        let want = data.get(skip..).unwrap_or(&[]);
                        let want = &want[..want.len().min(take)];
                        assert_eq!(collect(q), want, "cut {a} {b} skip {skip} take {take}");
                        assert_eq!(q.len(), want.len());
                        assert_eq!(q.sum(), checksum::data(want));
                        let mut out = [0u8; 7];
                        let n = q.copy_to(&mut out);
                        assert_eq!(&out[..n], &want[..want.len().min(7)]);
                    }
                }
            }
        }
    }

    #[test]
    fn a_view_is_one_slice_only_while_its_bytes_lie_in_the_first() {
        let data = bytes(10);
        let slices = [&data[..4], &data[4..]];
        let p = Parts::of(&slices);
        assert_eq!(p.as_slice(), None);
        assert_eq!(p.take(4).as_slice(), Some(&data[..4]));
        assert_eq!(p.skip(4).as_slice(), Some(&data[4..]));
        assert_eq!(Parts::of(&[]).len(), 0);
        assert!(Parts::of(&[]).is_empty());
    }
}
