"""GPU tests of the CUDA backend.  Every test here is skipped, with the reason, when the backend
cannot run (no CUDA GPU visible to torch, or kernels not built with `bash compile_cuda.sh`).

`-m small` selects the SMALL_CASES below: small shapes that still take each kernel library's code
paths, cheap enough to run under compute-sanitizer in minutes (scripts/sanitize.sh); speed reports
and memory-limit tests are not among them."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

HERE = Path(__file__).resolve().parent

# file -> test function -> {parameter: the values kept} ({}: every case of the test).
SMALL_CASES: Dict[str, Dict[str, Dict[str, List[Any]]]] = {
    "test_cuda_ops.py": {  # combine, random_kernel, embedding_kernel and matmul through the backend
        "test_fill_and_zeros": {}, "test_fill_non_contiguous_view_writes_only_the_view": {}, "test_arange": {"n": [33]},
        "test_uniform_range_determinism_and_moments": {"shape": [(33,), (257, 1001)]},
        "test_uniform_permuted_out_matches_logical_order": {}, "test_map_contiguous": {"shape": [(1023,), (2, 3, 1, 7)]},
        "test_map_permuted_input": {}, "test_map_into_out_broadcasts_and_writes_strided_out": {},
        "test_zip_broadcast": {"name": ["add", "mul", "pow", "max"]}, "test_zip_permuted_and_expanded": {},
        "test_reduce": {"name": ["add", "max"]}, "test_reduce_permuted": {}, "test_reduce_start_value_and_empty_dim": {},
        "test_matmul": {"transpose": ["nn", "tt"], "shapes": [((33, 33), (33, 33)), ((2, 1, 33, 17), (3, 17, 40)),
                                                              ((4, 3, 65, 129), (4, 3, 129, 66))]},
        "test_matmul_expanded_batch_and_odd_strides": {},
        "test_embedding_gather_and_scatter_add": {}, "test_embedding_invalid_ids_give_zero_rows_and_no_gradient": {},
    },
    "test_cuda_functions.py": {  # the same kernels under autodiff Functions
        "test_function_forward_backward_matches_cpu": {}, "test_embedding_function_forward_backward": {},
        "test_linear_gelu_softmax_loss_training_step_matches_cpu": {},
    },
    "test_matmul.py": {  # matmul_kernel: every layout, direct and split-K, epilogues, accumulate
        "test_layouts": {}, "test_sizes": {"M": [1, 17, 64, 128]}, "test_strided_and_misaligned": {},
        "test_batch_broadcast": {}, "test_epilogues": {"M": [100, 37, 5]}, "test_activation_without_bias": {},
        "test_accumulate": {"K": [100]}, "test_empty_and_invalid": {},
    },
    "test_softmax_fw.py": {  # sub-warp, warp, block and streaming rows; float4 and scalar; causal
        "test_softmax_fw_lengths": {"Tk": [3, 33, 1025, 4097]}, "test_softmax_fw_causal": {"Tq": [5, 33, 3, 8, 7]},
        "test_softmax_fw_every_key_masked": {}, "test_softmax_fw_raw_poisoned": {},
    },
    "test_softmax_bw.py": {
        "test_softmax_bw_lengths": {"Tk": [5, 33, 1025, 4097]}, "test_softmax_bw_causal": {"Tq": [1, 33, 4, 50]},
        "test_softmax_bw_raw_poisoned": {"Tk": [3, 40, 1027, 16389]},
    },
    "test_layernorm_fw.py": {
        "test_layernorm_fw_sizes": {"hidden": [3, 64, 1023, 4096, 16385]}, "test_layernorm_fw_constant_rows": {},
        "test_layernorm_fw_raw_poisoned": {},
    },
    "test_layernorm_bw.py": {
        "test_layernorm_bw_sizes": {"hidden": [3, 64, 1023, 8193]}, "test_layernorm_bw_row_counts": {"rows": [1, 17, 100]},
        "test_layernorm_bw_hidden_one": {}, "test_layernorm_bw_two_columns": {},
        "test_layernorm_bw_raw_poisoned": {"hidden": [3, 1025, 8192]},
    },
    "test_attention.py": {  # forward and backward, masks, causal offsets, odd head dims, one long row
        "test_small_lengths": {"T": [7, 129], "D": [16, 128], "mask_kind": ["inf"]},
        "test_cross_lengths": {"Tq": [7, 129]}, "test_odd_head_dims": {"D": [7, 65]},
        "test_length_1000": {"D": [64], "causal": [True], "activation": ["softmax"]},
        "test_non_contiguous_inputs_and_explicit_scale": {}, "test_matches_the_naive_minitorch_path": {},
    },
    "test_fused_loss.py": {  # classifier_kernel
        "test_fused_loss_matches_torch_float64": {"vocab": [7, 1000], "hidden_size": [64]},
        "test_all_zero_weights_give_zero_loss_and_gradients": {}, "test_classifier_launcher": {"vocab": [7, 64, 1003]},
    },
    "test_mt_resume_cuda.py": {"test_a_few_training_steps_use_every_library": {}},  # the program: all libraries
    "test_decode_graphs.py": {  # kv_cache_kernel, topk_kernel (each list size), beam_search_kernel
        "test_slot_write_kernel": {}, "test_gather_rows_kernel": {},
        "test_slot_attention_kernel_matches_numpy": {"rows": [6, 4], "slot": [7.0]},
        "test_top_k_kernel_matches_numpy": {"width": [7, 256, 300, 1000]},
        "test_beam_search_step_kernel_matches_numpy": {},
    },
    "test_adamw.py": {  # optimizer_kernel
        "test_adamw_matches_torch_in_place": {"lr": [1e-3]}, "test_launcher_scalar_path_on_misaligned_buffers": {},
    },
    "test_convert.py": {  # convert_kernel: vector and strided casts, 16-bit copies, bad codes
        "test_cast_from_float32_matches_torch_bit_for_bit": {"n": [7, 4099]}, "test_casts_and_copies_between_16bit_dtypes": {},
        "test_strided_broadcast_and_misaligned_layouts": {}, "test_launcher_rejects_bad_codes_and_layouts": {},
    },
    "test_bf16_linear.py": {  # matmul_bf16_kernel through the backend: dtype dispatch, Linear's bf16 hooks
        "test_bf16_products_run_on_the_bf16_library": {}, "test_mixed_products_promote_and_float16_is_refused": {},
        "test_linear_under_autocast_matches_torch_autocast": {"rows": [300, 65]},
    },
    "test_matmul_bf16.py": {  # matmul_bf16_kernel: mma.sync and TMA + wgmma paths, split-K, epilogues
        "test_layouts": {}, "test_sizes": {"M": [2, 64, 131]}, "test_batch_broadcast": {},
        "test_epilogues": {"M": [100, 37]}, "test_accumulate": {"K": [100, 20000]}, "test_strided_and_misaligned": {},
        "test_bad_input_is_refused": {}, "test_clustered_tiles": {"b_t": [False]},
        "test_transposed_products": {"shape": [6]},
    },
    "test_bf16_elementwise.py": {  # combine in bf16: maps, zips, mixed storage, dropout, reductions, GELU backward
        "test_map": {"name": ["gelu", "exp"]}, "test_zip_broadcast_and_permuted": {"name": ["add"]},
        "test_mixed_storage_operands": {}, "test_dropout_keeps_bfloat16_and_scales_kept_values": {},
        "test_reduce_accumulates_in_float32": {"shape": [(33, 1023), (5, 9, 11)]},
        "test_gelu_backward_in_bfloat16": {},
    },
    "test_bf16_softmax.py": {"test_softmax_forward_and_backward": {"Tk": [7, 1025]}},  # softmax_kernel in bf16
    "test_bf16_layernorm.py": {  # layernorm_kernel in bf16
        "test_layernorm_forward_and_backward": {"hidden": [7, 768]},
    },
    "test_bf16_embedding.py": {  # embedding_kernel in bf16
        "test_gather_rounds_rows_once": {"dim": [7, 64]}, "test_scatter_add_sums_bfloat16_gradients_in_float32": {"dim": [7]},
    },
    "test_bf16_adamw.py": {"test_working_copies_follow_the_masters": {}, "test_launcher_rejects_a_bad_working_copy": {}},
    "test_bf16_classifier.py": {  # classifier_kernel in bf16 (through matmul_bf16_kernel)
        "test_against_float64": {"V": [77]},
    },
    "test_cross_entropy_rows.py": {  # classifier_kernel out of place: nn.cross_entropy's rows
        "test_float32_against_float64": {"V": [10, 777]}, "test_bf16_under_autocast_within_torch_error": {"V": [10]},
        "test_softmax_loss_runs_the_kernel_and_marks_bad_targets_nan": {},
    },
    "test_bf16_decoding.py": {  # kv_cache_kernel in bf16
        "test_write_slot_copies_bf16_exactly_and_casts_float32_values": {},
        "test_slot_attention_against_float64": {"width": [37]},
    },
    "test_bf16_attention.py": {  # attention_bf16_kernel: every head-dim bucket, masks, odd sizes, empty rows
        "test_lengths": {"T": [65], "mask_kind": ["inf"]}, "test_cross_lengths": {"Tq": [7]},
        "test_odd_head_dims": {"D": [7, 65]}, "test_rows_without_keys_are_zero": {},
        "test_packed_qkv_and_autocast": {}, "test_raw_launcher_rejects_bad_sizes_and_strides": {},
        "test_packed_path_matches_the_split_path": {"activation": ["softmax"]}, "test_packed_path_launches_no_copy": {},
    },
    "test_torch_habits_cuda.py": {  # int_kernel: elementwise, reduce, casts, arg_reduce, cumsum, sort rows, gathers
        "test_int64_elementwise_and_reductions_are_exact": {}, "test_int64_casts_fill_arange_and_gather_rows": {},
        "test_sort_rows_of_every_length_are_stable": {"length": [3, 1000]}, "test_nan_in_argmax_argmin_and_max": {},
        "test_bad_input_on_the_device_is_loud_without_a_host_copy": {},
    },
}  # fmt: skip


def _unavailable() -> Optional[str]:
    if importlib.util.find_spec("torch") is None:
        return "PyTorch is not installed (the CUDA backend takes device memory and streams from it)"
    from minitorch import cuda_kernel_ops

    return cuda_kernel_ops.unavailable_reason()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "small: a small case for compute-sanitizer runs (kernel_tests/conftest.py)")


def _is_small(item: pytest.Item) -> Optional[tuple]:
    """The (file, test) key of SMALL_CASES that selects this item, or None."""
    key = (Path(str(item.fspath)).name, getattr(item, "originalname", item.name))
    keep = SMALL_CASES.get(key[0], {}).get(key[1])
    if keep is None:
        return None
    params = item.callspec.params if hasattr(item, "callspec") else {}
    unknown = set(keep) - set(params)
    if unknown:
        raise pytest.UsageError(f"SMALL_CASES[{key}] filters {sorted(unknown)}, which {item.nodeid} does not take")
    return key if all(params[name] in values for name, values in keep.items()) else None


def _mark_small(config: pytest.Config, items: List[pytest.Item]) -> None:
    matched = set()
    for item in items:
        key = _is_small(item)
        if key is not None:
            item.add_marker(pytest.mark.small)
            matched.add(key)
    files = {Path(str(item.fspath)).name for item in items}
    missing = [(f, t) for f, tests in SMALL_CASES.items() if f in files for t in tests if (f, t) not in matched]
    if missing and "small" in (config.option.markexpr or ""):
        raise pytest.UsageError(f"SMALL_CASES names tests that select no case (renamed or removed?): {missing}")


def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    _mark_small(config, items)
    reason = _unavailable()
    if reason is None:
        return
    marker = pytest.mark.skip(reason=f"CUDA backend unavailable: {reason}")
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:  # this hook sees the whole session's items
            item.add_marker(marker)


def pytest_report_header(config: pytest.Config) -> str:
    reason = _unavailable()
    if reason is not None:
        return f"minitorch CUDA backend: unavailable ({reason})"
    import torch

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "no torch CUDA device"
    return f"minitorch CUDA backend: loaded on {device} (torch {torch.__version__})"
