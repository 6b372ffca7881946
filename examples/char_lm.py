"""A character-level language model on the Python standard library's source, trained with Newton.

    uv run examples/char_lm.py --checkpoint char_lm.pt
    uv run examples/char_lm.py --resume char_lm.pt --steps 1200 --checkpoint char_lm.pt
    uv run examples/char_lm.py --resume char_lm.pt --generate 400 --prompt "def " --temperature 0.7

The text is this interpreter's own standard library (public top-level modules in sorted order,
cut at ``--budget-chars``): nothing is downloaded. Training draws random windows and runs every
ParaRNN layer by Newton; validation reads the held-out 10 % in eval mode (the one-step
recurrence, state carried across windows) and reports bits per character beside the unigram
entropy of that text. ``--resume`` continues a checkpoint up to ``--steps`` (no training when it
is already there: the checkpoint is only evaluated and sampled); ``--generate`` samples text
through the one-step recurrence after a prompt.
"""

from __future__ import annotations

import argparse

import torch

from pararnn_examples.tasks.char_lm import (
    CharLMConfig,
    generate,
    peek_config,
    run_char_lm,
    stdlib_corpus,
)
from pararnn_examples.tasks.cli import (
    add_common_options,
    add_training_options,
    config_from_args,
    nonnegative_float,
    nonnegative_int,
    positive_int,
    setup_device,
)
from pararnn_examples.tasks.models import CELLS
from pararnn_examples.train import plot_history

DEFAULTS = CharLMConfig()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_training_options(
        parser,
        DEFAULTS,
        cells=CELLS,
        cell="recurrent layer: a ParaRNN cell or the linear baseline",
        steps="optimizer steps in total, a resumed run's included",
        length="training window T in characters",
        batch="windows per step",
    )
    parser.add_argument(
        "--newton-iters",
        type=positive_int,
        default=DEFAULTS.newton_iters,
        help="most Newton iterations per layer and forward; each solve stops once its max "
        f"residual is below {DEFAULTS.newton_tol} (default {DEFAULTS.newton_iters})",
    )
    parser.add_argument(
        "--budget-chars",
        type=positive_int,
        default=DEFAULTS.budget_chars,
        help=f"characters of stdlib source to use, >= 1000 (default {DEFAULTS.budget_chars})",
    )
    parser.add_argument(
        "--eval-chars",
        type=positive_int,
        default=DEFAULTS.eval_chars,
        help=f"validation characters to score (default {DEFAULTS.eval_chars})",
    )
    parser.add_argument(
        "--checkpoint",
        default=None,
        metavar="PATH",
        help="save model, optimizer, config and step here (at the end and every --save-every)",
    )
    parser.add_argument(
        "--save-every",
        type=positive_int,
        default=None,
        metavar="N",
        help="also save every N steps (needs --checkpoint; default: only at the end)",
    )
    parser.add_argument(
        "--resume",
        default=None,
        metavar="PATH",
        help="continue from this checkpoint up to --steps (its sizes and settings win over "
        "the size options)",
    )
    parser.add_argument(
        "--generate",
        type=nonnegative_int,
        default=300,
        metavar="N",
        help="characters to sample after training (default 300; 0 = none)",
    )
    parser.add_argument(
        "--prompt",
        default="def ",
        help="text the sample continues; characters of the corpus only (default 'def ')",
    )
    parser.add_argument(
        "--temperature",
        type=nonnegative_float,
        default=0.8,
        help="sampling temperature; 0 = always the most likely character (default 0.8)",
    )
    add_common_options(parser, default_seed=DEFAULTS.seed)
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.save_every is not None and args.checkpoint is None:
        parser.error("argument --save-every: needs --checkpoint PATH to save to")
    if not args.prompt:
        parser.error("argument --prompt: expected at least one character, got ''")
    if args.budget_chars < 1000:
        parser.error(f"argument --budget-chars: expected >= 1000, got {args.budget_chars}")
    device = setup_device(parser, args)
    budget = args.budget_chars if args.resume is None else peek_config(args.resume).budget_chars
    corpus = stdlib_corpus(budget)
    try:
        corpus.vocab.encode(args.prompt)  # before training: a bad prompt should not cost a run
    except ValueError as err:
        parser.error(f"argument --prompt: {err}")
    config = config_from_args(CharLMConfig, args)
    source = f"resuming {args.resume}" if args.resume else f"ParaRNN({args.cell})"
    print(f"char LM on stdlib source: {source}, on {device}")
    result = run_char_lm(
        config,
        device,
        resume=args.resume,
        checkpoint=args.checkpoint,
        save_every=args.save_every,
        progress=not args.no_progress,
        corpus=corpus,
    )
    if args.plot is not None:
        plot_history(
            {f"ParaRNN({result.config.cell}), training batches": result.history},
            args.plot,
            title="char LM on Python stdlib source",
            metric="bits/char",
            smooth=10,
            reference_lines={
                "unigram entropy of the validation text": result.unigram_bpc,
                "validation, end of training (eval mode)": result.valid_bpc,
            },
        )
        print(f"loss curve: {args.plot}")
    if args.checkpoint is not None:
        print(f"checkpoint: {args.checkpoint} (step {max(result.start_step, config.steps)})")
    if args.generate > 0:
        sample = generate(
            result.model,
            result.vocab,
            args.prompt,
            args.generate,
            temperature=args.temperature,
            generator=torch.Generator().manual_seed(args.seed),
        )
        print(f"--- sample (temperature {args.temperature}, one-step recurrence) ---")
        print(args.prompt + sample)
        print("---")
    print(result.summary())


if __name__ == "__main__":
    main()
