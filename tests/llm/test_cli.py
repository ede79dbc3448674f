"""`kvpool demo`'s two modes keep their options apart (no torch needed)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from kvpool.cli import main


def test_synthetic_options_need_synthetic_and_model_options_refuse_it() -> None:
    r = CliRunner().invoke(main, ["demo", "--layers", "4"])
    assert r.exit_code == 2 and "--layers needs --synthetic" in r.output
    r = CliRunner().invoke(main, ["demo", "--synthetic", "--model-size", "tiny"])
    assert r.exit_code == 2 and "--model-size applies to the real model only" in r.output


def test_help_documents_both_modes() -> None:
    r = CliRunner().invoke(main, ["demo", "--help"])
    assert r.exit_code == 0
    assert "--synthetic" in r.output and "--model-size" in r.output


def test_a_pool_too_small_for_the_prefill_is_refused_before_anything_starts() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    r = CliRunner().invoke(
        main,
        [
            "demo",
            "--model-size",
            "reference",
            "--prompt-tokens",
            "100000",
            "--segment-size",
            "64MiB",
        ],
    )
    assert r.exit_code == 2 and "more than the 64.0 MiB segment" in r.output
