"""StepGraphs: CUDA graphs of a repeated step, one per key (the step's shapes), all in one memory pool.

The first time a key comes, the step runs eagerly (the real step, which also builds every lazily made
constant and layout plan, so nothing in the capture copies from the host) and is then captured;
later steps of that key replay the graph: one launch instead of one Python dispatch per kernel.
A replay runs the captured kernels on the captured buffers, so everything a step reads or writes
must be made before (persistent buffers whose addresses stay) or inside it, and everything that
changes from step to step must live in device memory.  A capture runs the step's Python again
without executing its kernels: the step must set its host-side state (widths, which buffers are
current) itself rather than carry it over from the previous call.

Graphs in one pool share their scratch memory, so they must not run concurrently (they replay one at
a time on the current stream).  Without graphs (`enabled` False: the CPU backends, or when turned
off) every step runs eagerly, so the same code serves every backend.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Hashable

from .runtime import runtime


class StepGraphs:
    """run(key, step) replays key's graph, or runs step() and captures it (see the module docstring)."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.captured = 0
        self.replayed = 0
        self._graphs: Dict[Hashable, Any] = {}
        self._pool: Any = None

    def run(self, key: Hashable, step: Callable[[], None], capture: bool = True) -> bool:
        """One step of `key`; True when it ran as a replay.  capture=False runs a step without a graph
        eagerly and leaves it uncaptured (a shape seen once)."""
        graph = self._graphs.get(key)
        if graph is not None:
            graph.replay()
            self.replayed += 1
            return True
        step()
        if self.enabled and capture:
            torch = runtime().torch
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
                step()
            self._pool = graph.pool()
            self._graphs[key] = graph
            self.captured += 1
        return False

    def release(self) -> None:
        """Free the captured graphs and their pool (a later step of any key captures again)."""
        for graph in self._graphs.values():
            graph.reset()
        self._graphs.clear()
        self._pool = None
