"""The character LM: corpus selection, entropy, checkpoints (reload and resume), sampling, script."""

from __future__ import annotations

import math
import runpy
import shutil
import sysconfig
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch import Tensor

from pararnn_examples.tasks import char_lm
from pararnn_examples.tasks.char_lm import (
    CharLMConfig,
    Vocabulary,
    evaluate_bits_per_char,
    generate,
    load_checkpoint,
    run_char_lm,
    stdlib_corpus,
    unigram_entropy,
)

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "char_lm.py"
TINY = CharLMConfig(
    budget_chars=12_000, length=24, batch=8, steps=8, lr=1e-2, warmup_steps=2, d_model=16,
    layers=1, eval_streams=4, eval_chars=800,
)  # fmt: skip


def _script(name: str) -> Callable[..., object]:
    function = runpy.run_path(str(SCRIPT), run_name="char_lm_script")[name]
    assert callable(function)
    return function  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def corpus() -> char_lm.Corpus:
    return stdlib_corpus(TINY.budget_chars)


def test_corpus_is_the_sorted_public_stdlib_modules(corpus: char_lm.Corpus) -> None:
    root = Path(sysconfig.get_paths()["stdlib"])
    public = sorted(p.name for p in root.glob("*.py") if not p.name.startswith("_"))
    assert corpus.files == tuple(public[: len(corpus.files)])
    text = "".join((root / name).read_text(encoding="utf-8") for name in corpus.files)
    ids = torch.cat([corpus.train, corpus.valid])
    assert ids.numel() == TINY.budget_chars
    assert corpus.vocab.decode(ids) == text[: TINY.budget_chars]
    assert corpus.train.numel() == int(0.9 * TINY.budget_chars)
    again = stdlib_corpus(TINY.budget_chars)
    assert torch.equal(again.train, corpus.train) and again.files == corpus.files


def test_corpus_rules_on_a_folder_of_our_own(tmp_path: Path) -> None:
    for name, body in [("b.py", "bb" * 600), ("_private.py", "x" * 5000), ("a.py", "a" * 700)]:
        (tmp_path / name).write_text(body)
    (tmp_path / "notes.txt").write_text("z" * 5000)
    small = stdlib_corpus(1000, tmp_path)
    assert small.files == ("a.py", "b.py")
    assert small.vocab.chars == "ab"
    with pytest.raises(ValueError, match="budget_chars must be an int >= 1000, got 10"):
        stdlib_corpus(10, tmp_path)
    with pytest.raises(ValueError, match=r"holds no public top-level \.py files"):
        stdlib_corpus(1000, tmp_path / "notes.txt")


def test_unigram_entropy_by_hand() -> None:
    ids = Vocabulary("ab").encode("aab")
    expected = -(2 / 3 * math.log2(2 / 3) + 1 / 3 * math.log2(1 / 3))
    assert unigram_entropy(ids) == pytest.approx(expected, rel=1e-12)
    assert unigram_entropy(Vocabulary("a").encode("aaaa")) == 0


def test_vocabulary_round_trip_and_unknown_character() -> None:
    vocab = Vocabulary("hello world")
    assert vocab.chars == " dehlorw"
    assert vocab.decode(vocab.encode("lower")) == "lower"
    with pytest.raises(ValueError, match="character 'z', which is not in the 8-character"):
        vocab.encode("zoo")


@pytest.fixture(scope="module")
def trained(
    tmp_path_factory: pytest.TempPathFactory, corpus: char_lm.Corpus
) -> tuple[char_lm.CharLMResult, Path]:
    path = tmp_path_factory.mktemp("ckpt") / "lm.pt"
    result = run_char_lm(TINY, "cpu", checkpoint=path, progress=False, corpus=corpus)
    return result, path


def test_training_lowers_the_loss_and_reports_bits_per_char(
    trained: tuple[char_lm.CharLMResult, Path], corpus: char_lm.Corpus
) -> None:
    result, _ = trained
    assert len(result.history) == TINY.steps
    assert result.history.mean_loss(6, 8) < result.history.loss[0]
    # A model that knows nothing scores log2(V) bits; even 8 steps must be better than that.
    assert result.valid_bpc < math.log2(len(corpus.vocab))
    valid = corpus.valid[: TINY.eval_chars]
    assert result.unigram_bpc == unigram_entropy(valid)
    recomputed = evaluate_bits_per_char(
        result.model, valid, length=TINY.length, streams=TINY.eval_streams
    )
    assert result.valid_bpc == recomputed
    assert f"{result.valid_bpc:.3f} bits/char" in result.summary()


def test_bits_per_char_match_a_plain_stepwise_recomputation(
    trained: tuple[char_lm.CharLMResult, Path], corpus: char_lm.Corpus
) -> None:
    result, _ = trained
    ids = corpus.valid[:120]
    bpc = evaluate_bits_per_char(result.model, ids, length=7, streams=3)
    per_stream = 40
    data = ids.view(3, per_stream)
    total, state = 0.0, None
    with torch.no_grad():
        for t in range(per_stream - 1):
            logits, state = result.model.step(data[:, t], state)
            total -= float(torch.log_softmax(logits, -1).gather(1, data[:, t + 1 : t + 2]).sum())
    assert bpc == pytest.approx(total / (3 * (per_stream - 1)) / math.log(2), rel=1e-5)


def test_checkpoint_reloads_to_bit_identical_outputs(
    trained: tuple[char_lm.CharLMResult, Path],
) -> None:
    result, path = trained
    loaded = load_checkpoint(path)
    assert loaded.step == TINY.steps
    assert loaded.config == TINY
    assert loaded.vocab.chars == result.vocab.chars
    assert loaded.history == result.history
    tokens = torch.randint(
        0, len(result.vocab), (3, 17), generator=torch.Generator().manual_seed(0)
    )
    for mode in ("train", "eval"):
        result.model.train(mode == "train")
        loaded.model.train(mode == "train")
        with torch.no_grad():
            a, b = result.model(tokens), loaded.model(tokens)
        assert isinstance(a, Tensor) and isinstance(b, Tensor)
        assert torch.equal(a, b), mode
    saved_state = result.optimizer.state_dict()["state"]
    for key, value in loaded.optimizer.state_dict()["state"].items():
        assert torch.equal(value["exp_avg"], saved_state[key]["exp_avg"])


def test_resume_continues_exactly_where_an_unbroken_run_would_be(
    tmp_path: Path, corpus: char_lm.Corpus, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = replace(TINY, steps=6)
    unbroken = run_char_lm(config, "cpu", progress=False, corpus=corpus)

    path, halfway = tmp_path / "lm.pt", tmp_path / "lm_step3.pt"
    save = char_lm.save_checkpoint

    def save_and_keep_step_3(*args: object, **kwargs: object) -> Path:
        out = save(*args, **kwargs)  # type: ignore[arg-type]
        if args[5] == 3:
            shutil.copy(out, halfway)
        return out

    monkeypatch.setattr(char_lm, "save_checkpoint", save_and_keep_step_3)
    run_char_lm(config, "cpu", checkpoint=path, save_every=3, progress=False, corpus=corpus)
    resumed = run_char_lm(config, "cpu", resume=halfway, progress=False, corpus=corpus)
    assert resumed.start_step == 3
    assert resumed.history.step == list(range(6))
    assert resumed.history.loss == unbroken.history.loss
    for (name, a), (_, b) in zip(
        unbroken.model.state_dict().items(), resumed.model.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name


def test_generate_returns_valid_characters(trained: tuple[char_lm.CharLMResult, Path]) -> None:
    result, _ = trained
    model, vocab = result.model, result.vocab
    text = generate(model, vocab, "def ", 25, generator=torch.Generator().manual_seed(1))
    assert len(text) == 25 and set(text) <= set(vocab.chars)
    same = generate(model, vocab, "def ", 25, generator=torch.Generator().manual_seed(1))
    assert same == text
    greedy = generate(model, vocab, "class", 1, temperature=0)
    model.eval()
    with torch.no_grad():
        logits = model(vocab.encode("class").unsqueeze(0))
    assert isinstance(logits, Tensor)
    assert greedy == vocab.chars[int(logits[0, -1].argmax())]
    with pytest.raises(ValueError, match="temperature must be a finite float >= 0, got -1"):
        generate(model, vocab, "a", 3, temperature=-1)
    with pytest.raises(ValueError, match="prompt must hold at least one character"):
        generate(model, vocab, "", 3)
    with pytest.raises(ValueError, match="length must be an int >= 0, got -2"):
        generate(model, vocab, "a", -2)


def test_every_option_has_help() -> None:
    parser = _script("build_parser")()
    for action in parser._actions:  # type: ignore[attr-defined]
        assert action.help, f"option {action.option_strings} has no help"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--length", "-1"], "argument --length: expected a positive integer, got '-1'"),
        (["--cell", "mamba"], "argument --cell: invalid choice: 'mamba'"),
        (["--temperature", "-0.5"], "argument --temperature: expected a finite number >= 0"),
        (["--save-every", "5"], "argument --save-every: needs --checkpoint PATH"),
        (["--budget-chars", "10"], "argument --budget-chars: expected >= 1000, got 10"),
        (["--prompt", "\u00e9t\u00e9", "--budget-chars", "2000"], "argument --prompt: text holds"),
    ],
)
def test_bad_arguments_name_the_option(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stop:
        _script("main")(argv)
    assert stop.value.code == 2
    assert message in capsys.readouterr().err


def test_script_trains_saves_resumes_and_samples(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "lm.pt"
    tiny = ["--budget-chars", "12000", "--length", "16", "--batch", "4", "--d-model", "8",
            "--layers", "1", "--eval-chars", "400", "--no-progress", "--generate", "30"]  # fmt: skip
    main = _script("main")
    plot = tmp_path / "bpc.png"
    main([*tiny, "--steps", "3", "--checkpoint", str(path), "--plot", str(plot)])
    first = capsys.readouterr().out
    assert "checkpoint:" in first and "(step 3)" in first
    assert plot.read_bytes()[:4] == b"\x89PNG"
    main(["--resume", str(path), "--steps", "5", "--no-progress", "--generate", "12"])
    out = capsys.readouterr().out
    assert "training: steps 3 -> 5" in out
    sample = out.split("---\n")[1][:-1]  # the print's own newline
    assert sample.startswith("def ") and len(sample) == len("def ") + 12
    assert "bits/char" in out and "unigram entropy" in out
