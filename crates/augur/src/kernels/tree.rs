//! The shape of a tree-verification block: which earlier rows of the block each row attends to. Every row sees
//! the cache before the block and its own ancestors; its rotary position is its depth. A causal block is the
//! tree in which every row's parent is the row before it.

use crate::error::{Error, Result};

/// A tree of rows: `parents[i] < i` is row `i`'s parent; a row without one (row 0 at least) follows the cache
/// before the tree directly, at depth 0. The first `cached` rows were fed by earlier forwards (a drafter grows
/// its tree depth by depth); a forward feeds the rest, its block. Built once per forward; every layer reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeMask {
    /// `paths[i]`: the tree rows from row `i`'s root down to row `i` (inclusive), `[depth(i) + 1]`.
    paths: Vec<Vec<usize>>,
    cached: usize,
}

impl TreeMask {
    /// The tree of `parents` (one per row of the block), checked: row 0 has no parent, and every parent comes
    /// before its child.
    pub fn new(parents: &[Option<usize>]) -> Result<Self> {
        let mut paths: Vec<Vec<usize>> = Vec::with_capacity(parents.len());
        for (i, p) in parents.iter().enumerate() {
            let path = match (i, p) {
                (_, None) => vec![i],
                (_, Some(p)) if *p < i => {
                    let mut path = paths[*p].clone();
                    path.push(i);
                    path
                }
                _ => {
                    return Err(Error::InvalidOption(format!(
                        "tree row {i} has parent {p:?}: a parent must be an earlier row"
                    )))
                }
            };
            paths.push(path);
        }
        Ok(Self { paths, cached: 0 })
    }

    /// The tree whose first `cached` rows are in the cache already.
    pub fn with_cached(self, cached: usize) -> Result<Self> {
        if cached >= self.paths.len() {
            return Err(Error::InvalidOption(format!("a tree of {} rows with {cached} cached", self.paths.len())));
        }
        Ok(Self { cached, ..self })
    }

    /// A chain of `len` rows: the causal block, as a tree.
    pub fn chain(len: usize) -> Self {
        Self { paths: (0..len).map(|i| (0..=i).collect()).collect(), cached: 0 }
    }

    /// Rows of the block (the rows not cached yet).
    pub fn len(&self) -> usize {
        self.paths.len() - self.cached
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Rows of the tree fed before the block: the block starts this many positions after the tree's.
    pub fn cached(&self) -> usize {
        self.cached
    }

    /// Block row `row`'s depth: its position in the sequence is the tree's start plus this.
    pub fn depth(&self, row: usize) -> usize {
        self.paths[self.cached + row].len() - 1
    }

    /// The tree rows block row `row` attends to, its root first, itself last.
    pub fn path(&self, row: usize) -> &[usize] {
        &self.paths[self.cached + row]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_depths_follow_the_parents() {
        let t = TreeMask::new(&[None, Some(0), Some(0), Some(1), Some(2), Some(2)]).unwrap();
        assert_eq!(t.path(5), &[0, 2, 5]);
        assert_eq!(t.depth(3), 2);
        assert_eq!(TreeMask::new(&[None, Some(0), Some(1)]).unwrap(), TreeMask::chain(3));
        assert_eq!(TreeMask::new(&[None, None, Some(1)]).unwrap().path(2), &[1, 2]);
        assert!(TreeMask::new(&[None, Some(1)]).is_err());
        assert!(TreeMask::new(&[Some(0)]).is_err());
        let grown = TreeMask::new(&[None, Some(0), None, Some(1)]).unwrap().with_cached(2).unwrap();
        assert_eq!((grown.len(), grown.depth(1), grown.path(1)), (2, 2, &[0, 1, 3][..]));
    }
}
