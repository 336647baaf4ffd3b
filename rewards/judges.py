"""Judges for hindsight relabelling (LfH): what did a rollout achieve, and did it do what it was told?

LfH turns failed RL rollouts into signal. A judge looks at an episode the policy failed, proposes the
instruction it *did* carry out ("pick up the red cube" when it was told to stack), then scores every
rollout of the group against that instruction; the GRPO / LfH agent (``policies/grpo``) trains on the
relabelled group. Every judge answers the same calls, on an :class:`EpisodeRecord`:

* ``propose_instruction(episode) -> str | None``: what the episode achieved, at most 20 words;
  None means "Nothing".
* ``score(episode, instruction) -> "yes" | "unsure" | "no"`` (``VERDICT_SCORE``: 1, 0.5, 0).
* ``stats() -> dict``: counters for the logs (``calls``, ``unparsed`` answers, ...).

Backends, built from a command-line spec by :func:`make_judge`:

* ``sim`` -- :class:`SimJudge`, **PRIVILEGED, simulation only**: it reads which registered sim tasks'
  success predicates held during the episode (``episode.achieved_tasks``, from object poses that no real
  robot knows). Use it to develop and test LfH in simulation, or as the ground truth a real judge is
  measured against; never as if it existed on the robot. Its ``privileged`` attribute says so, and the
  agent logs it.
* ``vlm:DIR`` -- :class:`VLMJudge`: a local vision-language model (``transformers``, loaded from DIR with
  ``local_files_only``; nothing is downloaded) shown a few frames of the episode. It also answers
  ``compare(frame_a, frame_b, instruction) -> "first" | "second" | "same"`` (which frame is closer to
  done) for potential-based shaping (``rewards.shaping.JudgeComparator``).
* ``classifier:DIR`` -- :class:`ClassifierJudge`: a ``vla reward`` success classifier on the last frame.
  It knows one task, the one it was trained for; any other instruction is "unsure".
* ``human`` -- :class:`HumanJudge`: a person at the terminal looks at a contact sheet of the frames.

Free text is snapped to known instructions by :class:`PromptMatcher` (MiniLM sentence embeddings,
cosine similarity, a floor below which nothing matches).

Parsing is strict (VLM and human answers). An answer is normalised -- surrounding whitespace stripped,
lower-cased, trailing punctuation stripped, inner whitespace collapsed -- and then:

* a verdict (``parse_verdict``) or a comparison (``parse_comparison``) must *be* one of the options:
  "Yes." is yes, "yes, it did" is not an answer;
* a proposal (``parse_proposal``) is "nothing" (-> None) or 1 to 20 words (-> that text, normalised);
  empty or longer is not an answer.

A VLM answer that does not parse counts in ``stats()["unparsed"]`` and gives the neutral answer
("unsure", None, "same"): a judge that rambles adds no signal instead of wrong signal. A person is
asked again, up to ``max_tries`` times.
"""

from __future__ import annotations

import abc
import collections
import contextlib
import dataclasses
import difflib
import logging
import os
import string
import tempfile
import time
import warnings
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

import numpy as np


if TYPE_CHECKING:
    from hardware.sim_tasks import Task

log = logging.getLogger(__name__)


def _sim_tasks() -> dict[str, "Task"]:
    """``hardware.sim_tasks.base_tasks()`` (the registered tasks less their scene variants, which share their
    base task's wordings and success), imported when a judge needs the sim tasks' wordings (the records and
    the parsing need no simulator)."""
    from hardware.sim_tasks import base_tasks

    return base_tasks()

VERDICTS: tuple[str, ...] = ("yes", "unsure", "no")
VERDICT_SCORE: dict[str, float] = {"yes": 1.0, "unsure": 0.5, "no": 0.0}
COMPARISONS: tuple[str, ...] = ("first", "second", "same")
"""``compare``'s answers: the first frame is closer to done, the second is, or neither / cannot tell."""
NOTHING = "nothing"
MAX_PROPOSAL_WORDS = 20


@dataclasses.dataclass
class EpisodeRecord:
    """One rollout as a judge sees it."""

    instruction: str
    """The instruction the policy was given."""
    frames: list[dict[str, np.ndarray]]
    """Time-ordered (already subsampled) camera images ``{camera: H x W x 3 uint8}``; the last is the final state."""
    success: bool
    """The episode's own task reward said success."""
    achieved_tasks: tuple[str, ...] = ()
    """PRIVILEGED (sim only): names of ``hardware.sim_tasks`` tasks whose success predicate held at some tick."""
    subgoals: tuple[str, ...] = ()
    """PRIVILEGED (sim only): sub-goal names reached at some tick."""
    achieved_skills: tuple[str, ...] = ()
    """PRIVILEGED (sim only): the pick sub-skills done at some tick, as instructions (``hardware.sim_tasks.
    achieved_skills``: "pick up the red cube", a cube held above 6 cm; "grasp the red cube", held lower): what a
    failed place or stack still carried out."""


# -- strict parsing (pure functions) -------------------------------------------------------------
def normalise(text: str) -> str:
    """Strip, lower-case, drop trailing punctuation, collapse inner whitespace: "  Yes. " -> "yes"."""
    return " ".join(str(text).strip().lower().rstrip(string.punctuation + string.whitespace).split())


def parse_choice(text: str, options: Sequence[str]) -> str | None:
    """The option ``text`` is, after :func:`normalise`; None when it is anything else."""
    t = normalise(text)
    return t if t in options else None


def parse_verdict(text: str) -> str | None:
    """"yes" / "unsure" / "no", or None (not an answer)."""
    return parse_choice(text, VERDICTS)


def parse_comparison(text: str) -> str | None:
    """"first" / "second" / "same", or None (not an answer)."""
    return parse_choice(text, COMPARISONS)


def parse_proposal(text: str) -> tuple[bool, str | None]:
    """-> (parsed, proposal): "Nothing." -> (True, None); 1..20 words -> (True, the normalised text);
    empty or more than 20 words -> (False, None)."""
    t = normalise(text)
    if t == NOTHING:
        return True, None
    if 1 <= len(t.split()) <= MAX_PROPOSAL_WORDS:
        return True, t
    return False, None


def subsample(n: int, k: int) -> list[int]:
    """``min(n, k)`` indices spread evenly over ``range(n)``, the first and the last always among them."""
    if n <= 0:
        return []
    if k <= 1:
        return [n - 1]
    return sorted({int(i) for i in np.linspace(0, n - 1, min(n, k)).round()})


def _check_instruction(instruction: Any, field: str = "instruction") -> str:
    if not isinstance(instruction, str) or not instruction.strip():
        raise ValueError(f"{field} must be a non-empty string, got {instruction!r}")
    return instruction


# -- prompt matching ------------------------------------------------------------------------------
class PromptMatcher:
    """Snaps free text to the nearest entry of ``vocabulary`` by MiniLM sentence embeddings
    (``vla.models.encoders.TextEncoder``: offline, unit norm, so the dot product is the cosine).
    ``match(text) -> (entry, cosine)``; the entry is None when the cosine is below ``floor``.
    The encoder loads on the first ``match``."""

    def __init__(self, vocabulary: Sequence[str], floor: float = 0.5) -> None:
        if isinstance(vocabulary, str):
            raise ValueError("vocabulary must be a list of strings, not one string")
        entries = list(dict.fromkeys(vocabulary))
        if not entries:
            raise ValueError("vocabulary is empty: PromptMatcher needs at least one entry")
        bad = [v for v in entries if not isinstance(v, str) or not v.strip()]
        if bad:
            raise ValueError(f"vocabulary entries must be non-empty strings, got {bad[:5]}")
        if not -1.0 <= floor <= 1.0:
            raise ValueError(f"floor is a cosine similarity in [-1, 1], got {floor}")
        self.vocabulary, self.floor = entries, float(floor)
        self._encoder = None
        self._emb = None

    def _encode(self, texts: list[str]):
        if self._encoder is None:
            from vla.models.encoders import TextEncoder

            self._encoder = TextEncoder()
        return self._encoder([t.strip() for t in texts])

    def match(self, text: str) -> tuple[str | None, float]:
        _check_instruction(text, "text")
        if self._emb is None:
            self._emb = self._encode(self.vocabulary)  # [V, 384], unit norm
        q = self._encode([text])[0]
        sims = (self._emb @ q).numpy()
        i = int(np.argmax(sims))
        cos = float(sims[i])
        return (self.vocabulary[i] if cos >= self.floor else None), cos


def sim_instructions() -> list[str]:
    """The canonical instruction of every registered sim task (``hardware.sim_tasks.TASKS``)."""
    return [t.instruction for t in _sim_tasks().values()]


def sim_wordings() -> list[str]:
    """Every wording (instruction and paraphrases, held-out ones too) of every registered sim task."""
    return [w for t in _sim_tasks().values() for w in t.instructions]


class _TaskResolver:
    """Instruction text -> sim task: an exact wording (case / whitespace-insensitive) of any registered
    task, else the nearest wording of ``vocabulary`` by :class:`PromptMatcher` at ``floor``."""

    def __init__(self, tasks: Sequence["Task"], vocabulary: Sequence[str] | None, floor: float) -> None:
        self.by_wording: dict[str, str] = {}
        for t in tasks:
            for w in t.instructions:
                self.by_wording.setdefault(normalise(w), t.name)
        vocab = list(vocabulary) if vocabulary is not None else [w for t in tasks for w in t.instructions]
        unknown = [v for v in vocab if not isinstance(v, str) or normalise(v) not in self.by_wording]
        if unknown:
            raise ValueError(f"vocabulary entries {unknown[:5]} are not wordings of the tasks "
                             f"{[t.name for t in tasks]} (their instructions and paraphrases)")
        self.matcher = PromptMatcher(vocab, floor=floor)

    def resolve(self, text: str) -> tuple[str | None, str]:
        """-> (task name or None, how: "exact" / "embedding" / "unmatched")."""
        name = self.by_wording.get(normalise(text))
        if name is not None:
            return name, "exact"
        entry, cos = self.matcher.match(text)
        log.debug("matched %r -> %r (cosine %.3f)", text, entry, cos)
        if entry is None:
            return None, "unmatched"
        return self.by_wording[normalise(entry)], "embedding"


# -- the interface --------------------------------------------------------------------------------
class Judge(abc.ABC):
    """Proposes what an episode achieved and scores episodes against instructions (module docstring)."""

    privileged: bool = False
    """True when the judge reads simulator state that no real robot has."""
    name: str = "judge"

    counters: tuple[str, ...] = ()
    """The judge's own counters, in ``stats()`` from the start (at 0)."""

    def __init__(self) -> None:
        self._counts: collections.Counter[str] = collections.Counter(
            {k: 0 for k in ("calls", "unparsed", *self.counters)})

    def _count(self, key: str, n: int = 1) -> None:
        self._counts[key] += n

    def _call(self, method: str) -> None:
        self._counts["calls"] += 1
        self._counts[f"{method}_calls"] += 1

    @abc.abstractmethod
    def propose_instruction(self, episode: EpisodeRecord) -> str | None:
        """What the episode did achieve (<= 20 words), or None for "Nothing"."""

    @abc.abstractmethod
    def score(self, episode: EpisodeRecord, instruction: str) -> str:
        """One of ``VERDICTS``: did the episode carry out ``instruction``?"""

    def stats(self) -> dict:
        """Counters since construction: ``calls``, ``unparsed`` and the judge's own."""
        return {"judge": self.name, "privileged": self.privileged, **dict(self._counts)}


# -- sim (privileged) -----------------------------------------------------------------------------
class SimJudge(Judge):
    """PRIVILEGED, simulation only: judges from ``episode.achieved_tasks``, the registered sim tasks
    (``hardware.sim_tasks.TASKS``) whose success predicate held at some tick -- object poses no real robot
    knows. For developing LfH in simulation and as ground truth for real judges.

    * propose: among the achieved tasks other than the commanded one, the most complete (most skills,
      ties by name) -> its canonical instruction; else a pick sub-skill the episode did
      (``episode.achieved_skills``: "pick up the red cube", a cube held above 6 cm, what a VLM would say of a
      place that lifted the cube and missed the bowl; else "grasp the red cube", a cube held but not lifted)
      other than the commanded wording; none -> None.
    * score: "yes" if the instruction is one of the episode's achieved sub-skill wordings; else it is mapped
      to a task (an exact wording of any task, case- and whitespace-insensitive; else the nearest wording of
      ``vocabulary`` by MiniLM at cosine >= ``floor``, else "unsure"); "yes" if that task was achieved,
      else "no".

    ``vocabulary``: the wordings free text may snap to (each a wording of a registered task); default
    every wording of every task. ``floor`` is stricter than :class:`PromptMatcher`'s default: MiniLM hardly
    tells colours apart ("put the green cube in the bowl" is at 0.86 from the red cube's wording), so exact
    wordings -- what this judge proposes -- are the reliable path, and loose text is best left "unsure"."""

    privileged = True
    name = "sim"
    counters = ("propose_calls", "score_calls", "nothing", "matched_exact", "matched_embedding", "matched_unmatched")

    def __init__(self, vocabulary: Sequence[str] | None = None, floor: float = 0.8) -> None:
        super().__init__()
        self.resolver = _TaskResolver(list(_sim_tasks().values()), vocabulary, floor)

    def _achieved(self, episode: EpisodeRecord) -> list[str]:
        unknown = [n for n in episode.achieved_tasks if n not in _sim_tasks()]
        if unknown:
            raise ValueError(f"episode.achieved_tasks names unknown sim task(s) {unknown}; "
                             f"known: {sorted(_sim_tasks())}")
        return list(dict.fromkeys(episode.achieved_tasks))

    def propose_instruction(self, episode: EpisodeRecord) -> str | None:
        self._call("propose")
        achieved = self._achieved(episode)
        commanded = self.resolver.by_wording.get(normalise(episode.instruction))  # exact wordings only: no model
        candidates = [_sim_tasks()[n] for n in achieved if n != commanded]
        if candidates:
            best = min(candidates, key=lambda t: (-len(t.skills), t.name))
            return best.instruction
        skills = [w for w in episode.achieved_skills if normalise(w) != normalise(episode.instruction)]
        if skills:  # a pick ("pick up ...") is more complete than a grasp ("grasp ...")
            self._count("skill_proposed")
            return min(skills, key=lambda w: (not normalise(w).startswith("pick up"), normalise(w)))
        self._count("nothing")
        return None

    def score(self, episode: EpisodeRecord, instruction: str) -> str:
        self._call("score")
        _check_instruction(instruction)
        achieved = self._achieved(episode)
        if normalise(instruction) in {normalise(w) for w in episode.achieved_skills}:
            self._count("matched_skill")
            return "yes"
        name, how = self.resolver.resolve(instruction)
        self._count(f"matched_{how}")
        if name is None:
            return "unsure"
        return "yes" if name in achieved else "no"


# -- a local vision-language model ----------------------------------------------------------------
PROPOSE_PROMPT = ('The robot was told: "{instruction}". The images are {frames} of what it did, in time order; '
                  'the last one shows how it ended. What did the robot actually achieve? Answer with the task it '
                  'completed, in at most 20 words, or answer exactly "Nothing" if it completed no task.')
SCORE_PROMPT = ('The images are {frames} of a robot episode, in time order; the last one shows how it ended. '
                'Did the robot carry out the instruction "{instruction}"? Answer with exactly one word: yes, unsure '
                'or no.')
COMPARE_PROMPT = ('The two images show the same robot scene at two moments. Which image is closer to completing '
                  'the instruction "{instruction}"? Answer with exactly one word: first, second or same.')


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silences transformers' logger, progress bars and Python warnings inside the block (library noise
    on a user's terminal), and restores them after."""
    from transformers.utils import logging as hf_logging

    level, bar = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        hf_logging.set_verbosity(level)
        if bar:
            hf_logging.enable_progress_bar()


def _check_image(img: Any, field: str) -> np.ndarray:
    a = np.asarray(img)
    if a.dtype != np.uint8 or a.ndim != 3 or a.shape[2] != 3:
        raise ValueError(f"{field} must be a uint8 H x W x 3 image, got {a.dtype} {list(a.shape)}")
    return a


def side_by_side(images: Sequence[np.ndarray]) -> np.ndarray:
    """Images side by side, each resized to the smallest height (aspect kept)."""
    if len(images) == 1:
        return images[0]
    import cv2

    h = min(im.shape[0] for im in images)
    size = lambda im: (max(1, round(im.shape[1] * h / im.shape[0])), h)  # noqa: E731  (width, height)
    return np.concatenate([im if im.shape[0] == h else cv2.resize(im, size(im), interpolation=cv2.INTER_AREA)
                           for im in images], axis=1)


class VLMJudge(Judge):
    """A local vision-language model (``transformers`` ``AutoModelForImageTextToText`` + ``AutoProcessor``
    from ``model_dir`` only: ``local_files_only``, ``HF_HUB_OFFLINE``). It sees ``max_frames`` frames spread
    evenly over the episode (the last always among them) from ``camera`` (default: every camera of a frame,
    side by side) and answers in at most ``max_new_tokens`` tokens, greedy. The prompt goes through the
    processor's chat template (its ``image_token`` per image when it has none). Answers are parsed strictly
    (module docstring); one that does not parse counts in ``stats()["unparsed"]``."""

    name = "vlm"
    counters = ("propose_calls", "score_calls", "compare_calls", "nothing", "propose_unparsed", "score_unparsed",
                "compare_unparsed", "generate_s")

    def __init__(self, model_dir: str, camera: str | None = None, max_frames: int = 4, max_new_tokens: int = 24,
                 device: str = "cpu") -> None:
        super().__init__()
        model_dir = os.fspath(model_dir)
        if max_frames < 1:
            raise ValueError(f"max_frames must be >= 1, got {max_frames}")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if not os.path.isfile(os.path.join(model_dir, "config.json")):
            raise FileNotFoundError(f"model_dir {model_dir!r} has no config.json: not a saved transformers model "
                                    "(save one with save_pretrained; nothing is downloaded)")
        self.model_dir, self.camera, self.device = model_dir, camera, device
        self.max_frames, self.max_new_tokens = max_frames, max_new_tokens
        self.last_unparsed: str | None = None
        """The last answer that did not parse (its first 200 characters), for the logs."""
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import torch

        with quiet_transformers():
            from transformers import AutoModelForImageTextToText, AutoProcessor

            try:
                self.processor = AutoProcessor.from_pretrained(model_dir, local_files_only=True)
                self.model = AutoModelForImageTextToText.from_pretrained(
                    model_dir, local_files_only=True, dtype=torch.float32 if device == "cpu" else "auto")
            except (OSError, ValueError, KeyError) as e:
                raise ValueError(f"model_dir {model_dir!r}: not a vision-language model transformers can load "
                                 f"locally ({type(e).__name__}: {e})") from e
        self.model.to(device).eval()
        self.tokenizer = getattr(self.processor, "tokenizer", None) or self.processor
        if not getattr(self.processor, "chat_template", None) and not getattr(self.processor, "image_token", None):
            raise ValueError(f"model_dir {model_dir!r}: the processor has neither a chat_template nor an image_token, "
                             "so there is no way to place the images in the prompt")

    def stats(self) -> dict:
        return {**super().stats(), "last_unparsed": self.last_unparsed}

    # -- frames -------------------------------------------------------------------------------------
    def _image(self, frame: Any, field: str) -> np.ndarray:
        if not isinstance(frame, dict):
            return _check_image(frame, field)
        if self.camera is not None:
            if self.camera not in frame:
                raise KeyError(f"{field}: no image from camera {self.camera!r}; it has {sorted(frame)}")
            return _check_image(frame[self.camera], f"{field}[{self.camera!r}]")
        if not frame:
            raise ValueError(f"{field} has no camera images")
        return side_by_side([_check_image(frame[c], f"{field}[{c!r}]") for c in frame])

    def episode_images(self, episode: EpisodeRecord) -> list[np.ndarray]:
        """The frames the model sees: ``max_frames`` spread evenly, the last always among them."""
        if not episode.frames:
            raise ValueError("episode.frames is empty: the VLM judge needs camera frames")
        return [self._image(episode.frames[i], f"episode.frames[{i}]")
                for i in subsample(len(episode.frames), self.max_frames)]

    # -- the model ----------------------------------------------------------------------------------
    def generate(self, images: list[np.ndarray], prompt: str) -> str:
        """The model's greedy answer to ``prompt`` about ``images`` (raw text, special tokens dropped)."""
        import torch

        template = getattr(self.processor, "chat_template", None)
        with quiet_transformers():
            if template:
                content = [{"type": "image"} for _ in images] + [{"type": "text", "text": prompt}]
                text = self.processor.apply_chat_template([{"role": "user", "content": content}],
                                                          add_generation_prompt=True, tokenize=False)
            else:
                text = self.processor.image_token * len(images) + "\n" + prompt
            inputs = self.processor(text=[text], images=[list(images)], return_tensors="pt").to(self.device)
            if "pixel_values" in inputs:
                inputs["pixel_values"] = inputs["pixel_values"].to(self.model.dtype)
            t0 = time.perf_counter()
            pad = getattr(self.tokenizer, "pad_token_id", None)
            pad = pad if pad is not None else getattr(self.tokenizer, "eos_token_id", None)
            with torch.inference_mode():
                out = self.model.generate(**inputs, max_new_tokens=self.max_new_tokens, do_sample=False,
                                          pad_token_id=pad)
            self._counts["generate_s"] += time.perf_counter() - t0
            new = out[0, inputs["input_ids"].shape[1]:]
            answer = self.tokenizer.decode(new, skip_special_tokens=True)
        log.debug("VLM answer %r", answer)
        return answer

    def _unparsed(self, method: str, answer: str) -> None:
        self._count("unparsed")
        self._count(f"{method}_unparsed")
        self.last_unparsed = answer[:200]

    @staticmethod
    def _frames_phrase(n: int) -> str:
        return "1 camera frame" if n == 1 else f"{n} camera frames"

    def propose_instruction(self, episode: EpisodeRecord) -> str | None:
        self._call("propose")
        imgs = self.episode_images(episode)
        answer = self.generate(imgs, PROPOSE_PROMPT.format(instruction=episode.instruction,
                                                           frames=self._frames_phrase(len(imgs))))
        ok, proposal = parse_proposal(answer)
        if not ok:
            self._unparsed("propose", answer)
        elif proposal is None:
            self._count("nothing")
        return proposal

    def score(self, episode: EpisodeRecord, instruction: str) -> str:
        self._call("score")
        _check_instruction(instruction)
        imgs = self.episode_images(episode)
        prompt = SCORE_PROMPT.format(instruction=instruction, frames=self._frames_phrase(len(imgs)))
        answer = self.generate(imgs, prompt)
        verdict = parse_verdict(answer)
        if verdict is None:
            self._unparsed("score", answer)
            return "unsure"
        return verdict

    def compare(self, frame_a: Any, frame_b: Any, instruction: str) -> str:
        """Which of two frames (``{camera: image}`` or one image) is closer to completing ``instruction``:
        "first", "second" or "same" (also the answer when the model's does not parse)."""
        self._call("compare")
        _check_instruction(instruction)
        imgs = [self._image(frame_a, "frame_a"), self._image(frame_b, "frame_b")]
        answer = self.generate(imgs, COMPARE_PROMPT.format(instruction=instruction))
        choice = parse_comparison(answer)
        if choice is None:
            self._unparsed("compare", answer)
            return "same"
        return choice


# -- a success classifier -------------------------------------------------------------------------
def _dataset_tasks(root: str) -> list[str]:
    """The task strings of a LeRobot v3 dataset (``meta/tasks.parquet``); [] when it cannot be read."""
    path = os.path.join(root, "meta", "tasks.parquet")
    if not os.path.isfile(path):
        return []
    import pandas as pd

    df = pd.read_parquet(path)
    tasks = df.index if df.index.name == "task" else df.get("task", [])
    return [str(t) for t in tasks]


def classifier_instruction(meta: dict[str, Any]) -> str | None:
    """The instruction a saved classifier was trained for: its meta's ``instruction``, else its ``task``
    (a sim task name -> that task's instruction), else the one task of the datasets it was trained on
    (``labels.datasets``). None when none of these says."""
    for key in ("instruction", "task"):
        v = meta.get(key)
        if isinstance(v, str) and v.strip():
            return _sim_tasks()[v].instruction if v in _sim_tasks() else v
    datasets = (meta.get("labels") or {}).get("datasets") or []
    tasks = sorted({t for root in datasets for t in _dataset_tasks(root)})
    return tasks[0] if len(tasks) == 1 else None


class ClassifierJudge(Judge):
    """A ``vla reward`` success classifier (``rewards.success_classifier``) on the episode's last frame. It
    knows one task: ``instruction``, default the one it was trained for (:func:`classifier_instruction`).

    * propose: P(success | last frame) >= the classifier's threshold -> its instruction, else None.
    * score: an instruction that is its own (exact, a paraphrase of the same sim task, or MiniLM-nearest at
      cosine >= ``floor``) -> yes / no from P(success | last frame); any other -> "unsure"."""

    name = "classifier"
    counters = ("propose_calls", "score_calls", "nothing", "other_task", "classifier_calls")

    def __init__(self, run_dir: str, instruction: str | None = None, floor: float = 0.8) -> None:
        super().__init__()
        from rewards.success_classifier import SuccessClassifier, read_meta

        run_dir = os.fspath(run_dir)
        meta = read_meta(run_dir)  # a wrong directory fails here, with its name
        self.instruction = instruction if instruction is not None else classifier_instruction(meta)
        if self.instruction is None:
            raise ValueError(f"run_dir {run_dir!r}: the classifier's config.json names no instruction or task, and "
                             "its datasets do not name exactly one: pass instruction= (the task it detects)")
        _check_instruction(self.instruction)
        self.run_dir = run_dir
        self.model = SuccessClassifier.load(run_dir)
        task = next((t for t in _sim_tasks().values()
                     if normalise(self.instruction) in map(normalise, t.instructions)), None)
        wordings = list(task.instructions) if task is not None else [self.instruction]
        self.wordings = {normalise(w) for w in wordings} | {normalise(self.instruction)}
        self.matcher = PromptMatcher(wordings, floor=floor)

    @property
    def threshold(self) -> float:
        return self.model.threshold

    def success_prob(self, episode: EpisodeRecord) -> float:
        """P(success) on the episode's last frame."""
        if not episode.frames:
            raise ValueError("episode.frames is empty: the classifier judge needs the last camera frame")
        last = episode.frames[-1]
        self.model.check_cameras(last)
        p = float(self.model.predict_proba({c: np.asarray(last[c])[None] for c in self.model.cameras})[0])
        self._count("classifier_calls")
        return p

    def propose_instruction(self, episode: EpisodeRecord) -> str | None:
        self._call("propose")
        if self.success_prob(episode) >= self.threshold:
            return self.instruction
        self._count("nothing")
        return None

    def _own(self, instruction: str) -> bool:
        if normalise(instruction) in self.wordings:
            return True
        entry, _ = self.matcher.match(instruction)
        return entry is not None

    def score(self, episode: EpisodeRecord, instruction: str) -> str:
        self._call("score")
        _check_instruction(instruction)
        if not self._own(instruction):
            self._count("other_task")
            return "unsure"
        return "yes" if self.success_prob(episode) >= self.threshold else "no"


# -- a person -------------------------------------------------------------------------------------
def contact_sheet(frames: Sequence[dict[str, np.ndarray]], path: str, tile: int = 160) -> str:
    """One PNG of an episode's frames: a row per camera, a column per frame (``t0``, ``t1`` ... in the
    corner), each ``tile`` px high. -> ``path``."""
    import cv2

    if not frames:
        raise ValueError("frames is empty: nothing to show")
    cams = list(dict.fromkeys(c for f in frames for c in f))
    rows = []
    for cam in cams:
        cells = []
        for i, f in enumerate(frames):
            if cam in f:
                im = _check_image(f[cam], f"frames[{i}][{cam!r}]")
                w = max(1, round(im.shape[1] * tile / im.shape[0]))
                im = np.ascontiguousarray(cv2.resize(im, (w, tile), interpolation=cv2.INTER_AREA))
            else:
                im = np.zeros((tile, tile, 3), np.uint8)
            cv2.putText(im, f"{cam} t{i}", (4, 14), cv2.FONT_HERSHEY_SIMPLEX, 0.4, (255, 255, 0), 1, cv2.LINE_AA)
            cells.append(np.pad(im, ((2, 2), (2, 2), (0, 0))))
        rows.append(np.concatenate(cells, axis=1))
    width = max(r.shape[1] for r in rows)
    sheet = np.concatenate([np.pad(r, ((0, 0), (0, width - r.shape[1]), (0, 0))) for r in rows], axis=0)
    if not cv2.imwrite(path, cv2.cvtColor(sheet, cv2.COLOR_RGB2BGR)):
        raise OSError(f"could not write the contact sheet to {path}")
    return path


def _as_parsed(parse: Callable[[str], str | None]) -> Callable[[str], tuple[bool, str | None]]:
    def f(text: str) -> tuple[bool, str | None]:
        v = parse(text)
        return v is not None, v
    return f


class HumanJudge(Judge):
    """A person at the terminal. Each call writes the episode's frames as one contact-sheet PNG (in
    ``out_dir``, default a new temporary directory), prints its path (``say``), calls ``show(path)`` if
    given (e.g. to open a window), and asks (``ask``, default ``input``). Only the exact options are
    accepted (after :func:`normalise`); anything else is asked again, up to ``max_tries`` times, then
    counted in ``stats()["unparsed"]`` and answered neutrally ("unsure" / None)."""

    name = "human"
    counters = ("propose_calls", "score_calls", "nothing", "re_asked")

    def __init__(self, ask: Callable[[str], str] = input, show: Callable[[str], Any] | None = None,
                 out_dir: str | None = None, max_tries: int = 3, say: Callable[[str], Any] = print) -> None:
        super().__init__()
        if max_tries < 1:
            raise ValueError(f"max_tries must be >= 1, got {max_tries}")
        self.ask, self.show, self.say, self.max_tries = ask, show, say, max_tries
        self.out_dir = out_dir
        self._sheets = 0

    def _present(self, episode: EpisodeRecord) -> str:
        if self.out_dir is None:
            self.out_dir = tempfile.mkdtemp(prefix="vla_judge_")
        os.makedirs(self.out_dir, exist_ok=True)
        path = contact_sheet(episode.frames, os.path.join(self.out_dir, f"episode_{self._sheets:05d}.png"))
        self._sheets += 1
        self.say(f"episode frames (left to right in time, the last is the end): {path}")
        if self.show is not None:
            self.show(path)
        return path

    def _ask(self, question: str, parse: Callable[[str], tuple[bool, Any]], hint: str) -> tuple[bool, Any]:
        for attempt in range(self.max_tries):
            ok, value = parse(str(self.ask(question)))
            if ok:
                return True, value
            self._count("re_asked")
            if attempt + 1 < self.max_tries:
                self.say(f"please answer {hint}")
        self.say(f"no valid answer in {self.max_tries} tries: counted as not answered")
        self._count("unparsed")
        return False, None

    def propose_instruction(self, episode: EpisodeRecord) -> str | None:
        self._call("propose")
        self._present(episode)
        ok, proposal = self._ask(f'The robot was told "{episode.instruction}". What did it actually achieve? '
                                 f'(at most {MAX_PROPOSAL_WORDS} words, or "nothing"): ', parse_proposal,
                                 f'with at most {MAX_PROPOSAL_WORDS} words, or "nothing"')
        if ok and proposal is None:
            self._count("nothing")
        return proposal

    def score(self, episode: EpisodeRecord, instruction: str) -> str:
        self._call("score")
        _check_instruction(instruction)
        self._present(episode)
        ok, verdict = self._ask(f'Did the robot carry out "{instruction}"? [yes / unsure / no]: ',
                                _as_parsed(parse_verdict), "yes, unsure or no")
        return verdict if ok else "unsure"


# -- the command-line spec ------------------------------------------------------------------------
JUDGES: dict[str, type[Judge]] = {"sim": SimJudge, "vlm": VLMJudge, "classifier": ClassifierJudge,
                                  "human": HumanJudge}
JUDGE_SPECS = {"sim": "sim", "vlm": "vlm:DIR", "classifier": "classifier:DIR", "human": "human"}
"""How each kind is written on the command line (DIR: a saved model directory)."""


def make_judge(spec: str) -> Judge:
    """A judge from a command-line spec: ``sim``, ``vlm:DIR``, ``classifier:DIR`` or ``human``."""
    kind, sep, arg = str(spec).partition(":")
    known = ", ".join(JUDGE_SPECS.values())
    if kind not in JUDGES:
        close = difflib.get_close_matches(kind, JUDGES, n=1, cutoff=0.5)
        hint = f" (did you mean {JUDGE_SPECS[close[0]]!r}?)" if close else ""
        raise ValueError(f"unknown judge spec {spec!r}{hint}; known kinds: {known}")
    takes_dir = JUDGE_SPECS[kind].endswith(":DIR")
    if takes_dir and not arg:
        raise ValueError(f"judge spec {spec!r}: {kind} needs a directory, written {JUDGE_SPECS[kind]}")
    if not takes_dir and sep:
        raise ValueError(f"judge spec {spec!r}: {kind} takes no argument (known kinds: {known})")
    return JUDGES[kind](arg) if takes_dir else JUDGES[kind]()
