"""The contract suite on PostgreSQL: an env whose stores are `FencedPostgresSaver`s.

Invariant: `PG_CASES` lists exactly the cases `FencedPostgresSaver` claims:
each runs and passes against it (tests/conformance/test_contract.py runs them all, on
both APIs). A case not listed needs what this store does not have yet (the
docs/postgres.md names them); it is not run against PostgreSQL,
never run and skipped.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

from ..clock import ManualClock
from .harness import ContractEnv
from .storage import PostgresStorage

__all__ = ["PG_CAPABILITIES", "PG_CASES", "make_pg_env"]

# Two stores on one schema ("sibling"), a store reopened on it ("reopen"), and
# its value table read and damaged with psycopg ("storage"); not "processes":
# the cases' children open SQLite files.
PG_CAPABILITIES = frozenset({"sibling", "reopen", "storage"})

PG_CASES: tuple[str, ...] = (
    "03-pending_writes_round_trip_in_langgraph_order",
    "03-special_channels_are_last_writer_wins",
    "03-a_write_its_checkpoint_holds_is_stored_once_and_reads_back",
    "03-values_metadata_and_writes_round_trip",
    "04-history_pages_newest_first",
    "04-history_paging_visits_every_checkpoint_once",
    "04-list_pages_by_either_shape_of_before",
    "05-reopen_keeps_everything",
    "06-close_twice_then_calls_raise_store_closed",
    "08-claim_is_exclusive_until_expiry",
    "08-claim_is_exclusive_until_expiry_siblings",
    "09-expiry_takeover_fences_old_holder",
    "09-expiry_takeover_fences_old_holder_siblings",
    "10-token_checked_before_version",
    "10-token_checked_before_version_siblings",
    "11-unknown_token_is_stale",
    "12-expired_unreplaced_holder_still_writes",
    "13-renew_extends_from_now_and_release_frees",
    "13-renew_extends_from_now_and_release_frees_siblings",
    "14-tokens_strictly_increase",
    "14-tokens_strictly_increase_siblings",
    "15-concurrent_claims_one_store",
    "15-concurrent_claims_own_stores",
    "16-require_claim_refuses_every_unfenced_write",
    "16-unfenced_put_refused_only_under_live_claim",
    "16-unfenced_put_refused_only_under_live_claim_siblings",
    "17-latest_is_by_commit_position",
    "17-version_check_for_input_and_loop",
    "18-stale_owner_never_displaces_current_writes",
    "18-stale_owner_never_displaces_current_writes_siblings",
    "19-each_write_appends_one_event_without_values",
    "19-failed_writes_spend_no_seq",
    "20-concurrent_commits_get_contiguous_seqs",
    "21-events_after_pages_ascending",
    "21-events_after_unknown_thread_is_empty",
    "22-compact_events_raises_floor_only",
    "23-wait_events_returns_at_once_or_empty_after_timeout",
    "23-wait_events_wakes_for_sibling_commit",
    "24-cancelled_wait_and_closed_watch_end_promptly",
    "25-resubscribe_after_restart_sees_exactly_the_rest",
    "26-retract_turn_by_run_id_removes_that_run_only",
    "26-retract_turn_removes_a_runs_writes_on_older_checkpoints",
    "26-retract_turn_with_run_ids_restores_state",
    "26-retract_turn_with_stale_token_changes_nothing",
    "26-retract_turn_without_run_ids_takes_subgraphs_saved_first",
    "26-retract_turn_without_run_ids_uses_input_checkpoint",
    "27-prune_by_age_uses_store_clock_and_keeps_latest",
    "27-prune_by_count_keeps_newest_and_latest_per_namespace",
    "27-prune_by_event_count_never_lowers_floor",
    "27-prune_unknown_thread_is_no_error",
    "28-delete_thread_removes_that_thread_only",
    "28-removals_free_the_value_rows_only_removed_checkpoints_named",
    "28-a_message_its_input_holds_is_stored_once_and_outlives_the_input",
    "28-a_reply_its_write_holds_is_stored_once_and_outlives_the_write",
    "28-a_row_naming_a_replaced_write_is_undecodable_and_never_named_again",
    "28-a_run_deleted_from_the_middle_leaves_later_lists_whole",
    "29-bad_input_is_rejected_before_the_file_is_touched",
    "29-malformed_writes_events_configs_and_filters_are_rejected",
    "30-allowed_types_make_a_user_type_round_trip",
    "30-non_allowed_type_is_refused_at_put_naming_it",
    "31-a_reader_of_a_deleted_thread_is_never_shown_a_gap",
    "33-an_accepted_special_write_after_expiry_is_what_readers_see",
    "34-a_damaged_value_row_is_undecodable_naming_its_channel",
    "34-a_forged_slice_write_is_undecodable",
    "35-wrong_shape_arguments_are_invalid_argument_and_change_nothing",
    "38-a_later_run_fences_off_every_earlier_run",
    "38-a_later_run_fences_off_every_earlier_run_siblings",
    "38-a_run_may_start_from_any_checkpoint",
    "38-a_runs_claim_yields_to_every_other_writer",
    "38-a_runs_lifecycle_reaches_the_log_and_its_status",
    "39-a_missing_or_wrong_key_is_refused_naming_the_checkpoint",
    "39-rotated_keys_read_and_rekey_moves_every_cell",
    "39-sealed_values_read_back_and_hold_nothing_in_clear",
    "39-tampered_ciphertext_is_refused_naming_its_channel",
    "39-values_in_clear_are_refused_unless_migrating",
    "40-search_filters_by_status_and_activity_as_threads_does",
    "40-search_follows_retraction_deletion_and_pruning",
    "40-search_matches_the_latest_root_checkpoints_metadata",
    "40-search_orders_and_pages_every_thread_once",
    "40-search_refuses_bad_arguments_naming_them",
    "41-a_threads_ttl_is_stored_in_the_file_and_read_back",
    "41-an_idle_thread_expires_by_its_strategy",
    "41-a_thread_written_or_claimed_is_not_expired",
    "41-stores_expiring_at_once_remove_each_thread_once",
    "41-nothing_due_commits_nothing",
    "41-the_sweeper_runs_by_itself_and_stops_on_close",
)


def make_pg_env(dsn: str, *, api: str = "sync", directory: str | None = None) -> ContractEnv:
    """Make an env whose stores are `FencedPostgresSaver`s on `dsn` (set up on open).

    Give each env a DSN of its own (an empty database or schema): the cases
    expect fresh storage. `path` is a directory for a case's own files.
    """
    import psycopg

    from ..postgres import FencedPostgresSaver

    def factory(**kwargs: Any) -> FencedPostgresSaver:
        conn = psycopg.connect(dsn, autocommit=True)
        try:
            saver = FencedPostgresSaver(conn, _owned=True, **kwargs)
        except BaseException:
            conn.close()
            raise
        saver.setup()
        return saver

    directory = directory or tempfile.mkdtemp(prefix="lgfs-contract-pg-")
    return ContractEnv(
        os.path.join(directory, "contract.db"),
        ManualClock(),
        api,
        capabilities=PG_CAPABILITIES,
        store_factory=factory,
        storage=PostgresStorage(dsn),
    )
