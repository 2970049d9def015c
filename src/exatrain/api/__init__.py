"""exatrain's Python API: where the parts are wired, one call per command of the CLI.

Each call takes a few typed requests (``api.requests``: ModelQuery, ClusterQuery, Layout, RunSettings,
Engine, Budget, PlanOptions, TrainRun, ...), one per group of the CLI's flags, whose fields have the names and
defaults of the flags (``--micro-batch 4`` is ``Layout(micro_batch=4)``); the same fields may be given flat
(``estimate("llama3-70b", "dgx-h100", gpus=64, tp=8)``). A model is a preset name, a ModelSpec or
``model_file``; a cluster a catalog name, a ClusterSpec or ``cluster_file``. Each call returns the typed result
the CLI prints:

* ``estimate``  -> Plan (with its StepEstimate)      ``search``  -> SearchResult (ranked Plans)
* ``scaling``   -> ScalingResult (points, efficiencies, the study's measurement)
* ``train``     -> TrainResult (the RunRecord)       ``tune``    -> TuneResult (trials, the best)
* ``bench``     -> BenchResult (a calibration)       ``calibrate`` -> CalibrateResult
* ``compare``   -> CompareResult (predicted vs measured of recorded runs)
* ``record``    -> RecordResult (a run measured anywhere, appended to a runs file)
* ``demo``      -> DemoResult (the loop on this machine: bench --quick, search, train, compare)
* ``make_plan`` -> a validated Plan from layout values; ``load_plan`` reads any file holding one
* ``from_launch`` -> the keyword arguments a Megatron-LM / Megatron-DeepSpeed launch or torchtitan TOML states;
  ``launch_request`` -> the same as the typed requests (ModelQuery, ClusterQuery, Layout, Engine, settings)
* ``launch`` / ``export_config`` / ``prepare`` / ``export_model`` / ``report``: files for elsewhere

Bad input raises ``exatrain.errors.UserError`` (one line naming the problem), before any work.
Importing this package does not import torch; ``train``, ``bench`` and ``estimate(trace=True)`` do
when they run.
"""

from exatrain.api.demo import DemoResult, demo
from exatrain.api.files import export_model, prepare, report, verify_dataset
from exatrain.api.jobs import export_config, launch
from exatrain.api.measuring import CompareResult, bench, calibrate, compare
from exatrain.api.planning import estimate, scaling, search
from exatrain.api.recording import RecordResult, record
from exatrain.api.requests import (
    Budget,
    ClusterQuery,
    Engine,
    JobOptions,
    Layout,
    ModelQuery,
    PlanOptions,
    RecordedRun,
    RunSettings,
    SlurmJob,
    TokenizeOptions,
    TorchrunJob,
    TrainRun,
    TrainStore,
    TuneOptions,
)
from exatrain.api.plans import (
    ExatrainWarning,
    from_launch,
    launch_request,
    load_plan,
    make_plan,
    resolve_cluster,
    resolve_model,
)
from exatrain.api.training import TrainResult, train
from exatrain.api.tuning import tune

# What the CLI prints results with (torch-free; re-exported so the CLI imports the api alone).
from exatrain.accounting.params import total_params
from exatrain.engine_configs import TARGETS as EXPORT_TARGETS
from exatrain.planner.compare import size
from exatrain.planner.results import estimate_json, search_json
from exatrain.planner.search.explain import describe, explain
from exatrain.report.text import (
    make_console,
    opt,
    progress_lines,
    render_comparisons,
    render_estimate,
    render_hardware,
    render_models,
    render_scaling,
    render_search,
    render_tune,
    table,
)

__all__ = [
    "Budget",
    "ClusterQuery",
    "Engine",
    "JobOptions",
    "Layout",
    "ModelQuery",
    "PlanOptions",
    "RecordedRun",
    "RunSettings",
    "SlurmJob",
    "TokenizeOptions",
    "TorchrunJob",
    "TrainRun",
    "TrainStore",
    "TuneOptions",
    "EXPORT_TARGETS",
    "describe",
    "estimate_json",
    "explain",
    "search_json",
    "size",
    "total_params",
    "make_console",
    "opt",
    "progress_lines",
    "render_comparisons",
    "render_estimate",
    "render_hardware",
    "render_models",
    "render_scaling",
    "render_search",
    "render_tune",
    "table",
    "CompareResult",
    "DemoResult",
    "ExatrainWarning",
    "RecordResult",
    "TrainResult",
    "bench",
    "calibrate",
    "compare",
    "demo",
    "estimate",
    "export_config",
    "export_model",
    "from_launch",
    "launch",
    "launch_request",
    "load_plan",
    "make_plan",
    "prepare",
    "report",
    "resolve_cluster",
    "record",
    "resolve_model",
    "scaling",
    "search",
    "train",
    "tune",
    "verify_dataset",
]
