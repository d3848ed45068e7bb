//! The wire protocol between simulated clients and the simulated store: one JSON object per line.
//!
//! Durations travel as whole microseconds, tokens as their numeric value. Every request carries an
//! id that its response echoes, so a client that timed out and reconnected never mistakes a late
//! answer for the answer to a newer request.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A request to the simulated server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// [`LeaseStore::acquire`](leasehold_core::LeaseStore::acquire).
    Acquire {
        /// The key.
        key: String,
        /// The owner.
        owner: String,
        /// The TTL in microseconds.
        ttl_us: u64,
    },
    /// [`LeaseStore::renew`](leasehold_core::LeaseStore::renew).
    Renew {
        /// The key.
        key: String,
        /// The owner.
        owner: String,
        /// The token.
        token: u64,
        /// The TTL in microseconds.
        ttl_us: u64,
    },
    /// [`LeaseStore::release`](leasehold_core::LeaseStore::release).
    Release {
        /// The key.
        key: String,
        /// The owner.
        owner: String,
        /// The token.
        token: u64,
        /// The TTL in microseconds.
        ttl_us: u64,
    },
    /// [`LeaseStore::inspect`](leasehold_core::LeaseStore::inspect).
    Inspect {
        /// The key.
        key: String,
    },
    /// [`FencedResource::write`](leasehold_core::FencedResource::write) of a counter increment.
    Write {
        /// The key.
        key: String,
        /// The writer's token.
        token: u64,
        /// The increment.
        add: i64,
    },
    /// [`FencedResource::install`](leasehold_core::FencedResource::install).
    Install {
        /// The key.
        key: String,
        /// The new generation.
        token: u64,
    },
}

/// A holder as the server reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireHolder {
    /// The holder's owner id.
    pub owner: String,
    /// Its token.
    pub token: u64,
    /// Time left, in microseconds, by the server's clock.
    pub remaining_us: u64,
    /// Its TTL in microseconds.
    pub ttl_us: u64,
}

/// The server's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Response {
    /// Granted with this token.
    Acquired {
        /// The token.
        token: u64,
    },
    /// Held by someone else.
    Held(WireHolder),
    /// Renewed.
    Renewed,
    /// Renewal refused.
    Lost,
    /// Released.
    Released,
    /// Release refused.
    NotHeld,
    /// The key's state.
    State {
        /// The unexpired holder.
        holder: Option<WireHolder>,
        /// The last token issued.
        last_token: Option<u64>,
    },
    /// The fenced write or install was applied.
    Accepted {
        /// The high-water mark after it.
        high_water: u64,
    },
    /// The fenced write or install was rejected.
    Rejected {
        /// The token presented.
        presented: u64,
        /// The greater mark already accepted.
        high_water: u64,
    },
    /// The request failed; `invalid` tells invalid input from a store failure.
    Error {
        /// Whether the input was invalid.
        invalid: bool,
        /// The message.
        message: String,
    },
}

/// A request or response with its id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Frame<T> {
    /// The request id (echoed by the response).
    pub id: u64,
    /// The payload.
    pub body: T,
}

/// A duration as whole microseconds (saturating).
pub fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}
