"""Recent429s: 429s from several containers of one place within the window, counted."""

from __future__ import annotations

import threading

from django_connector_outbox.connectors.spread import Recent429s


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_429s_of_one_container_count_once() -> None:
    recent = Recent429s(window=10.0, clock=Clock())

    assert [recent.note("T", "C1") for _ in range(3)] == [1, 1, 1]


def test_429s_of_several_containers_within_the_window_add_up() -> None:
    clock = Clock()
    recent = Recent429s(window=10.0, clock=clock)

    first = recent.note("T", "C1")
    clock.now += 9.9
    second = recent.note("T", "C2")

    assert (first, second) == (1, 2)


def test_a_429_as_old_as_the_window_no_longer_counts() -> None:
    clock = Clock()
    recent = Recent429s(window=10.0, clock=clock)

    recent.note("T", "C1")
    clock.now += 10.0

    assert recent.note("T", "C2") == 1


def test_a_container_429_again_counts_from_its_latest() -> None:
    clock = Clock()
    recent = Recent429s(window=10.0, clock=clock)

    recent.note("T", "C1")
    clock.now += 8.0
    recent.note("T", "C1")
    clock.now += 8.0

    assert recent.note("T", "C2") == 2


def test_429s_of_two_places_do_not_add_up() -> None:
    recent = Recent429s(window=10.0, clock=Clock())

    assert [recent.note("T1", "C1"), recent.note("T2", "C2"), recent.note("T1", "C3")] == [1, 1, 2]


def test_places_without_recent_429s_are_forgotten() -> None:
    clock = Clock()
    recent = Recent429s(window=10.0, clock=clock)
    for place in ("T1", "T2", "T3"):
        recent.note(place, "C")
    clock.now += 10.0

    recent.note("T4", "C")

    assert list(recent._seen) == ["T4"]


def test_threads_noting_at_once_count_every_container() -> None:
    recent = Recent429s(window=60.0)
    start = threading.Barrier(8)
    counts: list[int] = []

    def note(container: str) -> None:
        start.wait()
        counts.append(recent.note("T", container))

    threads = [threading.Thread(target=note, args=(f"C{i}",)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sorted(counts) == list(range(1, 9))
