"""Process helpers shared by the launcher, the run follower and the canceller."""

from __future__ import annotations

import math
import os
from pathlib import Path


def pid_alive(pid: int) -> bool:
    """True if `pid` exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def node_memory_bytes(node: int = 0) -> int:
    """Total memory of NUMA node `node` as the kernel reports it (what vLLM's CPU worker takes
    its share of); the machine's total where there are no node files."""
    try:
        with open(f"/sys/devices/system/node/node{node}/meminfo") as fh:
            for line in fh:
                if "MemTotal:" in line:
                    return int(line.split()[-2]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


# vLLM's CPU worker refuses to start when its share of the node is below its own process's
# memory: the trainer, the model and vLLM share that process (the tiny model's took ~0.8 GiB)
CPU_ENGINE_MIN_BYTES = 2**30


def cpu_share_for(gib: float, node_bytes: int | None = None) -> float:
    """The `vllm_gpu_memory_utilization` that gives vLLM's CPU worker `gib` GiB of this node
    (at most 0.9: the rest of the machine keeps some)."""
    return min(0.9, gib * 2**30 / (node_bytes or node_memory_bytes()))


def _share_text(share: float, node_bytes: int, under: str, need_bytes: int) -> str:
    """What `share` gives on vLLM's CPU build, what it falls under, and the share (rounded up to
    a hundredth) that gives `need_bytes`."""
    need = math.ceil(min(1.0, need_bytes / node_bytes) * 100) / 100
    return (f"on vLLM's CPU build it is a share of this machine's memory node "
            f"({node_bytes / 2**30:.1f} GiB): {share * node_bytes / 2**30:.2f} GiB here, under "
            f"{under}; use at least {need:g}")


def cpu_share_problem(share: float, node_bytes: int) -> str | None:
    """Why `vllm_gpu_memory_utilization` = `share` is too small on vLLM's CPU platform, where it
    is a share of the NUMA node's memory (None when it gives the worker at least 1 GiB)."""
    if share * node_bytes >= CPU_ENGINE_MIN_BYTES:
        return None
    return _share_text(share, node_bytes, "the 1 GiB its worker needs for its own process and "
                       "the KV cache", CPU_ENGINE_MIN_BYTES)


def process_rss_bytes() -> int:
    """Resident memory of this process (from /proc/self/statm); 0 where the kernel has no such
    file."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return 0
    return pages * os.sysconf("SC_PAGE_SIZE")


# vLLM 0.32's CPU worker, when the process already holds more than its share: "Available memory
# on node 0 (21.9/23.54 GiB) on kv cache allocation is less than requested memory for kv
# (-0.57/1.18 GiB). Reduce CPU memory used by other processes."
_KV_REFUSAL = "less than requested memory for kv"


def cpu_share_refusal(message: str, share: float, node_bytes: int, rss_bytes: int) -> str | None:
    """vLLM's CPU worker's refusal (`message`) of a share that this process already fills, in
    the trainer's words with a share that leaves 1 GiB for the KV cache; None for any other
    error. Its share counts the whole process: the trainer's model and copies, vLLM's weights."""
    if _KV_REFUSAL not in message.lower():
        return None
    return _share_text(share, node_bytes, f"the {rss_bytes / 2**30:.2f} GiB this process holds "
                       "(the trainer's model and its copies, vLLM's weights) before any KV cache",
                       rss_bytes + CPU_ENGINE_MIN_BYTES)
