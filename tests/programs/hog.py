"""Allocates memory 16 MiB at a time, touching every page, until the kernel stops it: an external
program for ups-doctor's tests of `launch.memory_limit` (no torch import, so it starts at once)."""

held = []
while True:
    held.append(bytearray(16 << 20))  # zero-filled: every page is written
