"""The LfH judges: strict parsing (fuzzed), the privileged sim judge, MiniLM prompt matching, a VLM
judge end to end on a tiny random Llava built here (no download), the success-classifier judge, the
human judge driven by generated answers, and the command-line spec."""

from __future__ import annotations

import dataclasses

import os
import string

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from hardware.sim_tasks import TASKS, base_tasks
from rewards.judges import (COMPARE_PROMPT, COMPARISONS, MAX_PROPOSAL_WORDS, SCORE_PROMPT, VERDICT_SCORE, VERDICTS,
                            ClassifierJudge, EpisodeRecord, HumanJudge, PromptMatcher, SimJudge, VLMJudge,
                            classifier_instruction, make_judge, normalise, parse_comparison, parse_proposal,
                            parse_verdict, sim_instructions, subsample)

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
word = st.text(alphabet=string.ascii_letters, min_size=1, max_size=9)
case = st.sampled_from([str.lower, str.upper, str.title, str.swapcase, lambda s: s])
space = st.text(alphabet=" \t\n", max_size=3)
tail = st.text(alphabet=string.punctuation, max_size=3)


def _episode(rng: np.random.Generator, n: int = 6, instruction: str = "pick up the red cube", achieved=(),
             cameras=("front", "wrist")) -> EpisodeRecord:
    frames = [{c: rng.integers(0, 256, (48 + 16 * k, 64, 3), dtype=np.uint8) for k, c in enumerate(cameras)}
              for _ in range(n)]
    return EpisodeRecord(instruction=instruction, frames=frames, success=False, achieved_tasks=tuple(achieved))


# -- parsing -------------------------------------------------------------------------------------
@FUZZ
@given(option=st.sampled_from(VERDICTS + COMPARISONS), f=case, lead=space, trail=space, punct=tail)
def test_an_option_in_any_case_with_trailing_punctuation_parses(option, f, lead, trail, punct):
    text = lead + f(option) + punct + trail
    parse = parse_verdict if option in VERDICTS else parse_comparison
    assert parse(text) == option


@FUZZ
@given(words=st.lists(st.sampled_from(VERDICTS + COMPARISONS + ("it", "did", "not", "maybe", "Yes,", "no.")),
                      min_size=2, max_size=6), f=case, punct=tail)
def test_more_than_the_option_does_not_parse(words, f, punct):
    text = f(" ".join(words)) + punct  # two words or more: "yes it did", "no no", "yes, no"
    assert parse_verdict(text) is None and parse_comparison(text) is None


@FUZZ
@given(text=st.text(max_size=40))
def test_any_text_parses_to_an_option_or_to_nothing(text):
    for parse, options in ((parse_verdict, VERDICTS), (parse_comparison, COMPARISONS)):
        v = parse(text)
        assert v is None or (v in options and normalise(text) == v)


@FUZZ
@given(w=word, punct=tail, lead=st.text(alphabet=string.punctuation, min_size=1, max_size=2))
def test_a_single_other_word_or_leading_punctuation_does_not_parse(w, punct, lead):
    assume(w.lower() not in VERDICTS + COMPARISONS)
    assert parse_verdict(w + punct) is None and parse_comparison(w + punct) is None
    for option in VERDICTS:  # "?yes", '"yes"': strict, not guessed
        assert parse_verdict(lead + option) is None


@FUZZ
@given(words=st.lists(word, min_size=1, max_size=MAX_PROPOSAL_WORDS), f=case, lead=space, punct=tail)
def test_a_proposal_of_1_to_20_words_parses_to_its_text(words, f, lead, punct):
    text = " ".join(words)
    assume(text.lower() != "nothing")
    assert parse_proposal(lead + f(text) + punct) == (True, text.lower())


@FUZZ
@given(words=st.lists(word, min_size=MAX_PROPOSAL_WORDS + 1, max_size=60), punct=tail)
def test_a_proposal_of_more_than_20_words_does_not_parse(words, punct):
    assert parse_proposal(" ".join(words) + punct) == (False, None)


@FUZZ
@given(f=case, lead=space, punct=tail, junk=st.text(alphabet=string.punctuation + string.whitespace, max_size=8))
def test_nothing_and_empty_proposals(f, lead, punct, junk):
    assert parse_proposal(lead + f("Nothing") + punct) == (True, None)
    assert parse_proposal(junk) == (False, None)  # empty once normalised


def test_parsing_examples_and_numpy_generated_answers():
    assert parse_verdict(" Yes. ") == "yes" and parse_verdict("UNSURE!?") == "unsure" and parse_verdict("no\n") == "no"
    for bad in ("y", "yes, it did", "'yes'", "Answer: yes", "", "yesno", "not sure"):
        assert parse_verdict(bad) is None, bad
    assert parse_comparison("Second.") == "second" and parse_comparison("the second") is None
    assert parse_proposal("Picked up the red cube.") == (True, "picked up the red cube")
    # answers sampled the way a small VLM rambles: random vocabulary words, random case and punctuation
    rng = np.random.default_rng(0)
    vocab = ["yes", "no", "unsure", "the", "robot", "cube", "nothing", "red", "first", ".", ","]
    for _ in range(300):
        toks = [vocab[i] for i in rng.integers(len(vocab), size=int(rng.integers(0, 30)))]
        text = " ".join(t.upper() if rng.random() < 0.3 else t for t in toks)
        n_words = len(normalise(text).split())
        assert (parse_verdict(text) is not None) == (n_words == 1 and normalise(text) in VERDICTS)
        ok, p = parse_proposal(text)
        assert ok == (1 <= n_words <= MAX_PROPOSAL_WORDS)
        assert p is None or len(p.split()) <= MAX_PROPOSAL_WORDS


def test_subsample_keeps_first_and_last_evenly():
    assert subsample(10, 4) == [0, 3, 6, 9] and subsample(3, 4) == [0, 1, 2] and subsample(5, 1) == [4]
    assert subsample(0, 4) == []
    rng = np.random.default_rng(1)
    for n, k in rng.integers(1, 40, (200, 2)):
        idx = subsample(int(n), int(k))
        assert len(idx) == min(n, k) and idx == sorted(set(idx)) and idx[-1] == n - 1
        assert k == 1 or idx[0] == 0


def test_verdict_scores():
    assert VERDICTS == ("yes", "unsure", "no") and VERDICT_SCORE == {"yes": 1.0, "unsure": 0.5, "no": 0.0}


# -- prompt matching -----------------------------------------------------------------------------
def test_prompt_matcher_snaps_to_the_sim_vocabulary():
    m = PromptMatcher(sim_instructions())
    entry, cos = m.match("pick the red block up")
    assert entry == "pick up the red cube" and 0.5 <= cos <= 1.0 + 1e-5
    entry, cos = m.match("what a lovely day for a picnic in the park")
    assert entry is None and cos < 0.5
    with pytest.raises(ValueError, match="vocabulary"):
        PromptMatcher([])
    with pytest.raises(ValueError, match="floor"):
        PromptMatcher(["a"], floor=2.0)
    with pytest.raises(ValueError, match="text"):
        m.match("  ")


# -- the sim judge (privileged) ------------------------------------------------------------------
def test_sim_judge_proposes_the_most_complete_other_task():
    j, rng = SimJudge(), np.random.default_rng(0)
    assert j.privileged and "PRIVILEGED" in SimJudge.__doc__
    ep = lambda instr, achieved: _episode(rng, 1, instr, achieved)  # noqa: E731
    stack = TASKS["stack_cubes"].instruction
    assert j.propose_instruction(ep(stack, ["pick_red_cube", "put_all_cubes_in_bowl", "place_cube_in_bowl"])) == \
        TASKS["put_all_cubes_in_bowl"].instruction  # most skills
    assert j.propose_instruction(ep(stack, ["stack_cubes", "place_cube_in_bowl", "pick_red_cube"])) == \
        "pick up the red cube"  # two skills each: by name
    assert j.propose_instruction(ep("  Put the RED cube in the bowl ", ["place_cube_in_bowl"])) is None  # commanded
    assert j.propose_instruction(ep(stack, [])) is None
    with pytest.raises(ValueError, match="achieved_tasks.*fly_away"):
        j.propose_instruction(ep(stack, ["fly_away"]))
    # generated episodes: the answer is always an achieved task other than the commanded one, with the most skills
    names = sorted(base_tasks())  # what achieved_tasks names: scene variants (pick_red_cube_yaw45 ...) left out
    for _ in range(200):
        commanded = TASKS[names[int(rng.integers(len(names)))]]
        achieved = [n for n in names if rng.random() < 0.3]
        others = [TASKS[n] for n in achieved if n != commanded.name]
        got = j.propose_instruction(ep(commanded.sample_instruction(rng), achieved))
        if not others:
            assert got is None
        else:
            t = next(t for t in others if t.instruction == got)
            assert len(t.skills) == max(len(o.skills) for o in others)
    assert j.stats()["calls"] == j.stats()["propose_calls"] == 205  # the refused call too


def test_sim_judge_scores_by_the_achieved_tasks():
    j, rng = SimJudge(), np.random.default_rng(0)
    ep = _episode(rng, 1, "stack the green cube on the red cube", ["pick_red_cube", "push_block_to_marker"])
    assert j.score(ep, "  PICK up the  red cube ") == "yes"  # exact, case / whitespace aside
    assert j.score(ep, "slide the blue block onto the pink marker") == "yes"  # a paraphrase
    assert j.score(ep, "push the blue cube onto the target") == "yes"  # a held-out paraphrase is still its task
    assert j.score(ep, "stack the green cube on the red cube") == "no"
    assert j.score(ep, "pick the red block up") == "yes"  # no exact wording: MiniLM's nearest
    assert j.score(ep, "what a lovely day for a picnic in the park") == "unsure"  # below the floor
    s = j.stats()
    assert (s["matched_exact"], s["matched_embedding"], s["matched_unmatched"]) == (4, 1, 1)
    with pytest.raises(ValueError, match="instruction"):
        j.score(ep, "")
    with pytest.raises(ValueError, match="vocabulary"):
        SimJudge(vocabulary=["pick up the red cube", "juggle three balls"])


def test_sim_judge_falls_back_to_the_pick_sub_skills_a_failed_place_carried_out():
    """A place that lifted the red cube and missed the bowl achieved no registered task, but it did pick the cube up:
    the judge proposes "pick up the red cube" (what a VLM would say) and scores it yes on every rollout that lifted
    the red cube, whatever its task."""
    j, rng = SimJudge(), np.random.default_rng(0)
    place = TASKS["place_cube_in_bowl"].instruction
    lifted = dataclasses.replace(_episode(rng, 1, place, []), achieved_skills=("pick up the red cube",))
    assert j.propose_instruction(lifted) == "pick up the red cube"
    assert j.score(lifted, "pick up the red cube") == "yes"
    assert j.score(_episode(rng, 1, place, []), "pick up the red cube") == "no"
    # a registered task other than the commanded one comes first; the commanded wording is never proposed
    both = dataclasses.replace(_episode(rng, 1, place, ["push_block_to_marker"]), achieved_skills=("pick up the red cube",))
    assert j.propose_instruction(both) == TASKS["push_block_to_marker"].instruction
    own = dataclasses.replace(_episode(rng, 1, "pick up the red cube", []), achieved_skills=("pick up the red cube",))
    assert j.propose_instruction(own) is None
    # a pick is more complete than a grasp, whatever the order
    grasped = dataclasses.replace(_episode(rng, 1, place, []), achieved_skills=("grasp the blue cube", "pick up the red cube"))
    assert j.propose_instruction(grasped) == "pick up the red cube"
    only_grasp = dataclasses.replace(_episode(rng, 1, place, []), achieved_skills=("grasp the red cube",))
    assert j.propose_instruction(only_grasp) == "grasp the red cube" and j.score(only_grasp, "grasp the red cube") == "yes"


# -- the VLM judge on a tiny random Llava ----------------------------------------------------------
@pytest.fixture(scope="module")
def vlm_dirs(tmp_path_factory) -> dict:
    """Tiny VLMs: random (answers gibberish) and ones that always answer a given text."""
    pytest.importorskip("transformers")
    from tests.rewards.tiny_vlm import make_tiny_vlm

    root = tmp_path_factory.mktemp("vlm")
    answers = {"random": None, "yes": "yes", "proposal": "pick up the red cube", "nothing": "Nothing.",
               "second": "second"}
    return {k: make_tiny_vlm(str(root / k), answer=a) for k, a in answers.items()}


def test_vlm_judge_end_to_end_on_a_random_model(vlm_dirs, capfd):
    capfd.readouterr()
    j = VLMJudge(vlm_dirs["random"], max_frames=4, max_new_tokens=24)
    rng = np.random.default_rng(0)
    ep = _episode(rng, 9)
    imgs = j.episode_images(ep)
    assert len(imgs) == 4 and all(im.shape == (48, 64 + 64 * 48 // 64, 3) for im in imgs)  # cameras side by side
    p = j.propose_instruction(ep)
    assert p is None or (isinstance(p, str) and 1 <= len(p.split()) <= MAX_PROPOSAL_WORDS)
    raw = j.generate(imgs, SCORE_PROMPT.format(instruction="pick up the red cube", frames="4 camera frames"))
    assert parse_verdict(raw) is None, raw  # random weights ramble ...
    before = j.stats()["unparsed"]
    assert j.score(ep, "pick up the red cube") == "unsure"  # ... which is counted, and neutral
    assert j.stats()["unparsed"] == before + 1 and j.stats()["score_unparsed"] == 1
    assert j.stats()["last_unparsed"] == raw[:200]
    c = j.compare(ep.frames[0], ep.frames[-1]["front"], "pick up the red cube")
    assert c in COMPARISONS
    s = j.stats()
    assert s["calls"] == 3 and s["generate_s"] > 0 and not s["privileged"]
    out = capfd.readouterr()
    assert out.out == "" and out.err == "", out  # no library noise on the user's terminal


def test_vlm_judge_parses_what_the_model_says(vlm_dirs):
    rng = np.random.default_rng(1)
    ep = _episode(rng, 5, cameras=("front",))
    yes = VLMJudge(vlm_dirs["yes"], max_frames=2)
    assert yes.score(ep, "pick up the red cube") == "yes" and yes.stats()["unparsed"] == 0
    assert yes.compare(ep.frames[0], ep.frames[1], "pick up the red cube") == "same"  # "yes" is no comparison
    assert yes.stats()["unparsed"] == 1 and yes.stats()["last_unparsed"] == "yes"
    prop = VLMJudge(vlm_dirs["proposal"], camera="front")
    assert prop.propose_instruction(ep) == "pick up the red cube" and prop.stats()["unparsed"] == 0
    assert prop.score(ep, "pick up the red cube") == "unsure" and prop.stats()["unparsed"] == 1  # five words
    nothing = VLMJudge(vlm_dirs["nothing"])
    assert nothing.propose_instruction(ep) is None
    assert nothing.stats()["nothing"] == 1 and nothing.stats()["unparsed"] == 0
    second = VLMJudge(vlm_dirs["second"])
    assert second.compare(ep.frames[0], ep.frames[-1], "put the red cube in the bowl") == "second"
    assert COMPARE_PROMPT.format(instruction="x").count('"x"') == 1


def test_vlm_judge_errors_name_the_field(vlm_dirs, tmp_path):
    with pytest.raises(FileNotFoundError, match="model_dir"):
        VLMJudge(str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match="max_frames"):
        VLMJudge(vlm_dirs["yes"], max_frames=0)
    j = VLMJudge(vlm_dirs["yes"], camera="top")
    rng = np.random.default_rng(2)
    with pytest.raises(KeyError, match="top"):
        j.score(_episode(rng, 2), "pick up the red cube")
    with pytest.raises(ValueError, match="episode.frames"):
        j.score(EpisodeRecord("pick up the red cube", [], False), "pick up the red cube")
    with pytest.raises(ValueError, match="frame_a"):
        j.compare(np.zeros((8, 8), np.uint8), np.zeros((8, 8, 3), np.uint8), "pick up the red cube")
    with pytest.raises(ValueError, match="instruction"):
        j.compare(np.zeros((8, 8, 3), np.uint8), np.zeros((8, 8, 3), np.uint8), "")


# -- the classifier judge ------------------------------------------------------------------------
def _constant_classifier(path: str, logit: float, extra: dict | None) -> str:
    """A success classifier (random trunk) whose P(success) is sigmoid(logit) on every frame."""
    pytest.importorskip("efficientnet_lite_pytorch")
    import torch

    from rewards.classifier_config import ClassifierConfig
    from rewards.success_classifier import SuccessClassifier

    torch.manual_seed(0)
    m = SuccessClassifier(ClassifierConfig(cameras=("front",), image_size=32, pretrained=False, threshold=0.5))
    with torch.no_grad():
        m.mlp[-1].weight.zero_()
        m.mlp[-1].bias.fill_(logit)
    m.save(path, extra=extra)
    return path


def test_classifier_judge_knows_its_own_task(tmp_path):
    always = ClassifierJudge(_constant_classifier(str(tmp_path / "a"), 8.0,
                                                  {"instruction": "put the red cube in the bowl"}))
    never = ClassifierJudge(_constant_classifier(str(tmp_path / "n"), -8.0, {"task": "place_cube_in_bowl"}))
    assert never.instruction == "put the red cube in the bowl"  # a sim task name in the meta
    rng = np.random.default_rng(0)
    ep = _episode(rng, 3, "stack the green cube on the red cube", cameras=("front",))
    assert always.propose_instruction(ep) == "put the red cube in the bowl"
    assert never.propose_instruction(ep) is None
    for instr in ("put the red cube in the bowl", " Drop the red CUBE in the bowl", "place the red cube in the bowl"):
        assert always.score(ep, instr) == "yes" and never.score(ep, instr) == "no", instr  # own, paraphrase, nearest
    assert always.score(ep, "stack the green cube on the red cube") == "unsure"  # not its task
    assert always.stats()["other_task"] == 1 and not always.privileged
    with pytest.raises(KeyError, match="front"):
        always.score(_episode(rng, 2, cameras=("wrist",)), "put the red cube in the bowl")


def test_classifier_instruction_from_meta_or_its_dataset(tmp_path):
    import pandas as pd

    assert classifier_instruction({"instruction": "fold the towel"}) == "fold the towel"
    assert classifier_instruction({"task": "stack_cubes"}) == TASKS["stack_cubes"].instruction
    (tmp_path / "ds" / "meta").mkdir(parents=True)
    pd.DataFrame({"task_index": [0]}, index=pd.Index(["fold the towel"], name="task")).to_parquet(
        tmp_path / "ds" / "meta" / "tasks.parquet")
    assert classifier_instruction({"labels": {"datasets": [str(tmp_path / "ds")]}}) == "fold the towel"
    assert classifier_instruction({"labels": {"datasets": [str(tmp_path / "none")]}}) is None
    path = _constant_classifier(str(tmp_path / "c"), 0.0, None)
    with pytest.raises(ValueError, match="instruction"):
        ClassifierJudge(path)
    assert ClassifierJudge(path, instruction="fold the towel").instruction == "fold the towel"


# -- the human judge -----------------------------------------------------------------------------
def _random_non_answers(rng: np.random.Generator, n: int) -> list[str]:
    """Answers a person might type that are not an option: two or more words, or a word that is none."""
    words = ["yes", "no", "maybe", "sure", "y", "n", "idk", "the", "robot", "did", "it", "?"]
    out = []
    for _ in range(n):
        toks = [words[i] for i in rng.integers(len(words), size=int(rng.integers(2, 6)))]
        out.append(" ".join(toks) if rng.random() < 0.7 else rng.choice(["y", "n", "maybe", "ok", ""]))
    return out


def test_human_judge_reasks_until_an_option(tmp_path):
    rng = np.random.default_rng(0)
    ep = _episode(rng, 5)
    for trial in range(20):
        bad = _random_non_answers(rng, int(rng.integers(0, 3)))
        answers = iter([*bad, rng.choice(["Yes.", " no ", "UNSURE"])])
        asked, said, shown = [], [], []
        j = HumanJudge(ask=lambda q: (asked.append(q), next(answers))[1], show=shown.append, say=said.append,
                       out_dir=str(tmp_path / str(trial)), max_tries=3)
        v = j.score(ep, "pick up the red cube")
        assert v in VERDICTS and len(asked) == len(bad) + 1 and j.stats()["re_asked"] == len(bad)
        assert '"pick up the red cube"' in asked[0] and j.stats()["unparsed"] == 0
    assert len(shown) == 1 and os.path.isfile(shown[0]) and shown[0] in said[0]
    import cv2

    sheet = cv2.imread(shown[0])
    assert sheet.shape[0] == 2 * (160 + 4)  # a row per camera
    assert sheet.shape[1] == max(5 * (round(64 * 160 / h) + 4) for h in (48, 64))  # a column per frame


def test_human_judge_gives_up_and_proposes(tmp_path):
    rng = np.random.default_rng(1)
    ep = _episode(rng, 3)
    answers = iter(_random_non_answers(rng, 3))
    j = HumanJudge(ask=lambda q: next(answers), say=lambda s: None, out_dir=str(tmp_path), max_tries=3)
    assert j.score(ep, "pick up the red cube") == "unsure" and j.stats()["unparsed"] == 1
    long_answer = " ".join(["red"] * (MAX_PROPOSAL_WORDS + 1))
    answers = iter([long_answer, "", "Put the red cube in the bowl.", "nothing"])
    assert j.propose_instruction(ep) == "put the red cube in the bowl"
    assert j.propose_instruction(ep) is None and j.stats()["nothing"] == 1
    assert len(os.listdir(tmp_path)) == 3  # one contact sheet per question


# -- the spec ------------------------------------------------------------------------------------
def test_make_judge(vlm_dirs, tmp_path):
    assert isinstance(make_judge("sim"), SimJudge) and isinstance(make_judge("human"), HumanJudge)
    j = make_judge(f"vlm:{vlm_dirs['yes']}")
    assert isinstance(j, VLMJudge) and j.model_dir == vlm_dirs["yes"]
    for bad, match in (("simm", "'simm'.*did you mean 'sim'.*vlm:DIR"), ("gpt4", "'gpt4'.*classifier:DIR"),
                       ("vlm", "'vlm'.*needs a directory"), ("sim:x", "'sim:x'.*no argument"), ("", "''.*human")):
        with pytest.raises(ValueError, match=match):
            make_judge(bad)
    with pytest.raises(FileNotFoundError, match="nowhere"):
        make_judge(f"vlm:{tmp_path / 'nowhere'}")
    path = _constant_classifier(str(tmp_path / "c"), 8.0, {"instruction": "fold the towel"})
    assert isinstance(make_judge(f"classifier:{path}"), ClassifierJudge)
