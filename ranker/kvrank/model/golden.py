"""Train/serve parity: a file of inputs and the logits training computed for them, exported
next to the weights (``golden.safetensors``) and matched when the model is loaded.

Training and serving can disagree without any check noticing: another feature order, a
preprocessing step the server lacks, a library that changed a kernel. The exporter writes a
few real requests and the logits the trained model gave them; the ``golden_parity`` check
(:mod:`kvrank.model.checks`) scores them through the serving path and compares. Safetensors
only: nothing here unpickles anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor

from kvrank.errors import ArtifactError, InputError
from kvrank.model.contract import CandidateInput, FeatureSpec, UserInput
from kvrank.model.features import check_candidates, check_user

GOLDEN_FILE = "golden.safetensors"
GOLDEN_TOLERANCE = 1e-4
"""|Δlogit| allowed between training's logits and the served ones (other hardware, other
BLAS: a few ulps more than the 1e-5 of one process)."""


@dataclass(frozen=True)
class GoldenCase:
    user: UserInput
    candidates: CandidateInput
    logits: Tensor
    """What training's model gave, ``[C]``."""


def save_golden(directory: Path, cases: list[GoldenCase]) -> Path:
    """Write ``cases`` to ``directory/golden.safetensors``."""
    tensors: dict[str, Tensor] = {}
    for i, case in enumerate(cases):
        for group, columns in (
            ("events", case.user.events),
            ("user", case.user.user),
            ("candidates", case.candidates.columns),
        ):
            for name, t in columns.items():
                tensors[f"{i}/{group}/{name}"] = t.detach().contiguous().cpu()
        tensors[f"{i}/logits"] = case.logits.detach().float().contiguous().cpu()
    path = directory / GOLDEN_FILE
    save_file(tensors, str(path), metadata={"cases": str(len(cases))})
    return path


def load_golden(directory: Path, spec: FeatureSpec) -> list[GoldenCase] | None:
    """The artifact's golden cases (None when it has no such file), each checked against
    ``spec``; a malformed file is an ``ArtifactError``."""
    path = directory / GOLDEN_FILE
    if not path.is_file():
        return None
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError) as exc:
        raise ArtifactError(f"{path}: unreadable: {exc}") from exc
    cases = []
    for i in range(len([k for k in tensors if k.endswith("/logits")])):
        try:
            user = UserInput(_group(tensors, i, "events"), _group(tensors, i, "user"))
            cands = CandidateInput(_group(tensors, i, "candidates"))
            check_user(spec, user)
            check_candidates(spec, cands)
            cases.append(GoldenCase(user, cands, tensors[f"{i}/logits"]))
        except (InputError, KeyError, StopIteration) as exc:
            raise ArtifactError(f"{path}: case {i} does not fit the model: {exc}") from exc
    return cases


def _group(tensors: dict[str, Tensor], i: int, group: str) -> dict[str, Tensor]:
    prefix = f"{i}/{group}/"
    return {k[len(prefix) :]: t for k, t in tensors.items() if k.startswith(prefix)}
