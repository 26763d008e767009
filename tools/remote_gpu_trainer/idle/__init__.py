"""Idle boxes and custody before teardown: ``box_idle``, ``run_pull`` and the on-box ``idle_guard``.

A rented box that keeps billing after its run ended is the commonest way to waste money on GPUs;
tearing a box down before its outputs were copied off is the second. This package answers both
from the box itself: what the GPUs did over a short window, which of our runs are alive, what on the
box was never copied back (custody), what the provider's stop and terminate do, and an opt-in guard
that stops the box only when all of that says it is safe.
"""
