"""The ``tiny-llada-v`` fixture: its tokenizer, its config, and batches of its synthetic task (docs/DESIGN.md "The fixture model").

In:  task samples from ``seer_trt.eval.tasks``.
Out: a word-level ``tokenizers`` tokenizer with LLaDA-V's special-token strings and chat template, the tiny
     LLaDA-V config, and ``encode_batch``: left-padded prompt embeddings and answer windows in the layout
     LLaDA-V's SFT trains on (answer, ``<|eot_id|>``, then ``<|endoftext|>`` padding to the window length).

The trainer (``tools/train_fixture.py``), calibration and evaluation share these, so the prompts the model
was trained on are exactly the ones it is measured on.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from seer_export.models.config import DiffusionMLLMConfig, TextConfig, VisionConfig
from seer_export.models.families import FAMILIES, special_tokens
from seer_export.models.mllm import DiffusionMLLM, left_pad_prompts
from seer_trt.contracts.config import DEFAULT_DECODING, GenerationConfig
from seer_trt.contracts.errors import ConfigError
from seer_trt.contracts.geometry import IMAGE_PLACEHOLDER, IMAGE_TOKEN
from seer_trt.eval import easy_vqa
from seer_trt.eval.tasks import DEFAULT_FAMILY, FAMILY_KEY, Sample, task_family, vocabulary
from seer_trt.runtime.image import anyres_tiles, center_crop_tile, pixel_tiles
from seer_trt.runtime.prompt import ChatFormat, ChatTokenizer

# LLaDA-V's chat template (tokenizer_config.json of GSAI-ML/LLaDA-V), verbatim.
CHAT_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' "
    "+ message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{{ '<|start_header_id|>assistant"
    "<|end_header_id|>\n\n' }}"
)
SPECIAL_STRINGS = [
    "<|startoftext|>",
    "<|endoftext|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|mdm_mask|>",
]


# Dream's (Qwen2.5's) ChatML tokens and turn layout: "<|im_start|>{role}\n{content}<|im_end|>\n" per message, then
# "<|im_start|>assistant\n". Without Qwen's default system turn: a fixture's prompts hold only its task's words.
CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
DREAM_SPECIAL_STRINGS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|beginoftext|>", "<|mask|>"]


def build_tokenizer(family: str = "llada-v", task: str = DEFAULT_FAMILY):
    """A word-level tokenizer over the task's vocabulary (its role words included) plus the model family's special
    tokens (LLaDA-V's, or Dream's ChatML ones).

    ``task``: a synthetic task family (words split at spaces), or easy-vqa (``seer_trt.eval.easy_vqa``: its
    published questions, so punctuation splits from words: "shape?" is "shape" "?").
    """
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    dream = bool(FAMILIES[family].special_strings)
    dataset = task == easy_vqa.DATASET
    words = ["[UNK]"] + (easy_vqa.vocabulary() if dataset else vocabulary())
    vocab = {w: i for i, w in enumerate(words)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace() if dataset else pre_tokenizers.WhitespaceSplit()
    strings = DREAM_SPECIAL_STRINGS if dream else SPECIAL_STRINGS
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in strings])
    return tok


def tokenizer_config(family: str = "llada-v") -> dict:
    if FAMILIES[family].special_strings:  # Dream: ChatML, no BOS, <|endoftext|> ends and pads
        return {"chat_template": CHATML_TEMPLATE, "bos_token": None, "eos_token": "<|endoftext|>",
                "pad_token": "<|endoftext|>", "mask_token": "<|mask|>",
                "tokenizer_class": "PreTrainedTokenizerFast"}  # fmt: skip
    return {
        "chat_template": CHAT_TEMPLATE,
        "bos_token": "<|startoftext|>",
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "tokenizer_class": "PreTrainedTokenizerFast",
    }


def fixture_config(
    vocab_size: int, gen_length: int = 64, image_size: int = 32, patch_size: int = 8
) -> DiffusionMLLMConfig:
    """LLaDA-V's layout at 1.8M parameters: 8 layers of width 128, a 3-layer SigLIP on 32 px images in 8 px patches.

    ``gen_length``: the default answer window (and steps, one block) of the config's generation settings;
    ``image_size``, ``patch_size``: the tower's tile and patch (easy-vqa's fixture reads 64 px in 16 px patches).
    """
    return DiffusionMLLMConfig(
        text=TextConfig(
            vocab_size=vocab_size,
            hidden_size=128,
            intermediate_size=384,
            num_hidden_layers=8,
            num_attention_heads=4,
            num_key_value_heads=4,
            rms_norm_eps=1e-5,
            rope_theta=10000.0,
        ),  # fmt: skip
        vision=VisionConfig(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=3,
            num_attention_heads=2,
            image_size=image_size,
            patch_size=patch_size,
            layer_norm_eps=1e-6,
        ),  # fmt: skip
        image_aspect_ratio="pad",
        generation=GenerationConfig(
            gen_length=gen_length, steps=gen_length, block_length=gen_length, decoding=DEFAULT_DECODING
        ),  # what an export of LLaDA-V runs by default
        system_prompt=None,
    )


def dream_fixture_config(vocab_size: int, gen_length: int = 64) -> DiffusionMLLMConfig:
    """The Dream family at the fixture's size (``tiny-dream``): 8 layers of width 128, grouped-query attention (4
    query heads over 2 K/V heads) with q/k/v biases, RoPE base 1e6, shifted logits, text only; Dream's own loop
    (steps = positions, Dream's schedule, ranked by negative entropy) over ``gen_length`` positions."""
    return DiffusionMLLMConfig(
        text=TextConfig(vocab_size=vocab_size, hidden_size=128, intermediate_size=384, num_hidden_layers=8,
                        num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6, rope_theta=1e6,
                        qkv_bias=True),
        vision=VisionConfig(),  # unused: no tower
        image_aspect_ratio="pad",
        generation=FAMILIES["dream"].own_loop(gen_length),
        system_prompt=None,
        family="dream",
    )  # fmt: skip


def write_tokenizer(folder: Path, family: str = "llada-v", task: str = DEFAULT_FAMILY) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    build_tokenizer(family, task).save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(family), indent=2) + "\n")


def fixture_family(folder: Path) -> str:
    """The task family the model in ``folder`` was trained on: its config.json's ``task_family``, else the default.

    Raises:
        ConfigError: the config names a family ``seer_trt.eval.tasks`` does not know.
    """
    name = json.loads((Path(folder) / "config.json").read_text()).get(FAMILY_KEY, DEFAULT_FAMILY)
    if name == easy_vqa.DATASET:
        return name
    try:
        task_family(name)
    except ValueError as err:
        raise ConfigError(f"{Path(folder) / 'config.json'}: {err}") from None
    return name


class TaskEncoder:
    """Turns task samples into model inputs with one tokenizer and chat format."""

    def __init__(self, folder: Path, cfg: DiffusionMLLMConfig) -> None:
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.chat = ChatFormat.from_folder(folder, system=cfg.system_prompt)
        self.chat_tokenizer = ChatTokenizer(folder / "tokenizer.json", self.chat)  # as the runtime encodes prompts
        self.special = special_tokens(cfg.family, folder / "tokenizer.json")
        self.cfg = cfg
        self.family = fixture_family(folder)  # the task family its prompts are drawn from (seer_trt.eval.tasks)

    def prompt_ids(self, sample: Sample) -> list[int]:
        """As the runtime encodes it; MMaDA's image goes ahead of the template: <|mmu|><|soi|> image <|eoi|>."""
        if sample.image is not None and FAMILIES[self.cfg.family].image_placement == "before_prompt":
            text = sample.question.replace(f"{IMAGE_TOKEN}\n", "", 1).replace(IMAGE_TOKEN, "", 1)
            return [*self.cfg.image_prefix_ids, IMAGE_PLACEHOLDER, *self.cfg.image_suffix_ids,
                    *self.chat_tokenizer.encode(text)]  # fmt: skip
        return self.chat_tokenizer.encode(sample.question)

    def answer_ids(self, sample: Sample) -> list[int]:
        """Answer ids followed by ``<|eot_id|>``: the true length Seer should keep (plus its margin)."""
        return self.tokenizer.encode(" ".join(sample.answer), add_special_tokens=False).ids + [self.special.eot_id]

    def prefix(self, model: DiffusionMLLM, samples: list[Sample]) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-padded prompt embeddings [B, P, D] and validity [B, P]; images tiled as the config says (one tile, or
        the anyres grid of ``image_grid_pinpoints``)."""
        size = self.cfg.vision.image_size
        prompts = []
        for s in samples:
            if s.image is None:
                images = None
            elif FAMILIES[self.cfg.family].front_end == "none":
                raise ConfigError(f"{self.cfg.family} is a text-only model; its task samples hold no images")
            elif not self.cfg.has_tower:  # MMaDA: the image tokenizer's ids
                images = model.image_ids(torch.from_numpy(center_crop_tile(s.image, size)))
            elif self.cfg.image_aspect_ratio.startswith("anyres"):
                images = [anyres_tiles(s.image, size, self.cfg.grid_pinpoints)]
            else:
                images = torch.from_numpy(pixel_tiles(s.image, size))
            prompts.append(model.embed_prompt(self.prompt_ids(s), images))
        return left_pad_prompts(prompts)

    def decode(self, ids: np.ndarray) -> list[str]:
        """Answer text of each row: ids up to the first ``<|eot_id|>``, special tokens dropped."""
        out = []
        for row in np.asarray(ids):
            row = row.tolist()
            end = row.index(self.special.eot_id) if self.special.eot_id in row else len(row)
            out.append(self.tokenizer.decode(row[:end], skip_special_tokens=True))
        return out

    def window(self, sample: Sample, length: int) -> list[int]:
        """The SFT target window: answer, ``<|eot_id|>``, ``<|endoftext|>`` padding up to ``length``."""
        ids = self.answer_ids(sample)
        return ids + [self.special.endoftext_id] * (length - len(ids))
