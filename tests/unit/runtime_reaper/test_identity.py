"""Pid identity from /proc: start time (field 22 of stat) and cgroup membership, on a fake /proc."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from tests.unit.runtime_reaper.conftest import FakeProc
from warren.runtime.processes import (
    ProcessIdentity,
    in_cgroup,
    read_cgroups,
    read_identity,
    read_start_time,
    still_same,
)

V1 = ["/warren/sbx1", "/warren/sbx1", "/"]  # e.g. memory, pids, and a v2 line at the root


def test_start_time_is_field_22_even_with_parentheses_in_comm(fake_proc: FakeProc) -> None:
    fake_proc.add(42, start_time=987654, cgroups=V1, comm="evil) S 1 2 (x")
    assert read_start_time(42, proc=fake_proc.root) == 987654


def test_start_time_matches_the_kernels_for_a_real_process() -> None:
    fields = Path(f"/proc/{os.getpid()}/stat").read_text().rpartition(")")[2].split()
    assert read_start_time(os.getpid()) == int(fields[19])


def test_missing_process(fake_proc: FakeProc) -> None:
    assert read_start_time(7, proc=fake_proc.root) is None
    assert read_cgroups(7, proc=fake_proc.root) is None
    assert read_identity(7, "/warren/sbx1", proc=fake_proc.root) is None


def test_read_identity_requires_membership(fake_proc: FakeProc) -> None:
    fake_proc.add(42, start_time=100, cgroups=V1)
    assert read_identity(42, "/warren/sbx1", proc=fake_proc.root) == ProcessIdentity(42, 100, "/warren/sbx1")
    assert read_identity(42, "warren/sbx1/", proc=fake_proc.root) == ProcessIdentity(42, 100, "/warren/sbx1")
    assert read_identity(42, "/warren/sbx2", proc=fake_proc.root) is None
    assert read_identity(42, "/warren/sbx", proc=fake_proc.root) is None


def test_read_identity_without_a_cgroup_records_the_processes_own(fake_proc: FakeProc) -> None:
    fake_proc.add(42, start_time=100, cgroups=["/", "/a/b"])
    assert read_identity(42, proc=fake_proc.root) == ProcessIdentity(42, 100, "/a/b")


def test_zombie_has_no_identity(fake_proc: FakeProc) -> None:
    fake_proc.add(42, start_time=100, cgroups=V1, state="Z")
    assert read_identity(42, "/warren/sbx1", proc=fake_proc.root) is None


def test_in_cgroup_compares_whole_path_components() -> None:
    assert in_cgroup(["/warren/sbx1"], "/warren/sbx1")
    assert in_cgroup(["/warren/sbx1/child"], "/warren/sbx1")
    assert in_cgroup(["/", "/warren/sbx1"], "/warren")
    assert not in_cgroup(["/warren-test/sbx1"], "/warren")
    assert not in_cgroup(["/warren/sbx10"], "/warren/sbx1")
    assert not in_cgroup(["/"], "/warren/sbx1")


def test_still_same(fake_proc: FakeProc) -> None:
    fake_proc.add(42, start_time=100, cgroups=V1)
    identity = read_identity(42, "/warren/sbx1", proc=fake_proc.root)
    assert identity is not None
    assert still_same(identity, proc=fake_proc.root)
    # A reused pid: same number, another start time.
    assert not still_same(replace(identity, start_time=101), proc=fake_proc.root)
    fake_proc.set_start_time(42, 5000)
    assert not still_same(identity, proc=fake_proc.root)
    fake_proc.set_start_time(42, 100)
    assert still_same(identity, proc=fake_proc.root)


def test_leaving_the_cgroup_ends_the_identity(fake_proc: FakeProc) -> None:
    fake_proc.add(42, start_time=100, cgroups=V1)
    identity = read_identity(42, "/warren/sbx1", proc=fake_proc.root)
    assert identity is not None
    fake_proc.set_cgroups(42, ["/warren/sbx1/nested", "/"])
    assert still_same(identity, proc=fake_proc.root)  # below it still counts
    fake_proc.set_cgroups(42, ["/user.slice", "/"])
    assert not still_same(identity, proc=fake_proc.root)


def test_exit_and_zombie_end_the_identity(fake_proc: FakeProc) -> None:
    fake_proc.add(42, start_time=100, cgroups=V1)
    identity = ProcessIdentity(42, 100, "/warren/sbx1")
    fake_proc.add(42, start_time=100, cgroups=V1, state="Z")
    assert not still_same(identity, proc=fake_proc.root)
    fake_proc.remove(42)
    assert not still_same(identity, proc=fake_proc.root)
