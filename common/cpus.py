"""CPU lists (taskset's "0-3,8" form) and how several workers on one host share the cores.

Two workers on the same cores each running one torch thread per core oversubscribe them: torch's OpenMP
threads wait actively at every barrier, so a thread that is descheduled stalls its whole team (on two
cores, two workers of two threads each served the fleet load at 5 tok/s, against 124 tok/s with a core
each: docs/BENCHMARKS.md, "make run with two workers"). `make run` with WORKERS>1 therefore gives
each worker its own cores (WORKER_CPUS) and one thread per physical core among them, as vLLM's CPU
backend binds each rank's OpenMP threads to its own cores.
"""

from __future__ import annotations

import os
from pathlib import Path

SYS_CPU = Path("/sys/devices/system/cpu")


def parse_cpu_list(text: str) -> list[int]:
    """ "0-3,8" -> [0, 1, 2, 3, 8]; ValueError on anything else."""
    cpus: set[int] = set()
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        first, dash, last = part.partition("-")
        lo, hi = int(first), int(last if dash else first)
        if lo < 0 or hi < lo:
            raise ValueError(f"bad CPU range {part!r} in {text!r}")
        cpus.update(range(lo, hi + 1))
    if not cpus:
        raise ValueError(f"no CPU in {text!r}")
    return sorted(cpus)


def format_cpu_list(cpus: list[int]) -> str:
    """[0, 1, 2, 3, 8] -> "0-3,8"."""
    ranges: list[list[int]] = []
    for cpu in sorted(set(cpus)):
        if ranges and cpu == ranges[-1][1] + 1:
            ranges[-1][1] = cpu
        else:
            ranges.append([cpu, cpu])
    return ",".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in ranges)


def core_of(cpu: int, sys_cpu: Path = SYS_CPU) -> tuple[int, int]:
    """(package, core) of a logical CPU: hyperthread siblings share it. A CPU whose topology cannot be read
    counts as its own core."""
    topology = sys_cpu / f"cpu{cpu}" / "topology"
    try:
        package = int((topology / "physical_package_id").read_text())
        core = int((topology / "core_id").read_text())
    except (OSError, ValueError):
        return (-1, cpu)
    return (package, core)


def physical_cores(cpus: list[int], sys_cpu: Path = SYS_CPU) -> int:
    return len({core_of(cpu, sys_cpu) for cpu in cpus})


def split_cpus(cpus: list[int], parts: int, sys_cpu: Path = SYS_CPU) -> list[list[int]]:
    """`parts` CPU lists from `cpus`, whole physical cores each (siblings stay together), as even as the
    cores allow and contiguous. More parts than cores: each gets one core, the cores taken in turn."""
    if parts < 1:
        raise ValueError("parts must be at least 1")
    by_core: dict[tuple[int, int], list[int]] = {}
    for cpu in sorted(cpus):
        by_core.setdefault(core_of(cpu, sys_cpu), []).append(cpu)
    cores = [by_core[key] for key in sorted(by_core)]
    if not cores:
        raise ValueError("no CPU to split")
    if parts >= len(cores):
        return [list(cores[i % len(cores)]) for i in range(parts)]
    out, start = [], 0
    for i in range(parts):
        size = len(cores) // parts + (i < len(cores) % parts)
        out.append([cpu for core in cores[start : start + size] for cpu in core])
        start += size
    return out


def cgroup_cpu_limit(
    root: Path = Path("/sys/fs/cgroup"), own: Path = Path("/proc/self/cgroup")
) -> float | None:
    """The CPUs' worth of time this process's cgroup may use (a container's CPU limit: cgroup v2 `cpu.max`,
    or v1's CFS quota over period), the tightest along its path up to the root (Kubernetes sets a pod's
    limit on the pod's cgroup too); None when unlimited or unreadable."""
    try:
        lines = own.read_text().splitlines()
    except OSError:
        lines = []
    limits = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2
            limits += [_read_quota(d / "cpu.max") for d in _up_from(root, path)]
        elif "cpu" in controllers.split(","):  # v1
            limits += [
                _read_quota(d / "cpu.cfs_quota_us", d / "cpu.cfs_period_us")
                for d in _up_from(root / "cpu", path)
            ]
    found = [limit for limit in limits if limit is not None]
    return min(found) if found else None


def _up_from(root: Path, path: str) -> list[Path]:
    parts = [p for p in path.strip("/").split("/") if p]
    return [root.joinpath(*parts[:n]) for n in range(len(parts), -1, -1)]


def _read_quota(quota_path: Path, period_path: Path | None = None) -> float | None:
    """CPUs' worth from `cpu.max` ("quota period") or from v1's two files; None when unlimited or absent."""
    try:
        if period_path is None:
            quota, period = quota_path.read_text().split()
        else:
            quota, period = quota_path.read_text().strip(), period_path.read_text().strip()
        if quota in ("max", "-1"):
            return None
        return int(quota) / int(period)
    except (OSError, ValueError):
        return None


def default_threads(cpus: list[int], limit: float | None, sys_cpu: Path = SYS_CPU) -> int:
    """A worker's torch threads when none are set: one per physical core it may run on, no more than its
    CPU limit allows (threads beyond a CFS quota are throttled, and each throttled thread stalls the
    team at the next barrier), at least one."""
    threads = physical_cores(cpus, sys_cpu)
    if limit is not None:
        threads = min(threads, int(limit))
    return max(1, threads)


def usable_cpus() -> list[int]:
    """The CPUs this process may run on (its affinity: a container's cpuset, a taskset)."""
    return sorted(os.sched_getaffinity(0))


def pin_process(cpus: list[int]) -> None:
    """Run this process on `cpus` only: every thread it has (imports start some) and, since threads take
    their mask from the thread that creates them, every thread it starts from now on."""
    for task in Path("/proc/self/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), cpus)
        except ProcessLookupError:  # the thread ended meanwhile
            pass
    os.sched_setaffinity(0, cpus)
