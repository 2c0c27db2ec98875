"""CPU lists and how `make run` shares the cores among several workers (common/cpus.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from common.cpus import (
    cgroup_cpu_limit,
    core_of,
    default_threads,
    format_cpu_list,
    parse_cpu_list,
    physical_cores,
    split_cpus,
)
from scripts.launch import ROOT, clean_env
from scripts.run_stack import oversubscription_warning, worker_cpus
from worker.server.settings import WorkerSettings


def fake_topology(tmp_path: Path, cores: dict[int, tuple[int, int]]) -> Path:
    """/sys/devices/system/cpu with each logical CPU's (package, core)."""
    for cpu, (package, core) in cores.items():
        topology = tmp_path / f"cpu{cpu}" / "topology"
        topology.mkdir(parents=True)
        (topology / "physical_package_id").write_text(f"{package}\n")
        (topology / "core_id").write_text(f"{core}\n")
    return tmp_path


def test_cpu_lists_round_trip() -> None:
    assert parse_cpu_list("0-3,8") == [0, 1, 2, 3, 8]
    assert parse_cpu_list(" 5, 1-2 ,2") == [1, 2, 5]
    assert format_cpu_list([8, 0, 1, 2, 3, 10, 11]) == "0-3,8,10-11"
    assert format_cpu_list(parse_cpu_list("4")) == "4"
    for bad in ("", "a", "3-1", "-1", "1-"):
        with pytest.raises(ValueError):
            parse_cpu_list(bad)


def test_hyperthread_siblings_stay_with_their_core(tmp_path: Path) -> None:
    # 4 cores with two threads each, Linux's usual numbering: the siblings are n and n + 4
    sys_cpu = fake_topology(tmp_path, {c: (0, c % 4) for c in range(8)})
    assert physical_cores(list(range(8)), sys_cpu) == 4
    assert split_cpus(list(range(8)), 2, sys_cpu) == [[0, 4, 1, 5], [2, 6, 3, 7]]
    assert split_cpus(list(range(8)), 3, sys_cpu) == [[0, 4, 1, 5], [2, 6], [3, 7]]


def test_more_workers_than_cores_take_the_cores_in_turn(tmp_path: Path) -> None:
    sys_cpu = fake_topology(tmp_path, {0: (0, 0), 1: (0, 1)})
    assert split_cpus([0, 1], 2, sys_cpu) == [[0], [1]]
    assert split_cpus([0, 1], 3, sys_cpu) == [[0], [1], [0]]
    assert split_cpus([1], 1, sys_cpu) == [[1]]


def test_a_cpu_without_topology_counts_as_its_own_core(tmp_path: Path) -> None:
    assert core_of(7, tmp_path) == (-1, 7)
    assert split_cpus([0, 1, 2, 3], 2, tmp_path) == [[0, 1], [2, 3]]


def test_make_run_splits_the_cores_only_for_several_workers_left_at_their_defaults() -> None:
    usable = sorted(os.sched_getaffinity(0))
    parts = worker_cpus(2, {})
    assert len(parts) == 2
    first, second = parse_cpu_list(parts[0]), parse_cpu_list(parts[1])
    assert set(first) | set(second) <= set(usable)
    if len(usable) >= 2:
        assert not set(first) & set(second)  # each worker its own cores
    assert worker_cpus(1, {}) == []
    assert worker_cpus(2, {"WORKER_NUM_THREADS": "2"}) == []  # the operator chose
    assert worker_cpus(2, {"WORKER_CPUS": "0"}) == []


def test_the_worker_runs_one_thread_per_physical_core_of_its_cpus() -> None:
    cpu = sorted(os.sched_getaffinity(0))[0]
    settings = WorkerSettings(cpus=f"{cpu}")
    assert settings.cpu_list() == [cpu]
    assert settings.engine_config().num_threads == 1
    assert WorkerSettings(cpus=f"{cpu}", num_threads=3).engine_config().num_threads == 3
    usable = sorted(os.sched_getaffinity(0))
    assert WorkerSettings().engine_config().num_threads == default_threads(usable, cgroup_cpu_limit())
    with pytest.raises(ValueError, match="CPU"):
        WorkerSettings(cpus="2-1")


def cgroup_files(tmp_path: Path, own: str, files: dict[str, str]) -> tuple[Path, Path]:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    (tmp_path / "self-cgroup").write_text(own)
    return tmp_path, tmp_path / "self-cgroup"


def test_a_containers_cpu_limit_caps_the_threads(tmp_path: Path) -> None:
    v2 = cgroup_files(tmp_path / "v2", "0::/kubepods/pod1\n", {"kubepods/pod1/cpu.max": "250000 100000\n"})
    assert cgroup_cpu_limit(*v2) == 2.5
    unlimited = cgroup_files(tmp_path / "v2max", "0::/\n", {"cpu.max": "max 100000\n"})
    assert cgroup_cpu_limit(*unlimited) is None
    v1 = cgroup_files(
        tmp_path / "v1",
        "4:memory:/x\n1:cpu,cpuacct:/docker/abc\n0::/\n",
        {"cpu/docker/abc/cpu.cfs_quota_us": "150000\n", "cpu/docker/abc/cpu.cfs_period_us": "100000\n"},
    )
    assert cgroup_cpu_limit(*v1) == 1.5
    assert cgroup_cpu_limit(tmp_path / "none", tmp_path / "missing") is None
    pod = cgroup_files(
        tmp_path / "pod",
        "0::/kubepods/pod1/ctr\n",
        {"kubepods/pod1/cpu.max": "300000 100000\n", "kubepods/pod1/ctr/cpu.max": "max 100000\n"},
    )
    assert cgroup_cpu_limit(*pod) == 3.0  # the pod's limit binds its containers
    sys_cpu = fake_topology(tmp_path / "sys", {c: (0, c) for c in range(8)})
    assert default_threads(list(range(8)), None, sys_cpu) == 8
    assert default_threads(list(range(8)), 2.5, sys_cpu) == 2  # a thread over the quota is throttled
    assert default_threads(list(range(8)), 0.5, sys_cpu) == 1
    assert default_threads([3, 4], None, sys_cpu) == 2


def test_a_worker_given_no_cpu_it_may_use_says_so_and_exits() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "worker"],
        cwd=ROOT,
        env=clean_env({"WORKER_CPUS": "4096"}),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert "WORKER_CPUS=4096 names no CPU this process may use" in done.stderr


def test_make_run_warns_when_the_operators_threads_outnumber_the_cores() -> None:
    assert "unset WORKER_NUM_THREADS" in oversubscription_warning(2, {"WORKER_NUM_THREADS": "2"}, 2)
    assert oversubscription_warning(2, {"WORKER_NUM_THREADS": "1"}, 2) == ""
    assert oversubscription_warning(2, {"WORKER_NUM_THREADS": "4", "WORKER_CPUS": "0"}, 2) == ""
    assert (
        oversubscription_warning(1, {"WORKER_NUM_THREADS": "8"}, 2) == ""
    )  # one worker: torch's own business
    assert oversubscription_warning(3, {}, 2) == ""  # make run splits the cores itself
