"""Where lost winners were (ackline.load.losses): runs and their one-line description."""

from __future__ import annotations

from datetime import UTC, datetime

from ackline.load.losses import LostRun, Written, describe, lost_runs, window
from ackline.load.verify import LossWindow

AT = datetime(2026, 12, 5, 7, 55, 12, 345678, tzinfo=UTC)


def test_lost_winners_group_into_runs_of_neighbouring_winners() -> None:
    # winners on partition 0 at 10, 12 (a marker between), 13, 20, 21; lost 12, 13 and 21
    winners = {0: [10, 12, 13, 20, 21], 1: [5, 6]}
    runs = lost_runs([(0, 12, False), (0, 13, True), (0, 21, False), (1, 5, False)], winners)
    assert runs == [
        LostRun(0, 12, 13, 2, 1),
        LostRun(0, 21, 21, 1, 0),
        LostRun(1, 5, 5, 1, 0),
    ]


def test_a_run_never_written_between_two_batches_is_named_a_skip() -> None:
    run = LostRun(5, 41203, 41290, 78, 0)
    written = [
        Written(811, "w1-2", AT, 41000, 41100),
        Written(812, "w2-3", AT, 41100, 41203),
        Written(830, "w1-4", AT, 41292, 41400),
    ]
    line = describe(run, written)
    assert line.startswith(
        "lost on partition 5: 78 winners at offsets 41203..41290, 0 of them with their keys "
        "stored; before: batch 812 by w2-3 [41100, 41203) at 07:55:12.345; after: batch 830 "
        "by w1-4 [41292, 41400) at 07:55:12.345"
    ), line
    assert line.endswith(
        "(nothing written in [41203, 41292): the batch after committed past records nobody wrote)"
    ), line


def test_a_run_inside_a_batch_names_that_batch_and_no_skip() -> None:
    run = LostRun(1, 50, 69, 20, 20)
    line = describe(run, [Written(3, "w", AT, 0, 100)])
    assert "before: none; after: none; over it: batch 3 by w [0, 100)" in line
    assert "nobody wrote" not in line


def test_a_window_runs_from_the_batch_before_to_the_batch_after() -> None:
    later = datetime(2026, 12, 5, 7, 55, 20, tzinfo=UTC)
    run = LostRun(5, 41203, 41290, 78, 0)
    written = [Written(812, "w2-3", AT, 41100, 41203), Written(830, "w1-4", later, 41292, 41400)]
    assert window(run, written) == LossWindow(5, AT.isoformat(), later.isoformat())
    assert window(run, []) == LossWindow(5, "", "")
    # a run inside a batch: that batch's commit
    over = [Written(3, "w", later, 41000, 41400)]
    assert window(run, over) == LossWindow(5, later.isoformat(), later.isoformat())
