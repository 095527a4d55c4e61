"""The schedule explorer: real Senders on one real database, driven by a seeded schedule.

`explorer.run_schedule(seed)` builds a world from the seed (senders, sources, containers),
plays its events one at a time (a sender's turn, a delivery that runs, the clock moving, a
producer, a kill between two statements, a stop (or two: forced), a dropped connection), drains, and checks
the invariants of issue 9. A failing schedule is shrunk to the events that still fail and
printed as a one-line replay command (`python bench/simulate.py --seed S --events ...`).
"""
