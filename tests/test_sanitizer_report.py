"""scripts/sanitizer_report.py attributes compute-sanitizer reports to the kernel each names."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

SPEC = importlib.util.spec_from_file_location("sanitizer_report", Path(__file__).parents[1] / "scripts" / "sanitizer_report.py")
report = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(report)

LOG = """========= COMPUTE-SANITIZER
========= Uninitialized __global__ memory read of size 2 bytes
=========     at void at::native::unrolled_elementwise_kernel<int>(int)+0x870
=========     by thread (0,0,0) in block (0,0,0)
=========         Host Frame: rel_err in test_x.py:27
=========
========= Uninitialized __global__ memory read of size 4 bytes
=========     at void (anonymous namespace)::slot_attention_kernel<float>(int)+0x10
=========     by thread (3,0,0) in block (1,0,0)
=========
========= Error: Race reported between Write access at void mine(int)+0x1a0 in a.cu:3
=========     and Read access at void mine(int)+0x2a0 in a.cu:4 [2 hazards]
=========
========= Program hit cudaErrorInvalidValue (error 1) due to "invalid argument" on CUDA API call to cudaMemcpy.
=========     Saved host backtrace up to driver entry point at error
=========
========= ERROR SUMMARY: 4 errors
"""


def test_reports_name_their_kernels(tmp_path: Path) -> None:
    assert report.reports(LOG.splitlines()) == [
        "void at::native::unrolled_elementwise_kernel<int>(int)",
        "void (anonymous namespace)::slot_attention_kernel<float>(int)",
        "void mine(int)",
        None,
    ]
    log = tmp_path / "initcheck.log"
    log.write_text(LOG)
    assert report.split_counts(log, re.compile("cudnn|native|cublas")) == (3, 1)


def test_a_clean_or_missing_log_has_no_reports(tmp_path: Path) -> None:
    clean = tmp_path / "clean.log"
    clean.write_text("========= COMPUTE-SANITIZER\n========= ERROR SUMMARY: 0 errors\n")
    assert report.split_counts(clean, re.compile("x")) == (0, 0)
    assert report.split_counts(tmp_path / "absent.log", re.compile("x")) == (0, 0)
