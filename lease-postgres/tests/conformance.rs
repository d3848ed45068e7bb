//! The shared lease-testkit suite, unchanged, against the real PostgreSQL server, plus this
//! backend's own failure cases (group `postgres`).
//!
//! Server: `LEASE_POSTGRES_URL` (default `postgres://postgres@127.0.0.1:5432/test`). Tables live in
//! the schema `lease_pg_test`; every case uses its own random key namespace and deletes its rows.

mod support;

use std::sync::Arc;
use std::time::Duration;

use lease_core::{FencedResource, LeaseStore};
use lease_testkit::{Backend, BoxFuture, case};

#[derive(Debug)]
struct Postgres;

impl Backend for Postgres {
    fn name(&self) -> &'static str {
        "postgres"
    }

    fn connect(&self) -> BoxFuture<'_, lease_core::Result<Arc<dyn LeaseStore>>> {
        Box::pin(async { Ok(Arc::new(support::store().await?) as Arc<dyn LeaseStore>) })
    }

    fn resource(&self) -> BoxFuture<'_, lease_core::Result<Arc<dyn FencedResource>>> {
        Box::pin(async {
            Ok(Arc::new(support::store().await?.fenced_resource()) as Arc<dyn FencedResource>)
        })
    }

    /// Longer than the default 600 ms: the shared 2-core test machine (other crates compiling,
    /// fsyncs of their target dirs) can stall a round trip past the supervisor's per-call
    /// timeout of TTL / 3.
    fn short_ttl(&self) -> Duration {
        Duration::from_millis(2000)
    }

    fn cleanup<'a>(&'a self, namespace: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            if let Ok(store) = support::store().await {
                let _ = store.delete_prefix(namespace).await;
            }
        })
    }
}

fn main() {
    support::migrate_once();
    lease_testkit::run_with(
        Postgres,
        vec![
            case!(
                "postgres",
                support::seed::seed_statements_behave_as_described_next_to_the_library
            ),
            case!(
                "postgres",
                support::seed::tokens_never_go_back_after_row_deletion_or_hand_edits
            ),
            case!(
                "postgres",
                support::fenced::fenced_transaction_commits_only_for_the_valid_holder
            ),
            case!(
                "postgres",
                support::fenced::fenced_transaction_holds_off_takeover_and_rechecks_expiry
            ),
            case!(
                "postgres",
                support::fenced::fenced_transaction_is_bounded_by_server_timeouts
            ),
            case!(
                "postgres",
                support::fenced::advance_in_fences_a_callers_own_transaction
            ),
            case!(
                "postgres",
                support::row_fence::lease_row_fence_rejects_the_stale_owner
            ),
            case!(
                "postgres",
                support::row_fence::lease_row_fence_installed_generation_rejects_the_old_owner
            ),
            case!(
                "postgres",
                support::row_fence::lease_row_fence_contention_gives_exact_count
            ),
            case!(
                "postgres",
                support::advisory::advisory_xact_lock_excludes_and_try_reports_busy
            ),
            case!(
                "postgres",
                support::clock::forward_clock_step_grants_early_and_fencing_rejects_the_old_holder
            ),
            case!(
                "postgres",
                support::deadline::fenced_transaction_has_a_client_deadline
            ),
            case!(
                "postgres",
                support::deadline::lease_row_fence_has_a_client_deadline
            ),
            case!(
                "postgres",
                support::deadline::advisory_locks_have_a_client_deadline
            ),
            case!(
                "postgres",
                support::failure::terminated_connections_lose_no_lease_and_leak_no_lock
            ),
            case!(
                "postgres",
                support::failure::supervisor_recovers_from_killed_connections
            ),
            case!(
                "postgres",
                support::failure::pool_exhausted_is_a_retryable_error_without_hang
            ),
            case!(
                "postgres",
                support::failure::bad_configuration_is_a_typed_error
            ),
            case!(
                "postgres",
                support::failure::migrate_is_idempotent_and_concurrent_safe
            ),
            case!(
                "postgres",
                support::failure::renew_many_renews_exactly_the_held_leases
            ),
            case!(
                "postgres",
                support::schema::migrate_handles_a_schema_named_like_the_table
            ),
            case!(
                "postgres",
                support::schema::migrate_upgrades_a_version_1_schema
            ),
            case!(
                "postgres",
                support::watch::watch_wakes_only_the_released_key
            ),
            case!(
                "postgres",
                support::watch::watches_of_different_tables_are_separate
            ),
            case!("postgres", support::watch::dropped_watches_unsubscribe),
            case!(
                "postgres",
                support::watch::killed_listener_ends_watches_and_next_watch_reconnects
            ),
            case!("postgres", support::watch::notify_off_offers_no_watch),
            case!(
                "postgres",
                support::watch::supervisor_handoff_is_woken_by_the_watch
            ),
        ],
    );
}
