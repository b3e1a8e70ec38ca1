"""Answers end where the model ends them, and read as text (issue 38 §2).

Real tiny model, real Engine, real hypercorn: a completion ends at the model's first end-of-sequence
token by default (``finish_reason: "stop"``) and its text leaves special tokens out, while the token
list keeps them; ``ignore_eos`` (vLLM's name) runs to ``max_tokens`` with the same prefix; a chat
with no ``max_tokens`` runs to the end of its turn, a completion keeps OpenAI's 16; and plain
prompts start with the model's document boundary, which on Qwen is ``<|endoftext|>``, not its
end-of-sequence token ``<|im_end|>``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from node.model.decoding import GenerateConfig, document_boundary, end_of_sequence_tokens, generate
from node.model.pairs import get_pair
from node.target.engine import Engine
from node.target.http.api import build_app
from tests.httputil import MODEL, post_json, request, serving
from verifier.params import SamplingParams

# Found by search on the shipped tiny pair: at T = 1 with seed 4 the model ends this file (emits
# its <|endoftext|>) at the second token.
ENDING_PROMPT = "if __name__ == '__main__':\n    main()\n"
ENDING_SEED = 4
BOUNDARY = "<|endoftext|>"
OPENAI_COMPLETION_DEFAULT = 16


@pytest.fixture(scope="module")
def url(pair) -> Iterator[str]:
    engine = Engine(pair, model_name=MODEL, gamma=4, model_hash=b"\x07" * 32)
    with serving({"main": build_app(engine)}) as urls:
        yield urls["main"]


def _complete(url: str, **body) -> dict:
    status, answer = post_json(url, {"prompt": ENDING_PROMPT, "seed": ENDING_SEED, **body})
    assert status == 200, answer
    return answer


def test_a_completion_ends_at_the_end_of_sequence_and_hides_it(url, pair):
    answer = _complete(url, max_tokens=8)
    tokens, choice = answer["specmarket"]["tokens"], answer["choices"][0]
    eos = set(end_of_sequence_tokens(pair.tokenizer))
    assert choice["finish_reason"] == "stop" and len(tokens) < 8
    assert tokens[-1] in eos and not eos & set(tokens[:-1])  # the first one ends it
    assert BOUNDARY not in choice["text"]  # the text reads as text ...
    assert pair.tokenizer.decode(tokens).endswith(BOUNDARY)  # ... the token ids keep it, for audit


def test_ignore_eos_runs_to_max_tokens_with_the_same_prefix(url, pair):
    stopped = _complete(url, max_tokens=8)["specmarket"]["tokens"]
    running = _complete(url, max_tokens=8, ignore_eos=True)
    tokens = running["specmarket"]["tokens"]
    assert running["choices"][0]["finish_reason"] == "length" and len(tokens) == 8
    assert tokens[: len(stopped)] == stopped
    assert BOUNDARY not in running["choices"][0]["text"]


def test_the_local_generate_ends_alike(pair):
    """`specmarket generate` is the reference an answer is compared with: same rule, same tokens."""
    params = SamplingParams(1.0)
    cfg = GenerateConfig(ENDING_PROMPT, seed=ENDING_SEED, max_new_tokens=8, params=params, drafter="none")
    local = generate(cfg, pair)
    assert local["tokens"][-1] in end_of_sequence_tokens(pair.tokenizer) and len(local["tokens"]) < 8
    assert BOUNDARY not in local["text"]
    ignoring = generate(GenerateConfig(**{**cfg.__dict__, "ignore_eos": True}), pair)
    assert len(ignoring["tokens"]) == 8


def test_chat_runs_to_the_end_of_its_turn_and_completions_keep_openais_default(url, pair):
    completion = _complete(url, prompt="def main(", seed=1)
    assert len(completion["specmarket"]["tokens"]) <= OPENAI_COMPLETION_DEFAULT
    body = {"messages": [{"role": "user", "content": "def main("}], "seed": 1, "temperature": 0.0}
    status, chat = post_json(url, body, "/v1/chat/completions")
    assert status == 200, chat
    tokens, finish = chat["specmarket"]["tokens"], chat["choices"][0]["finish_reason"]
    window = pair.target.max_positions - len(chat["specmarket"]["prompt_tokens"])
    # the tiny model has no notion of turns: it runs to its end of text, or to the window's end
    assert len(tokens) > OPENAI_COMPLETION_DEFAULT
    assert (finish == "stop" and tokens[-1] in end_of_sequence_tokens(pair.tokenizer)) or (
        finish == "length" and len(tokens) == window
    ), (finish, len(tokens), window)


def test_models_names_the_served_model_and_its_hash(url):
    status, _, raw = request(url, "GET", "/v1/models")
    card = json.loads(raw)["data"][0]
    assert status == 200 and card["id"] == MODEL and card["model_hash"] == "0x" + "07" * 32


@pytest.mark.parametrize(("body", "said"), [({"prompt": ""}, "'prompt' is empty"), ({"prompt": [""]}, "is empty")])
def test_an_empty_prompt_gets_a_plain_sentence(url, body, said):
    status, answer = post_json(url, body)
    message = answer["error"]["message"]
    assert status == 400 and said in message and "Value should" not in message


def test_empty_messages_get_a_plain_sentence(url):
    status, answer = post_json(url, {"messages": []}, "/v1/chat/completions")
    assert status == 400 and "'messages' is empty: send at least one message" in answer["error"]["message"]


@pytest.mark.parametrize(
    ("pair_name", "boundary", "stops"),
    [("qwen2.5-coder", 151643, (151643, 151645)), ("smollm2", 0, (0, 2)), ("tiny", 0, (0,))],
)
def test_plain_prompts_start_with_the_document_boundary(pair_name, boundary, stops):
    """Qwen's end-of-sequence token is <|im_end|> (151645), the end of a chat turn: a plain prompt
    starts with the document boundary <|endoftext|> (151643) instead, as in pretraining; and the
    answer ends at either."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(get_pair(pair_name).target_dir(), local_files_only=True)
    assert tokenizer.convert_ids_to_tokens(boundary) == BOUNDARY
    assert document_boundary(tokenizer) == boundary
    assert end_of_sequence_tokens(tokenizer) == stops
    from node.model.decoding import encode_prompt

    assert encode_prompt(tokenizer, "def main(") == [boundary, *tokenizer.encode("def main(")]
