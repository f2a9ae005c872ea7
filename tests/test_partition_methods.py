"""``partition(graph, method=...)`` as a user meets it: a method that cannot give a placement
is a one-line error with what to do, from the command line as from the library."""
from __future__ import annotations

import pytest

from placer import cli
from placer.errors import PlacerError
from placer.examples import path as example_path


def test_milp_out_of_time_is_one_line_with_the_fix(capsys):
    # resnet_small's MILP has ~700 variables: HiGHS stops at a zero time limit before any
    # incumbent, so there is no placement to return
    rc = cli.main(["plan", str(example_path("resnet_small")), "--method", "milp", "--time-limit", "0"])
    out, err = capsys.readouterr()
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith("placer: error: ") and "Traceback" not in out + err
    assert "the MILP found no placement within its 0 s time limit" in err
    assert "Time limit reached" in err            # HiGHS's own words, kept
    assert "raise --time-limit" in err


def test_milp_out_of_time_raises_a_placer_error_under_debug():
    with pytest.raises(PlacerError, match="time limit"):
        cli.main(["plan", str(example_path("resnet_small")), "--method", "milp", "--time-limit", "0",
                  "--debug"])
