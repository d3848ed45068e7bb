//! Fencing tokens and fenced resources: where safety actually comes from.
//!
//! A lease decides who may *start* work; it cannot stop a holder that pauses past its TTL and
//! resumes. The resource can: every protected write carries the writer's [`FencingToken`], the
//! resource remembers the highest token it accepted per key, and rejects anything older.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use crate::error::{Error, Result};
use crate::lease::LeaseKey;

/// The generation a store issues on each successful acquisition of a key.
///
/// Strictly increasing per key and never reused, whatever happens to the lease (release, expiry,
/// deletion, store restart: each backend documents what it rests on in its
/// [`Capabilities`](crate::Capabilities)). A plain, totally ordered 64-bit number so that a resource
/// can compare tokens without knowing which backend issued them (`docs/adr/0001-fencing-token.md`).
/// Tokens are at least 1 and at most `i64::MAX`, so they fit a SQL `BIGINT` unchanged.
///
/// ```
/// use leasehold_core::FencingToken;
/// let t = FencingToken::new(41)?;
/// assert!(t.next()? > t);
/// assert_eq!(i64::try_from(t)?, 41);
/// assert!(FencingToken::try_from(-1i64).is_err());
/// assert!(FencingToken::new(0).is_err());
/// assert_eq!(t.to_string(), "41");
/// # Ok::<(), leasehold_core::Error>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(u64);

impl FencingToken {
    /// The smallest token.
    pub const MIN: FencingToken = FencingToken(1);
    /// The largest token (`i64::MAX`).
    pub const MAX: FencingToken = FencingToken(i64::MAX.unsigned_abs());

    /// A token from its numeric value.
    ///
    /// # Errors
    /// [`Error::InvalidToken`] for 0 or values above `i64::MAX`.
    pub fn new(value: u64) -> Result<Self> {
        if value == 0 || value > Self::MAX.0 {
            return Err(Error::InvalidToken {
                reason: format!("{value} is outside 1..=i64::MAX"),
            });
        }
        Ok(FencingToken(value))
    }

    /// The numeric value.
    pub fn get(self) -> u64 {
        self.0
    }

    /// The next token.
    ///
    /// # Errors
    /// [`Error::InvalidToken`] at `i64::MAX`.
    pub fn next(self) -> Result<Self> {
        FencingToken::new(self.0 + 1)
    }

    /// The value as an `i64`, for SQL `BIGINT` columns and etcd revisions. Never fails, since
    /// tokens are at most `i64::MAX`.
    pub fn to_i64(self) -> i64 {
        i64::try_from(self.0).unwrap_or(i64::MAX)
    }
}

impl fmt::Debug for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FencingToken({})", self.0)
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl TryFrom<u64> for FencingToken {
    type Error = Error;
    fn try_from(value: u64) -> Result<Self> {
        FencingToken::new(value)
    }
}

impl TryFrom<i64> for FencingToken {
    type Error = Error;
    fn try_from(value: i64) -> Result<Self> {
        let v = u64::try_from(value).map_err(|_| Error::InvalidToken {
            reason: format!("{value} is negative"),
        })?;
        FencingToken::new(v)
    }
}

impl From<FencingToken> for u64 {
    fn from(t: FencingToken) -> u64 {
        t.0
    }
}

impl TryFrom<FencingToken> for i64 {
    type Error = Error;
    fn try_from(t: FencingToken) -> Result<i64> {
        i64::try_from(t.0).map_err(|_| Error::InvalidToken {
            reason: format!("{} exceeds i64", t.0),
        })
    }
}

impl std::str::FromStr for FencingToken {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let v: u64 = s.trim().parse().map_err(|_| Error::InvalidToken {
            reason: format!("{s:?} is not a number"),
        })?;
        FencingToken::new(v)
    }
}

/// A protected write.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum WriteOp {
    /// Replace the stored value.
    Put(Vec<u8>),
    /// Add to the stored counter (atomically with the token check).
    Add(i64),
}

/// What a fenced call asks of a [`FencedResource`]: the one argument of
/// [`FencedResource::apply`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum FenceOp {
    /// Apply a write ([`FencedResource::write`]).
    Write(WriteOp),
    /// Move the high-water mark without writing ([`FencedResource::install`]).
    Install,
}

impl FenceOp {
    /// The write, or `None` for an install, by value.
    pub fn into_write_op(self) -> Option<WriteOp> {
        match self {
            FenceOp::Write(op) => Some(op),
            FenceOp::Install => None,
        }
    }

    /// A short name for logs and spans: `"write"` or `"install"`.
    pub fn name(&self) -> &'static str {
        match self {
            FenceOp::Write(_) => "write",
            FenceOp::Install => "install",
        }
    }

    /// The write, or `None` for an install (the form [`ResourceState::apply`] takes).
    pub fn write_op(&self) -> Option<&WriteOp> {
        match self {
            FenceOp::Write(op) => Some(op),
            FenceOp::Install => None,
        }
    }
}

impl From<WriteOp> for FenceOp {
    fn from(op: WriteOp) -> Self {
        FenceOp::Write(op)
    }
}

/// The result of a fenced write or install.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum WriteOutcome {
    /// Applied; the high-water mark is now `high_water`.
    Accepted {
        /// The resource's highest accepted token after this write.
        high_water: FencingToken,
    },
    /// Rejected because a greater token was accepted (or installed) before; nothing changed.
    Rejected {
        /// The token the writer presented.
        presented: FencingToken,
        /// The greater token the resource already accepted.
        high_water: FencingToken,
    },
}

impl WriteOutcome {
    /// Whether the write was applied.
    pub fn is_accepted(&self) -> bool {
        matches!(self, WriteOutcome::Accepted { .. })
    }
}

/// What a fenced resource holds for a key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResourceState {
    /// The highest token accepted or installed.
    pub high_water: Option<FencingToken>,
    /// The last value written with [`WriteOp::Put`].
    pub value: Option<Vec<u8>>,
    /// The sum of all accepted [`WriteOp::Add`].
    pub counter: i64,
    /// How many writes were accepted.
    pub accepted: u64,
}

impl ResourceState {
    /// Applies the fencing rule to this state, in memory: a token below the high-water mark is
    /// rejected and changes nothing; otherwise the mark moves to the token and `op` (if any; `None`
    /// is an install) is applied. Backends that keep a resource's state as one record load it,
    /// call this, and write it back conditionally, so every fenced resource follows one rule.
    ///
    /// ```
    /// use leasehold_core::{FencingToken, ResourceState, WriteOp, WriteOutcome};
    /// let mut s = ResourceState::default();
    /// let (one, two) = (FencingToken::new(1)?, FencingToken::new(2)?);
    /// assert!(s.apply(two, Some(&WriteOp::Add(5))).is_accepted());
    /// assert_eq!(s.apply(one, Some(&WriteOp::Add(5))), WriteOutcome::Rejected { presented: one, high_water: two });
    /// assert_eq!((s.counter, s.accepted), (5, 1));
    /// # Ok::<(), leasehold_core::Error>(())
    /// ```
    pub fn apply(&mut self, token: FencingToken, op: Option<&WriteOp>) -> WriteOutcome {
        if let Some(high_water) = self.high_water
            && token < high_water
        {
            return WriteOutcome::Rejected {
                presented: token,
                high_water,
            };
        }
        self.high_water = Some(token);
        match op {
            Some(WriteOp::Put(v)) => {
                self.value = Some(v.clone());
                self.accepted += 1;
            }
            Some(WriteOp::Add(n)) => {
                self.counter = self.counter.saturating_add(*n);
                self.accepted += 1;
            }
            None => {}
        }
        WriteOutcome::Accepted { high_water: token }
    }
}

/// A resource that accepts writes only from the newest generation.
///
/// The contract every implementation keeps, per key:
/// - `write` with a token **at least** the high-water mark is applied and moves the mark to the
///   token, atomically with the write (equal tokens are allowed: one holder writes many times);
/// - a lower token is rejected with both tokens in the outcome and changes nothing;
/// - `install` moves the mark to a new generation *without* writing, so that the previous holder is
///   rejected even before the new one writes (immediate fencing). Installing a lower token than the
///   mark is rejected.
///
/// ```
/// use leasehold_core::{FencedResource, FencingToken, LeaseKey, MemoryFencedResource, WriteOp, WriteOutcome};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold_core::Result<()> {
/// let res = MemoryFencedResource::new();
/// let key = LeaseKey::new("ledger")?;
/// let (old, new) = (FencingToken::new(1)?, FencingToken::new(2)?);
/// assert!(res.write(&key, old, WriteOp::Add(1)).await?.is_accepted());
/// assert!(res.install(&key, new).await?.is_accepted());
/// let out = res.write(&key, old, WriteOp::Add(1)).await?;
/// assert_eq!(out, WriteOutcome::Rejected { presented: old, high_water: new });
/// # Ok(()) }
/// ```
///
/// # Implementing
/// One method does the work: [`apply`](FencedResource::apply) receives a [`FenceOp`] (a write or
/// an install); [`write`](FencedResource::write) and [`install`](FencedResource::install) are
/// provided on top of it. [`read`](FencedResource::read) is the other required method. A
/// resource that keeps its state as one record can load it, call [`ResourceState::apply`] with
/// [`FenceOp::write_op`], and store it back conditionally.
#[async_trait]
pub trait FencedResource: Send + Sync + fmt::Debug {
    /// Applies `op` (a write or an install) if `token` is at least the key's high-water mark, and
    /// moves the mark to `token`; otherwise changes nothing and reports both tokens.
    ///
    /// # Cancellation safety
    /// Not cancel safe for [`FenceOp::Write`]: a write cancelled in flight may or may not have
    /// been applied. [`FenceOp::Install`] is idempotent, so safe to retry after cancellation.
    async fn apply(&self, key: &LeaseKey, token: FencingToken, op: FenceOp)
    -> Result<WriteOutcome>;

    /// Applies `op` if `token` is at least the key's high-water mark
    /// (`apply(key, token, FenceOp::Write(op))`).
    ///
    /// # Cancellation safety
    /// Not cancel safe in general: a write cancelled in flight may or may not have been applied.
    async fn write(
        &self,
        key: &LeaseKey,
        token: FencingToken,
        op: WriteOp,
    ) -> Result<WriteOutcome> {
        self.apply(key, token, FenceOp::Write(op)).await
    }

    /// Moves the high-water mark to `token` (if not lower) without writing
    /// (`apply(key, token, FenceOp::Install)`).
    ///
    /// # Cancellation safety
    /// Idempotent, so safe to retry after cancellation.
    async fn install(&self, key: &LeaseKey, token: FencingToken) -> Result<WriteOutcome> {
        self.apply(key, token, FenceOp::Install).await
    }

    /// Reads the key's state.
    ///
    /// # Cancellation safety
    /// Cancel safe (read only).
    async fn read(&self, key: &LeaseKey) -> Result<ResourceState>;
}

#[async_trait]
impl<T: FencedResource + ?Sized> FencedResource for Arc<T> {
    async fn apply(
        &self,
        key: &LeaseKey,
        token: FencingToken,
        op: FenceOp,
    ) -> Result<WriteOutcome> {
        (**self).apply(key, token, op).await
    }
    async fn read(&self, key: &LeaseKey) -> Result<ResourceState> {
        (**self).read(key).await
    }
}

/// The in-memory reference [`FencedResource`]: a cloneable handle over shared state.
#[derive(Debug, Clone, Default)]
pub struct MemoryFencedResource {
    inner: Arc<Mutex<HashMap<LeaseKey, ResourceState>>>,
}

impl MemoryFencedResource {
    /// An empty resource.
    pub fn new() -> Self {
        Self::default()
    }

    fn apply_now(&self, key: &LeaseKey, token: FencingToken, op: &FenceOp) -> WriteOutcome {
        let mut map = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let out = map
            .entry(key.clone())
            .or_default()
            .apply(token, op.write_op());
        if let WriteOutcome::Rejected { high_water, .. } = out {
            tracing::debug!(key = %key, token = %token, high_water = %high_water, "stale token rejected");
        }
        out
    }
}

#[async_trait]
impl FencedResource for MemoryFencedResource {
    async fn apply(
        &self,
        key: &LeaseKey,
        token: FencingToken,
        op: FenceOp,
    ) -> Result<WriteOutcome> {
        Ok(self.apply_now(key, token, &op))
    }
    async fn read(&self, key: &LeaseKey) -> Result<ResourceState> {
        let map = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        Ok(map.get(key).cloned().unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts the calls that reach `apply`: the provided `write` and `install` must route there.
    #[derive(Debug, Default)]
    struct Recording {
        inner: MemoryFencedResource,
        seen: Mutex<Vec<FenceOp>>,
    }

    #[async_trait]
    impl FencedResource for Recording {
        async fn apply(
            &self,
            key: &LeaseKey,
            token: FencingToken,
            op: FenceOp,
        ) -> Result<WriteOutcome> {
            self.seen.lock().unwrap().push(op.clone());
            self.inner.apply(key, token, op).await
        }
        async fn read(&self, key: &LeaseKey) -> Result<ResourceState> {
            self.inner.read(key).await
        }
    }

    #[tokio::test]
    async fn write_and_install_are_apply() {
        let r = Arc::new(Recording::default());
        let key = LeaseKey::new("k").unwrap();
        let (one, two) = (FencingToken::new(1).unwrap(), FencingToken::new(2).unwrap());
        assert!(
            r.write(&key, one, WriteOp::Add(3))
                .await
                .unwrap()
                .is_accepted()
        );
        assert!(r.install(&key, two).await.unwrap().is_accepted());
        let stale = r.write(&key, one, WriteOp::Put(vec![1])).await.unwrap();
        assert_eq!(
            stale,
            WriteOutcome::Rejected {
                presented: one,
                high_water: two
            }
        );
        assert_eq!(
            *r.seen.lock().unwrap(),
            [
                FenceOp::Write(WriteOp::Add(3)),
                FenceOp::Install,
                FenceOp::Write(WriteOp::Put(vec![1]))
            ]
        );
        let state = r.read(&key).await.unwrap();
        assert_eq!((state.counter, state.accepted, state.value), (3, 1, None));
        assert_eq!(FenceOp::Install.name(), "install");
        assert_eq!(
            FenceOp::from(WriteOp::Add(1)).into_write_op(),
            Some(WriteOp::Add(1))
        );
    }
}
