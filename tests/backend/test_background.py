"""Background work runs in one thread, below the caller's priority (issue 35 item 5): whole
programs compiling, fused groups, kernels kept on disk and the warm-up queue for that thread
instead of starting one thread each (on a loaded 2-core machine a caller's small kernels waited
behind several compilations side by side)."""

from __future__ import annotations

import os
import threading

from circuits.backend import tiers
from circuits.backend.cache import background
from circuits.backend.cache.background import AGAIN, THREAD, in_background, wait_for, wait_for_background


def _nice() -> int | None:
    try:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    except (AttributeError, OSError):
        return None


def _holding():
    """A job that holds the background thread until the event returned is set."""
    release = threading.Event()
    started = threading.Event()

    def hold():
        started.set()
        release.wait(60)

    in_background(hold, name="circuits-test-hold")
    started.wait(60)
    return release


def test_jobs_run_one_at_a_time_on_one_thread_below_the_caller():
    release = _holding()
    seen, running, most = [], [0], [0]
    lock = threading.Lock()

    def job(k):
        def run():
            with lock:
                running[0] += 1
                most[0] = max(most[0], running[0])
            seen.append((k, threading.current_thread(), _nice()))
            with lock:
                running[0] -= 1
        return run

    for k in range(6):
        in_background(job(k), name=f"circuits-test-{k % 2}")
    release.set()
    wait_for_background(60)
    assert [k for k, _, _ in seen] == list(range(6))  # in the order asked
    assert len({id(t) for _, t, _ in seen}) == 1 and seen[0][1].name == THREAD
    assert most[0] == 1
    if _nice() is not None:
        assert all(n > _nice() for _, _, n in seen)


def test_a_job_returning_again_takes_turns_with_the_others():
    release = _holding()
    order, left = [], [3]

    def steps():
        order.append("step")
        left[0] -= 1
        return AGAIN if left[0] else None

    stepping = in_background(steps, name="circuits-test-steps")
    in_background(lambda: order.append("other"), name="circuits-test-other")
    release.set()
    wait_for_background(60)
    assert order == ["step", "other", "step", "step"] and not stepping.is_alive()


def test_wait_for_moves_the_jobs_of_its_name_to_the_front():
    release = _holding()
    order = []
    in_background(lambda: order.append("a"), name="circuits-test-a")
    in_background(lambda: order.append("x"), name="circuits-test-x")
    waiter = threading.Thread(target=wait_for, args=("circuits-test-x",))
    waiter.start()
    while [j.name for j in background._pending()][1:2] != ["circuits-test-x"]:  # reordered (no timing)
        threading.Event().wait(0.01)
    release.set()
    waiter.join(60)
    wait_for_background(60)
    assert order == ["x", "a"]


def test_the_backends_whole_program_compilations_share_the_one_thread():
    from circuits.backend.tiers import policy

    threads = []

    def compile_whole(k):
        def run():
            threads.append(threading.current_thread())
            return f"program {k}"
        return run

    keys = [("test-background-compile", k, object()) for k in range(3)]
    release = _holding()  # the compilations queue behind it
    with tiers.configure(background=True):
        for k, key in enumerate(keys):
            policy.note_op_run(key, compile_whole(k), now=True)
    release.set()
    wait_for_background(120)
    assert len(threads) == 3 and len({id(t) for t in threads}) == 1 and threads[0].name == THREAD
    assert [policy.whole_program_ready(key) for key in keys] == ["program 0", "program 1", "program 2"]
