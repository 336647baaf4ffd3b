"""``PromptLibrary``: the candidate prompts of SARL's semantic MDP (its discrete action set), each with a
frozen, unit-norm text embedding.

A library is built from a prompt list (``from_prompts``) or from simulated tasks (``from_sim_task`` /
``from_sim_tasks``): the tasks' sub-skill instructions (``Task.skill_instruction`` of each of their
``skills``: "pick up the red cube", "put it in the bowl"), the tasks' own instructions and trained
paraphrases, and the template vocabulary ``SIM_TEMPLATES`` expanded over ``SIM_COLOURS``. A task is
read by duck typing (``instruction``, ``skills``, ``skill_instruction``, ``train_wordings``):
``policies`` never imports ``hardware``.

The encoder is any callable ``list[str] -> [N, D]`` (torch tensor or array); the default is the frozen
MiniLM of the compact VLA (``vla.models.encoders.TextEncoder``, 384-d, offline). ``snap(text)`` maps free
text (a VLM's proposal, an operator's wording) to the nearest library prompt by cosine similarity.
"""

from __future__ import annotations

import itertools
import string
from typing import Any, Callable, Iterable, Sequence

import numpy as np

Encoder = Callable[[list[str]], Any]

SIM_COLOURS: tuple[str, ...] = ("red", "green", "blue")
"""The cube colours of the simulated tabletop (``hardware.sim_tasks.CUBES``)."""
SIM_TEMPLATES: tuple[str, ...] = (
    "pick up the {colour} cube",
    "put it in the bowl",
    "put it on the {colour} cube",
    "push the {colour} cube to the pink marker",
    "lift the {colour} cube high",
)
"""Sub-skill templates over the simulated tabletop's verbs, objects and places; every ``{colour}``
slot is filled with each of ``SIM_COLOURS``."""


def expand_templates(templates: Iterable[str], colours: Sequence[str] = SIM_COLOURS) -> list[str]:
    """Every template with each ``{colour}`` slot filled by each colour (a template without a slot
    gives itself once). An unknown slot name is an error."""
    out: list[str] = []
    for t in templates:
        slots = {name for _, name, _, _ in string.Formatter().parse(t) if name is not None}
        if slots - {"colour"}:
            raise ValueError(f"template {t!r}: unknown slot(s) {sorted(slots - {'colour'})} (known: colour)")
        out += [t.format(colour=c) for c in colours] if slots else [t]
    return out


def _clean(prompt: str) -> str:
    if not isinstance(prompt, str):
        raise ValueError(f"a prompt must be a string, got {type(prompt).__name__}")
    text = " ".join(prompt.split())
    if not text:
        raise ValueError("a prompt is empty (or only whitespace)")
    return text


def _unit_rows(x: Any, n: int, what: str) -> np.ndarray:
    """float32 [n, D] with unit-norm rows, from the encoder's output."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[0] != n:
        raise ValueError(f"the text encoder returned shape {list(x.shape)} for {n} {what}; expected [{n}, D]")
    if not np.isfinite(x).all():
        raise ValueError(f"the text encoder returned NaN or inf for {what}")
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    if (norms < 1e-8).any():
        raise ValueError(f"the text encoder returned a zero embedding for {what} (no direction to compare)")
    return x / norms


def default_encoder() -> Encoder:
    """The compact VLA's frozen MiniLM sentence encoder (384-d, loaded from an installed package)."""
    from vla.models.encoders import TextEncoder

    return TextEncoder()


def subskill_prompts(task: Any) -> list[str]:
    """The instruction of each of a sim task's sub-skills, in the task's order (repeats kept: the hand-written
    sequence)."""
    return [_clean(task.skill_instruction(skill)) for skill in task.skills]


def task_prompts(task: Any, paraphrases: bool = True) -> list[str]:
    """A sim task's own vocabulary (read by duck typing): its instruction, its trained paraphrases
    (``train_wordings``) if ``paraphrases``, and its sub-skill instructions, each once."""
    prompts = [task.instruction, *(task.train_wordings if paraphrases else ()), *subskill_prompts(task)]
    return list(dict.fromkeys(_clean(p) for p in prompts))


class PromptLibrary:
    """An ordered set of distinct prompts and their unit-norm embeddings ``[N, D]`` (float32).

    Args:
        prompts: the candidate prompts (whitespace is normalised; duplicates are an error).
        encoder: ``list[str] -> [N, D]``; default ``default_encoder()``. Its ``dim`` attribute, if it
            has one, must match the width it returns.
    """

    def __init__(self, prompts: Sequence[str], encoder: Encoder | None = None) -> None:
        cleaned = [_clean(p) for p in prompts]
        if not cleaned:
            raise ValueError("the prompt library is empty: give at least one prompt")
        dupes = sorted({p for p in cleaned if cleaned.count(p) > 1})
        if dupes:
            raise ValueError(f"the prompt library lists {dupes} more than once (prompts must be distinct)")
        self.encoder = encoder if encoder is not None else default_encoder()
        self.prompts: tuple[str, ...] = tuple(cleaned)
        self.embeddings = _unit_rows(self.encoder(list(self.prompts)), len(self.prompts), "the library prompts")
        """float32 [N, D], unit rows, in ``prompts`` order."""
        declared = getattr(self.encoder, "dim", None)
        if declared is not None and int(declared) != self.dim:
            raise ValueError(f"embedding dimension mismatch: the encoder declares dim={declared} but returned "
                             f"{self.dim}-d embeddings")
        self._index = {p: i for i, p in enumerate(self.prompts)}

    # -- constructors ------------------------------------------------------------------------------
    @classmethod
    def from_prompts(cls, prompts: Sequence[str], encoder: Encoder | None = None) -> "PromptLibrary":
        """A library of exactly ``prompts`` (in order; duplicates are an error)."""
        return cls(list(prompts), encoder)

    @classmethod
    def from_sim_tasks(cls, tasks: Iterable[Any], encoder: Encoder | None = None,
                       templates: Iterable[str] = SIM_TEMPLATES, colours: Sequence[str] = SIM_COLOURS,
                       paraphrases: bool = True) -> "PromptLibrary":
        """The sub-skill vocabulary of simulated tasks (``hardware.sim_tasks.Task``), in this order: each
        task's instruction, its trained paraphrases (``train_wordings``; held-out wordings stay out, so
        wording-generalisation benches stay clean) if ``paraphrases``, the instruction of each of its
        sub-skills, then the expanded ``templates``. Repeats across sources are kept once."""
        prompts = [p for task in tasks for p in task_prompts(task, paraphrases)]
        prompts += expand_templates(templates, colours)
        return cls(list(dict.fromkeys(_clean(p) for p in prompts)), encoder)

    @classmethod
    def from_sim_task(cls, task: Any, encoder: Encoder | None = None, templates: Iterable[str] = SIM_TEMPLATES,
                      colours: Sequence[str] = SIM_COLOURS, paraphrases: bool = True) -> "PromptLibrary":
        """``from_sim_tasks([task], ...)``."""
        return cls.from_sim_tasks([task], encoder, templates, colours, paraphrases)

    # -- reading -----------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.prompts)

    def __getitem__(self, i: int) -> str:
        return self.prompts[i]

    def __contains__(self, prompt: str) -> bool:
        return " ".join(prompt.split()) in self._index

    @property
    def dim(self) -> int:
        """D, the embedding width."""
        return int(self.embeddings.shape[1])

    def index(self, prompt: str) -> int:
        """The position of ``prompt`` in the library (KeyError naming the closest prompt if absent)."""
        text = _clean(prompt)
        if text not in self._index:
            raise KeyError(f"{prompt!r} is not in the prompt library; the closest is {self.snap(text)[0]!r}")
        return self._index[text]

    def similarities(self, text: str) -> np.ndarray:
        """Cosine similarity of ``text`` to every library prompt, float32 [N]."""
        query = _unit_rows(self.encoder([_clean(text)]), 1, repr(text))[0]
        if query.shape[0] != self.dim:
            raise ValueError(f"embedding dimension mismatch: {text!r} embeds to {query.shape[0]} dims, the library "
                             f"holds {self.dim}-d embeddings (was the encoder changed?)")
        return self.embeddings @ query

    def snap(self, text: str) -> tuple[str, float]:
        """The library prompt nearest to ``text`` by cosine similarity, and that similarity."""
        sims = self.similarities(text)
        i = int(np.argmax(sims))
        return self.prompts[i], float(sims[i])

    def __repr__(self) -> str:
        shown = ", ".join(repr(p) for p in itertools.islice(self.prompts, 3))
        more = f", ... ({len(self)} prompts)" if len(self) > 3 else ""
        return f"PromptLibrary([{shown}{more}], dim={self.dim})"
