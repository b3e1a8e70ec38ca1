"""`specmarket ask`, fast and safe (issue 38 §3), against a real anvil and a real bonded target process.

- the receipt is checked without transformers, web3 or eth-account: the prompt is tokenized with
  the `tokenizers` package (the same ids as the target's transformers tokenizer), the chain is read
  over plain JSON-RPC (what the contract says), the signature recovered with eth-keys (what
  eth-account and the contract say), and the model hash is cached by file metadata (a stale or
  corrupted entry is computed again; --verify-model recomputes);
- a client without model files, or whose chain does not answer, still checks what it can, saves
  --receipt-out, and names what it could not check (exit status 0); a check that fails after the
  receipt was saved exits 2 and says it was saved;
- --top-k reaches the target over HTTP and libp2p and the receipt commits to it; a bare HOST:PORT
  target is refused with the http:// URL it likely means.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from chainutil import deployed_chain, new_operator
from eth_account import Account
from netutil import SPECMARKET, start_target

from node.chain import ChainError
from node.chain.client import deploy
from node.chain.deployment import DEFAULT_THRESHOLD, DEV_DEPLOYER, DEV_REFEREES, BondConfig, dev_address, dev_key
from node.chain.receipts import ReceiptError, RequestSpec, SignedReceipt, receipt_signable, sign_receipt
from node.client.chain_view import OPERATOR_INFO, OPERATOR_INFO_TYPES, ChainUnreachable, ChainView
from node.client.expected import expect, fast_prompt, transformers_prompt
from node.client.signature import check_signed, receipt_digest, receipt_signer
from node.model.hash_cache import CACHE_FILE, cached_model_hash, compute_model_hash
from node.model.loading import TINY_TARGET, model_hash
from node.model.pairs import MODELS_DIR, QWEN_TARGET_DIR, SMOLLM2_TARGET_DIR
from verifier.errors import InvalidParams
from verifier.params import SamplingParams

pytestmark = pytest.mark.slow(seconds=40)  # a bonded target process and a dozen `ask` processes

RUN_TIMEOUT_S = 120
PROMPT = "def parse_args(argv):"
HEAVY = ("torch", "transformers", "web3", "eth_account", "py_ecc", "libp2p")


@pytest.fixture(scope="module")
def own_chain(tmp_path_factory):
    with deployed_chain(tmp_path_factory.mktemp("ask-deployments")) as chain:
        yield chain


@pytest.fixture(scope="module")
def target(own_chain, tmp_path_factory):
    """A bonded target process on the tiny pair, plain decoding."""
    tmp = tmp_path_factory.mktemp("ask-target")
    node = start_target(
        tmp, "--chain", own_chain.rpc, "--deployments", str(own_chain.deployments), "--max-drafters", "0"
    )
    yield node
    node.stop()


@pytest.fixture
def data_home(tmp_path) -> Path:
    """The client's XDG_DATA_HOME (its model hash cache), fresh for each test."""
    return tmp_path / "xdg"


def ask(data_home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "XDG_DATA_HOME": str(data_home)}
    return subprocess.run([*SPECMARKET, "ask", *args], capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=env)


def checked_against(chain, *extra: str) -> list[str]:
    return ["--pair", "tiny", "--seed", "3", "--rpc", chain.rpc, "--deployments", str(chain.deployments), *extra]


def warnings(done: subprocess.CompletedProcess) -> list[str]:
    return [line for line in done.stderr.splitlines() if line.startswith("warning: not checked:")]


# --- the model hash cache -----------------------------------------------------------------------


def _model_dir(tmp_path: Path) -> Path:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "toy"}')
    (model / "weights.bin").write_bytes(bytes(range(256)) * 64)
    (model / "specmarket_source.json").write_text("{}")  # the conversion record: not hashed
    return model


def test_the_model_hash_cache_is_used_only_while_every_file_is_unchanged_succeeds(tmp_path):
    model, cache = _model_dir(tmp_path), tmp_path / "cache" / CACHE_FILE
    first = cached_model_hash(model, cache=cache)
    assert first == compute_model_hash(model) == model_hash(model)
    entry = json.loads(cache.read_text())["entries"][str(model.resolve())]
    assert entry["hash"] == first.hex() and [row[0] for row in entry["files"]] == ["config.json", "weights.bin"]
    assert cached_model_hash(model, cache=cache) == first  # a hit
    weights = model / "weights.bin"
    stamp = weights.stat()
    weights.write_bytes(bytes(reversed(range(256))) * 64)  # same size, other bytes
    os.utime(weights, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))  # even with the old mtime (ctime moves)
    changed = cached_model_hash(model, cache=cache)
    assert changed != first and changed == compute_model_hash(model)
    (model / "tokenizer.json").write_text("{}")  # a file added
    added = cached_model_hash(model, cache=cache)
    assert added not in (first, changed) and added == compute_model_hash(model)


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda text: "{not json",
        lambda text: text.replace('"version": 1', '"version": 99'),
        lambda text: text.replace('"hash": "', '"hash": "zz'),  # not hex
        lambda text: text.replace('"files": [[', '"files": [["x", 0, 0, 0, 0, 0], ['),  # another file list
        lambda text: json.dumps({"version": 1, "entries": []}),
    ],
    ids=["not-json", "other-version", "hash-not-hex", "other-files", "entries-not-a-table"],
)
def test_a_corrupted_cache_entry_is_recomputed_not_trusted_succeeds(tmp_path, corrupt):
    model, cache = _model_dir(tmp_path), tmp_path / CACHE_FILE
    right = cached_model_hash(model, cache=cache)
    text = json.loads(cache.read_text())
    text["entries"][str(model.resolve())]["hash"] = "00" * 32  # would be trusted if it stood
    planted = json.dumps(text)
    cache.write_text(corrupt(planted))
    assert cached_model_hash(model, cache=cache) == right
    assert json.loads(cache.read_text())["entries"][str(model.resolve())]["hash"] == right.hex()  # repaired


def test_verify_recomputes_whatever_the_cache_says_succeeds(tmp_path):
    model, cache = _model_dir(tmp_path), tmp_path / CACHE_FILE
    right = cached_model_hash(model, cache=cache)
    data = json.loads(cache.read_text())
    data["entries"][str(model.resolve())]["hash"] = "11" * 32  # a well-formed lie, files unchanged
    cache.write_text(json.dumps(data))
    assert cached_model_hash(model, cache=cache) == b"\x11" * 32  # the cache is keyed by metadata only
    assert cached_model_hash(model, cache=cache, verify=True) == right
    assert cached_model_hash(model, cache=cache) == right  # and the entry is repaired


# --- the prompt's tokens without transformers -----------------------------------------------------

PROMPTS = ["def main(", "", "  two spaces", "héllo wörld 日本語 🎉", "<|endoftext|>inside", "a\n\n\tb\r\n", "x" * 2000]
MODEL_DIRS = [TINY_TARGET, MODELS_DIR / "smollm2-draft", SMOLLM2_TARGET_DIR, QWEN_TARGET_DIR]


@pytest.mark.parametrize("model_dir", MODEL_DIRS, ids=lambda d: d.name)
def test_the_fast_tokenization_is_the_targets_succeeds(model_dir):
    """The `tokenizers` path gives the ids (document boundary + text) and stop tokens that the
    target's transformers tokenizer gives (node.model.decoding.encode_prompt, end_of_sequence_tokens)."""
    if not (model_dir / "tokenizer.json").is_file():
        pytest.skip(f"{model_dir} is not prepared here (make setup)")
    for prompt in PROMPTS:
        assert fast_prompt(model_dir, prompt) == transformers_prompt(model_dir, prompt), prompt


CHATS = [
    [{"role": "user", "content": "def main("}],
    [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "héllo 日本語 🎉\n\tx"}],
    [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "<|im_end|>hello"},
        {"role": "user", "content": "  and again  "},
    ],
]


@pytest.mark.parametrize("model_dir", MODEL_DIRS, ids=lambda d: d.name)
def test_the_fast_chat_template_is_the_targets_succeeds(model_dir):
    """A chat's ids rendered without transformers (node.client.chat_render) are the ids that the
    target's transformers tokenizer gives through apply_chat_template (node.target.chat): the model's
    own template where it has one (Qwen, SmolLM2), the fallback where it has none (the tiny pair)."""
    if not (model_dir / "tokenizer.json").is_file():
        pytest.skip(f"{model_dir} is not prepared here (make setup)")
    for chat in CHATS:
        assert fast_prompt(model_dir, chat) == transformers_prompt(model_dir, chat), chat


def test_a_template_that_refuses_the_chat_is_a_plain_error_reverts(tmp_path):
    model = tmp_path / "model"
    shutil.copytree(TINY_TARGET, model)
    config = json.loads((model / "tokenizer_config.json").read_text())
    config["chat_template"] = "{{ raise_exception('system messages are not supported') }}"
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(InvalidParams, match="refused the messages: system messages are not supported"):
        fast_prompt(model, CHATS[1])


def test_expect_without_model_files_names_what_it_cannot_check_succeeds(tmp_path):
    expected = expect(tmp_path, "x", hash_cache=tmp_path / CACHE_FILE)
    assert expected.prompt is expected.model_hash is expected.stop_tokens is None
    assert expected.missing == (
        f"the prompt's tokens, the stop tokens and the model hash (no model files at {tmp_path})",
    )
    full = expect(TINY_TARGET, "x", hash_cache=tmp_path / CACHE_FILE)
    assert full.missing == () and full.model_hash == model_hash(TINY_TARGET) and full.prompt[0] == full.stop_tokens[0]


# --- the chain over plain JSON-RPC, the signature without eth-account -------------------------------


def test_the_chain_view_reads_what_the_contract_says_succeeds(own_chain, tmp_path):
    from eth_utils import function_abi_to_4byte_selector, keccak

    from node.chain.deployment import load_artifact

    view = ChainView.connect(own_chain.rpc, own_chain.deployments)
    assert view.domain == own_chain.client.domain
    abi, _ = load_artifact()
    (entry,) = [e for e in abi if e.get("name") == "operatorInfo"]
    assert function_abi_to_4byte_selector(entry) == keccak(text=OPERATOR_INFO)[:4]
    assert tuple(o["type"] for o in entry["outputs"]) == OPERATOR_INFO_TYPES
    operator, _ = new_operator(own_chain, tmp_path, b"\x42" * 32)
    stranger = Account.create().address
    for address in (operator.address, stranger):
        assert view.operator_info(address).__dict__ == own_chain.client.operator_info(address).__dict__
    assert view.operator_info(operator.address).active and not view.operator_info(stranger).registered
    pending = int(own_chain.client.w3.eth.get_block("pending")["timestamp"])
    assert abs(view.now() - pending) <= 2


def test_the_chain_view_fails_clearly_reverts(own_chain, tmp_path):
    with pytest.raises(ChainUnreachable, match=r"no Ethereum JSON-RPC endpoint answers at http://127\.0\.0\.1:1"):
        ChainView.connect("http://127.0.0.1:1", own_chain.deployments)
    with pytest.raises(ChainError, match="no deployment for chain 31337"):
        ChainView.connect(own_chain.rpc, tmp_path)
    record = json.loads((own_chain.deployments / "31337.json").read_text())
    (tmp_path / "31337.json").write_text(json.dumps({**record, "address": "0x" + "11" * 20}))
    stale = ChainView.connect(own_chain.rpc, tmp_path)
    with pytest.raises(ChainError, match="does not answer operatorInfo"):
        stale.operator_info(Account.create().address)


def test_the_signature_check_agrees_with_eth_account_and_the_contract_succeeds(own_chain, tmp_path):
    from eth_utils import keccak

    operator, _ = new_operator(own_chain, tmp_path)
    rng = random.Random(5)
    for _ in range(6):
        prompt = tuple(rng.randrange(1 << 32) for _ in range(rng.randrange(1, 30)))
        spec = RequestSpec.build(prompt, SamplingParams(0.7, rng.randrange(50), 0.9), rng.randrange(1 << 40), 9)
        signed = operator.sign(spec, tuple(rng.randrange(1 << 32) for _ in range(rng.randrange(1, 9))))
        signed.check()
        check_signed(signed)
        signable = receipt_signable(signed.domain, signed.receipt)
        digest = receipt_digest(signed.domain, signed.receipt)
        assert digest == keccak(b"\x19" + signable.version + signable.header + signable.body)
        assert digest == own_chain.client.receipt_digest(signed.receipt)
        assert receipt_signer(signed.domain, signed.receipt, signed.signature) == operator.address
    _refused_like_eth_account(signed)


def _refused_like_eth_account(signed: SignedReceipt) -> None:
    """Every forgery SignedReceipt.check refuses, check_signed refuses."""
    from node.chain.receipts import SECP256K1_N

    r, s, v = signed.signature[:32], int.from_bytes(signed.signature[32:64], "big"), signed.signature[64]
    high_s = r + (SECP256K1_N - s).to_bytes(32, "big") + bytes([55 - v])  # the twin that reverts on chain
    other_key = sign_receipt(bytes(Account.create().key), signed.domain, signed.receipt)
    forgeries = [
        replace(signed, signature=high_s),
        replace(signed, signature=other_key),
        replace(signed, signature=bytes(65)),
        replace(signed, request=replace(signed.request, max_tokens=signed.request.max_tokens + 1)),
        replace(signed, output=signed.output[:-1]),
        replace(signed, receipt=replace(signed.receipt, issued_at=signed.receipt.issued_at + 1)),
    ]
    for forged in forgeries:
        with pytest.raises(ReceiptError):
            forged.check()
        with pytest.raises(ReceiptError):
            check_signed(forged)


# --- `specmarket ask` end to end ------------------------------------------------------------------


@pytest.mark.parametrize("chat", [False, True], ids=["completion", "chat"])
def test_ask_checks_the_receipt_without_the_heavy_stacks_succeeds(target, own_chain, tmp_path, data_home, chat):
    """A bonded answer over HTTP, --top-k and --receipt-out, as a completion and as a chat: every
    check runs, and none of transformers, torch, web3, eth-account (py_ecc) or libp2p is imported
    to run them."""
    out = tmp_path / "r.json"
    args = [PROMPT, "--target", target.lines["http"][0], *checked_against(own_chain, "--top-k", "7")]
    args += ["--max-new-tokens", "6", "--receipt-out", str(out), "--json", *(["--chat"] if chat else [])]
    code = (
        "import sys, json; from node.cli import main; rc = main(sys.argv[1:]); "
        f"print(json.dumps({{'rc': rc, 'heavy': [m for m in {HEAVY!r} if m in sys.modules]}}), file=sys.stderr)"
    )
    env = {**os.environ, "XDG_DATA_HOME": str(data_home)}
    done = subprocess.run(
        [sys.executable, "-c", code, "ask", *args], capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=env
    )
    assert json.loads(done.stderr.strip().splitlines()[-1]) == {"rc": 0, "heavy": []}, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    signed = SignedReceipt.from_json(json.loads(out.read_text()))
    prompt, stops = fast_prompt(TINY_TARGET, [{"role": "user", "content": PROMPT}] if chat else PROMPT)
    assert signed.request.prompt == prompt and signed.request.stop_tokens == stops and signed.request.top_k == 7
    assert list(signed.output) == summary["tokens"] and summary["not_checked"] == []
    assert signed.receipt.model_hash == model_hash(TINY_TARGET)
    cached = json.loads((data_home / "specmarket" / "cache" / CACHE_FILE).read_text())["entries"]
    assert cached[str(TINY_TARGET.resolve())]["hash"] == model_hash(TINY_TARGET).hex()


def test_top_k_reaches_the_target_over_libp2p_succeeds(target, own_chain, data_home):
    args = [PROMPT, "--target", target.lines["multiaddr"][0], *checked_against(own_chain, "--top-k", "3")]
    done = ask(data_home, *args, "--max-new-tokens", "4", "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    signed = SignedReceipt.from_json(json.loads(done.stdout)["receipt"])
    assert signed.request.top_k == 3 and list(signed.output) == json.loads(done.stdout)["tokens"]


def test_ignore_eos_runs_to_max_tokens_and_the_receipt_names_no_stop_tokens_succeeds(target, own_chain, data_home):
    args = [PROMPT, "--target", target.lines["http"][0], *checked_against(own_chain, "--ignore-eos")]
    done = ask(data_home, *args, "--max-new-tokens", "5", "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    signed = SignedReceipt.from_json(summary["receipt"])
    assert signed.request.stop_tokens == () and len(summary["tokens"]) == 5 and summary["not_checked"] == []


def test_with_no_chain_the_receipt_is_still_saved_with_a_warning_succeeds(target, own_chain, tmp_path, data_home):
    """Before: the answer streamed, then 'error: no Ethereum JSON-RPC endpoint answers', exit 2, no file."""
    out = tmp_path / "r.json"
    args = [PROMPT, "--target", target.lines["http"][0], *checked_against(own_chain)]
    done = ask(data_home, *args, "--rpc", "http://127.0.0.1:1", "--max-new-tokens", "4", "--receipt-out", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"saved to {out}" in done.stderr and SignedReceipt.from_json(json.loads(out.read_text()))
    (line,) = warnings(done)
    assert (
        "the operator's registration" in line and "no Ethereum JSON-RPC endpoint answers at http://127.0.0.1:1" in line
    )
    missing = ask(data_home, *args, "--deployments", str(tmp_path / "none"), "--max-new-tokens", "2")
    assert missing.returncode == 0 and "no deployment for chain 31337" in warnings(missing)[0]


def test_without_model_files_the_signature_and_operator_are_still_checked_succeeds(
    target, own_chain, tmp_path, data_home
):
    empty = tmp_path / "no-model"
    empty.mkdir()
    base = [PROMPT, "--target", target.lines["http"][0], *checked_against(own_chain, "--target-model", str(empty))]
    done = ask(data_home, *base, "--max-new-tokens", "4", "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    expected = f"the prompt's tokens, the stop tokens and the model hash (no model files at {empty})"
    assert json.loads(done.stdout)["not_checked"] == [expected] and warnings(done) == [
        f"warning: not checked: {expected}"
    ]
    other = tmp_path / "other-deployments"  # another SpecmarketBond on the same chain: the operator is not there
    w3 = own_chain.client.w3
    deployment, _ = deploy(
        w3, dev_key(DEV_DEPLOYER), BondConfig(), [dev_address(i) for i in DEV_REFEREES], DEFAULT_THRESHOLD
    )
    deployment.save(other)
    out = tmp_path / "r.json"
    wrong = ask(data_home, *base, "--deployments", str(other), "--max-new-tokens", "2", "--receipt-out", str(out))
    assert wrong.returncode == 2 and "not the deployment this client trusts" in wrong.stderr
    assert f"(the receipt is saved to {out})" in wrong.stderr and out.is_file()


def test_verify_model_recomputes_a_cached_hash_succeeds(target, own_chain, data_home):
    args = [PROMPT, "--target", target.lines["http"][0], *checked_against(own_chain), "--max-new-tokens", "2"]
    assert ask(data_home, *args).returncode == 0
    cache = data_home / "specmarket" / "cache" / CACHE_FILE
    data = json.loads(cache.read_text())
    data["entries"][str(TINY_TARGET.resolve())]["hash"] = "42" * 32  # an entry that lies, its files unchanged
    cache.write_text(json.dumps(data))
    fooled = ask(data_home, *args)
    assert fooled.returncode == 2 and "not the expected 0x" + "42" * 32 in fooled.stderr
    verified = ask(data_home, *args, "--verify-model")
    assert verified.returncode == 0 and not warnings(verified), verified.stderr[-3000:]
    assert json.loads(cache.read_text())["entries"][str(TINY_TARGET.resolve())]["hash"] == model_hash(TINY_TARGET).hex()


def test_a_host_and_port_target_suggests_the_http_url_reverts(data_home):
    done = ask(data_home, "hi", "--target", "localhost:8000")
    assert done.returncode == 2 and "did you mean http://localhost:8000?" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    plain = ask(data_home, "hi", "--target", "somewhere")
    assert plain.returncode == 2 and "neither an http:// URL nor a peer multiaddr" in plain.stderr
    assert "did you mean" not in plain.stderr


def test_a_copied_model_directory_is_hashed_in_its_own_entry_succeeds(tmp_path):
    copy = tmp_path / "target-copy"
    shutil.copytree(TINY_TARGET, copy)
    cache = tmp_path / CACHE_FILE
    assert (
        cached_model_hash(copy, cache=cache) == cached_model_hash(TINY_TARGET, cache=cache) == model_hash(TINY_TARGET)
    )
    assert set(json.loads(cache.read_text())["entries"]) == {str(copy.resolve()), str(TINY_TARGET.resolve())}
