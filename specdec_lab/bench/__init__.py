"""The benchmark: systems.py (what is timed), run.py (the run and its statistics), report.py (the
tables), probes.py (side-by-side probes), gpu.py (GPU mode), main.py (the command)."""
from .gpu import cuda_syncs_per_step, random_model, run_synthetic
from .main import bench_main, parse_list
from .probes import (compare_caches, compare_kernels, compare_policies, format_kernels, format_policies,
                     format_profile, profile_decode)
from .report import format_synthetic, format_table
from .run import (QUICK, SAMPLE_STRIDE, BenchConfig, alpha_from_steps, by_kind, judged, ratio_interval, run_bench,
                  run_systems, seeds_for, teacher_forced_alpha)
from .systems import (FEATURE_KS, FEATURE_LOOKUP_K, FEATURE_STOP_K, SELF_KS, SELF_LOOKUP_K, STOP_BELOW, STOP_K, System,
                      Tally, make_systems)

__all__ = ["cuda_syncs_per_step", "random_model", "run_synthetic", "bench_main", "parse_list", "compare_caches",
           "compare_kernels", "compare_policies", "format_kernels", "format_policies", "format_profile",
           "profile_decode", "format_synthetic", "format_table", "QUICK", "SAMPLE_STRIDE", "BenchConfig",
           "alpha_from_steps", "by_kind", "judged", "ratio_interval", "run_bench", "run_systems", "seeds_for",
           "teacher_forced_alpha", "FEATURE_KS", "FEATURE_LOOKUP_K", "FEATURE_STOP_K", "SELF_KS", "SELF_LOOKUP_K",
           "STOP_BELOW", "STOP_K", "System", "Tally", "make_systems"]
