"""PACER-SD: lossless speculative decoding with strategies as plugins."""

from .config import PacerConfig, RunPlan, load_config, load_plan
from .draft_values import Draft, DraftBlock, DraftVocab, SideNodes, TokenTree
from .engine import Engine
from .errors import ConfigError, InputError, PacerError
from .hookspecs import hookimpl
from .protocols import FeatureModel, LanguageModel, ModelOutput
from .types import (
    Component,
    DecodeState,
    DraftInfo,
    GenerationResult,
    Resources,
    SamplingParams,
    StepRecord,
    Stop,
    Verdict,
)

__all__ = [
    "Component",
    "ConfigError",
    "DecodeState",
    "Draft",
    "DraftBlock",
    "DraftInfo",
    "DraftVocab",
    "Engine",
    "FeatureModel",
    "GenerationResult",
    "InputError",
    "LanguageModel",
    "ModelOutput",
    "PacerConfig",
    "PacerError",
    "Resources",
    "RunPlan",
    "SamplingParams",
    "SideNodes",
    "StepRecord",
    "Stop",
    "TokenTree",
    "Verdict",
    "hookimpl",
    "load_config",
    "load_plan",
]
