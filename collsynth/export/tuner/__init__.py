"""Tuner configs for stock NCCL and RCCL: the CSV format and its two parsers, and the chooser.

:mod:`collsynth.export.tuner.config` writes and reads the CSV that NCCL's example tuner plugin
and RCCL's built-in CSV tuner load; :mod:`collsynth.export.tuner.choose` picks per size range the
runtime's own (algorithm, protocol, channels) to force; :mod:`collsynth.export.tuner.machine`
prices those choices on a machine (for now with the runtime's own tuning model). The format and
its quirks: docs/tuner-config.md.
"""

from collsynth.export.tuner.choose import (Choice, RuntimeTuning, SizeRow, TunedRange,
                                           tune_runtime, tuning_rules)
from collsynth.export.tuner.config import (ParsedConfig, ParseNote, RuntimeOutcome, TunerRule,
                                           format_rule, match, parse_as_nccl_example,
                                           parse_as_rccl, parse_tuner_config,
                                           render_tuner_config, runtime_outcome,
                                           write_tuner_config)

__all__ = ["TunerRule", "ParsedConfig", "ParseNote", "RuntimeOutcome", "format_rule",
           "render_tuner_config", "write_tuner_config", "parse_as_nccl_example", "parse_as_rccl",
           "parse_tuner_config", "match", "runtime_outcome", "Choice", "SizeRow", "TunedRange",
           "RuntimeTuning", "tune_runtime", "tuning_rules"]
