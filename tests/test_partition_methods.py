"""``partition(arrays, method=...)`` as a user meets it: a method that cannot give a placement
is a one-line error with what to do, from the command line as from the library."""
from __future__ import annotations

import pytest
from conftest import corpus_dir

from placer import cli
from placer.errors import PlacerError


def _resnet50():
    # ResNet-50's MILP has ~1000 variables: HiGHS stops at a zero time limit before any
    # incumbent, so there is no placement to return (smaller nets' MILPs, ~300 variables,
    # get one from HiGHS's presolve even then)
    return [str(corpus_dir() / "caffe/resnet50_ResNet-50-deploy.prototxt"), "--input", "data=1,3,224,224"]


def test_milp_out_of_time_is_one_line_with_the_fix(capsys):
    rc = cli.main(["plan", *_resnet50(), "--method", "milp", "--time-limit", "0"])
    out, err = capsys.readouterr()
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith("placer: error: ") and "Traceback" not in out + err
    assert "the MILP found no placement within its 0 s time limit" in err
    assert "Time limit reached" in err            # HiGHS's own words, kept
    assert "raise --time-limit" in err


def test_milp_out_of_time_raises_a_placer_error_under_debug():
    with pytest.raises(PlacerError, match="no placement within its 0 s time limit"):
        cli.main(["plan", *_resnet50(), "--method", "milp", "--time-limit", "0", "--debug"])
