"""An ``lmcache server`` for the LMCache tests (test_lmcache.py) and benchmark (bench/lmcache_ttft.py):
one L2 adapter, in a process group of its own, its output in a log file. Written once for both."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, Optional


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tensorzip_adapter(l2: Path) -> dict:
    """tensorzip's file-system adapter with the serde ``tensorzip`` (doc/kv.md section 7.3)."""
    return {"type": "plugin", "module_path": "tensorzip.lmcache", "class_name": "TensorZipFSL2Adapter",
            "adapter_params": {"base_path": str(l2)}, "serde": {"type": "tensorzip"}}


def fs_adapter(l2: Path) -> dict:
    """LMCache's own file-system adapter, no serde (chunks stored as they are)."""
    return {"type": "fs", "base_path": str(l2)}


class LMCacheServer:
    """``lmcache server`` on 127.0.0.1 with this L2 adapter; ready when the constructor returns
    (RuntimeError with the log's tail if it exits or is not ready in ``timeout`` seconds)."""

    def __init__(self, adapter: dict, log: Path, chunk_tokens: int, env: Optional[Dict[str, str]] = None,
                 timeout: float = 300) -> None:
        self.port, self.http_port, self.log = free_port(), free_port(), log
        cmd = [sys.executable, "-m", "lmcache.cli.main", "server", "--host", "127.0.0.1", "--port", str(self.port),
               "--http-host", "127.0.0.1", "--http-port", str(self.http_port), "--chunk-size", str(chunk_tokens),
               "--l1-size-gb", "0.25", "--eviction-policy", "LRU", "--supported-transfer-mode", "engine_driven",
               "--l2-adapter", json.dumps(adapter)]
        self._out = open(log, "w")
        self.proc = subprocess.Popen(cmd, stdout=self._out, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        deadline = time.monotonic() + timeout
        while "cache server is running" not in log.read_text(errors="replace"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                why = f"exited {self.proc.returncode}" if self.proc.poll() is not None else "not ready"
                self.stop()
                raise RuntimeError(f"lmcache server {why}:\n{self.tail()}")
            time.sleep(0.5)

    def tail(self, n: int = 6000) -> str:
        return self.log.read_text(errors="replace")[-n:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._out.close()
