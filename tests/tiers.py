"""The test tiers: the gate (the README's test command, minutes) and the full tier.

Every test that starts no job (pure logic, in-process sockets and signals) is in the gate.
Of the tests that start processes (``processes``, ``soak``, ``frameworks``), the gate runs the
ones named below: each mechanism at least once (every start method; torchrun on one and two
nodes; every exit path; signal ownership as a pairwise cover of its matrix; media; console;
``install()`` under one real framework; one comparison with plain wandb per record type).
Every other one is marked ``full`` and runs in ``tox -e full``, and, sampled, after the gate
in ``.ci/run``. A new process test is ``full`` until it is named here.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence

# node ids (from tests/), "file::test" or "file::test[param]"; a name without a parameter
# takes every parametrization of that test.
GATE: frozenset[str] = frozenset(
    {
        # frameworks: install() under one real framework (accelerate under torchrun: 30 s, where
        # Lightning takes 50); wandb's tensorboard sync, one way
        "frameworks/test_clients.py::test_client_through_the_funnel_keeps_everything_plain_wandb_had[accelerate-install]",
        "frameworks/test_tensorboard.py::test_one_process_gets_plain_wandbs_tensorboard_history_files_and_tbrecords[run-torch]",
        "frameworks/test_tensorboard.py::test_keywords_that_cannot_act_in_the_caller_warn_once_and_are_counted[wf-init-not_carried0]",
        # online against OpenWandb behind the fault proxy: healthy, and a server that never
        # answers (the run offline under its id, the printed wandb sync uploads it)
        "online/test_funnel_online.py::test_an_online_run_reaches_the_server_whole",
        "online/test_funnel_online.py::test_a_server_that_never_answers_costs_no_rank_any_time_and_no_row",
        # testing.capture_run, as a user's test runs it
        "processes/test_capture.py::test_a_users_test_gets_every_row_without_wandb",
        # examples/: the ways in as a user runs them (wandb-funnel run on an unmodified
        # script, install(), capture_run in a user's pytest file: 5-15 s each; Lightning's
        # FunnelLogger, 15-35 s: the full tier)
        "processes/test_examples.py::test_an_unmodified_script_under_wandb_funnel_run_makes_one_run",
        "processes/test_examples.py::test_install_in_a_script_that_spawns_its_ranks_makes_one_run",
        "processes/test_examples.py::test_a_users_capture_run_test_passes_and_catches_a_wrong_key",
        # console (output_raw) and system metrics (stats, each rank's, sampled in the same job),
        # against plain wandb (a job where only rank 0 calls wandb: full tier; its ordering
        # rule is test_ordering's; ranks busy while sampled: full tier)
        "processes/test_console.py::test_every_ranks_console_reaches_the_run_labelled_and_the_program_is_the_script",
        # torchrun: two nodes (auto, and new mode per worker), one node (a rank that raises;
        # 4 ranks: test_health's; SIGTERM to torchrun: the soak's torchrun-sigterm scenario)
        "processes/test_ddp.py::test_mode_scope_matrix_on_two_nodes[auto-global-runs0]",
        "processes/test_ddp.py::test_mode_scope_matrix_on_two_nodes[new-worker-runs5]",
        "processes/test_ddp.py::test_rank_raising_fails_the_run",
        # the node tier (issue 38): two torchrun agents, 2 ranks each (10-15 s each): exact
        # reductions and status, a node logger SIGKILLed (also with an image's bytes in it;
        # flat side by side, the root
        # logger killed, wandb-funnel run on each node: the full tier)
        "processes/test_nodes.py::test_two_nodes_one_run_exact_reductions_and_status",
        "processes/test_nodes.py::test_a_sigkilled_node_logger_loses_no_rank_s_record",
        "processes/test_nodes.py::test_an_image_in_flight_in_a_sigkilled_node_logger_reaches_the_run",
        # install() and wandb-funnel run: the wandb API against plain wandb (history, config,
        # summary, metric records), every kind of child, the command line, mp.spawn ranks
        "processes/test_installed.py::test_the_wandb_api_through_the_funnel_matches_plain_wandb",
        "processes/test_installed.py::test_install_holds_in_every_kind_of_child_process",
        "processes/test_installed.py::test_funnel_run_exits_with_the_commands_code_and_exports_the_options",
        "processes/test_installed.py::test_funnel_run_takes_the_command_without_dashes_and_the_tool_has_a_version",
        "processes/test_installed.py::test_mp_spawn_ranks_with_only_a_process_group_make_one_run",
        # a WANDB_FUNNEL_* variable acts through each entry point, a bad one is named (issue
        # 35; 2-5 s each; the torchrun stall case, 20 s: the full tier)
        "processes/test_option_variables.py::test_the_run_mode_variable_acts_through_funnel_and_install",
        "processes/test_option_variables.py::test_the_reduce_variable_acts_through_init",
        "processes/test_option_variables.py::test_wandb_funnel_run_takes_variables_under_its_flags_in_every_process",
        "processes/test_option_variables.py::test_wandb_funnel_run_names_a_bad_variable",
        # run.name / notes / tags against plain wandb: the script as is, under `wandb-funnel
        # run`, and set from a spawn worker's wf.init (issue 34; 5 s; wandb's cross-validation
        # example: the full tier)
        "processes/test_run_attributes.py::test_name_notes_and_tags_set_from_any_rank_are_plain_wandbs",
        # a logger started ahead of time: used, and gone when unused (issue 34)
        "processes/test_prewarm.py::test_a_script_that_never_calls_init_leaves_no_logger",
        "processes/test_prewarm.py::test_the_run_takes_the_environment_and_directory_of_its_init",
        # the terminal of a script that never calls finish() (issue 34)
        "processes/test_parity.py::test_a_script_that_never_finishes_prints_what_plain_wandb_prints",
        # the user's steps as plain wandb writes them (issue 34), one way in
        "processes/test_installed.py::test_steps_and_a_partial_global_step_read_back_as_plain_wandb_writes_them[run]",
        # exit paths: an exception, atexit without close, a signal, a straggler, a dead worker, a
        # dead logger (restarted, or not: test_restart's), a dead owner (test_restart's), a
        # stalled wandb, a backlog at close (a dead owner with a stalled wandb: the full tier)
        "processes/test_lifecycle.py::test_exception_in_block_exits_1",
        "processes/test_lifecycle.py::test_the_logger_process_exits_with_the_runs_exit_code[3]",
        "processes/test_lifecycle.py::test_no_close_atexit[raise-1]",
        "processes/test_lifecycle.py::test_private_funnel_is_like_wandb_init",
        "processes/test_lifecycle.py::test_signal_mid_run[15-143-group]",
        "processes/test_lifecycle.py::test_sigterm_that_misses_the_main_thread_still_runs_its_handler[spawn]",
        "processes/test_lifecycle.py::test_sigterm_during_a_batch_send_loses_nothing[True]",
        "processes/test_lifecycle.py::test_close_waits_for_a_straggler",
        "processes/test_lifecycle.py::test_dead_worker_is_not_waited_for",
        "processes/test_lifecycle.py::test_logger_death_does_not_fail_training",
        # the logger (or the owner) SIGKILLed mid-run: every step once; its wandb-core, while
        # one rank is far behind the other (that rank's records of the dead logger's last
        # steps must be written, not skipped as duplicates)
        "processes/test_restart.py::test_a_killed_logger_or_wandb_core_costs_no_step[logger]",
        "processes/test_restart.py::test_a_killed_logger_costs_no_step_on_the_recording_sink",
        "processes/test_one_core.py::test_a_funnel_job_runs_one_wandb_core",
        "processes/test_one_core.py::test_an_installed_job_runs_one_wandb_core",
        "processes/test_restart.py::test_the_owners_death_leaves_the_workers_steps_and_a_failed_run",
        "processes/test_restart.py::test_a_rank_far_behind_when_the_logger_dies_loses_nothing[core]",
        # rank health under torchrun (4 gloo ranks): spread names the straggler, and
        # `wandb-funnel status --json` from another process lists the job's ranks
        "processes/test_health.py::test_spread_names_the_straggler_and_status_shows_the_job",
        "processes/test_lifecycle.py::test_stalled_wandb_finish_is_bounded",
        "processes/test_lifecycle.py::test_close_with_a_row_backlog_keeps_its_deadline_and_accounting",
        # media (history media, tables across ranks, files and artifacts) against plain wandb
        "processes/test_media.py::test_wandbs_media_through_install_are_recorded_as_plain_wandb_records_them",
        "processes/test_media.py::test_every_ranks_table_becomes_one_table_and_ranks_never_import_wandb[auto]",
        "processes/test_media.py::test_a_kill_with_media_in_flight_leaves_nothing_staged[rank]",
        "processes/test_media.py::test_watch_artifacts_and_save_from_any_rank_as_plain_wandb_records_them",
        # wandb.save's paths, globs, base_path and errors against plain wandb (3 s)
        "processes/test_saving.py::test_save_resolves_paths_globs_and_base_path_as_plain_wandb",
        # (one process as plain wandb's run, Logs, System, footer, telemetry: the full tier;
        # the console test above compares the run's record types and program with plain's)
        # every start method; fork safety; the socket's privacy
        # what differs between wandb releases, on whichever is installed (tox -e wandb-oldest,
        # wandb-newest run the gate on the oldest and the newest)
        "processes/test_wandb_versions.py::test_this_wandb_gets_every_ranks_rows_console_metrics_and_files",
        "processes/test_wandb_versions.py::test_define_metric_goal_fails_at_the_call_where_plain_wandb_refuses_it",
        # one run across a job's restarts: torchrun --max-restarts, a SLURM requeue after
        # SIGTERM, two trainings in one allocation (plain wandb's runs beside, per attempt)
        "processes/test_requeue.py::test_torchrun_max_restarts_continues_one_run_where_plain_wandb_makes_two",
        "processes/test_requeue.py::test_a_slurm_requeue_after_sigterm_continues_one_run",
        "processes/test_requeue.py::test_two_trainings_in_one_allocation_make_two_runs",
        "processes/test_requeue.py::test_an_attempt_killed_outright_is_continued_and_status_shows_the_attempt",
        "processes/test_pool.py::test_pool_workers_log_every_step",
        "processes/test_pool.py::test_fork_child_never_reuses_parent_socket",
        "processes/test_pool.py::test_socket_dir_is_private",
        "processes/test_pool.py::test_the_demo_leaves_no_temporary_directory",
        "processes/test_security.py::test_another_user_cannot_reach_the_ipc_socket",
        # merging and reducing across ranks, late records, config and summary, bad input
        "processes/test_semantics.py::test_auto_mode_reduces_like_all_gather",
        "processes/test_semantics.py::test_shared_mode_keeps_every_rank",
        "processes/test_semantics.py::test_late_record_is_logged_at_its_step_and_counted",
        "processes/test_semantics.py::test_worker_config_and_summary_reach_the_run",
        "processes/test_semantics.py::test_bad_input_raises_at_call_site_and_funnel_keeps_working",
        "processes/test_socket_fuzz.py::test_raw_garbage_below_zeromq_is_refused_and_counted",
        # the soak harness judges hangs and exit codes (a process left behind: every process
        # test's own check; the harness's, full tier); one fault of the matrix on real wandb
        # (Ctrl-C, Pool workers, a killed logger: test_lifecycle's and test_pool's)
        "soak/test_harness.py::test_a_hang_is_caught_and_killed",
        "soak/test_harness.py::test_a_wrong_exit_code_is_caught",
        "soak/test_soak.py::test_scenario[torchrun-sigterm]",
        "soak/test_user_command.py::test_a_users_command_gets_its_faults_and_a_report",
        "test_fuzz_api.py::test_public_api_raises_only_type_or_value_errors_and_keeps_working[record]",
    }
)

JOB_MARKERS = ("processes", "soak", "frameworks")
# Set by conftest for a run that includes the full tier (--full, or a -m naming it).
FULL_RUN_ENV = "_WANDB_FUNNEL_TESTS_FULL"


def examples(full: int) -> int:
    """Hypothesis examples for a slow property test: ``full`` when the full tier runs, a
    quarter of it (at least 25) in the gate, which looks for the mechanism, not the rare case."""
    return full if os.environ.get(FULL_RUN_ENV) else max(25, full // 4)


def in_gate(nodeid: str) -> bool:
    """``nodeid`` is pytest's ("tests/...::name[param]")."""
    rel = nodeid.removeprefix("tests/")
    return rel in GATE or rel.split("[", 1)[0] in GATE


def pairwise_cover(cases: Sequence[tuple[str, ...]]) -> list[tuple[str, ...]]:
    """A subset of ``cases`` in which every pair of values (of any two dimensions) that some
    case has appears at least once, and so every value of each dimension: greedy, in the
    cases' order, so the same cases always come out."""
    dims = range(len(cases[0]))

    every_pair = list(itertools.combinations_with_replacement(dims, 2))  # (i, i): each value

    def pairs(case: tuple[str, ...]) -> set[tuple[int, int, str, str]]:
        return {(i, j, case[i], case[j]) for i, j in every_pair}

    left = set().union(*(pairs(c) for c in cases))
    chosen: list[tuple[str, ...]] = []
    while left:
        best = max(cases, key=lambda c: len(pairs(c) & left))
        chosen.append(best)
        left -= pairs(best)
    return chosen
