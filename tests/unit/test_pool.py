"""The default launcher's pool and schedule (``litlab.launch.pool``), in-process: which ids a pool
has, which job starts when and on which ids, and each job's CPU share. The same scheduler runs real
processes in tests/integration/test_pool.py; ``simulate`` runs it on paper."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from litlab.launch.pool import DeviceSchedule, Pending, Taken, cpu_share, pool_ids


def simulate(needs: Sequence[int], lengths: Sequence[float], schedule: DeviceSchedule) -> list[dict]:
    """Run the schedule on paper: jobs of known ``needs`` and ``lengths`` (seconds), all queued at
    time 0, as the launcher queues a grid. Each job's start, end and ids, in job order; a job that
    never fits gets None."""
    queue = [Pending(i, n) for i, n in enumerate(needs) if schedule.fits_ever(n)]
    result: list[dict | None] = [None] * len(needs)
    running: list[tuple[float, int, Taken]] = []
    now = 0.0
    while queue or running:
        while (job := schedule.next_to_start(queue)) is not None:
            queue.remove(job)
            taken = schedule.take(job.need)
            running.append((now + lengths[job.index], job.index, taken))
            result[job.index] = {"start": now, "ids": taken.ids, "cores": taken.cores}
        running.sort(key=lambda r: r[:2])
        end, index, taken = running.pop(0)
        now = end
        schedule.give_back(taken)
        result[index]["end"] = end
    return result


@pytest.mark.parametrize(
    "devices,gpus,expected",
    [
        (None, None, ["0"]),  # no GPU: one slot
        (None, ["0", "1", "2", "3"], ["0", "1", "2", "3"]),  # every GPU the sweep sees
        (None, ["4", "6"], ["4", "6"]),  # CUDA_VISIBLE_DEVICES=4,6
        (3, None, ["0", "1", "2"]),  # slots on a CPU machine
        (2, ["4", "6", "7"], ["4", "6"]),  # the first N the sweep sees
        ([0, 1, 4, 5], ["0", "1", "2", "3", "4", "5"], ["0", "1", "4", "5"]),
        (["a", "b"], None, ["a", "b"]),  # slot names
    ],
)
def test_the_pool_has_the_ids_hydra_launcher_devices_says(devices, gpus, expected):
    assert pool_ids(devices, gpus) == expected


@pytest.mark.parametrize(
    "devices,gpus,message",
    [
        (0, None, "hydra.launcher.devices=0 is not allowed: use null (every GPU), a count >= 1 or a list"),
        (-1, None, "hydra.launcher.devices=-1 is not allowed"),
        (True, None, "hydra.launcher.devices=True is not allowed"),
        ([], None, "hydra.launcher.devices=[] is not allowed"),
        ([1, 1], None, "hydra.launcher.devices=[1, 1] is not allowed: use null (every GPU), a count >= 1"),
        (4, ["0", "1"], "hydra.launcher.devices=4: the sweep sees 2 GPUs (0,1)"),
        ("two", None, "hydra.launcher.devices='two' is not allowed"),
    ],
)
def test_a_value_that_is_not_a_pool_is_one_line_naming_it(devices, gpus, message):
    with pytest.raises(ValueError) as error:
        pool_ids(devices, gpus)
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


@pytest.mark.parametrize("jobs_per_device", [0, -1, "two", True])
def test_jobs_per_device_is_a_count_of_one_or_more(jobs_per_device):
    with pytest.raises(ValueError) as error:
        DeviceSchedule(["0"], jobs_per_device)
    assert str(error.value) == (
        f"hydra.launcher.jobs_per_device={jobs_per_device} is not allowed: use an int >= 1"
    )


def starts(plan: list[dict | None]) -> list[float | None]:
    return [None if job is None else job["start"] for job in plan]


def test_the_job_needing_the_most_devices_starts_first_then_the_others_in_sweep_order():
    # needs 1, 2, 1, 4 on 4 devices: the 4-device job takes the whole pool first; then the 2-device
    # job, and the two 1-device jobs beside it.
    plan = simulate([1, 2, 1, 4], [5, 5, 5, 5], DeviceSchedule(["0", "1", "2", "3"]))
    assert starts(plan) == [5, 5, 5, 0]
    assert plan[3]["ids"] == ["0", "1", "2", "3"]
    assert plan[1]["ids"] == ["0", "1"] and plan[0]["ids"] == ["2"] and plan[2]["ids"] == ["3"]


def test_a_smaller_job_fills_devices_a_waiting_larger_one_cannot_use_yet():
    # 3 devices: two 2-device jobs of 10 s, two 1-device jobs of 5 s. The second 2-device job waits
    # for two free devices; the free third one runs the 1-device jobs meanwhile (backfill).
    plan = simulate([2, 2, 1, 1], [10, 10, 5, 5], DeviceSchedule(["0", "1", "2"]))
    assert starts(plan) == [0, 10, 0, 5]
    assert plan[2]["ids"] == plan[3]["ids"] == ["2"]
    assert plan[1]["ids"] == ["0", "1"]


def test_a_short_jobs_device_is_reused_while_a_long_job_still_runs():
    plan = simulate([1, 1, 1, 1], [30, 5, 5, 5], DeviceSchedule(["0", "1"]))
    assert starts(plan) == [0, 0, 5, 10]
    assert plan[0]["ids"] == ["0"] and all(plan[i]["ids"] == ["1"] for i in (1, 2, 3))
    assert max(job["end"] for job in plan) == 30  # the ideal: the longest job, nothing waits for a batch


def test_no_device_idles_while_a_queued_job_fits():
    needs, lengths = [2, 1, 3, 1, 2, 1, 1, 2], [7, 3, 4, 9, 2, 6, 1, 5]
    schedule = DeviceSchedule(["0", "1", "2", "3"])
    plan = simulate(needs, lengths, schedule)
    moments = sorted({job["start"] for job in plan} | {job["end"] for job in plan})
    for t in moments:  # just after each event: a queued job must not fit the idle devices
        busy = sum(needs[i] for i, job in enumerate(plan) if job["start"] <= t < job["end"])
        waiting = [needs[i] for i, job in enumerate(plan) if job["start"] > t]
        assert not any(n <= 4 - busy for n in waiting), (t, busy, waiting)
    for t in moments:  # never more than the pool
        assert sum(needs[i] for i, job in enumerate(plan) if job["start"] <= t < job["end"]) <= 4


def test_a_job_larger_than_the_pool_never_starts_and_the_others_do():
    schedule = DeviceSchedule(["0", "1"])
    assert not schedule.fits_ever(3) and schedule.fits_ever(2)
    plan = simulate([3, 1, 1], [1, 1, 1], schedule)
    assert plan[0] is None and starts(plan) == [None, 0, 0]


def test_jobs_per_device_lets_small_jobs_share_a_device_and_a_multi_device_job_gets_distinct_ids():
    schedule = DeviceSchedule(["0", "1"], jobs_per_device=2, cores=range(8))
    plan = simulate([1, 1, 1, 1, 2], [4, 4, 4, 4, 4], schedule)
    assert plan[4]["start"] == 0 and plan[4]["ids"] == ["0", "1"]  # largest first: both ids, once each
    assert sorted(plan[i]["start"] for i in range(4)) == [0, 0, 4, 4]
    at_zero = [plan[i]["ids"][0] for i in range(4) if plan[i]["start"] == 0]
    assert sorted(at_zero) == ["0", "1"]  # the least loaded id first: one more job on each
    # Four slots at once: each has its own quarter of the 8 cores.
    concurrent = [plan[4]["cores"]] + [plan[i]["cores"] for i in range(4) if plan[i]["start"] == 0]
    assert sorted(c for cores in concurrent for c in cores) == list(range(8))


def test_each_slot_gets_an_even_share_of_the_cores():
    assert [cpu_share(s, 2, range(8)) for s in range(2)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [cpu_share(s, 3, [0, 1, 2, 3, 4, 5]) for s in range(3)] == [[0, 1], [2, 3], [4, 5]]
    assert [cpu_share(s, 4, [0, 1]) for s in range(4)] == [[0], [0], [1], [1]]  # fewer cores than slots
    assert [cpu_share(s, 3, [0, 1]) for s in range(3)] == [[0], [0], [1]]
    assert cpu_share(1, 2, [3, 7]) == [7]  # the cores the sweep may use, not 0..n-1
    schedule = DeviceSchedule(["0", "1"], cores=[0, 1, 2, 3])
    taken = schedule.take(2)
    assert taken.ids == ["0", "1"] and taken.cores == [0, 1, 2, 3]  # a 2-device job: both shares
    schedule.give_back(taken)
    assert schedule.free_ids() == ["0", "1"]


def test_next_to_start_breaks_ties_by_sweep_order():
    schedule = DeviceSchedule(["0", "1"])
    queue = [Pending(5, 1), Pending(2, 1), Pending(7, 2)]
    assert schedule.next_to_start(queue).index == 7
    schedule.take(1)
    assert schedule.next_to_start(queue).index == 2  # the 2-device job does not fit one free device


def test_a_job_waits_while_another_job_of_its_run_identity_runs():
    # The same overrides twice (seed=1,1): one run identity, one storage folder and lock. The second
    # waits for the first (then finds its run completed) instead of failing on the lock.
    from pathlib import Path

    from litlab.launch.pool import DevicePoolLauncher, _Job

    def job(index: int, identity: str) -> _Job:
        return _Job(index, None, Path(str(index)), [], 1, {}, identity)

    launcher = DevicePoolLauncher(devices=2)
    launcher._running = {0: job(0, "default-aaa")}
    queue = {1: job(1, "default-aaa"), 2: job(2, "default-bbb")}
    assert [p.index for p in launcher._startable(queue)] == [2]
    launcher._running = {}
    assert [p.index for p in launcher._startable(queue)] == [1, 2]


def test_without_gpus_a_job_larger_than_the_pool_runs_alone_on_the_whole_pool():
    # trainer.devices=2 strategy=ddp on a laptop: two processes, not two GPUs to share. The pool of
    # one slot runs the job alone, after the others (the largest first: here, at once).
    assert not DeviceSchedule(["0"]).fits_ever(2)  # on GPUs: never, a failed row as before
    schedule = DeviceSchedule(["0"], cores=[0, 1], gpus=False)
    assert schedule.fits_ever(2)
    plan = simulate([1, 2, 1], [5, 5, 5], schedule)
    assert starts(plan) == [5, 0, 10]
    assert plan[1]["ids"] == ["0"] and plan[1]["cores"] == [0, 1]
    # While any slot holds a job it waits; then it holds every slot of every id, and all the cores.
    schedule = DeviceSchedule(["0", "1"], jobs_per_device=2, cores=range(4), gpus=False)
    small = schedule.take(1)
    assert schedule.next_to_start([Pending(0, 3)]) is None
    schedule.give_back(small)
    assert schedule.next_to_start([Pending(1, 1), Pending(0, 3)]).index == 0
    whole = schedule.take(3)
    assert whole.ids == ["0", "1"] and len(whole.slots) == 4 and whole.cores == [0, 1, 2, 3]
    assert not schedule.free_ids()
    schedule.give_back(whole)
    assert schedule.free_ids() == ["0", "1"]
