"""A tiny, randomly initialised vision-language model saved like a real one, for tests (no download).

``make_tiny_vlm(path)`` writes a Llava (CLIP vision tower, 1 layer; Llama language model, 1 layer,
hidden size 32) with a word-level tokenizer over a small vocabulary (the judges' prompts, the sim
tasks' wordings, the answer options), a default ``CLIPImageProcessor`` and a chat template, all with
``save_pretrained``: ``rewards.judges.VLMJudge(path)`` loads it through ``AutoProcessor`` /
``AutoModelForImageTextToText`` exactly as it loads a downloaded checkpoint.

Random weights answer gibberish. ``answer="yes"`` makes the model answer exactly that (whatever it
is shown): the saved generation config biases greedy decoding towards the answer's tokens, then
end-of-sequence (``sequence_bias``), so a test can drive the parsing end to end.
"""

from __future__ import annotations

import os
import re

SPECIAL = ("<pad>", "<s>", "</s>", "<unk>", "<image>", "<assistant>")
TEMPLATE = ("{% for message in messages %}{% for c in message['content'] %}"
            "{% if c['type'] == 'image' %}<image>{% else %}{{ c['text'] }}{% endif %}"
            "{% endfor %}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}")
EXTRA_WORDS = ("yes unsure no nothing first second same robot arm gripper moved waved dropped it the a cube block "
               "table bowl marker . , ? ! : ; \" '")


def vocabulary() -> list[str]:
    """The special tokens, then every word of the judges' prompts, the sim wordings and the options."""
    from hardware.sim_tasks import TASKS
    from rewards import judges

    text = " ".join([judges.PROPOSE_PROMPT, judges.SCORE_PROMPT, judges.COMPARE_PROMPT, EXTRA_WORDS,
                     *(w for t in TASKS.values() for w in t.instructions)]).lower()
    words = sorted(set(re.findall(r"\w+|[^\w\s]", text)))
    return [*SPECIAL, *words]


def make_tiny_vlm(path: str, answer: str | None = None, seed: int = 0) -> str:
    """Writes the tiny VLM to directory ``path`` (see the module docstring) -> ``path``."""
    import torch
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import (CLIPImageProcessor, CLIPVisionConfig, GenerationConfig, LlamaConfig, LlavaConfig,
                              LlavaForConditionalGeneration, LlavaProcessor, PreTrainedTokenizerFast)

    from rewards.judges import quiet_transformers

    path = os.fspath(path)
    vocab = {w: i for i, w in enumerate(vocabulary())}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.normalizer = normalizers.Lowercase()
    tk.pre_tokenizer = pre_tokenizers.BertPreTokenizer()  # words and single punctuation marks
    tk.decoder = decoders.WordPiece(prefix="##", cleanup=True)  # joins words with spaces, no space before "."
    with quiet_transformers():
        tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                      unk_token="<unk>",
                                      extra_special_tokens={"image_token": "<image>", "assistant_token": "<assistant>"})
        image_processor = CLIPImageProcessor()  # default: 224 px
        vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                  image_size=224, patch_size=32, projection_dim=32)
        text = LlamaConfig(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                           num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=1024,
                           pad_token_id=vocab["<pad>"], bos_token_id=vocab["<s>"], eos_token_id=vocab["</s>"])
        cfg = LlavaConfig(vision_config=vision, text_config=text, image_token_index=vocab["<image>"],
                          vision_feature_select_strategy="default", vision_feature_layer=-1)
        # the processor expands each <image> into the tower's patch count: 49 patches (+1 CLS token, dropped
        # by the "default" feature strategy)
        processor = LlavaProcessor(image_processor=image_processor, tokenizer=tok, patch_size=vision.patch_size,
                                   vision_feature_select_strategy="default", num_additional_image_tokens=1,
                                   chat_template=TEMPLATE)
        torch.manual_seed(seed)
        model = LlavaForConditionalGeneration(cfg).eval()
        gen = GenerationConfig(do_sample=False, bos_token_id=vocab["<s>"], eos_token_id=vocab["</s>"],
                               pad_token_id=vocab["<pad>"])
        if answer is not None:
            ids = tok(answer, add_special_tokens=False)["input_ids"]
            if not ids or vocab["<unk>"] in ids:
                raise ValueError(f"answer {answer!r} has words outside the tiny vocabulary")
            ids = [*ids, vocab["</s>"]]
            # token j of the answer gets (j + 1) * 100 when the answer's first j tokens precede it: greedy
            # decoding spells out the answer, then ends
            gen.sequence_bias = [[ids[: j + 1], 100.0 * (j + 1)] for j in range(len(ids))]
        model.generation_config = gen
        model.save_pretrained(path)
        processor.save_pretrained(path)
    return path
