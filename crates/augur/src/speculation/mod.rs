//! Speculative decoding, the floor above plain decoding (`generation/`): the one loop (propose, verify in one
//! target forward, accept, roll back), verification, the cost model, draft lengths and back-off, the method a
//! call runs, and `methods/` with one drafter per file. The loop knows the [`Drafter`] trait and nothing of the
//! methods behind it.

pub mod backoff;
pub mod cost_model;
pub mod draft_length;
pub mod draft_vocab;
pub mod drafter;
pub mod factory;
pub mod method;
pub mod methods;
pub mod registry;
pub mod speculative;
pub mod suffix_cache;
pub mod verify;

pub use backoff::{Backoff, BackoffPolicy};
pub use drafter::{Draft, Drafter, TargetReads, TreeShape};
