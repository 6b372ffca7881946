"""Running parity: ParaRNN trained with Newton against a linear recurrence of the same size.

    uv run examples/state_tracking.py
    uv run examples/state_tracking.py --seed 1 --plot docs/img/loss_state_tracking.png

Input: random bits; target at every step: the parity of all bits so far. A nonlinear cell can
flip its state on every 1 and so tracks parity at any length; a linear recurrence
``h_t = a_t ⊙ h_{t-1} + (1 - a_t) ⊙ v_t`` with decay ``a_t ∈ (0, 1)`` cannot. Both models
(same width, depth, blocks, optimizer, steps and data) are trained at ``--length`` and tested on
fresh sequences at that length and at twice it. Accuracy is per step, with the model in eval
mode (the one-step recurrence); the ParaRNN is also tested in train mode (Newton).
"""

from __future__ import annotations

import argparse

from pararnn_examples.tasks.cli import (
    add_common_options,
    add_training_options,
    config_from_args,
    positive_float,
    positive_int,
    setup_device,
)
from pararnn_examples.tasks.state_tracking import (
    StateTrackingConfig,
    plot_state_tracking,
    run_state_tracking,
)

DEFAULTS = StateTrackingConfig()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_training_options(
        parser,
        DEFAULTS,
        steps="optimizer steps per model",
        length="training sequence length T; also tested at 2T",
        d_model="width of every layer, both models",
        layers="recurrent blocks, both models",
        lr="peak learning rate, AdamW, both models",
    )
    parser.add_argument(
        "--recurrent-init",
        type=positive_float,
        default=DEFAULTS.recurrent_init,
        help="half-width w of the U(-w, w) init of the cells' diagonal recurrent weights "
        f"(default {DEFAULTS.recurrent_init}; the cells' own init is 0.25)",
    )
    parser.add_argument(
        "--newton-iters",
        type=positive_int,
        default=DEFAULTS.newton_iters,
        help=f"Newton iterations per layer and forward (default {DEFAULTS.newton_iters})",
    )
    parser.add_argument(
        "--eval-batch",
        type=positive_int,
        default=DEFAULTS.eval_batch,
        help=f"test sequences per accuracy measurement (default {DEFAULTS.eval_batch})",
    )
    parser.add_argument(
        "--no-baseline",
        action="store_true",
        help="skip the linear-recurrence baseline",
    )
    add_common_options(parser, default_seed=DEFAULTS.seed)
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    device = setup_device(parser, args)
    config = config_from_args(StateTrackingConfig, args, baseline=not args.no_baseline)
    print(
        f"running parity at T={args.length}: ParaRNN({args.cell}) vs linear recurrence, "
        f"{args.layers} layers, d={args.d_model}, B={args.batch}, seed {args.seed}, on {device}"
    )
    result = run_state_tracking(config, device, progress=not args.no_progress)
    if args.plot is not None:
        plot_state_tracking(result, args.plot)
        print(f"loss curves: {args.plot}")
    print(result.summary())


if __name__ == "__main__":
    main()
