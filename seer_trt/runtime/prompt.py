"""Stage 1a, prompt: a request's text -> prompt ids through the export's chat template (docs/DESIGN.md "The model (LLaDA-V) in plain PyTorch").

In:  a user message (``<image>`` marks where the picture goes), an optional system message, the export's
     ``tokenizer.json`` and chat template.
Out: prompt ids with ``IMAGE_PLACEHOLDER`` where image features are spliced (``ChatTokenizer.encode``).

Uses the light ``tokenizers`` package and jinja2 (the tokenizer's own chat template), never transformers. User
text is text: only the chat template's own text may hold control tokens; a message's content is tokenized with
special-token matching off, so typing ``<|eot_id|>`` cannot end a turn or forge one.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import secrets
from collections.abc import Sequence
from pathlib import Path

from seer_trt.contracts.confined import MAX_TOKENIZER_BYTES, inside, read_bounded
from seer_trt.contracts.errors import ConfigError, InputError, ManifestError
from seer_trt.contracts.geometry import IMAGE_PLACEHOLDER, IMAGE_TOKEN
from seer_trt.contracts.manifest import Manifest


@dataclasses.dataclass(frozen=True)
class ChatFormat:
    """The tokenizer's chat template and what it needs, from ``tokenizer_config.json``."""

    template: str  # jinja2 source, as HF tokenizers store it
    bos_token: str  # <|startoftext|> for LLaDA-V
    system: str | None = None  # default system message, None for none

    @classmethod
    def from_folder(cls, folder: str | Path, system: str | None = None) -> ChatFormat:
        path = Path(folder) / "tokenizer_config.json"
        try:
            data = json.loads(read_bounded(path, folder, "tokenizer", MAX_TOKENIZER_BYTES))
        except (OSError, ValueError) as err:
            raise ManifestError(f"cannot read the chat template from {path} ({err}); re-export") from None
        if "chat_template" not in data:
            raise ConfigError(f"{path} has no 'chat_template'; LLaDA-V tokenizers ship one")
        bos = data.get("bos_token")
        bos = bos["content"] if isinstance(bos, dict) else bos
        return cls(template=data["chat_template"], bos_token=bos or "", system=system)

    @functools.cached_property
    def _compiled(self):
        """The template as Hugging Face's ``apply_chat_template`` compiles it, so a checkpoint's own template renders
        alike: a sandbox, ``trim_blocks`` and ``lstrip_blocks``, loop controls, names a chat does not set (``tools``,
        a message's ``tool_calls``, as Qwen's templates test) undefined and falsy, and ``raise_exception``."""
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.globals["raise_exception"] = _template_error
        return env.from_string(self.template)

    def _render(self, roles: Sequence[str], contents: Sequence[str]) -> str:
        messages = [{"role": r, "content": c} for r, c in zip(roles, contents, strict=True)]
        import jinja2

        try:
            return self._compiled.render(messages=messages, bos_token=self.bos_token, add_generation_prompt=True)
        except jinja2.TemplateError as err:  # the template's own check of the conversation, or a broken template
            raise InputError(f"the model's chat template refused this conversation: {err}") from None

    def render(self, user: str, system: str | None = None, history: Sequence[tuple[str, str]] = ()) -> str:
        """The full prompt text for a user turn, ending with the assistant header (``system``: None for the
        default system message, "" for none; ``history``: earlier (role, text) turns, oldest first)."""
        return "".join(text for text, _ in self.segments(user, system, history))

    def segments(self, user: str, system: str | None = None,
                 history: Sequence[tuple[str, str]] = ()) -> list[tuple[str, str | None]]:  # fmt: skip
        """The prompt as (text, role) pieces, in order: role None for the template's own text, "system", "user"
        or "assistant" for message content; the last "user" piece is ``user``, the turn being answered.

        The template's own text (role headers, ``<|eot_id|>``, BOS) is what may hold control tokens; message
        content is the user's and is tokenized as plain text (``ChatTokenizer``). Each content goes through the
        template as it would whole (its ``trim`` and the like applied): the template is rendered with an
        unguessable slot per content, and once with every content filled; where that render is the slots'
        template text around each content as given (or trimmed, as LLaDA's and Llama 3's templates do), that is
        the placement, in two renders whatever the conversation's length. Otherwise (a template that changes
        content in another way) the template is rendered once per content with only that slot filled, and the text
        between the slot's neighbours is the content as placed.

        Raises:
            ConfigError: the template does not place each message's content exactly once, as one piece.
        """
        system = self.system if system is None else system
        roles = [*(["system"] if system else []), *(role for role, _ in history), "user"]
        contents = [*([system] if system else []), *(text for _, text in history), user]
        nonce = secrets.token_hex(8)
        slots = [f"\x00seer-content-{i}-{nonce}\x00" for i in range(len(contents))]
        base = self._render(roles, slots)
        placed = _placed_at_once(base, slots, self._render(roles, contents), contents)
        if placed is None:
            placed = [self._placed_alone(roles, slots, base, i, content) for i, content in enumerate(contents)]
        pieces: list[tuple[str, str | None]] = []
        rest = base
        for slot, text, role in sorted(zip(slots, placed, roles, strict=True), key=lambda p: base.index(p[0])):
            head, _, rest = rest.partition(slot)
            pieces += [(head, None), (text, role)]
        pieces.append((rest, None))
        return [(text, role) for text, role in pieces if text]

    def _placed_alone(self, roles: Sequence[str], slots: list[str], base: str, i: int, content: str) -> str:
        """Content ``i`` as the template places it, from a render with only its slot filled."""
        if base.count(slots[i]) != 1:
            raise ConfigError(f"the chat template places message content {base.count(slots[i])} times, expected "
                              f"once; seer-trt cannot keep user text apart from its control tokens")  # fmt: skip
        start = base.index(slots[i])
        prefix, suffix = base[:start], base[start + len(slots[i]) :]
        filled = self._render(roles, [content if j == i else s for j, s in enumerate(slots)])
        if not (filled.startswith(prefix) and filled.endswith(suffix) and len(filled) >= len(prefix) + len(suffix)):
            raise ConfigError("the chat template renders around message content differently depending on the "
                              "content; seer-trt cannot keep user text apart from its control tokens")  # fmt: skip
        return filled[len(prefix) : len(filled) - len(suffix)]


TOKENS_PER_TURN = 4  # the fewest prompt tokens a chat turn's header and end take (LLaDA-V's template: 5)


def _placed_at_once(base: str, slots: list[str], filled: str, contents: list[str]) -> list[str] | None:
    """Each content as the template placed it, read from one render with every content ``filled``: the template's
    text between the slots of ``base`` must surround each content as given or trimmed; None where it does not."""
    if any(base.count(slot) != 1 for slot in slots):
        return None
    order = sorted(range(len(slots)), key=lambda i: base.index(slots[i]))
    heads, rest = [], base
    for i in order:
        head, _, rest = rest.partition(slots[i])
        heads.append(head)
    placed: list[str | None] = [None] * len(slots)
    pos = 0
    for k, i in enumerate(order):
        if not filled.startswith(heads[k], pos):
            return None
        pos += len(heads[k])
        after = heads[k + 1] if k + 1 < len(order) else rest
        for text in dict.fromkeys((contents[i], contents[i].strip())):
            end = pos + len(text)
            if filled.startswith(text, pos) and (filled.startswith(after, end) if k + 1 < len(order) else
                                                  filled[end:] == after):  # fmt: skip
                placed[i] = text
                pos = end
                break
        else:
            return None
    return placed  # type: ignore[return-value]


def _template_error(message: str):
    """``raise_exception`` inside a chat template, as transformers defines it."""
    import jinja2

    raise jinja2.TemplateError(message)


class ChatTokenizer:
    """Prompt ids of one turn: the template's text with its control tokens, message content as plain text.

    Two ``tokenizers.Tokenizer``s over one ``tokenizer.json``: one matches the added tokens (``<|eot_id|>``,
    headers, BOS) in the template's own text; the other has ``encode_special_tokens`` set, so a special-token
    string typed by a user is split like any other text and never becomes a control id. (Two instances, since
    that flag is state of the tokenizer and a pipeline may encode from several threads at once.)
    """

    def __init__(self, tokenizer_json: str | Path, chat: ChatFormat) -> None:
        """
        Raises:
            InputError: the tokenizer file is missing or corrupt.
        """
        from tokenizers import Tokenizer

        path = Path(tokenizer_json)
        try:
            text = read_bounded(path, path.parent, "tokenizer", MAX_TOKENIZER_BYTES).decode()
            self.control = Tokenizer.from_str(text)
            self.text = Tokenizer.from_str(text)
        except ManifestError:
            raise
        except Exception as err:  # tokenizers raises its own Exception type for a corrupt file
            raise ManifestError(f"cannot read the tokenizer {tokenizer_json} ({err}); re-export") from None
        self.text.encode_special_tokens = True
        self.chat = chat
        self.special_ids = frozenset(i for i, t in self.control.get_added_tokens_decoder().items() if t.special)

    def user_ids(self, text: str, images: bool) -> list[int]:
        """Ids of message content; with ``images``, ``IMAGE_PLACEHOLDER`` for every ``<image>``.

        Raises:
            InputError: the tokenizer maps the text to a control token anyway (a vocabulary holding one as a word).
        """
        ids: list[int] = []
        for k, chunk in enumerate(text.split(IMAGE_TOKEN) if images else [text]):
            if k:
                ids.append(IMAGE_PLACEHOLDER)
            if chunk:
                ids.extend(self.text.encode(chunk, add_special_tokens=False).ids)
        control = sorted(self.special_ids.intersection(ids))
        if control:
            raise InputError(f"this tokenizer encodes the message text to control token(s) "
                             f"{[self.control.id_to_token(i) for i in control]}; remove them from the text")  # fmt: skip
        return ids

    def encode(self, user: str, system: str | None = None, history: Sequence[tuple[str, str]] = ()) -> list[int]:
        """Prompt ids of a user turn, ``IMAGE_PLACEHOLDER`` for every ``<image>`` of the user's message
        (``tokenizer_image_token``); ``system``: None for the default system message, "" for none; ``history``:
        earlier (role, text) turns, all text (an ``<image>`` in them stays text)."""
        pieces = self.chat.segments(user, system, history)
        last = max(i for i, (_, role) in enumerate(pieces) if role == "user") if user else -1
        ids: list[int] = []
        for i, (text, role) in enumerate(pieces):
            if role is None:
                ids.extend(self.control.encode(text, add_special_tokens=False).ids)
            else:
                ids.extend(self.user_ids(text, images=i == last))
        return ids


def longest_token(tokenizer) -> int:
    """Characters of the vocabulary's longest token string: no token stands for more characters of text.

    Byte-level BPE spells a token with one character per byte (a text character is one byte or more), Metaspace
    vocabularies spell it with the characters it stands for, WordPiece adds ``##``: each spelling is at least as
    long as the text it encodes.
    """
    return max((len(t) for t in tokenizer.get_vocab(with_added_tokens=True)), default=1)


def prompt_char_limit(tokenizer, prompt_tokens: int) -> int:
    """The most characters of message text (prompt and system together) that can fit ``prompt_tokens`` ids:
    every id holds at most ``longest_token`` characters. Text past it cannot fit, and is refused before any
    templating or tokenizing (whose memory and time grow with the text)."""
    return prompt_tokens * longest_token(tokenizer)


class PromptFormat:
    """One request's text -> its prompt ids, with the export's chat template and tokenizer.

    ``max_chars`` bounds the message text before any work that grows with it (``prompt_char_limit`` of the
    largest prompt bucket, or the pipeline's ``max_prompt_chars``); the exact check, in embeddings, follows
    tokenizing (``SeerPipeline.prepare``).
    """

    def __init__(self, folder: str | Path, manifest: Manifest, max_tokens: int | None = None,
                 max_chars: int | None = None) -> None:  # fmt: skip
        """
        Args:
            max_tokens: the largest prompt bucket the backend takes (default: the manifest's).
            max_chars: the most characters of message text accepted (default: what ``max_tokens`` ids can hold).

        Raises:
            ConfigError: ``max_chars`` is not a positive integer.
        """
        tok = inside(folder, manifest.tokenizer, "tokenizer")
        self.vision = manifest.vision
        self.chat = ChatFormat.from_folder(tok, system=manifest.system_prompt)
        self.chat_tokenizer = ChatTokenizer(tok / "tokenizer.json", self.chat)
        self.tokenizer = self.chat_tokenizer.control  # for decoding answers (``seer_trt.runtime.detokenize``)
        self.max_tokens = max_tokens or manifest.buckets.prompt[-1]
        if max_chars is not None and (isinstance(max_chars, bool) or not isinstance(max_chars, int) or max_chars < 1):
            raise ConfigError(f"max_prompt_chars must be a positive integer, got {max_chars!r}")
        self.max_chars = max_chars or prompt_char_limit(self.tokenizer, self.max_tokens)
        self.max_turns = max(1, self.max_tokens // TOKENS_PER_TURN)  # what the largest bucket could hold

    def check_length(self, prompt: str, system: str | None = None, history: Sequence[tuple[str, str]] = ()) -> None:
        """Refuse message text longer than ``max_chars``, before any work that grows with it.

        Raises:
            InputError: naming the limit and the bucket it comes from.
        """
        turns = len(history) + 1
        if turns > self.max_turns:  # before any rendering: each turn costs the template's work and header tokens
            raise InputError(f"the conversation has {turns} turns, more than the {self.max_turns} accepted (each turn's "
                             f"header takes at least {TOKENS_PER_TURN} of the largest prompt bucket's "
                             f"{self.max_tokens} embeddings); send fewer earlier turns")  # fmt: skip
        n = len(prompt) + len(system or "") + sum(len(text) for _, text in history)
        if n > self.max_chars:
            what = (
                "the messages hold"
                if history
                else "the prompt and system message hold"
                if system
                else ("the prompt holds")
            )
            raise InputError(f"{what} {n} characters, more than the {self.max_chars} accepted (max_prompt_chars: "
                             f"what the largest prompt bucket, {self.max_tokens} embeddings, can hold); shorten "
                             f"it, or re-export with larger buckets")  # fmt: skip

    def ids(self, prompt: str, has_image: bool, system: str | None = None,
            history: Sequence[tuple[str, str]] = ()) -> list[int]:  # fmt: skip
        """Prompt ids of a user turn after ``history`` (earlier (role, text) turns); ``<image>`` is prepended
        when an image comes without a placeholder. The prompt, ``system`` and the history are text: special-token
        strings in them stay text (``ChatTokenizer``); the image belongs to the turn being answered.

        Raises:
            InputError: the text is longer than ``max_chars``, an empty prompt, or a number of ``<image>``
                placeholders other than the images sent.
        """
        if not isinstance(prompt, str) or not isinstance(system, str | None):
            raise InputError(f"the prompt is a {type(prompt).__name__}; send the question as text")
        self.check_length(prompt, system, history)
        if has_image and self.vision.encoder == "none":
            raise InputError("this export is a text-only model (vision.encoder none: Dream); send the prompt without "
                             "an image")  # fmt: skip
        if not prompt or not prompt.strip():
            raise InputError("the prompt is empty; send the question as text")
        n_tokens = prompt.count(IMAGE_TOKEN)
        if n_tokens > (1 if has_image else 0):
            raise InputError(
                f"the prompt holds {n_tokens} {IMAGE_TOKEN} placeholder(s) for {int(has_image)} image(s); use one "
                f"{IMAGE_TOKEN} per image (or none: it is prepended)"
            )
        if self.vision.placement == "before_prompt":  # MMaDA: prefix ids, the image, suffix ids, then the template
            text = prompt.replace(f"{IMAGE_TOKEN}\n", "", 1).replace(IMAGE_TOKEN, "", 1) if has_image else prompt
            if has_image and not text.strip():
                raise InputError("the prompt holds only the image placeholder; send the question as text")
            ids = self.chat_tokenizer.encode(text, system, history)
            v = self.vision
            return [*v.prefix_ids, IMAGE_PLACEHOLDER, *v.suffix_ids, *ids] if has_image else ids
        if has_image and n_tokens == 0:
            prompt = f"{IMAGE_TOKEN}\n{prompt}"
        return self.chat_tokenizer.encode(prompt, system, history)
