"""ParaRNN in one minute: train a small ParaGRU model with Newton, check it, time it.

    uv run examples/quickstart.py
    uv run examples/quickstart.py --cell lstm --steps 300 --plot docs/img/loss_quickstart.png

The task is flip-flop memory (tokens write 0 / write 1 / noise 0 / noise 1; the target at every
step is the latest written bit). Training runs every ParaRNN layer by Newton's method
(``.train()`` mode); the bar shows the loss, the accuracy, the Newton iterations and the largest
residual. Then the same trained model runs one test batch in ``.eval()`` mode (the one-step
recurrence) and the script reports how far the two forwards differ, and times both forwards on
the same longer batch. Runs on the GPU when one is visible (``--device`` to choose).
"""

from __future__ import annotations

import argparse

from pararnn_examples.tasks.cli import (
    add_common_options,
    add_training_options,
    config_from_args,
    positive_int,
    setup_device,
)
from pararnn_examples.tasks.quickstart import QuickstartConfig, run_quickstart
from pararnn_examples.train import plot_history

DEFAULTS = QuickstartConfig()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_training_options(parser, DEFAULTS)
    parser.add_argument(
        "--eval-batch",
        type=positive_int,
        default=DEFAULTS.eval_batch,
        help=f"sequences of the test and timing batches (default {DEFAULTS.eval_batch})",
    )
    parser.add_argument(
        "--time-length",
        type=positive_int,
        default=DEFAULTS.time_length,
        help="sequence length T of the timing batch (default 16384 on a GPU, 1024 on the CPU)",
    )
    parser.add_argument(
        "--time-repeats",
        type=positive_int,
        default=DEFAULTS.time_repeats,
        help=f"timed runs of each forward after one warm-up (default {DEFAULTS.time_repeats})",
    )
    add_common_options(parser, default_seed=DEFAULTS.seed)
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    device = setup_device(parser, args)
    config = config_from_args(QuickstartConfig, args)
    print(
        f"flip-flop memory, ParaRNN({args.cell}) x {args.layers} layers, d={args.d_model}, "
        f"B={args.batch}, T={args.length}, on {device}"
    )
    result = run_quickstart(config, device, progress=not args.no_progress)
    if args.plot is not None:
        plot_history(
            {f"ParaRNN({args.cell})": result.history},
            args.plot,
            title=f"quickstart: flip-flop memory, T = {args.length}",
            extra_axis="acc",
            log_y=True,
        )
        print(f"loss curve: {args.plot}")
    print(result.summary())


if __name__ == "__main__":
    main()
